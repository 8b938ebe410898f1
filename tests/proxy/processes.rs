//! Test peers that read and run things themselves: an upstream that reads requests off the
//! socket (header-name case, a body cut before its end), and the `shedgate` binary as a child
//! process.

#![allow(dead_code, reason = "not every module uses every helper")]
#![allow(unreachable_pub, reason = "not every module uses every helper")]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;

/// What a [`RawUpstream`] read of one request: its head as sent (header-name case and all),
/// its body, and whether the body arrived whole (its `Content-Length`, or the chunked body's
/// final chunk) before the connection ended.
#[derive(Debug, Clone)]
pub struct RawRequest {
    pub head: String,
    pub body: Vec<u8>,
    pub complete: bool,
}

/// A 200 with no body, for a [`RawUpstream`].
pub const OK_EMPTY: &str = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";

/// When and what a [`RawUpstream`] answers.
#[derive(Debug, Clone, Copy)]
pub enum RawReply {
    /// As soon as the head has arrived, before the body is read (the body is read after).
    AtHead(&'static str),
    /// Once the body has arrived whole, after a delay.
    AfterBody(&'static str, Duration),
}

/// An HTTP/1.1 upstream on 127.0.0.1:0 that reads requests off the socket itself, so that a
/// test sees what hyper would normalise (header-name case, a body cut before its end), and
/// answers each request with the bytes `reply` picks for its head (lower-cased).
pub struct RawUpstream {
    pub addr: SocketAddr,
    pub seen: Arc<Mutex<Vec<RawRequest>>>,
    /// TCP connections accepted.
    pub accepted: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl RawUpstream {
    pub async fn start(reply: impl Fn(&str) -> RawReply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let reply = Arc::new(reply);
        let (record, count) = (Arc::clone(&seen), Arc::clone(&accepted));
        let task = tokio::spawn(async move {
            let mut served = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                while served.try_join_next().is_some() {}
                let (record, reply) = (Arc::clone(&record), Arc::clone(&reply));
                served.spawn(async move {
                    let _ = raw_connection(stream, &record, &*reply).await;
                });
            }
        });
        RawUpstream {
            addr,
            seen,
            accepted,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<RawRequest> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves one connection of a [`RawUpstream`] until it ends.
async fn raw_connection(
    stream: tokio::net::TcpStream,
    record: &Mutex<Vec<RawRequest>>,
    reply: &(dyn Fn(&str) -> RawReply + Send + Sync),
) -> std::io::Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let mut io = BufReader::new(stream);
    loop {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            if io.read_until(b'\n', &mut head).await? == 0 {
                return Ok(());
            }
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let lower = head.to_ascii_lowercase();
        let length = lower
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok());
        let chunked = lower
            .lines()
            .any(|l| l.starts_with("transfer-encoding:") && l.contains("chunked"));
        let answer = reply(&lower);
        if let RawReply::AtHead(bytes) = answer {
            io.get_mut().write_all(bytes.as_bytes()).await?;
        }
        let mut body = Vec::new();
        let complete = if chunked {
            loop {
                let mut line = Vec::new();
                if io.read_until(b'\n', &mut line).await? == 0 {
                    break false;
                }
                let text = String::from_utf8_lossy(&line);
                let size = text.trim().split(';').next().unwrap_or("");
                let Ok(size) = usize::from_str_radix(size, 16) else {
                    break false;
                };
                if size == 0 {
                    let mut end = Vec::new();
                    io.read_until(b'\n', &mut end).await?;
                    break end == b"\r\n";
                }
                let mut chunk = vec![0u8; size + 2];
                if io.read_exact(&mut chunk).await.is_err() {
                    break false;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        } else {
            let mut data = vec![0u8; length.unwrap_or(0)];
            let whole = io.read_exact(&mut data).await.is_ok();
            body = data;
            whole
        };
        record.lock().unwrap().push(RawRequest {
            head,
            body,
            complete,
        });
        if !complete {
            return Ok(());
        }
        if let RawReply::AfterBody(bytes, delay) = answer {
            tokio::time::sleep(delay).await;
            io.get_mut().write_all(bytes.as_bytes()).await?;
        }
    }
}

/// The `shedgate` binary running as a child process, its stderr read line by line.
pub struct Spawned {
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    /// Every stderr line read so far.
    pub log: Vec<String>,
}

impl Spawned {
    /// Starts `shedgate ARGS` with `RUST_LOG=info` and no colours.
    pub fn start(args: &[&std::ffi::OsStr]) -> Self {
        Self::spawn(args, std::process::Stdio::inherit())
    }

    /// As [`Spawned::start`], with standard output a pipe (`child.stdout`) the test reads, or
    /// leaves unread.
    pub fn start_piped(args: &[&std::ffi::OsStr]) -> Self {
        Self::spawn(args, std::process::Stdio::piped())
    }

    fn spawn(args: &[&std::ffi::OsStr], stdout: std::process::Stdio) -> Self {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"))
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(stdout)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = std::sync::mpsc::channel::<String>();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Spawned {
            child,
            lines,
            log: Vec::new(),
        }
    }

    /// Sends `signal` (`HUP`, `TERM`, `USR1`, …) with `kill`.
    pub fn signal(&self, signal: &str) {
        let sent = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal}");
    }

    /// Reads stderr until a line contains `text` (panics after `within`, with the log).
    pub fn wait_for(&mut self, text: &str, within: Duration) -> String {
        let polls = within.as_millis() / POLL.as_millis();
        for _ in 0..=polls {
            while let Ok(line) = self.lines.recv_timeout(POLL) {
                self.log.push(line.clone());
                if line.contains(text) {
                    return line;
                }
            }
        }
        panic!("no line with {text:?} within {within:?}: {:#?}", self.log)
    }

    /// Reads what stderr says for about `for_` more.
    pub fn drain_log(&mut self, for_: Duration) {
        for _ in 0..for_.as_millis() / POLL.as_millis() {
            while let Ok(line) = self.lines.try_recv() {
                self.log.push(line);
            }
            std::thread::sleep(POLL);
        }
        while let Ok(line) = self.lines.try_recv() {
            self.log.push(line);
        }
    }

    /// Waits for the process to exit (kills it and panics after about `within`).
    pub fn wait_exit(&mut self, within: Duration) -> std::process::ExitStatus {
        for _ in 0..=within.as_millis() / POLL.as_millis() {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.drain_log(Duration::from_millis(200));
                return status;
            }
            std::thread::sleep(POLL);
        }
        let _ = self.child.kill();
        panic!("still running after {within:?}: {:#?}", self.log);
    }
}

/// How often [`Spawned`] looks again.
const POLL: Duration = Duration::from_millis(20);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
