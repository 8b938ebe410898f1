//! An upstream simulator and a closed-loop scenario runner (the controller's
//! closed-loop evidence, docs/pressure.md "Pressure").
//!
//! [`Simulator`] is an upstream of fixed capacity: `workers` requests served at a time, each
//! for a service time drawn from a [`ServiceTime`] distribution, the rest waiting in a FIFO
//! queue, with optional [`Phase`]s that slow it down or make it fail. It runs in-process
//! ([`Simulator::serve`], deterministic under paused tokio time) and as a real loopback HTTP
//! server ([`Simulator::serve_http`], for the demo and benchmarks).
//!
//! [`run_scenario`] drives the real decision ([`crate::admission::decide`]) and the real
//! controller ([`crate::pressure::PressureGauge`]) against a simulator, with seeded Poisson
//! arrivals of events from real geography, and reports per-second figures.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::time::Instant;

mod figures;
pub mod fleet;
mod scenario;

pub use figures::{Figures, recovery_seconds};
pub use scenario::{
    BANDS, MIX, Replicas, Scenario, Second, SimEvent, Spread, band, geographic_events,
    run_scenario, run_scenario_phased,
};

/// A service-time distribution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ServiceTime {
    /// Always this long.
    Fixed(Duration),
    /// Uniform in `[min, max]`.
    Uniform {
        /// Shortest.
        min: Duration,
        /// Longest.
        max: Duration,
    },
    /// Exponential with this mean (memoryless; heavy tail of queueing).
    Exponential {
        /// Mean.
        mean: Duration,
    },
}

impl ServiceTime {
    /// The mean service time.
    pub fn mean(&self) -> Duration {
        match *self {
            ServiceTime::Fixed(d) => d,
            ServiceTime::Uniform { min, max } => (min + max) / 2,
            ServiceTime::Exponential { mean } => mean,
        }
    }

    fn sample(&self, u: f64) -> Duration {
        match *self {
            ServiceTime::Fixed(d) => d,
            ServiceTime::Uniform { min, max } => min + (max - min).mul_f64(u),
            ServiceTime::Exponential { mean } => mean.mul_f64(-(1.0 - u).max(1e-12).ln()),
        }
    }
}

/// From `from` (time since the simulator started) on, service times are multiplied by
/// `slowdown` and a share `fail_rate` (0.0–1.0) of requests fail fast.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    /// Start, since the simulator started.
    pub from: Duration,
    /// Service-time multiplier (2.0 = half speed).
    pub slowdown: f64,
    /// Share of requests that fail (answered 500 at once).
    pub fail_rate: f64,
}

impl Phase {
    /// An upstream that gets `slowdown` times slower from `from` over `ramp`, in 20 equal
    /// steps (a deploy rolling over 20 pods, or a slowdown that builds up): 20 phases in time
    /// order, the last at `from + ramp`, none failing.
    pub fn gradual(from: Duration, ramp: Duration, slowdown: f64) -> Vec<Phase> {
        (1..=20_u32)
            .map(|k| Phase {
                from: from + ramp * k / 20,
                slowdown: 1.0 + (slowdown - 1.0) * f64::from(k) / 20.0,
                fail_rate: 0.0,
            })
            .collect()
    }

    /// An upstream `slowdown` times slower from `from` until `until` (a hang, with a large
    /// factor), itself before and after: two phases, none failing.
    pub fn between(from: Duration, until: Duration, slowdown: f64) -> Vec<Phase> {
        vec![
            Phase {
                from,
                slowdown,
                fail_rate: 0.0,
            },
            Phase {
                from: until,
                slowdown: 1.0,
                fail_rate: 0.0,
            },
        ]
    }
}

/// The upstream failed the request (a failure phase).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("simulated upstream failure")]
pub struct Failed;

/// From `from` (time since the simulator started) on, the upstream runs `workers` workers: an
/// autoscaler added or removed pods. A removed worker finishes what it already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scale {
    /// Start, since the simulator started.
    pub from: Duration,
    /// Workers from then on (at least 1).
    pub workers: u32,
}

/// An upstream of known capacity: `workers` at a time, changed by [`Scale`] steps.
#[derive(Debug)]
pub struct Simulator {
    /// When each worker is next free: the queue is kept in virtual time, so that the
    /// timer's millisecond rounding delays a response's wake-up but never the next
    /// request's start (a `sleep(20 ms)` per request measured 5% under the nominal
    /// capacity over loopback).
    free_at: Mutex<Vec<Instant>>,
    worker_count: u32,
    service: ServiceTime,
    phases: Vec<Phase>,
    scale: Vec<Scale>,
    started: Instant,
    rng: Mutex<fastrand::Rng>,
    served: std::sync::atomic::AtomicU64,
    /// When each request taken and not yet answered will be: its in-flight count, for the
    /// load report ([`Simulator::utilisation`]), whether or not its caller still waits.
    pending: Mutex<std::collections::BinaryHeap<std::cmp::Reverse<Instant>>>,
}

impl Simulator {
    /// `workers` at a time (at least 1), service times from `service`, `phases` in start
    /// order, random draws from `seed`.
    pub fn new(workers: u32, service: ServiceTime, phases: Vec<Phase>, seed: u64) -> Arc<Self> {
        Self::scaled(workers, service, phases, Vec::new(), seed)
    }

    /// As [`Simulator::new`], with the worker count changed by `scale` steps (in start
    /// order) during the run.
    pub fn scaled(
        workers: u32,
        service: ServiceTime,
        phases: Vec<Phase>,
        scale: Vec<Scale>,
        seed: u64,
    ) -> Arc<Self> {
        let workers = workers.max(1);
        let most = scale.iter().map(|s| s.workers).fold(workers, u32::max);
        Arc::new(Simulator {
            free_at: Mutex::new(vec![Instant::now(); most as usize]),
            worker_count: workers,
            service,
            phases,
            scale,
            started: Instant::now(),
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            served: std::sync::atomic::AtomicU64::new(0),
            pending: Mutex::new(std::collections::BinaryHeap::new()),
        })
    }

    /// Requests per second it completes when always busy, before any slowdown or scaling
    /// step (the reference scenarios express offered load in).
    pub fn capacity(&self) -> f64 {
        f64::from(self.worker_count) / self.service.mean().as_secs_f64()
    }

    /// Its worker count at the start.
    pub fn workers(&self) -> u32 {
        self.worker_count
    }

    fn workers_at(&self, at: Instant) -> u32 {
        let t = at.saturating_duration_since(self.started);
        self.scale
            .iter()
            .rev()
            .find(|s| s.from <= t)
            .map_or(self.worker_count, |s| s.workers.max(1))
    }

    fn phase_at(&self, at: Instant) -> Phase {
        let t = at.saturating_duration_since(self.started);
        self.phases
            .iter()
            .rev()
            .find(|p| p.from <= t)
            .copied()
            .unwrap_or(Phase {
                from: Duration::ZERO,
                slowdown: 1.0,
                fail_rate: 0.0,
            })
    }

    /// Serves one request: FIFO, by the worker (of those running at its arrival) that is free first, for a service time at the
    /// speed of the phase its service starts in; the request completes when that worker has
    /// served everything queued before it. A request whose caller gives up (drops this
    /// future) keeps its place: an upstream does not learn that a client went away.
    ///
    /// # Errors
    /// [`Failed`] at once, in a failure phase (by arrival time), for its share of requests.
    pub async fn serve(&self) -> Result<(), Failed> {
        self.serve_for(None).await
    }

    /// [`Simulator::serve`] for a request whose work is `service` at full speed (`None`: a
    /// draw from the simulator's distribution): streams whose requests cost different work
    /// (a position stored in 10 ms, a geofence transition evaluated in 200 ms).
    ///
    /// # Errors
    /// As [`Simulator::serve`].
    pub async fn serve_for(&self, service: Option<Duration>) -> Result<(), Failed> {
        let now = Instant::now();
        let (u, fail) = {
            let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            (rng.f64(), rng.f64())
        };
        if fail < self.phase_at(now).fail_rate {
            return Err(Failed);
        }
        let workers = self.workers_at(now) as usize;
        let done = {
            let mut free_at = self.free_at.lock().unwrap_or_else(|p| p.into_inner());
            let Some(first) = free_at.iter_mut().take(workers).min() else {
                return Err(Failed);
            };
            let start = (*first).max(now);
            let slowdown = self.phase_at(start).slowdown.max(0.0);
            let work = service.unwrap_or_else(|| self.service.sample(u));
            *first = start + work.mul_f64(slowdown);
            *first
        };
        self.pending_at(now).push(std::cmp::Reverse(done));
        tokio::time::sleep_until(done).await;
        self.served
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// The load report it would send now: requests taken and not yet answered over the
    /// workers running (ORCA's `application_utilization` as `crate::upstream::load_report`
    /// reads it): 1.0 with every worker busy and none waiting.
    pub fn utilisation(&self) -> f64 {
        let now = Instant::now();
        #[expect(clippy::cast_precision_loss, reason = "a count below 2^52")]
        let n = self.pending_at(now).len() as f64;
        n / f64::from(self.workers_at(now))
    }

    /// The requests taken and not yet answered at `now` (those answered by then dropped),
    /// locked.
    fn pending_at(
        &self,
        now: Instant,
    ) -> std::sync::MutexGuard<'_, std::collections::BinaryHeap<std::cmp::Reverse<Instant>>> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        while pending.peek().is_some_and(|r| r.0 <= now) {
            pending.pop();
        }
        pending
    }

    /// Requests served so far.
    pub fn served(&self) -> u64 {
        self.served.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Serves HTTP on an ephemeral loopback port: 204 when served, 500 on a failure.
    ///
    /// # Errors
    /// When the port cannot be bound.
    pub async fn serve_http(
        self: Arc<Self>,
    ) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        self.serve_http_with(false).await
    }

    /// [`Simulator::serve_http`], each 204 carrying a load report if `load_reports`:
    /// `endpoint-load-metrics: TEXT application_utilization=U` with U its
    /// [`Simulator::utilisation`] then (ORCA's text form, `crate::upstream::load_report`).
    ///
    /// # Errors
    /// When the port cannot be bound.
    pub async fn serve_http_with(
        self: Arc<Self>,
        load_reports: bool,
    ) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let sim = Arc::clone(&self);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let sim = Arc::clone(&sim);
                        async move {
                            let _ = req.into_body().collect().await;
                            let status = match sim.serve().await {
                                Ok(()) => StatusCode::NO_CONTENT,
                                Err(Failed) => StatusCode::INTERNAL_SERVER_ERROR,
                            };
                            let mut r = Response::new(Empty::<Bytes>::new());
                            *r.status_mut() = status;
                            if load_reports && status == StatusCode::NO_CONTENT {
                                let report = format!(
                                    "TEXT application_utilization={:.3}",
                                    sim.utilisation()
                                );
                                if let Ok(value) = http::HeaderValue::from_str(&report) {
                                    r.headers_mut()
                                        .insert(crate::upstream::load_report::HEADER, value);
                                }
                            }
                            Ok::<_, std::convert::Infallible>(r)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok((addr, task))
    }
}
