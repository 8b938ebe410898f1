//! Metrics as a declared API: every name is a constant with its description (`catalog.rs`), handles are
//! registered once (off the hot path), and labels carry only names from the policy, never a
//! value a client sent (docs/operations.md "Observability";
//! docs/decision.md "Areas").
//!
//! Each proxy owns its own Prometheus recorder (no global recorder), so several proxies in
//! one process — the tests, the demo — keep separate counts.

use metrics::{
    Counter, Gauge, Histogram, Key, Label, Level, Metadata, Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};

use crate::policy::Policy;

mod admin;
mod catalog;
mod connections;
mod live;
mod per_policy;
mod tls;
mod upstream;

pub use admin::AdminRefusal;
pub use catalog::*;
pub use connections::{CloseReason, DescriptorShortage};
pub use per_policy::PolicyMetrics;
pub use tls::{AlpnProtocol, HandshakeOutcome, ReloadOutcome as TlsReloadOutcome, TlsMetrics};
pub use upstream::UpstreamMetrics;

/// Buckets of [`EVENT_AGE`], seconds: around the default `stale_after` (30 s), up to a day
/// (past which a time is not believed). Never negative: times in the future go to
/// [`EVENT_LEAD`].
const AGE_BUCKETS: &[f64] = &[
    1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0, 7200.0, 21600.0, 86400.0,
];

/// Buckets of [`EVENT_LEAD`], seconds: a device clock a little ahead, minutes ahead, up to
/// the day past which a time is not believed.
const LEAD_BUCKETS: &[f64] = &[1.0, 5.0, 60.0, 300.0, 3600.0, 86400.0];

/// Buckets of [`DEVICE_GAP`], seconds: a report interval of a few seconds (OwnTracks' move
/// mode, Traccar Client) up to the minutes a device goes dark while its rank is shed.
const GAP_BUCKETS: &[f64] = &[1.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 900.0];

/// Buckets of [`DEVICE_SILENCE`], seconds: a fix every second up to the hour a device may be
/// kept dark with no floor set.
const SILENCE_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0,
];

/// Buckets of [`UPSTREAM_LATENCY`], seconds.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Request outcome label values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Forwarded and answered by the upstream.
    Forwarded,
    /// Shed (any reason, stale included).
    Shed,
    /// Refused by the proxy for the request's own fault (413, 408, 400).
    Rejected,
    /// The upstream failed (502, 504).
    UpstreamError,
}

impl Outcome {
    /// Every outcome, in metric-slot order.
    pub const ALL: [Outcome; 4] = [
        Outcome::Forwarded,
        Outcome::Shed,
        Outcome::Rejected,
        Outcome::UpstreamError,
    ];

    /// Stable name, the `outcome` label: `forwarded`, `shed`, `rejected`, `upstream_error`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Shed => "shed",
            Outcome::Rejected => "rejected",
            Outcome::UpstreamError => "upstream_error",
        }
    }
}

/// Which fact was unreadable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fact {
    /// The body was not JSON.
    Body,
    /// No readable coordinates.
    Coordinates,
    /// No readable time.
    Time,
    /// A time too far from now to be right (a broken device clock): not believed.
    ImplausibleTime,
    /// A fact stated twice, differently (a duplicate header or JSON key): unreadable.
    Ambiguous,
}

impl Fact {
    fn as_str(self) -> &'static str {
        match self {
            Fact::Body => "body",
            Fact::Coordinates => "coordinates",
            Fact::Time => "time",
            Fact::ImplausibleTime => "time_implausible",
            Fact::Ambiguous => "ambiguous",
        }
    }
}

/// Another protocol than HTTP/1.x on a client connection's first bytes
/// (`edge::framing::sniff`): a peer told the port speaks something else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolMismatch {
    /// The HTTP/2 connection preface (RFC 9113 section 3.4): told the port speaks h2c.
    Http2Preface,
    /// A TLS handshake record (RFC 8446 section 5.1): told the port speaks HTTPS.
    TlsClientHello,
}

impl ProtocolMismatch {
    /// Both, in the order of their metric slots.
    pub const ALL: [ProtocolMismatch; 2] = [
        ProtocolMismatch::Http2Preface,
        ProtocolMismatch::TlsClientHello,
    ];

    /// The `reason` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ProtocolMismatch::Http2Preface => "http2_preface",
            ProtocolMismatch::TlsClientHello => "tls_client_hello",
        }
    }
}

/// Kinds of errors the proxy answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 502.
    BadGateway,
    /// 504.
    GatewayTimeout,
    /// 413.
    PayloadTooLarge,
    /// 408.
    BodyTimeout,
    /// 400.
    BadRequest,
    /// 504: the class's `max_request_time`.
    ClassTimeout,
}

impl ErrorKind {
    const ALL: [ErrorKind; 6] = [
        ErrorKind::BadGateway,
        ErrorKind::GatewayTimeout,
        ErrorKind::PayloadTooLarge,
        ErrorKind::BodyTimeout,
        ErrorKind::BadRequest,
        ErrorKind::ClassTimeout,
    ];

    /// The request outcome this error is: the client's fault (`rejected`) or the
    /// upstream's (`upstream_error`).
    pub fn outcome(self) -> Outcome {
        match self {
            ErrorKind::BadGateway | ErrorKind::GatewayTimeout | ErrorKind::ClassTimeout => {
                Outcome::UpstreamError
            }
            ErrorKind::PayloadTooLarge | ErrorKind::BodyTimeout | ErrorKind::BadRequest => {
                Outcome::Rejected
            }
        }
    }

    /// Stable name, the `kind` label.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::BadGateway => "bad_gateway",
            ErrorKind::GatewayTimeout => "gateway_timeout",
            ErrorKind::PayloadTooLarge => "payload_too_large",
            ErrorKind::BodyTimeout => "body_timeout",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::ClassTimeout => "class_timeout",
        }
    }
}

/// One proxy's recorder and its process-wide handles (each upstream's are its
/// [`UpstreamMetrics`]).
pub struct Metrics {
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
    /// [`BUFFERED_BYTES`].
    pub buffered_bytes: Gauge,
    /// [`PARKED_CONNECTIONS`].
    pub parked_connections: Gauge,
    /// [`DEVICES`].
    pub devices: Gauge,
    /// [`DEVICES_PAST_FLOOR`].
    pub devices_past_floor: Gauge,
    /// [`DEVICE_TABLE_BYTES`].
    pub device_table_bytes: Gauge,
    /// [`DEVICE_EVICTIONS`].
    pub device_evictions: Counter,
    /// [`ACCESS_LOG_LINES`].
    pub access_log_lines: Counter,
    /// [`ACCESS_LOG_DROPPED`]: `behind`, `write_error`.
    pub access_log_dropped: [Counter; 2],
    proxy_errors: [Counter; 6],
    connection_closes: [Counter; 8],
    /// [`DESCRIPTOR_SHORTAGES`], by [`DescriptorShortage`].
    descriptor_shortages: [Counter; 4],
    /// [`PROTOCOL_MISMATCHES`], by [`ProtocolMismatch`].
    protocol_mismatches: [Counter; 2],
    /// [`ADMIN_REFUSALS`], by [`AdminRefusal`].
    admin_refusals: [Counter; 6],
    /// The TLS listener's handshakes, certificate reloads and expiry.
    pub tls: TlsMetrics,
    reload_success: Counter,
    reload_failure: Counter,
    reload_ok: Gauge,
    last_reload: Gauge,
    /// The `/stats` counts, kept across policy reloads.
    pub stats: crate::stats::Stats,
    disabled: std::sync::Mutex<std::collections::HashMap<(&'static str, String), Gauge>>,
    policy_info: std::sync::Mutex<Option<Gauge>>,
    schedules: std::sync::Mutex<std::collections::HashMap<String, Gauge>>,
    /// The live policy's names: renders leave out series of names that left it.
    live: std::sync::Mutex<Option<live::LiveNames>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn metadata() -> Metadata<'static> {
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()))
}

impl Metrics {
    /// A fresh recorder with every metric described and the process-wide handles registered.
    pub fn new() -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Full(UPSTREAM_LATENCY.into()), LATENCY_BUCKETS)
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(EVENT_AGE.into()), AGE_BUCKETS))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(EVENT_LEAD.into()), LEAD_BUCKETS))
            .and_then(|b| b.set_buckets_for_metric(Matcher::Full(DEVICE_GAP.into()), GAP_BUCKETS))
            .and_then(|b| {
                b.set_buckets_for_metric(Matcher::Full(DEVICE_SILENCE.into()), SILENCE_BUCKETS)
            })
            .map(PrometheusBuilder::build_recorder)
            .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
        for (name, kind, help) in CATALOG {
            let unit = name.ends_with("_seconds").then_some(Unit::Seconds);
            let (name, help) = (metrics::KeyName::from(*name), SharedString::from(*help));
            match *kind {
                "counter" => recorder.describe_counter(name, unit, help),
                "gauge" => recorder.describe_gauge(name, unit, help),
                _ => recorder.describe_histogram(name, unit, help),
            }
        }
        let handle = recorder.handle();
        let counter = |name: &'static str, labels: Vec<Label>| {
            recorder.register_counter(&Key::from_parts(name, labels), &metadata())
        };
        let gauge =
            |name: &'static str| recorder.register_gauge(&Key::from_name(name), &metadata());
        let proxy_errors =
            ErrorKind::ALL.map(|k| counter(PROXY_ERRORS, vec![Label::new("kind", k.as_str())]));
        let connection_closes = CloseReason::ALL
            .map(|r| counter(CONNECTION_CLOSES, vec![Label::new("reason", r.as_str())]));
        let protocol_mismatches = ProtocolMismatch::ALL
            .map(|p| counter(PROTOCOL_MISMATCHES, vec![Label::new("reason", p.as_str())]));
        let admin_refusals = AdminRefusal::ALL
            .map(|r| counter(ADMIN_REFUSALS, vec![Label::new("reason", r.as_str())]));
        let descriptor_shortages = DescriptorShortage::ALL
            .map(|r| counter(DESCRIPTOR_SHORTAGES, vec![Label::new("reason", r.as_str())]));
        Metrics {
            connection_closes,
            descriptor_shortages,
            protocol_mismatches,
            admin_refusals,
            parked_connections: gauge(PARKED_CONNECTIONS),
            devices: gauge(DEVICES),
            devices_past_floor: gauge(DEVICES_PAST_FLOOR),
            device_table_bytes: gauge(DEVICE_TABLE_BYTES),
            device_evictions: counter(DEVICE_EVICTIONS, vec![]),
            access_log_lines: counter(ACCESS_LOG_LINES, vec![]),
            access_log_dropped: ["behind", "write_error"]
                .map(|r| counter(ACCESS_LOG_DROPPED, vec![Label::new("reason", r)])),
            buffered_bytes: gauge(BUFFERED_BYTES),
            proxy_errors,
            tls: TlsMetrics::register(counter, gauge),
            reload_success: counter(POLICY_RELOADS, vec![Label::new("outcome", "success")]),
            reload_failure: counter(POLICY_RELOADS, vec![Label::new("outcome", "failure")]),
            reload_ok: gauge(POLICY_RELOAD_SUCCESS),
            last_reload: gauge(POLICY_LAST_RELOAD),
            stats: crate::stats::Stats::default(),
            disabled: std::sync::Mutex::default(),
            policy_info: std::sync::Mutex::new(None),
            schedules: std::sync::Mutex::default(),
            live: std::sync::Mutex::new(None),
            recorder,
            handle,
        }
    }

    /// Prometheus text exposition of every metric, without the series of stream, area and
    /// route names (and policy versions) that left the live policy: they disappear at the
    /// reload that removes them (see `live.rs`).
    pub fn render(&self) -> String {
        let text = self.handle.render();
        match &*self.live.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(live) => live.filter(&text),
            None => text,
        }
    }

    /// Drains histogram samples into their buckets and frees the blocks they were held in;
    /// call periodically (the exporter starts no upkeep task of its own: metrics-rs issue 467).
    ///
    /// The exporter holds a histogram's samples with their times in blocks of 64 (its
    /// `AtomicBucketInstant`, over metrics-util's `AtomicBucket`: 1,048 bytes a block, in
    /// jemalloc's 1,280-byte class), and draining them only defers the blocks' free to
    /// crossbeam-epoch (`AtomicBucket::clear_with`, which flushes once): they are freed after
    /// the global epoch has advanced twice more, which happens only when some thread pins
    /// again. An idle proxy records no samples and pins nothing, so a burst's blocks stayed
    /// allocated, one or two to a slab among slabs that parked connections had emptied: after
    /// 10,000 requests on 10,000 idle connections, ~170 blocks held ~140 partly used 20 KiB
    /// slabs (jemalloc's statistics), 2.8 MiB of resident memory. Three pins with a flush
    /// each advance the epoch past the deferred blocks and free them.
    pub fn run_upkeep(&self) {
        self.handle.run_upkeep();
        for _ in 0..3 {
            crossbeam_epoch::pin().flush();
        }
    }

    /// Counts an error answered by the proxy.
    pub fn proxy_error(&self, kind: ErrorKind) {
        self.proxy_errors[kind as usize].increment(1);
    }

    /// Counts a client connection closed because it spoke another protocol.
    pub fn protocol_mismatch(&self, wrong: ProtocolMismatch) {
        self.protocol_mismatches[wrong as usize].increment(1);
    }

    /// Counts a request the admin listener refused.
    pub fn admin_refused(&self, reason: AdminRefusal) {
        self.admin_refusals[reason as usize].increment(1);
    }

    /// Counts a client connection closed for `reason`.
    pub fn connection_closed(&self, reason: CloseReason) {
        self.connection_closes[reason as usize].increment(1);
    }

    /// Counts a descriptor shortage met at `at`.
    pub fn descriptor_shortage(&self, at: DescriptorShortage) {
        self.descriptor_shortages[at as usize].increment(1);
    }

    /// Records a successful load of `policy` at `now`: its version, the reload gauges, and
    /// what it disables ([`Metrics::export_disabled`]).
    pub fn policy_loaded(&self, policy: &Policy, now: crate::clock::UnixMillis) {
        let version = policy.version();
        self.reload_success.increment(1);
        self.reload_ok.set(1.0);
        self.last_reload.set(now.as_secs_f64());
        let gauge = self.recorder.register_gauge(
            &Key::from_parts(POLICY_INFO, vec![Label::new("version", version.to_owned())]),
            &metadata(),
        );
        let mut info = self.policy_info.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = info.take() {
            old.set(0.0);
        }
        gauge.set(1.0);
        *info = Some(gauge);
        drop(info);
        *self.live.lock().unwrap_or_else(|p| p.into_inner()) = Some(live::LiveNames::of(policy));
        self.export_disabled(policy, now);
    }

    /// The files on disk are the live policy again after a failure (restored by hand).
    pub fn policy_files_match_live(&self) {
        self.reload_ok.set(1.0);
    }

    /// Exports what `policy` disables at `now` ([`DISABLED_UNTIL`]); switches that ended or
    /// left the policy go to 0.
    pub fn export_disabled(&self, policy: &Policy, now: crate::clock::UnixMillis) {
        use crate::policy::{Class, Disable};
        let mut live: Vec<((&'static str, String), f64)> = Vec::new();
        let value = |d: Disable| match d {
            Disable::Until(t) => t.as_secs_f64(),
            _ => f64::INFINITY,
        };
        for s in policy.streams() {
            if s.disabled.active(now) {
                live.push((("stream", s.name.clone()), value(s.disabled)));
            }
        }
        for c in Class::ALL {
            let d = policy.class(c).disabled;
            if d.active(now) {
                live.push((("class", c.as_str().to_owned()), value(d)));
            }
        }
        let mut gauges = self.disabled.lock().unwrap_or_else(|p| p.into_inner());
        for g in gauges.values() {
            g.set(0.0);
        }
        for (key, v) in live {
            let gauge = gauges.entry(key.clone()).or_insert_with(|| {
                self.recorder.register_gauge(
                    &Key::from_parts(
                        DISABLED_UNTIL,
                        vec![Label::new("scope", key.0), Label::new("name", key.1)],
                    ),
                    &metadata(),
                )
            });
            gauge.set(v);
        }
    }

    /// Sets [`SCHEDULE_ACTIVE`] for every schedule of `policy` at `now` (1 open, 0 closed).
    pub fn export_schedules(&self, policy: &Policy, now: crate::clock::UnixMillis) {
        let mut gauges = self.schedules.lock().unwrap_or_else(|p| p.into_inner());
        for s in policy.schedules() {
            let gauge = gauges.entry(s.name.clone()).or_insert_with(|| {
                self.recorder.register_gauge(
                    &Key::from_parts(
                        SCHEDULE_ACTIVE,
                        vec![Label::new("schedule", s.name.clone())],
                    ),
                    &metadata(),
                )
            });
            gauge.set(if s.is_open(now) { 1.0 } else { 0.0 });
        }
    }

    /// Records a failed policy load at `now`.
    pub fn policy_reload_failed(&self, now: crate::clock::UnixMillis) {
        self.reload_failure.increment(1);
        self.reload_ok.set(0.0);
        self.last_reload.set(now.as_secs_f64());
    }

    /// Counts one request a policy preview decided in shadow ([`PREVIEW_DECISIONS`]): the
    /// candidate's stream, area (`none`: the default rank's places) and band, and what the
    /// live and the candidate decision did. Registers the series per call (about 110 ns):
    /// only while a preview runs.
    pub fn preview_decision(
        &self,
        stream: &str,
        area: &str,
        band: &str,
        live: &'static str,
        candidate: &'static str,
    ) {
        self.counter(
            PREVIEW_DECISIONS,
            vec![
                Label::new("stream", stream.to_owned()),
                Label::new("candidate_area", area.to_owned()),
                Label::new("band", band.to_owned()),
                Label::new("live", live),
                Label::new("candidate", candidate),
            ],
        )
        .increment(1);
    }

    pub(super) fn histogram(&self, name: &'static str, labels: Vec<Label>) -> Histogram {
        self.recorder
            .register_histogram(&Key::from_parts(name, labels), &metadata())
    }

    pub(super) fn gauge(&self, name: &'static str, labels: Vec<Label>) -> Gauge {
        self.recorder
            .register_gauge(&Key::from_parts(name, labels), &metadata())
    }

    pub(super) fn counter(&self, name: &'static str, labels: Vec<Label>) -> Counter {
        self.recorder
            .register_counter(&Key::from_parts(name, labels), &metadata())
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
