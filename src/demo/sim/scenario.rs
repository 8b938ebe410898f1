//! A scenario: seeded arrivals of events from real geography, each decided by the real rule
//! at the current pressure, against a simulated upstream; per-second counts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{Failed, Simulator};

use crate::admission::{Load, Verdict, decide};
use crate::clock::UnixMillis;
use crate::extract::{Coordinates, EventTime, Facts};
use crate::policy::{Policy, Rank, StreamId, Supersession};
use crate::pressure::{ControllerConfig, PressureGauge, TICK};

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
    /// The upstream's work for it at full speed (`None`: the simulator's distribution).
    pub service: Option<Duration>,
    /// The device that sends it (`None`: none named).
    pub device: Option<u32>,
}

pub use crate::policy::curve::{BANDS, band};

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
    /// Fixes of devices admitted in this second: `(device, seconds since the start)`.
    pub admitted_fixes: Vec<(u32, f64)>,
}

/// How arrivals are spread over the replicas in service at the moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// In turn (a Kubernetes Service with IPVS round robin, an L7 balancer).
    RoundRobin,
    /// Uniformly at random (kube-proxy's iptables mode picks a backend at random).
    Random,
    /// By device: every fix of one device to one replica (a balancer hashing on the device,
    /// nginx `hash $arg_id consistent`), the rest in turn.
    ByDevice,
}

impl Spread {
    /// The replica, of `n` (at least 1), that the next request goes to: in turn, the one after
    /// the last (`turn` counts the requests sent so far and is advanced), or one drawn
    /// uniformly from `rng`.
    pub fn pick(self, turn: &mut usize, n: usize, rng: &mut fastrand::Rng) -> usize {
        self.pick_for(None, turn, n, rng)
    }

    /// [`Spread::pick`] for a request of `device`: [`Spread::ByDevice`] sends a device to
    /// the replica its number hashes to (a multiplicative hash, as a consistent hash spreads
    /// keys evenly).
    pub fn pick_for(
        self,
        device: Option<u32>,
        turn: &mut usize,
        n: usize,
        rng: &mut fastrand::Rng,
    ) -> usize {
        match (self, device) {
            (Spread::ByDevice, Some(d)) => {
                let h = u64::from(d).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
                usize::try_from(h).unwrap_or(0) % n
            }
            (Spread::Random, _) => rng.usize(..n),
            (Spread::RoundRobin | Spread::ByDevice, _) => {
                *turn = turn.wrapping_add(1);
                *turn % n
            }
        }
    }
}

/// The proxy replicas in service: `(from, count)` steps in start order, from the scenario's
/// start. A replica taken out of service finishes what it holds (a lame duck); a replica put
/// in service starts cold, as a new pod does.
#[derive(Debug, Clone, PartialEq)]
pub struct Replicas {
    /// `(since the start, replicas in service from then on)`; the first step should be at 0
    /// (before it, one replica).
    pub steps: Vec<(Duration, usize)>,
    /// How arrivals are spread over them.
    pub spread: Spread,
}

impl Replicas {
    /// One replica throughout.
    pub fn one() -> Self {
        Replicas::fixed(1)
    }

    /// `n` replicas (at least 1) throughout, round robin.
    pub fn fixed(n: usize) -> Self {
        Replicas::steady(n, Spread::RoundRobin)
    }

    /// `n` replicas (at least 1) throughout, arrivals spread over them by `spread`.
    pub fn steady(n: usize, spread: Spread) -> Self {
        Replicas {
            steps: vec![(Duration::ZERO, n.max(1))],
            spread,
        }
    }

    fn at(&self, since: Duration) -> usize {
        self.steps
            .iter()
            .rev()
            .find(|(from, _)| *from <= since)
            .map_or(1, |(_, n)| (*n).max(1))
    }
}

/// A scenario: load phases (duration, offered load as a multiple of the simulator's initial
/// capacity) against a simulator, through one or more proxy replicas, each with its own
/// controller.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// `(duration, offered load / initial capacity)`, in order.
    pub load: Vec<(Duration, f64)>,
    /// Every replica's controller settings.
    pub controller: ControllerConfig,
    /// The proxy's upstream timeout.
    pub timeout: Duration,
    /// Random seed of arrivals and draws.
    pub seed: u64,
    /// The replicas in service over time.
    pub replicas: Replicas,
    /// Whether the upstream reports its utilisation with each answer (ORCA,
    /// [`Simulator::utilisation`]) and the replicas read it; `false` from [`Scenario::new`].
    pub load_reports: bool,
    /// Arrivals at set times instead of Poisson ones: `(since the start, index into the
    /// events)`, in time order (a fleet of devices reporting on their own schedules,
    /// [`super::fleet`]); the load phases then only set the run's length. `None` from
    /// [`Scenario::new`].
    pub schedule: Option<Arc<[(Duration, u32)]>>,
    /// Whether each replica keeps a device table and decides fixes of devices by it
    /// ([`crate::devices`]); `false`: every request an independent draw, as before devices
    /// were read. `true` from [`Scenario::new`] (events without a device are unaffected).
    pub devices: bool,
}

impl Scenario {
    /// The upstream timeout of the scenario tests and benchmarks: one second.
    pub const TIMEOUT: Duration = Duration::from_secs(1);

    /// A scenario of `load` phases as `(seconds, offered load / initial capacity)`, every
    /// replica's controller set to `controller`, with [`Scenario::TIMEOUT`].
    pub fn new(
        load: &[(u64, f64)],
        controller: ControllerConfig,
        replicas: Replicas,
        seed: u64,
    ) -> Self {
        Scenario {
            load: load
                .iter()
                .map(|&(secs, factor)| (Duration::from_secs(secs), factor))
                .collect(),
            controller,
            timeout: Self::TIMEOUT,
            seed,
            replicas,
            load_reports: false,
            schedule: None,
            devices: true,
        }
    }
}

/// The replicas of a run: every one ever started, the first `active` in service.
struct Fleet {
    gauges: Vec<Arc<PressureGauge>>,
    /// Each replica's device table.
    tables: Vec<Arc<crate::devices::DeviceTable>>,
    /// Each replica's freshness-floor budget (the policy's `max_silence` turns it on).
    floors: Vec<Arc<crate::upstream::FreshnessBudget>>,
    /// Each replica's pressure at its last tick (0 once out of service).
    last: Vec<f64>,
    active: usize,
}

/// Runs a scenario in-process: Poisson arrivals at the phase's rate, spread over the
/// replicas in service, each decided by the real rule at its replica's pressure, admitted
/// ones served by the simulator under the timeout, every replica's controller ticked every
/// [`TICK`] (each at its own phase). Deterministic under paused tokio time.
///
/// A second's `max_pressure` is the highest any replica saw in it, and its `end_pressure`
/// the highest of the replicas' last values in it.
pub async fn run_scenario(
    scenario: &Scenario,
    sim: &Arc<Simulator>,
    policy: &Arc<Policy>,
    events: &[SimEvent],
) -> Vec<Second> {
    let phases = vec![events; scenario.load.len()];
    run_scenario_phased(scenario, sim, policy, &phases).await
}

/// [`run_scenario`] with each load phase's arrivals drawn from its own events (`events[i]` for
/// `scenario.load[i]`): a stream mix that shifts between phases.
///
/// # Panics
/// When `events` has fewer entries than the scenario has phases, or one is empty.
pub async fn run_scenario_phased(
    scenario: &Scenario,
    sim: &Arc<Simulator>,
    policy: &Arc<Policy>,
    events: &[&[SimEvent]],
) -> Vec<Second> {
    let total: Duration = scenario.load.iter().map(|(d, _)| *d).sum();
    let seconds = usize::try_from(total.as_secs()).unwrap_or(0) + 2;
    let report = Arc::new(Mutex::new(vec![Second::default(); seconds]));
    let start = Instant::now();
    let second_of = move |t: Instant| {
        usize::try_from(t.saturating_duration_since(start).as_secs()).unwrap_or(usize::MAX)
    };
    let wall = UnixMillis(1_780_000_000_000);
    let fleet = Arc::new(Mutex::new(Fleet {
        gauges: Vec::new(),
        tables: Vec::new(),
        floors: Vec::new(),
        last: Vec::new(),
        active: 0,
    }));
    let mut tickers = Vec::new();
    // Puts `n` replicas in service: new ones start cold, with a ticker of their own whose
    // phase depends on their index (replicas do not tick in step).
    let scale_to = |n: usize, tickers: &mut Vec<tokio::task::JoinHandle<()>>| {
        let mut f = fleet.lock().unwrap_or_else(|e| e.into_inner());
        while f.gauges.len() < n {
            let index = f.gauges.len();
            let gauge = Arc::new(PressureGauge::new(scenario.controller));
            f.gauges.push(Arc::clone(&gauge));
            f.tables
                .push(Arc::new(crate::devices::DeviceTable::new(1 << 20, wall)));
            f.floors
                .push(Arc::new(crate::upstream::FreshnessBudget::default()));
            f.last.push(0.0);
            let (fleet, report) = (Arc::clone(&fleet), Arc::clone(&report));
            let offset = TICK / 10 * u32::try_from((index * 7) % 10).unwrap_or(0);
            tickers.push(tokio::spawn(async move {
                let mut interval = tokio::time::interval_at(Instant::now() + offset, TICK);
                loop {
                    interval.tick().await;
                    let now = Instant::now();
                    let p = gauge.tick(now);
                    let mut f = fleet.lock().unwrap_or_else(|e| e.into_inner());
                    if index >= f.active {
                        continue;
                    }
                    f.last[index] = p;
                    let end = f.last.iter().copied().fold(0.0, f64::max);
                    let mut r = report.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(s) = r.get_mut(second_of(now)) {
                        s.max_pressure = s.max_pressure.max(p);
                        s.end_pressure = end;
                    }
                }
            }));
        }
        // Out of service: lame ducks finish what they hold but take no arrivals.
        for last in &mut f.last[n..] {
            *last = 0.0;
        }
        f.active = n;
    };
    scale_to(scenario.replicas.at(Duration::ZERO), &mut tickers);
    let mut rng = fastrand::Rng::with_seed(scenario.seed);
    let mut turn = 0usize;
    let mut tasks = Vec::new();
    let mut phase_start = Instant::now();
    let mut scheduled = scenario
        .schedule
        .as_deref()
        .unwrap_or_default()
        .iter()
        .peekable();
    for (phase, &(duration, factor)) in scenario.load.iter().enumerate() {
        let events = events[phase];
        let rate = sim.capacity() * factor;
        let end = phase_start + duration;
        let mut at = phase_start;
        loop {
            let pick = if scenario.schedule.is_some() {
                match scheduled.next_if(|(t, _)| start + *t < end) {
                    Some(&(t, i)) => {
                        at = start + t;
                        Some(i as usize)
                    }
                    None => break,
                }
            } else {
                at += Duration::from_secs_f64(-(1.0 - rng.f64()).max(1e-12).ln() / rate.max(1e-9));
                if at >= end {
                    break;
                }
                None
            };
            tokio::time::sleep_until(at).await;
            let in_service = scenario.replicas.at(at.saturating_duration_since(start));
            if in_service != fleet.lock().unwrap_or_else(|e| e.into_inner()).active {
                scale_to(in_service, &mut tickers);
            }
            // The replica, then the event, as the runs before devices drew them (a device's
            // replica needs its event first).
            let spread = scenario.replicas.spread;
            let event_of = |rng: &mut fastrand::Rng| match pick {
                Some(i) => events[i % events.len()].clone(),
                None => events[rng.usize(..events.len())].clone(),
            };
            let (replica, event) = if spread == Spread::ByDevice {
                let event = event_of(&mut rng);
                (
                    spread.pick_for(event.device, &mut turn, in_service, &mut rng),
                    event,
                )
            } else {
                let replica = spread.pick(&mut turn, in_service, &mut rng);
                (replica, event_of(&mut rng))
            };
            let (gauge, table, floors) = {
                let f = fleet.lock().unwrap_or_else(|e| e.into_inner());
                (
                    Arc::clone(&f.gauges[replica]),
                    Arc::clone(&f.tables[replica]),
                    Arc::clone(&f.floors[replica]),
                )
            };
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
                device: None,
            };
            // A fix of a device of a sheddable stream: decided by the device's history, with
            // the freshness floor of its stream's `max_silence`, as the proxy decides it.
            let device = event
                .device
                .filter(|_| scenario.devices && !event.never)
                .map(|d| crate::extract::DeviceId::of("sim", &d.to_string()));
            let mut load = Load {
                class_inflight: [0; 3],
                total: gauge.inflight(),
                capacity: gauge.capacity(),
                floor: crate::admission::Floor::OFF,
            };
            if device.is_some() {
                let max_silence = event.stream.and_then(|id| policy.max_silence(id, None));
                load.floor = floors.floor(
                    max_silence,
                    policy.freshness_share(),
                    load.capacity,
                    now_wall,
                );
            }
            let pressure = gauge.admission_pressure();
            let decide_with = |history| {
                decide(
                    policy,
                    event.stream,
                    &facts,
                    now_wall,
                    pressure,
                    draw,
                    &load,
                    history,
                )
            };
            let decision = match device {
                None => decide_with(None),
                Some(id) => {
                    // Drawn only for fixes of devices, so runs without any draw as before.
                    let fresh_credit = rng.f64();
                    table
                        .decide_with(id, now_wall, |h| {
                            let h = h.unwrap_or_else(|| {
                                crate::admission::DeviceHistory::new(fresh_credit)
                            });
                            // As the proxy: a fix its device could not have made is decided
                            // as naming none.
                            match crate::admission::trust::judge(policy, &facts, now_wall, h) {
                                Ok(h) => decide_with(Some(h)),
                                Err(_) => decide_with(None),
                            }
                        })
                        .0
                }
            };
            if let (Some(crate::admission::FloorVerdict::Denied), Some(history)) =
                (decision.floor, &decision.device)
            {
                floors.denied(&load.floor, history, now_wall);
            }
            let floor_guard = (decision.rule == crate::admission::Rule::Freshness)
                .then(|| floors.start(now_wall));
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
                        if let (Some(d), false) = (event.device, event.never) {
                            s.admitted_fixes.push((d, start.elapsed().as_secs_f64()));
                        }
                    }
                }
            }
            if !admitted {
                continue;
            }
            let slot = policy.cost_slot(event.stream);
            let facts_time = UnixMillis(now_wall.0 - 200);
            let (gauge, sim, report) = (Arc::clone(&gauge), Arc::clone(sim), Arc::clone(&report));
            let timeout = scenario.timeout;
            let load_reports = scenario.load_reports;
            tasks.push(tokio::spawn(async move {
                let _inflight = (gauge.start(), floor_guard);
                let began = Instant::now();
                let outcome = tokio::time::timeout(timeout, sim.serve_for(event.service)).await;
                let done = Instant::now();
                let mut r = report.lock().unwrap_or_else(|e| e.into_inner());
                let Some(s) = r.get_mut(second_of(done)) else {
                    return;
                };
                match outcome {
                    Ok(Ok(())) => {
                        let latency = done - began;
                        gauge.record_latency(slot, latency);
                        if let Some(id) = device {
                            let done_wall = UnixMillis(
                                wall.0 + i64::try_from((done - start).as_millis()).unwrap_or(0),
                            );
                            table.delivered(
                                id,
                                Some(facts_time),
                                crate::admission::trust::PackedPoint::of(Coordinates::Valid {
                                    lat: event.lat,
                                    lon: event.lon,
                                }),
                                now_wall,
                                done_wall,
                            );
                        }
                        if load_reports {
                            gauge.record_load_report(sim.utilisation());
                        }
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
                        gauge.record_latency(slot, timeout);
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
    for t in tickers {
        t.abort();
    }
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
                service: None,
                device: None,
            }
        })
        .collect()
}
