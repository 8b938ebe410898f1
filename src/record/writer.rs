//! The access log's writer: lines are formatted on the request path into per-thread shards,
//! and chunks of them go through a bounded queue to a thread of their own that writes them;
//! when too many wait, a chunk is dropped and counted, so a slow disk or a pipe nobody reads
//! never slows a request (docs/operations.md "Access log"). SIGUSR1 reopens the file
//! (logrotate's `postrotate`).
//!
//! Lines are written in the order the requests were answered: each line takes a number
//! when it is formatted, under its shard's lock, and each sweep takes every shard at once
//! (all their locks held), so a sweep holds every line numbered before it and none after;
//! the writer sorts a sweep's lines by number before writing them in one call.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::Counter;

use super::format::Formatter;
use super::line::Entry;
use super::sink::{Out, Sink};
use crate::metrics::{Metrics, Outcome};
use crate::signals::Signals;

/// Where lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Standard output (`-`); the process's own logs go to standard error.
    Stdout,
    /// A file, created if missing and appended to.
    File(PathBuf),
    /// A sink the embedding program opens (never from the command line).
    Sink(super::sink::OpenSink),
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
    pub format: super::format::Format,
    /// Lines the queue holds before new ones are dropped.
    pub queue: usize,
}

/// Lines waiting to be written, at most, by default: 64 Ki lines of about 640 bytes, 40 MiB,
/// a second of 60,000 requests a second while the disk stalls.
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

/// Shards of formatted lines: a request thread formats its line into its own shard's buffer,
/// under a lock nobody else wants (two threads share one only past 16 workers, or while the
/// writer takes the buffer).
const SHARDS: usize = 16;

/// Bytes a shard holds before it hands them to the writer: about a hundred lines, one write.
const CHUNK: usize = 64 * 1024;

/// How often the writer takes what the shards hold, and how long a line can wait in one.
const SWEEP: Duration = Duration::from_millis(20);

/// Bytes of the writer's batch buffer kept between sweeps: a sweep of 50,000 requests a
/// second, at about 640 bytes a line.
const BATCH_KEPT: usize = 640 * 1024;

/// The access log: request ids, the sampling, the shards lines are formatted into, and the
/// writer thread's queue of chunks (docs/operations.md "Access log").
///
/// A line is formatted on the request path, into a buffer the request's thread owns in
/// effect (0.35 µs; `cargo bench --bench replay`); full buffers of about a hundred lines are
/// queued without waking anyone, and the writer thread takes them every 20 ms and writes
/// them, sorted into the order answered, in one call. `scripts/costoflog.py`, 12 paired
/// rounds on the 2-core bench machine, when each chunk was written as it came: +1.37 µs
/// (+7.8%) per shed request with every line written, 0.43 µs of it the writer thread; the
/// sort and the copy into one batch add about a line's copy and a share of a sort of a
/// thousand numbers on that thread. Waking the writer per chunk instead doubled the
/// writer's share and cost +4.3 µs.
#[derive(Debug)]
pub struct AccessLog {
    shards: Box<[Mutex<Shard>]>,
    /// Full chunks waiting for the writer, which takes them on its next sweep: a request
    /// never wakes it (a wake per chunk was a context switch per hundred requests).
    chunks: Mutex<Vec<Chunk>>,
    /// Lines handed to the writer and not yet written, and the most allowed.
    pending: Arc<AtomicU64>,
    limit: u64,
    sampling: Sampling,
    next_id: AtomicU64,
    counts: Arc<Counts>,
}

/// One shard: its formatter (its time and peer text kept) and the lines formatted so far.
#[derive(Debug)]
struct Shard {
    formatter: Formatter,
    buf: Vec<u8>,
    /// Each line's number (the order it was answered in) and where it ends in `buf`.
    ends: Vec<(u64, usize)>,
}

/// Formatted lines on their way to the writer: each line's number and where it ends.
#[derive(Debug)]
struct Chunk {
    bytes: Vec<u8>,
    ends: Vec<(u64, usize)>,
}

impl Chunk {
    fn lines(&self) -> u64 {
        self.ends.len() as u64
    }
}

/// What the writer thread and the request path count, for the metrics and for a drained
/// shutdown.
#[derive(Debug)]
struct Counts {
    /// Lines formatted; a line's number is the count before it.
    submitted: AtomicU64,
    /// Written, or dropped.
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
        config: &LogConfig,
        metrics: &Metrics,
        signals: &Signals,
    ) -> Result<Arc<Self>, OpenError> {
        let counts = Arc::new(Counts {
            submitted: AtomicU64::new(0),
            done: AtomicU64::new(0),
            written: metrics.access_log_lines.clone(),
            behind: metrics.access_log_dropped[0].clone(),
            failed: metrics.access_log_dropped[1].clone(),
        });
        let log = Arc::new(AccessLog {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        formatter: Formatter::new(config.format.clone()),
                        buf: Vec::new(),
                        ends: Vec::new(),
                    })
                })
                .collect(),
            chunks: Mutex::new(Vec::new()),
            pending: Arc::new(AtomicU64::new(0)),
            limit: config.queue.max(1) as u64,
            sampling: config.sampling,
            next_id: AtomicU64::new(u64::from(fastrand::u32(..)) << 32),
            counts,
        });
        let (opened_tx, opened_rx) = std::sync::mpsc::channel();
        let thread = Writer {
            log: Arc::downgrade(&log),
            target: config.target.clone(),
            signals: signals.clone(),
            counts: Arc::clone(&log.counts),
            pending: Arc::clone(&log.pending),
        };
        let spawned = std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || thread.run(&opened_tx));
        let path = match &config.target {
            Target::Stdout => "-".to_owned(),
            Target::File(p) => p.display().to_string(),
            Target::Sink(_) => "(sink)".to_owned(),
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
        Ok(log)
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

    /// Formats `entry`'s line into this thread's shard; a full shard goes to the writer.
    /// Never blocks on the writer: with `--access-log-queue` lines already waiting, a chunk is
    /// dropped and its lines counted (`shedgate_access_log_dropped_total{reason="behind"}`).
    pub fn submit(&self, entry: &Entry) {
        thread_local! {
            static SHARD: usize = {
                static NEXT: AtomicUsize = AtomicUsize::new(0);
                NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS
            };
        }
        let i = SHARD.with(|i| *i);
        let mut shard = self.shards[i].lock().unwrap_or_else(|p| p.into_inner());
        let shard = &mut *shard;
        // Numbered under the shard's lock: a sweep, which holds every shard's lock at once,
        // sees every line numbered before it whole (module docs).
        let number = self.counts.submitted.fetch_add(1, Ordering::Relaxed);
        if shard.buf.capacity() == 0 {
            shard.buf.reserve(CHUNK + 4096);
        }
        shard.formatter.write(entry, &mut shard.buf);
        shard.ends.push((number, shard.buf.len()));
        if shard.buf.len() >= CHUNK {
            let chunk = take(shard);
            self.hand_over(chunk);
        }
    }

    /// Queues a chunk for the writer, or drops and counts it when too many lines wait. A
    /// chunk is always taken when nothing waits, so a queue smaller than a chunk still writes.
    fn hand_over(&self, chunk: Chunk) {
        if !self.admit(chunk.lines()) {
            return;
        }
        self.chunks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(chunk);
    }

    /// What the writer writes next (every [`SWEEP`]): the queued chunks and what every
    /// shard holds, taken with every shard's lock held at once, so that every line numbered
    /// before the sweep is in it and none numbered after. Only buffers are swapped while the
    /// locks are held (a shard's next line allocates its buffer); the queue's limit applies
    /// after, to these chunks only, never by queueing them behind newer ones.
    fn sweep(&self) -> Vec<Chunk> {
        let (held, mut chunks) = {
            let mut shards: Vec<_> = self
                .shards
                .iter()
                .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()))
                .collect();
            let held: Vec<Chunk> = shards
                .iter_mut()
                .filter(|shard| !shard.ends.is_empty())
                .map(|shard| Chunk {
                    bytes: std::mem::take(&mut shard.buf),
                    ends: std::mem::take(&mut shard.ends),
                })
                .collect();
            let queued =
                std::mem::take(&mut *self.chunks.lock().unwrap_or_else(|p| p.into_inner()));
            (held, queued)
        };
        for chunk in held {
            if self.admit(chunk.lines()) {
                chunks.push(chunk);
            }
        }
        chunks
    }

    /// Counts `lines` as waiting for the writer, or drops and counts them when too many wait
    /// already (never when none waits, so a queue smaller than a chunk still writes).
    fn admit(&self, lines: u64) -> bool {
        let waiting = self.pending.fetch_add(lines, Ordering::AcqRel);
        if waiting > 0 && waiting + lines > self.limit {
            self.pending.fetch_sub(lines, Ordering::AcqRel);
            self.counts.drop_behind(lines);
            return false;
        }
        true
    }

    /// Waits up to `limit` for every line submitted to be written (shutdown).
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

fn take(shard: &mut Shard) -> Chunk {
    let lines = shard.ends.len();
    Chunk {
        bytes: std::mem::replace(&mut shard.buf, Vec::with_capacity(CHUNK + 4096)),
        ends: std::mem::replace(&mut shard.ends, Vec::with_capacity(lines.max(64))),
    }
}

/// The lines of `chunks` in the order they were numbered, into `batch` (cleared first);
/// `index` is scratch. Returns how many.
fn order(
    chunks: &[Chunk],
    index: &mut Vec<(u64, usize, usize, usize)>,
    batch: &mut Vec<u8>,
) -> u64 {
    index.clear();
    for (c, chunk) in chunks.iter().enumerate() {
        let mut start = 0;
        for &(number, end) in &chunk.ends {
            index.push((number, c, start, end));
            start = end;
        }
    }
    index.sort_unstable_by_key(|&(number, ..)| number);
    batch.clear();
    for &(_, c, start, end) in index.iter() {
        batch.extend_from_slice(&chunks[c].bytes[start..end]);
    }
    index.len() as u64
}

impl Counts {
    fn drop_behind(&self, lines: u64) {
        self.behind.increment(lines);
        self.done.fetch_add(lines, Ordering::Release);
    }
}

/// The writer thread.
struct Writer {
    /// The log, to sweep its shards (weak: the thread ends when the log is dropped).
    log: std::sync::Weak<AccessLog>,
    target: Target,
    signals: Signals,
    counts: Arc<Counts>,
    pending: Arc<AtomicU64>,
}

impl Writer {
    fn run(self, opened: &std::sync::mpsc::Sender<std::io::Result<()>>) {
        let mut reopens = self.signals.reopens();
        let mut out = match self.open() {
            Ok(sink) => {
                let _ = opened.send(Ok(()));
                Out::new(sink)
            }
            Err(e) => {
                let _ = opened.send(Err(e));
                return;
            }
        };
        let mut failing = false;
        let (mut index, mut batch) = (Vec::new(), Vec::new());
        loop {
            // Sleeps a sweep whatever the load: the writer wakes 50 times a second, not once
            // per chunk.
            std::thread::sleep(SWEEP);
            let chunks = {
                let Some(log) = self.log.upgrade() else {
                    self.counts.failed.increment(out.abandon());
                    return;
                };
                log.sweep()
            };
            // The reopen after the chunks are taken, before they are written: a line of a
            // request that came after SIGUSR1 is in these chunks or later ones, and goes to
            // the new file.
            let seen = self.signals.reopens();
            if seen != reopens {
                reopens = seen;
                match self.open() {
                    Ok(new) => {
                        self.counts.failed.increment(out.abandon());
                        out = Out::new(new);
                        tracing::info!("access log reopened on SIGUSR1");
                    }
                    Err(e) => tracing::error!(
                        error = %e,
                        "access log not reopened on SIGUSR1; still writing to the open file"
                    ),
                }
            }
            if chunks.is_empty() && !out.torn() {
                continue;
            }
            let lines = order(&chunks, &mut index, &mut batch);
            drop(chunks);
            self.write(&mut out, &batch, lines, &mut failing);
            // What a burst grew is given back; a sweep's worth at 50,000 requests a second
            // is kept.
            batch.clear();
            batch.shrink_to(BATCH_KEPT);
            index.clear();
            index.shrink_to(BATCH_KEPT / 640);
        }
    }

    /// Writes a batch and counts its lines, written or dropped; logs the first failure of a
    /// run of them, and the write that ends it.
    fn write(&self, out: &mut Out, batch: &[u8], lines: u64, failing: &mut bool) {
        let wrote = out.write(batch, lines);
        self.counts.written.increment(wrote.written);
        self.counts.failed.increment(wrote.failed);
        match &wrote.error {
            None if *failing => {
                *failing = false;
                tracing::info!("access log writes resumed");
            }
            None => {}
            Some(e) if !*failing => {
                *failing = true;
                tracing::error!(
                    error = %e,
                    lines_written = wrote.written,
                    "access log write failed: no torn line is left (a file is cut back to its \
                     last whole line; elsewhere the line is completed first on the next write); \
                     lines dropped and counted \
                     (shedgate_access_log_dropped_total{{reason=\"write_error\"}}) \
                     until a write succeeds"
                );
            }
            Some(_) => {}
        }
        self.pending.fetch_sub(lines, Ordering::AcqRel);
        self.counts.done.fetch_add(lines, Ordering::Release);
    }

    fn open(&self) -> std::io::Result<Box<dyn Sink>> {
        match &self.target {
            Target::Stdout => Ok(Box::new(super::sink::Stdout::open()?)),
            Target::File(path) => {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?;
                Ok(Box::new(file))
            }
            Target::Sink(open) => (open.0)(),
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
