//! Where the access log's bytes go, and the rule that no torn line stays there, whatever the
//! disk does (docs/operations.md "Access log", "A full disk").
//!
//! A write can stop part-way: the disk fills (`ENOSPC` after a short write), a pipe's reader
//! goes away. The bytes written up to there end in the middle of a line, and the next write
//! would be glued to that fragment, making both lines unreadable (stellar-core#2288; logrotate
//! PR #16 for the same on its own files). So after a short write:
//!
//! - a regular file is cut back to the end of its last complete line (`ftruncate`), after
//!   checking that its length is still what this write left (a rotation by `copytruncate`
//!   in between is never extended with zeros);
//! - a sink that cannot be cut back (a pipe, standard output, or a file whose length changed
//!   under the write) keeps the rest of the torn line and writes it before anything else, so
//!   the line is completed and the next one starts on a line of its own.
//!
//! Lines count as written only once a reader can parse them; the lines of a failed write
//! after the torn one are dropped (`write_error`). Each later batch is tried again, so
//! writing resumes as soon as there is room.

use std::io::{self, Write};
use std::sync::Arc;

/// An unbuffered destination of whole batches of lines, which can say whether it can be cut
/// back to an earlier length (a regular file can; a pipe cannot).
pub trait Sink: Write + Send {
    /// The sink's length now, bytes, when it can be cut back to an earlier one with
    /// [`Sink::truncate`] (a regular file opened for appending); `None` otherwise.
    fn end(&mut self) -> Option<u64>;

    /// Cuts the sink back to `len` bytes.
    ///
    /// # Errors
    /// The system's error (`EINVAL` for a pipe).
    fn truncate(&mut self, len: u64) -> io::Result<()>;
}

/// A file opened for appending: every write lands at its end, so cutting it back to the end
/// of its last complete line is safe.
impl Sink for std::fs::File {
    fn end(&mut self) -> Option<u64> {
        self.metadata()
            .ok()
            .filter(std::fs::Metadata::is_file)
            .map(|m| m.len())
    }

    fn truncate(&mut self, len: u64) -> io::Result<()> {
        self.set_len(len)
    }
}

/// Standard output as a file of its own (a duplicate of descriptor 1, unbuffered): never cut
/// back, even when it is a regular file, since the shell may have opened it without
/// `O_APPEND` and a cut would leave the write position past the end.
#[derive(Debug)]
pub struct Stdout(std::fs::File);

impl Stdout {
    /// A duplicate of the process's standard output.
    ///
    /// # Errors
    /// The system's error (`EMFILE`, a closed descriptor 1).
    pub fn open() -> io::Result<Self> {
        use std::os::fd::AsFd;
        let fd = io::stdout().as_fd().try_clone_to_owned()?;
        Ok(Stdout(std::fs::File::from(fd)))
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Sink for Stdout {
    fn end(&mut self) -> Option<u64> {
        None
    }

    fn truncate(&mut self, _: u64) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// Opens a sink the embedding program chooses, at start and again on each SIGUSR1 (tests use
/// it for a disk that fills up; `--access-log` always names a file or `-`).
#[derive(Clone)]
pub struct OpenSink(pub Arc<dyn Fn() -> io::Result<Box<dyn Sink>> + Send + Sync>);

impl std::fmt::Debug for OpenSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpenSink(..)")
    }
}

impl PartialEq for OpenSink {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for OpenSink {}

/// What one batch came to, in lines.
#[derive(Debug, Default)]
pub(super) struct Wrote {
    /// Lines a reader can now parse (a torn line completed included).
    pub written: u64,
    /// Lines lost.
    pub failed: u64,
    /// Why the write stopped, if it did.
    pub error: Option<io::Error>,
}

/// The open sink and the rest of a line torn on it that could not be cut back.
pub(super) struct Out {
    sink: Box<dyn Sink>,
    /// The rest of a torn line, newline included, written before anything else.
    torn: Vec<u8>,
}

impl Out {
    /// Writes to `sink`.
    pub(super) fn new(sink: Box<dyn Sink>) -> Self {
        Out {
            sink,
            torn: Vec::new(),
        }
    }

    /// Whether a torn line waits to be completed (it is counted once it is, or once it is
    /// given up: [`Out::abandon`]).
    pub(super) fn torn(&self) -> bool {
        !self.torn.is_empty()
    }

    /// Gives up a torn line still to be completed (the sink is being replaced): the lines
    /// lost, 0 or 1.
    pub(super) fn abandon(&mut self) -> u64 {
        let lost = u64::from(self.torn());
        self.torn = Vec::new();
        lost
    }

    /// Writes `batch`, `lines` whole lines, after the rest of any torn line; see the module
    /// docs for what a short write leaves.
    pub(super) fn write(&mut self, batch: &[u8], lines: u64) -> Wrote {
        let mut wrote = Wrote::default();
        if self.torn() {
            let (n, error) = write_some(&mut *self.sink, &self.torn);
            self.torn.drain(..n);
            if error.is_some() {
                wrote.failed = lines;
                wrote.error = error;
                return wrote;
            }
            wrote.written = 1;
        }
        if batch.is_empty() {
            return wrote;
        }
        let start = self.sink.end();
        let (n, error) = write_some(&mut *self.sink, batch);
        let Some(error) = error else {
            wrote.written += lines;
            return wrote;
        };
        let done = &batch[..n];
        let cut = done.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let complete = done[..cut].iter().filter(|&&b| b == b'\n').count() as u64;
        let mut lost = lines.saturating_sub(complete);
        if n > cut {
            let cut_back = start.is_some_and(|start| {
                self.sink.end() == Some(start + n as u64)
                    && self.sink.truncate(start + cut as u64).is_ok()
            });
            if !cut_back {
                let line_end = batch[n..]
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(batch.len(), |i| n + i + 1);
                self.torn = batch[n..line_end].to_vec();
                lost = lost.saturating_sub(1);
            }
        }
        wrote.written += complete;
        wrote.failed = lost;
        wrote.error = Some(error);
        wrote
    }
}

/// Writes as much of `buf` as the sink takes: the bytes written, and the error that stopped
/// it (`None`: all of it).
fn write_some(sink: &mut dyn Sink, buf: &[u8]) -> (usize, Option<io::Error>) {
    let mut n = 0;
    while n < buf.len() {
        match sink.write(&buf[n..]) {
            Ok(0) => return (n, Some(io::ErrorKind::WriteZero.into())),
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (n, Some(e)),
        }
    }
    (n, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A pipe into a buffer that takes `room` more bytes, then fails with `ENOSPC`.
    struct Pipe {
        out: Arc<Mutex<Vec<u8>>>,
        room: Arc<Mutex<usize>>,
    }

    impl Write for Pipe {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let mut room = self.room.lock().unwrap();
            if *room == 0 {
                return Err(io::ErrorKind::StorageFull.into());
            }
            let n = buf.len().min(*room);
            *room -= n;
            self.out.lock().unwrap().extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Sink for Pipe {
        fn end(&mut self) -> Option<u64> {
            None
        }

        fn truncate(&mut self, _: u64) -> io::Result<()> {
            Err(io::ErrorKind::Unsupported.into())
        }
    }

    fn batch(from: u32, n: u32) -> Vec<u8> {
        (from..from + n)
            .flat_map(|i| format!("{{\"n\":{i},\"pad\":\"{}\"}}\n", "x".repeat(40)).into_bytes())
            .collect()
    }

    /// A sink that cannot be cut back: the torn line is completed by the next write, before
    /// the next batch; every line the reader gets parses, and the counts are those lines.
    #[test]
    fn a_torn_line_on_a_pipe_is_completed_before_the_next() {
        let out = Arc::new(Mutex::new(Vec::new()));
        let room = Arc::new(Mutex::new(130));
        let mut sink = Out::new(Box::new(Pipe {
            out: Arc::clone(&out),
            room: Arc::clone(&room),
        }));
        let first = sink.write(&batch(0, 4), 4);
        assert_eq!((first.written, first.failed), (2, 1), "two whole, one torn");
        assert!(first.error.is_some() && sink.torn());
        // Still no room: the torn line waits, the whole batch is lost.
        let second = sink.write(&batch(4, 2), 2);
        assert_eq!((second.written, second.failed), (0, 2));
        *room.lock().unwrap() = usize::MAX;
        let third = sink.write(&batch(6, 2), 2);
        assert_eq!(
            (third.written, third.failed),
            (3, 0),
            "the torn line and two"
        );
        assert!(third.error.is_none() && !sink.torn());
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        let read: Vec<u64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["n"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        assert_eq!(read, [0, 1, 2, 6, 7], "{text}");
    }

    /// A regular file is cut back to its last complete line at once.
    #[test]
    fn a_torn_line_in_a_file_is_cut_back() {
        struct Small(std::fs::File, usize);
        impl Write for Small {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                if self.1 == 0 {
                    return Err(io::ErrorKind::StorageFull.into());
                }
                let n = self.0.write(&buf[..buf.len().min(self.1)])?;
                self.1 -= n;
                Ok(n)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        impl Sink for Small {
            fn end(&mut self) -> Option<u64> {
                self.0.end()
            }
            fn truncate(&mut self, len: u64) -> io::Result<()> {
                self.0.truncate(len)
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let mut sink = Out::new(Box::new(Small(file, 200)));
        let wrote = sink.write(&batch(0, 5), 5);
        assert_eq!((wrote.written, wrote.failed), (3, 2));
        assert!(!sink.torn(), "nothing waits: the fragment is gone");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with('\n'), "{text:?}");
        assert_eq!(text.lines().count(), 3);
    }
}
