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

use crate::admission::{Load, Verdict, decide};
use crate::clock::UnixMillis;
use crate::extract::{Coordinates, EventTime, Facts};
use crate::policy::{Policy, Rank, StreamId, Supersession};
use crate::pressure::{ControllerConfig, PressureGauge, TICK};

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

/// The upstream failed the request (a failure phase).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("simulated upstream failure")]
pub struct Failed;

/// An upstream of fixed capacity.
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
    started: Instant,
    rng: Mutex<fastrand::Rng>,
    served: std::sync::atomic::AtomicU64,
}

impl Simulator {
    /// `workers` at a time (at least 1), service times from `service`, `phases` in start
    /// order, random draws from `seed`.
    pub fn new(workers: u32, service: ServiceTime, phases: Vec<Phase>, seed: u64) -> Arc<Self> {
        let workers = workers.max(1);
        Arc::new(Simulator {
            free_at: Mutex::new(vec![Instant::now(); workers as usize]),
            worker_count: workers,
            service,
            phases,
            started: Instant::now(),
            rng: Mutex::new(fastrand::Rng::with_seed(seed)),
            served: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Requests per second it completes when always busy, before any slowdown.
    pub fn capacity(&self) -> f64 {
        f64::from(self.worker_count) / self.service.mean().as_secs_f64()
    }

    /// Its worker count.
    pub fn workers(&self) -> u32 {
        self.worker_count
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

    /// Serves one request: FIFO, by the worker that is free first, for a service time at the
    /// speed of the phase its service starts in; the request completes when that worker has
    /// served everything queued before it. A request whose caller gives up (drops this
    /// future) keeps its place: an upstream does not learn that a client went away.
    ///
    /// # Errors
    /// [`Failed`] at once, in a failure phase (by arrival time), for its share of requests.
    pub async fn serve(&self) -> Result<(), Failed> {
        let now = Instant::now();
        let (u, fail) = {
            let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            (rng.f64(), rng.f64())
        };
        if fail < self.phase_at(now).fail_rate {
            return Err(Failed);
        }
        let done = {
            let mut free_at = self.free_at.lock().unwrap_or_else(|p| p.into_inner());
            let Some(first) = free_at.iter_mut().min() else {
                return Err(Failed);
            };
            let start = (*first).max(now);
            let slowdown = self.phase_at(start).slowdown.max(0.0);
            *first = start + self.service.sample(u).mul_f64(slowdown);
            *first
        };
        tokio::time::sleep_until(done).await;
        self.served
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
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

/// One event of a scenario's traffic.
#[derive(Debug, Clone)]
pub struct SimEvent {
    /// Its stream in the policy (`None`: unknown).
    pub stream: Option<StreamId>,
    /// Whether the stream is `never`-shed.
    pub never: bool,
    /// Position, degrees.
    pub lat: f64,
    /// Position, degrees.
    pub lon: f64,
    /// Its rank under the policy.
    pub rank: Rank,
}

/// Rank bands a report splits sheds by: priority (1–10), important (11–30), default (31–50),
/// low (51–100).
pub const BANDS: [(u8, u8); 4] = [(1, 10), (11, 30), (31, 50), (51, 100)];

/// The index in [`BANDS`] of the band `rank` falls in.
pub fn band(rank: Rank) -> usize {
    BANDS
        .iter()
        .position(|(lo, hi)| (*lo..=*hi).contains(&rank.get()))
        .unwrap_or(3)
}

/// Counts of one second of a scenario.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Second {
    /// Requests offered.
    pub offered: u64,
    /// Admitted to the upstream.
    pub admitted: u64,
    /// Completed by the upstream within the timeout, by the second they completed in.
    pub goodput: u64,
    /// Timed out or failed after admission.
    pub failed: u64,
    /// Sheddable events offered, per band.
    pub offered_by_band: [u64; 4],
    /// Sheddable events shed, per band.
    pub shed_by_band: [u64; 4],
    /// Never-shed events offered.
    pub never_offered: u64,
    /// Never-shed events completed.
    pub never_delivered: u64,
    /// Never-shed events admitted that the upstream failed or that timed out.
    pub never_failed: u64,
    /// Highest pressure seen in the second.
    pub max_pressure: f64,
    /// Pressure at the end of the second.
    pub end_pressure: f64,
    /// Latencies of admitted requests that completed, milliseconds.
    pub latencies_ms: Vec<f64>,
}

/// A scenario: load phases (duration, offered load as a multiple of capacity) against a
/// simulator, with the controller and the policy.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// `(duration, offered load / capacity)`, in order.
    pub load: Vec<(Duration, f64)>,
    /// The controller's settings.
    pub controller: ControllerConfig,
    /// The proxy's upstream timeout.
    pub timeout: Duration,
    /// Random seed of arrivals and draws.
    pub seed: u64,
}

/// Runs a scenario in-process: Poisson arrivals at the phase's rate, each decided by the real
/// rule at the current pressure, admitted ones served by the simulator under the timeout,
/// the controller ticked every [`TICK`]. Deterministic under paused tokio time.
pub async fn run_scenario(
    scenario: &Scenario,
    sim: &Arc<Simulator>,
    policy: &Arc<Policy>,
    events: &[SimEvent],
) -> Vec<Second> {
    let gauge = Arc::new(PressureGauge::new(scenario.controller));
    let total: Duration = scenario.load.iter().map(|(d, _)| *d).sum();
    let seconds = usize::try_from(total.as_secs()).unwrap_or(0) + 2;
    let report = Arc::new(Mutex::new(vec![Second::default(); seconds]));
    let start = Instant::now();
    let second_of = move |t: Instant| {
        usize::try_from(t.saturating_duration_since(start).as_secs()).unwrap_or(usize::MAX)
    };
    // The controller's tick, and a per-second pressure record.
    let ticker = {
        let (gauge, report) = (Arc::clone(&gauge), Arc::clone(&report));
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(TICK);
            loop {
                interval.tick().await;
                let now = Instant::now();
                let p = gauge.tick(now);
                let mut r = report.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(s) = r.get_mut(second_of(now)) {
                    s.max_pressure = s.max_pressure.max(p);
                    s.end_pressure = p;
                }
            }
        })
    };
    let mut rng = fastrand::Rng::with_seed(scenario.seed);
    let mut tasks = Vec::new();
    let wall = UnixMillis(1_780_000_000_000);
    let mut phase_start = Instant::now();
    for &(duration, factor) in &scenario.load {
        let rate = sim.capacity() * factor;
        let end = phase_start + duration;
        let mut at = phase_start;
        loop {
            at += Duration::from_secs_f64(-(1.0 - rng.f64()).max(1e-12).ln() / rate.max(1e-9));
            if at >= end {
                break;
            }
            tokio::time::sleep_until(at).await;
            let event = events[rng.usize(..events.len())].clone();
            let draw = rng.f64();
            let now_wall =
                UnixMillis(wall.0 + i64::try_from(start.elapsed().as_millis()).unwrap_or(0));
            let facts = Facts {
                body: crate::extract::BodyState::Json,
                coordinates: Coordinates::Valid {
                    lat: event.lat,
                    lon: event.lon,
                },
                time: EventTime::At(UnixMillis(now_wall.0 - 200)),
                ambiguous: false,
            };
            let load = Load {
                class_inflight: [0; 3],
                total: gauge.inflight(),
                capacity: scenario.controller.max_inflight.get(),
            };
            let decision = decide(
                policy,
                event.stream,
                &facts,
                now_wall,
                gauge.admission_pressure(),
                draw,
                &load,
            );
            let sec = second_of(Instant::now());
            let admitted = !matches!(decision.verdict, Verdict::Shed(_));
            {
                let mut r = report.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(s) = r.get_mut(sec) {
                    s.offered += 1;
                    if event.never {
                        s.never_offered += 1;
                    } else {
                        s.offered_by_band[band(event.rank)] += 1;
                        if !admitted {
                            s.shed_by_band[band(event.rank)] += 1;
                        }
                    }
                    if admitted {
                        s.admitted += 1;
                    }
                }
            }
            if !admitted {
                continue;
            }
            let (gauge, sim, report) = (Arc::clone(&gauge), Arc::clone(sim), Arc::clone(&report));
            let timeout = scenario.timeout;
            tasks.push(tokio::spawn(async move {
                let _inflight = gauge.start();
                let began = Instant::now();
                let outcome = tokio::time::timeout(timeout, sim.serve()).await;
                let done = Instant::now();
                let mut r = report.lock().unwrap_or_else(|e| e.into_inner());
                let Some(s) = r.get_mut(second_of(done)) else {
                    return;
                };
                match outcome {
                    Ok(Ok(())) => {
                        let latency = done - began;
                        gauge.record_latency(latency);
                        s.goodput += 1;
                        s.latencies_ms.push(latency.as_secs_f64() * 1e3);
                        if event.never {
                            s.never_delivered += 1;
                        }
                    }
                    Ok(Err(Failed)) => {
                        // Not a latency sample (the middleware skips upstream 5xx alike).
                        s.failed += 1;
                        s.never_failed += u64::from(event.never);
                    }
                    Err(_) => {
                        // A timeout is overload, not a fast sample.
                        gauge.record_latency(timeout);
                        s.failed += 1;
                        s.never_failed += u64::from(event.never);
                    }
                }
            }));
        }
        phase_start = end;
    }
    tokio::time::sleep_until(phase_start + Duration::from_secs(1)).await;
    for t in tasks {
        let _ = t.await;
    }
    ticker.abort();
    let r = report.lock().unwrap_or_else(|e| e.into_inner());
    r.clone()
}

/// The stream mix of the scenario tests and the overload benchmark: 95% sheddable, so at 10x
/// the never-shed share alone is half the upstream's capacity.
pub const MIX: &[(&str, f64)] = &[
    ("vehicle.position", 0.75),
    ("sensor.reading", 0.15),
    ("tile.render", 0.05),
    ("geofence.transition", 0.03),
    ("dlq.replay", 0.02),
];

/// Events from real geography: cities weighted by population and rural places (the demo's
/// data), with the given stream mix `(stream name, share)`, ranked by `policy`.
pub fn geographic_events(
    policy: &Policy,
    mix: &[(&str, f64)],
    n: usize,
    seed: u64,
) -> Vec<SimEvent> {
    let geography = crate::demo::geography::Geography::embedded();
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..n)
        .map(|_| {
            let stream = crate::demo::geography::pick_stream(&mut rng, mix);
            let (place, _) = geography.pick(&mut rng, 0.25);
            let id = policy.stream(stream);
            let never =
                id.is_none_or(|id| policy.stream_policy(id).supersession == Supersession::Never);
            let (_, rank) = policy.area_at(place.lat, place.lon);
            SimEvent {
                stream: id,
                never,
                lat: place.lat,
                lon: place.lon,
                rank,
            }
        })
        .collect()
}

/// A scenario's figures over a window of its seconds (the controller's targets in docs/pressure.md, measured).
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    /// Completed requests per second over the window, as a share of capacity (0.0–1.0+).
    pub goodput: f64,
    /// Median latency of admitted requests that completed, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile of the same, milliseconds.
    pub p99_ms: f64,
    /// Coefficient of variation of the per-second admitted count (0.0 = flat).
    pub cv: f64,
    /// Shed share of sheddable events per rank band ([`BANDS`]), 0.0–1.0.
    pub shed_by_band: [f64; 4],
    /// Shed share of all sheddable events, 0.0–1.0.
    pub shed: f64,
    /// Never-shed events completed over offered, whole run, 0.0–1.0.
    pub never_delivered: f64,
}

impl Figures {
    /// Figures of `seconds[window]` against an upstream of `capacity` requests per second.
    #[expect(
        clippy::cast_precision_loss,
        reason = "second counts and request counts of a run stay far below 2^52"
    )]
    pub fn of(seconds: &[Second], window: std::ops::Range<usize>, capacity: f64) -> Figures {
        let w = &seconds[window];
        let n = w.len().max(1) as f64;
        let goodput = w.iter().map(|s| s.goodput as f64).sum::<f64>() / n / capacity;
        let admitted: Vec<f64> = w.iter().map(|s| s.admitted as f64).collect();
        let mean = admitted.iter().sum::<f64>() / n;
        let var = admitted.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / n;
        let mut lat: Vec<f64> = w
            .iter()
            .flat_map(|s| s.latencies_ms.iter().copied())
            .collect();
        lat.sort_by(f64::total_cmp);
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a quantile index in [0, len - 1]"
        )]
        let pct = |q: f64| {
            lat.get(((lat.len().saturating_sub(1)) as f64 * q) as usize)
                .copied()
                .unwrap_or(f64::NAN)
        };
        let share = |shed: u64, of: u64| {
            if of == 0 {
                0.0
            } else {
                shed as f64 / of as f64
            }
        };
        let mut shed_by_band = [0.0; 4];
        for (b, out) in shed_by_band.iter_mut().enumerate() {
            let (shed, of) = w.iter().fold((0, 0), |(s, o), x| {
                (s + x.shed_by_band[b], o + x.offered_by_band[b])
            });
            *out = share(shed, of);
        }
        let (shed, of) = w.iter().fold((0, 0), |(s, o), x| {
            (
                s + x.shed_by_band.iter().sum::<u64>(),
                o + x.offered_by_band.iter().sum::<u64>(),
            )
        });
        let (delivered, offered) = seconds.iter().fold((0, 0), |(d, o), x| {
            (d + x.never_delivered, o + x.never_offered)
        });
        Figures {
            goodput,
            p50_ms: pct(0.5),
            p99_ms: pct(0.99),
            cv: if mean > 0.0 { var.sqrt() / mean } else { 0.0 },
            shed_by_band,
            shed: share(shed, of),
            never_delivered: if offered == 0 {
                1.0
            } else {
                share(delivered, offered)
            },
        }
    }
}

impl std::fmt::Display for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "goodput {:.1}% p50 {:.1} ms p99 {:.1} ms cv {:.3} shed {:.1}% by band {:.1?} never {:.1}%",
            self.goodput * 100.0,
            self.p50_ms,
            self.p99_ms,
            self.cv,
            self.shed * 100.0,
            self.shed_by_band.map(|s| s * 100.0),
            self.never_delivered * 100.0
        )
    }
}
