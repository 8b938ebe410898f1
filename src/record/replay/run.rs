//! A whole log replayed ([`Run`]): every line through [`Replay`], the bad lines kept, the
//! report as text or JSON.

use serde::Serialize;

use super::{LineError, Replay};
use crate::policy::Policy;

/// Most mismatches and bad lines a report lists one by one (all are counted).
pub const LISTED: usize = 20;

/// A whole log replayed: [`Replay`]'s counts, the lines that were not access-log lines, and
/// a torn last line skipped.
#[derive(Debug)]
pub struct Run<'p> {
    /// The replay.
    pub replay: Replay<'p>,
    /// Lines that are not access-log lines (every one; the first [`LISTED`] printed).
    pub errors: Vec<LineError>,
    /// The last line, skipped: it had no newline and was not a line.
    pub torn: Option<Torn>,
    /// `gzip` when the input was gzip-compressed (and read decompressed).
    pub compression: Option<&'static str>,
}

/// A last line without its newline that is not an access-log line: a log still being
/// written (the writer's chunk cut short), or the zero bytes a crash or another writer's
/// truncation (logrotate's `copytruncate`) leaves at the end. Skipped, with a warning: the
/// lines before it are whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error(
    "line {line}: {}: skipped",
    if *zeros {
        format!("{bytes} zero bytes at the end (a crash, or another writer's truncation)")
    } else {
        format!("a torn last line, {bytes} bytes without a newline (a log still being written?)")
    }
)]
pub struct Torn {
    /// 1-based line number.
    pub line: u64,
    /// Its length, bytes.
    pub bytes: usize,
    /// Whether every byte of it is zero.
    pub zeros: bool,
}

/// A log that cannot be read as one: the reader's error, or compressed data that does not
/// decompress, or a compression this reader does not undo.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The reader failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// gzip data (magic bytes `1f 8b`, RFC 1952) that does not decompress: corrupt, or cut
    /// short.
    #[error("gzip-compressed, but it does not decompress: {0}")]
    Gzip(std::io::Error),
    /// Data compressed by another program (`zstd`, `xz`, `bzip2`), named by its magic bytes.
    #[error(
        "{0}-compressed: decompress it first, e.g. `{1} FILE | shedgate replay --log -` (gzip is read as it is)"
    )]
    Compressed(&'static str, &'static str),
}

/// Magic bytes of compressions logrotate's `compresscmd` may be set to, with the command that
/// decompresses to standard output: zstd (RFC 8878 section 3.1.1), xz (its file format's
/// section 2.1.1.1), bzip2.
const OTHER_COMPRESSIONS: [(&[u8], &str, &str); 3] = [
    (&[0x28, 0xb5, 0x2f, 0xfd], "zstd", "zstdcat"),
    (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz", "xzcat"),
    (b"BZh", "bzip2", "bzcat"),
];

/// How a run ended, for the command's exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Every decision of the policy given came out the same, and every line read.
    Reproduced,
    /// A decision of the policy given came out otherwise (whatever else the input held).
    Differ,
    /// A line that is not an access-log line (a torn last line aside).
    Unreadable,
    /// Not one access-log line: nothing was replayed.
    Empty,
}

impl<'p> Run<'p> {
    /// Replays every line `log` holds under `policy`. gzip-compressed input (by its magic
    /// bytes, not its name) is read decompressed, several members one after the other as
    /// `zcat` reads them (logrotate's `compress`, or `cat a.gz b.gz`).
    ///
    /// # Errors
    /// [`ReadError`]: the reader's error, gzip that does not decompress, or another
    /// compression.
    pub fn read(mut log: impl std::io::BufRead, policy: &'p Policy) -> Result<Self, ReadError> {
        let head = log.fill_buf()?;
        if head.starts_with(&[0x1f, 0x8b]) {
            let inflated = flate2::bufread::MultiGzDecoder::new(log);
            let mut run = Run::lines(
                &mut std::io::BufReader::with_capacity(1 << 20, inflated),
                policy,
            )
            .map_err(ReadError::Gzip)?;
            run.compression = Some("gzip");
            return Ok(run);
        }
        if let Some((_, name, command)) = OTHER_COMPRESSIONS
            .iter()
            .find(|(magic, _, _)| head.starts_with(magic))
        {
            return Err(ReadError::Compressed(name, command));
        }
        Ok(Run::lines(&mut log, policy)?)
    }

    /// Replays every line `log` holds, as they are.
    fn lines(log: &mut dyn std::io::BufRead, policy: &'p Policy) -> std::io::Result<Self> {
        let mut replay = Replay::new(policy);
        let mut errors = Vec::new();
        let mut torn = None;
        let mut bytes = Vec::new();
        let mut number = 0u64;
        loop {
            bytes.clear();
            if log.read_until(b'\n', &mut bytes)? == 0 {
                break;
            }
            number += 1;
            let whole = bytes.ends_with(b"\n");
            let read = std::str::from_utf8(&bytes)
                .map_err(|e| LineError {
                    line: number,
                    why: format!("not UTF-8 text (at byte {})", e.valid_up_to()),
                })
                .and_then(|text| replay.line(number, text));
            match read {
                Ok(()) => {}
                // Nothing follows a line without its newline: it is the last.
                Err(_) if !whole => {
                    torn = Some(Torn {
                        line: number,
                        bytes: bytes.len(),
                        zeros: bytes.iter().all(|&b| b == 0),
                    });
                }
                Err(e) => errors.push(e),
            }
        }
        Ok(Run {
            replay,
            errors,
            torn,
            compression: None,
        })
    }

    /// Whether every decision of the policy given came out the same and every line read.
    pub fn passed(&self) -> bool {
        self.replay.stats.mismatched == 0 && self.errors.is_empty()
    }

    /// How the run ended: decisions that differ first (they are what a replay is for), then
    /// lines that are not access-log lines, then an input without one line to replay.
    pub fn outcome(&self) -> Outcome {
        if self.replay.stats.mismatched > 0 {
            Outcome::Differ
        } else if !self.errors.is_empty() {
            Outcome::Unreadable
        } else if self.replay.stats.lines == 0 {
            Outcome::Empty
        } else {
            Outcome::Reproduced
        }
    }

    /// The report as text.
    pub fn text(&self, source: &str) -> String {
        use std::fmt::Write as _;
        let r = &self.replay;
        let s = &r.stats;
        let version = r.policy.version();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "replayed {} lines of {source}{} under policy {version}",
            s.lines,
            self.compression
                .map(|c| format!(" ({c}-compressed)"))
                .unwrap_or_default()
        );
        let _ = writeln!(
            out,
            "  decided under this policy:    {} reproduced, {} mismatched",
            s.reproduced, s.mismatched
        );
        let others: Vec<String> = r
            .versions
            .iter()
            .filter(|(v, _)| v.as_str() != version)
            .map(|(v, n)| format!("{v}: {n} lines logged, unread bodies included"))
            .collect();
        let _ = writeln!(
            out,
            "  decided under other policies: {}{}",
            s.compared,
            if others.is_empty() {
                String::new()
            } else {
                format!(" ({})", others.join(", "))
            }
        );
        if s.moved > 0 {
            let _ = writeln!(
                out,
                "  sent to another upstream:     {} of the other policies' decisions: not \
                 decided (open loop: that upstream's pressure then is unknown)",
                s.moved
            );
        }
        let _ = writeln!(
            out,
            "  bodies streamed through unread: {} still never shed, {} undecidable under this \
             policy (it would need their facts)",
            s.unread, s.undecidable
        );
        let _ = writeln!(
            out,
            "  not decided by a policy:      {} (rejections, budget waits, buffered-bytes \
             sheds)",
            s.outside
        );
        for m in r.mismatches.iter().take(LISTED) {
            let _ = writeln!(
                out,
                "line {}: mismatch: recorded {}; replayed {}",
                m.line, m.recorded, m.replayed
            );
        }
        if r.mismatches.len() > LISTED {
            let _ = writeln!(
                out,
                "... and {} more mismatches",
                r.mismatches.len() - LISTED
            );
        }
        for e in self.errors.iter().take(LISTED) {
            let _ = writeln!(out, "{e}");
        }
        if self.errors.len() > LISTED {
            let _ = writeln!(out, "... and {} more bad lines", self.errors.len() - LISTED);
        }
        if !r.tally.is_empty() {
            let _ = writeln!(
                out,
                "\nThe other policies' decisions under {version}, over {:.1} s of traffic \
                 (open-loop: the recorded pressure is replayed; a policy that admits more \
                 would in reality raise it; `moved` ones it sends to another upstream, whose \
                 pressure then is unknown, are not decided):",
                r.seconds()
            );
            out.push_str(&r.tally.table(r.policy, r.seconds()));
        }
        out
    }

    /// The report as JSON.
    pub fn json(&self) -> serde_json::Value {
        let r = &self.replay;
        serde_json::json!({
            "policy": r.policy.version(),
            "stats": r.stats,
            "versions": r.versions,
            "mismatches": r.mismatches,
            "errors": self.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "torn": self.torn,
            "compression": self.compression,
            "outcome": self.outcome(),
            "seconds": r.seconds(),
            "rows": r.tally.rows(r.policy, r.seconds()),
        })
    }
}
