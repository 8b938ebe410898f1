//! The controller reading the upstream's load report: unit tests on paused time.

use std::time::Duration;

use tokio::time::Instant;

use super::super::constants::TICK;
use super::super::controller::Controller;
use super::super::output::{InflightWindow, LatencyWindow};
use super::super::{ControllerConfig, PressureGauge};
use super::{MAX_REPORT, REPORT_STALE, ReportWindow};

fn config() -> ControllerConfig {
    ControllerConfig {
        max_inflight: None,
        latency_target: Duration::from_millis(50),
        tuning: &super::super::Tuning::DEFAULT,
    }
}

fn controller() -> Controller {
    Controller::new(config())
}

/// A gauge with one 20 ms answer waiting for its next tick.
fn answered_gauge() -> PressureGauge {
    let gauge = PressureGauge::new(config());
    gauge.record_latency(crate::pressure::CostSlot::NONE, Duration::from_millis(20));
    gauge
}

/// `per_tick` answers of `ms` each, with `inflight` in flight, and a report of
/// `utilisation` with each answer if given, for `secs` from `start`; the end time.
fn run(
    c: &mut Controller,
    start: Instant,
    secs: f64,
    inflight: u32,
    (per_tick, ms): (u64, u64),
    utilisation: Option<f64>,
) -> Instant {
    let mut now = start;
    #[expect(clippy::cast_sign_loss, reason = "secs is not negative")]
    #[expect(clippy::cast_possible_truncation, reason = "a few hundred ticks")]
    let ticks = (secs / TICK.as_secs_f64()) as u32;
    #[expect(clippy::cast_sign_loss, reason = "utilisations here are positive")]
    #[expect(clippy::cast_possible_truncation, reason = "a few millions")]
    let reports = utilisation.map_or(ReportWindow::default(), |u| ReportWindow {
        count: per_tick,
        sum_millionths: per_tick * (u * 1e6) as u64,
    });
    for _ in 0..ticks {
        now += TICK;
        c.update(
            now,
            inflight,
            InflightWindow {
                count: 5,
                sum: 5 * u64::from(inflight),
            },
            LatencyWindow {
                count: per_tick,
                sum_us: per_tick * ms * 1000,
            },
            reports,
        );
    }
    now
}

/// One replica of many holds a request at a time: its own in-flight count, over what its
/// completions hold at the no-load latency it learned, reads no queue. The upstream says it
/// has one twice its workers deep, and latency is over the setpoint: the effort starts.
#[tokio::test(start_paused = true)]
async fn a_reported_queue_is_read_where_this_replicas_own_in_flight_count_shows_none() {
    let effort = |report: Option<f64>| {
        let mut c = controller();
        // Learned at rest: 100 answers a second of 25 ms, 3 in flight.
        let now = run(&mut c, Instant::now(), 3.0, 3, (5, 25), None);
        // Then 48 ms answers (0.96 of the target) with one request in flight: under the
        // 2.5 that 100 a second hold at 25 ms.
        run(&mut c, now, 1.0, 1, (5, 48), report);
        c.output().effort
    };
    assert!(effort(None).abs() < f64::EPSILON, "{}", effort(None));
    assert!(effort(Some(2.0)) > 0.1, "{}", effort(Some(2.0)));
}

/// A replica started in front of an upstream whose own latency is over the target has not
/// seen it calm, so without a report it steers on latency alone and sheds. The upstream
/// reports every worker busy and none waiting: slowness, not a queue; nothing is shed.
#[tokio::test(start_paused = true)]
async fn a_slow_upstream_that_reports_no_queue_is_not_shed_by_a_replica_not_yet_calm() {
    let pressure = |report: Option<f64>| {
        let mut c = controller();
        // 100 answers a second of 60 ms (1.2 targets), 6 in flight, from the start.
        run(&mut c, Instant::now(), 3.0, 6, (5, 60), report);
        assert!(c.state(6).cold, "{:?}", c.state(6));
        (c.output().effort, c.output().pressure(6))
    };
    let (effort, p) = pressure(None);
    assert!(effort > 0.1 && p > 0.5, "{effort} {p}");
    let (effort, p) = pressure(Some(0.95));
    assert!(effort.abs() < f64::EPSILON, "{effort}");
    assert!(p <= 0.5 + 1e-9, "{p}");
}

/// Reports count until [`REPORT_STALE`] after the last: then the replica steers on its own
/// readings again, and `GET /pressure` says so.
#[tokio::test(start_paused = true)]
async fn a_report_older_than_report_stale_is_not_read() {
    let mut c = controller();
    let now = run(&mut c, Instant::now(), 1.0, 3, (5, 25), Some(0.6));
    let reported = c.state(3).reported_utilisation.unwrap();
    assert!((reported - 0.6).abs() < 1e-6, "{reported}");
    let now = run(
        &mut c,
        now,
        REPORT_STALE.as_secs_f64() - 0.1,
        3,
        (5, 25),
        None,
    );
    assert!(c.state(3).reported_utilisation.is_some(), "still fresh");
    run(&mut c, now, 0.2, 3, (5, 25), None);
    assert_eq!(c.state(3).reported_utilisation, None);
}

/// The gauge sums reports as millionths between ticks; values that are not utilisations
/// are dropped, not summed.
#[tokio::test(start_paused = true)]
async fn the_gauge_folds_reports_into_the_next_tick() {
    let gauge = answered_gauge();
    for u in [0.5, 1.5, f64::NAN, -1.0, f64::INFINITY] {
        gauge.record_load_report(u);
    }
    gauge.tick(Instant::now() + TICK);
    let reported = gauge.view().controller.reported_utilisation.unwrap();
    assert!((reported - 1.0).abs() < 1e-6, "{reported}");
}

/// One report is read as at most [`MAX_REPORT`]: a pod that writes a percentage does not
/// hold the tick's mean at thousands, and a busy tick's capped reports do not overflow the
/// window's sum into its count.
#[tokio::test(start_paused = true)]
async fn a_report_counts_as_at_most_max_report() {
    let gauge = answered_gauge();
    gauge.record_load_report(85.0);
    for _ in 0..3 {
        gauge.record_load_report(1.0);
    }
    gauge.tick(Instant::now() + TICK);
    let reported = gauge.view().controller.reported_utilisation.unwrap();
    assert!(
        (reported - (MAX_REPORT + 3.0) / 4.0).abs() < 1e-6,
        "{reported}"
    );
    let gauge = answered_gauge();
    for _ in 0..5_000 {
        gauge.record_load_report(1e9);
    }
    gauge.tick(Instant::now() + TICK);
    let reported = gauge.view().controller.reported_utilisation.unwrap();
    assert!((reported - MAX_REPORT).abs() < 1e-6, "{reported}");
}
