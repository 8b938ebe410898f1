//! The access log's writer: entries go from the request path into a bounded queue and are
//! formatted and written on a thread of their own; a full queue drops the line and counts it,
//! so a slow disk or a pipe nobody reads never slows a request (docs/operations.md "Access
//! log"). SIGUSR1 reopens the file (logrotate's `postrotate`).

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::time::Duration;

use metrics::Counter;

use super::line::{Entry, Format};
use crate::metrics::{Metrics, Outcome};
use crate::signals::Signals;

/// Where lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Standard output (`-`); the process's own logs go to standard error.
    Stdout,
    /// A file, created if missing and appended to.
    File(PathBuf),
}

impl std::str::FromStr for Target {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(if s == "-" {
            Target::Stdout
        } else {
            Target::File(PathBuf::from(s))
        })
    }
}

/// The share of each outcome's requests written, `(0, 1]` each (`--access-log-sample`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling([f64; 4]);

impl Default for Sampling {
    /// Every line.
    fn default() -> Self {
        Sampling([1.0; 4])
    }
}

impl Sampling {
    /// The rate of `outcome`.
    pub fn rate(&self, outcome: Outcome) -> f64 {
        self.0[outcome as usize]
    }
}

impl std::str::FromStr for Sampling {
    type Err = String;

    /// `forwarded=0.01,shed=1`: an outcome (`forwarded`, `shed`, `rejected`,
    /// `upstream_error`) and its rate in `(0, 1]` per item; outcomes not named keep 1.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut rates = Sampling::default();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, rate) = item
                .split_once('=')
                .ok_or_else(|| format!("{item:?}: write OUTCOME=RATE, e.g. forwarded=0.01"))?;
            let outcome = super::line::parse_outcome(name.trim()).ok_or_else(|| {
                format!("{name:?} is not an outcome: forwarded, shed, rejected or upstream_error")
            })?;
            let rate: f64 = rate
                .trim()
                .parse()
                .map_err(|_| format!("{item:?}: the rate is not a number"))?;
            if !(rate > 0.0 && rate <= 1.0) {
                return Err(format!(
                    "{item:?}: a rate is in (0, 1] (to write no lines, leave --access-log unset)"
                ));
            }
            rates.0[outcome as usize] = rate;
        }
        Ok(rates)
    }
}

/// `--access-log` and the settings that go with it.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Where lines go.
    pub target: Target,
    /// Rates per outcome.
    pub sampling: Sampling,
    /// What a line says of the sender.
    pub format: Format,
    /// Lines the queue holds before new ones are dropped.
    pub queue: usize,
}

/// Lines the queue holds by default: 64 Ki entries of about 400 bytes, 25 MiB at most, a
/// second of 60 000 requests a second while the disk stalls.
pub const DEFAULT_QUEUE: usize = 65_536;

/// Why the access log cannot start.
#[derive(Debug, thiserror::Error)]
#[error("access log {path}: {source}")]
pub struct OpenError {
    /// The file.
    pub path: String,
    /// The cause.
    pub source: std::io::Error,
}

/// The request path's end of the access log: request ids, the sampling, and the queue.
#[derive(Debug)]
pub struct AccessLog {
    queue: SyncSender<Entry>,
    sampling: Sampling,
    next_id: AtomicU64,
    counts: Arc<Counts>,
}

/// What the writer thread and the request path count, for the metrics and for a drained
/// shutdown.
#[derive(Debug)]
struct Counts {
    submitted: AtomicU64,
    /// Written, or dropped by a write error.
    done: AtomicU64,
    written: Counter,
    behind: Counter,
    failed: Counter,
}

impl AccessLog {
    /// Opens the target and starts the writer thread. A file is opened on that thread, and
    /// waited for at most a second: a FIFO without a reader opens only when one comes, and
    /// requests are served meanwhile (their lines counted as dropped once the queue fills).
    ///
    /// # Errors
    /// [`OpenError`] when the file cannot be opened (a missing directory, no permission).
    pub fn start(
        config: LogConfig,
        metrics: &Metrics,
        signals: &Signals,
    ) -> Result<Arc<Self>, OpenError> {
        let (queue, entries) = std::sync::mpsc::sync_channel(config.queue.max(1));
        let counts = Arc::new(Counts {
            submitted: AtomicU64::new(0),
            done: AtomicU64::new(0),
            written: metrics.access_log_lines.clone(),
            behind: metrics.access_log_dropped[0].clone(),
            failed: metrics.access_log_dropped[1].clone(),
        });
        let (opened_tx, opened_rx) = std::sync::mpsc::channel();
        let thread = Writer {
            entries,
            format: config.format,
            target: config.target.clone(),
            signals: signals.clone(),
            counts: Arc::clone(&counts),
        };
        let spawned = std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || thread.run(&opened_tx));
        let path = match &config.target {
            Target::Stdout => "-".to_owned(),
            Target::File(p) => p.display().to_string(),
        };
        if let Err(source) = spawned {
            return Err(OpenError { path, source });
        }
        match opened_rx.recv_timeout(Duration::from_secs(1)) {
            Ok(Ok(())) => {}
            Ok(Err(source)) => return Err(OpenError { path, source }),
            Err(_) => tracing::warn!(
                %path,
                "access log not open after 1 s (a FIFO waiting for its reader?): serving; \
                 lines are dropped and counted until it opens"
            ),
        }
        Ok(Arc::new(AccessLog {
            queue,
            sampling: config.sampling,
            next_id: AtomicU64::new(u64::from(fastrand::u32(..)) << 32),
            counts,
        }))
    }

    /// A new request id: unique per process (a random high half, then a count).
    pub fn request_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The rate `outcome` is kept at, and whether this request is kept: `draw` uniform in
    /// `[0, 1)` is under the rate.
    pub fn sampled(&self, outcome: Outcome, draw: f64) -> Option<f64> {
        let rate = self.sampling.rate(outcome);
        (rate >= 1.0 || draw < rate).then_some(rate)
    }

    /// Whether every outcome is written (no draw needed).
    pub fn samples_all(&self) -> bool {
        self.sampling == Sampling::default()
    }

    /// Queues `entry` for writing; with the queue full it is dropped and counted
    /// (`shedgate_access_log_dropped_total{reason="behind"}`). Never blocks.
    pub fn submit(&self, entry: Entry) {
        self.counts.submitted.fetch_add(1, Ordering::Relaxed);
        match self.queue.try_send(entry) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counts.behind.increment(1);
                self.counts.done.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Waits up to `limit` for the queued lines to be written (shutdown).
    pub async fn drain(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while self.counts.done.load(Ordering::Acquire)
            < self.counts.submitted.load(Ordering::Acquire)
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// The writer thread.
struct Writer {
    entries: Receiver<Entry>,
    format: Format,
    target: Target,
    signals: Signals,
    counts: Arc<Counts>,
}

/// Lines formatted before one write: bounds the buffer at about 400 KiB.
const BATCH: usize = 1024;

impl Writer {
    fn run(self, opened: &std::sync::mpsc::Sender<std::io::Result<()>>) {
        let mut reopens = self.signals.reopens();
        let mut out = match self.open() {
            Ok(out) => {
                let _ = opened.send(Ok(()));
                out
            }
            Err(e) => {
                let _ = opened.send(Err(e));
                return;
            }
        };
        let mut buf = Vec::with_capacity(64 * 1024);
        let mut warned = false;
        loop {
            let first = match self.entries.recv_timeout(Duration::from_millis(250)) {
                Ok(entry) => Some(entry),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let seen = self.signals.reopens();
            if seen != reopens {
                reopens = seen;
                match self.open() {
                    Ok(new) => {
                        out = new;
                        warned = false;
                        tracing::info!("access log reopened on SIGUSR1");
                    }
                    Err(e) => tracing::error!(
                        error = %e,
                        "access log not reopened on SIGUSR1; still writing to the open file"
                    ),
                }
            }
            let Some(first) = first else { continue };
            buf.clear();
            first.write_line(&self.format, &mut buf);
            let mut lines = 1u64;
            while lines < BATCH as u64 {
                match self.entries.try_recv() {
                    Ok(entry) => {
                        entry.write_line(&self.format, &mut buf);
                        lines += 1;
                    }
                    Err(_) => break,
                }
            }
            match out.write_all(&buf).and_then(|()| out.flush()) {
                Ok(()) => self.counts.written.increment(lines),
                Err(e) => {
                    self.counts.failed.increment(lines);
                    if !warned {
                        warned = true;
                        tracing::error!(
                            error = %e,
                            "access log write failed: lines dropped and counted \
                             (shedgate_access_log_dropped_total{{reason=\"write_error\"}}) \
                             until a write succeeds or SIGUSR1 reopens it"
                        );
                    }
                }
            }
            self.counts.done.fetch_add(lines, Ordering::Release);
        }
    }

    fn open(&self) -> std::io::Result<Box<dyn Write + Send>> {
        match &self.target {
            Target::Stdout => Ok(Box::new(std::io::stdout())),
            Target::File(path) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?;
                Ok(Box::new(file))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_reads_outcomes_and_rates() {
        let s: Sampling = "forwarded=0.01, shed=1".parse().unwrap();
        assert!((s.rate(Outcome::Forwarded) - 0.01).abs() < 1e-12);
        assert!((s.rate(Outcome::Shed) - 1.0).abs() < 1e-12);
        assert!((s.rate(Outcome::Rejected) - 1.0).abs() < 1e-12);
        for bad in [
            "forwarded",
            "sent=1",
            "shed=0",
            "shed=1.5",
            "shed=NaN",
            "shed=x",
        ] {
            assert!(bad.parse::<Sampling>().is_err(), "{bad}");
        }
    }
}
