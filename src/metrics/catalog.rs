//! Every metric name as a constant, with its kind and description ([`CATALOG`]): the
//! declared API that tests check docs/metrics.md and the Grafana dashboard against.

/// Requests by `stream`, `outcome` (`forwarded`, `shed`, `rejected`, `upstream_error`) and
/// `upstream` (the one chosen for it, or [`NO_UPSTREAM`] when answered before one was).
pub const REQUESTS: &str = "shedgate_requests_total";
/// Requests shed, by `stream`, `area` and `reason` (`pressure`, `stale`, `superseded`,
/// `disabled`, `budget`, `memory`).
pub const SHED: &str = "shedgate_shed_total";
/// Warn-mode would-sheds (admitted), by `stream`, `area` and `reason`. Counted at the observed
/// pressure, which is higher than enforcement would leave it.
pub const WOULD_SHED: &str = "shedgate_would_shed_total";
/// Sheddable requests whose facts could not be read, by `stream`, `route` (its prefix, or
/// `none`) and `fact` (`body`: not JSON; `coordinates`: missing or invalid, default rank
/// used; `time`: missing or invalid, not stale; `time_implausible`: more than a day from now,
/// not believed, not stale; `ambiguous`: stated twice, differently, so unreadable, and for a
/// stream, unknown). Ambiguity is counted on unknown streams too.
pub const UNREADABLE: &str = "shedgate_unreadable_facts_total";
/// Sheddable requests admitted by the decision, by `stream` and `area`: with
/// [`SHED`] (stale aside), the offered sheddable events a completeness objective counts
/// against (`deploy/prometheus/shedgate-slo.yml`).
pub const ADMITTED: &str = "shedgate_admitted_total";
/// Opaque envelopes (encrypted OwnTracks messages) by `route`: forwarded unread, never shed.
pub const OPAQUE: &str = "shedgate_opaque_envelopes_total";
/// The local clock's offset from an upstream's, seconds (positive: the upstream is ahead),
/// estimated from its responses' `Date` headers (see [`crate::clock::skew`]), by `upstream`.
pub const CLOCK_OFFSET: &str = "shedgate_clock_offset_seconds";
/// 1 while event ages are judged against an upstream's clock because the offset is beyond
/// the bound (5 s), else 0; by `upstream`.
pub const CLOCK_CORRECTED: &str = "shedgate_clock_corrected";
/// `OPTIONS *` probes sent to read an upstream's clock while every answer was stale, by
/// `upstream`.
pub const CLOCK_PROBES: &str = "shedgate_clock_probes_total";
/// Event age at the decision, seconds, by `stream` (sheddable events with a readable time at
/// or before now; never negative, so its `_sum` never decreases).
pub const EVENT_AGE: &str = "shedgate_event_age_seconds";
/// How far ahead of now an event's time was, seconds, by `stream` (sheddable events whose
/// time is in the future: a device clock ahead); kept apart from [`EVENT_AGE`] so that no
/// histogram records a negative value.
pub const EVENT_LEAD: &str = "shedgate_event_lead_seconds";
/// The `route` label of requests no route matched.
pub const NO_ROUTE: &str = "none";
/// The `upstream` label of requests answered before an upstream was chosen for them (refused
/// at their framing or their declared size, or a body that could not be read); the policy
/// refuses an upstream of that name.
pub const NO_UPSTREAM: &str = crate::policy::NO_UPSTREAM_LABEL;
/// Pressure as decisions see it, 0.0–1.0, by `upstream` (each has its own controller): the
/// controller's, raised to an open schedule's floor; the pinned value when pinned.
pub const PRESSURE: &str = "shedgate_pressure";
/// 1 while an operator pins an upstream's pressure, else 0; by `upstream`.
pub const PRESSURE_PINNED: &str = "shedgate_pressure_pinned";
/// Requests admitted to an upstream and not yet finished (response body ended), by `upstream`.
pub const INFLIGHT: &str = "shedgate_inflight_requests";
/// Sheddable body bytes buffered now, against `--max-buffered-bytes`.
pub const BUFFERED_BYTES: &str = "shedgate_buffered_body_bytes";
/// The rank cut-off of an upstream's requests, by `upstream`: ranks above it are being
/// pressure-shed (partly, within the band); 100 when nothing is.
pub const RANK_CUTOFF: &str = "shedgate_rank_cutoff";
/// Seconds an upstream spent with pressure above 0.5 (shedding), by `upstream`. Alert on its
/// rate, i.e. on duration.
pub const SHEDDING_SECONDS: &str = "shedgate_shedding_seconds_total";
/// Upstream latency to response headers, seconds, for requests the upstream answered, by
/// `upstream`.
pub const UPSTREAM_LATENCY: &str = "shedgate_upstream_latency_seconds";
/// Upstream load reports (`--load-report`, the ORCA `endpoint-load-metrics` header), by
/// `upstream` and `outcome`: `read`, or `invalid` (there but not readable as the one
/// utilisation named).
pub const UPSTREAM_LOAD_REPORTS: &str = "shedgate_upstream_load_reports_total";
/// Errors answered by the proxy itself, by `kind` (`bad_gateway`, `gateway_timeout`,
/// `payload_too_large`, `body_timeout`, `bad_request`).
pub const PROXY_ERRORS: &str = "shedgate_proxy_errors_total";
/// 1 while a schedule's window is open (its pressure floor applies), else 0; by `schedule`.
pub const SCHEDULE_ACTIVE: &str = "shedgate_schedule_active";
/// Client connections shedgate closed on its own, by `reason` ([`CloseReason`](super::CloseReason)).
pub const CONNECTION_CLOSES: &str = "shedgate_client_connection_closes_total";
/// Time between a device's admitted fixes, seconds, by `area` (of the later fix; never by
/// device): how long devices go dark while their rank is shed (docs/decision.md "Devices").
pub const DEVICE_GAP: &str = "shedgate_device_gap_seconds";
/// Fixes of devices silent past their `max_silence` that the curve shed, by `stream` and
/// `outcome`: `admitted` by the freshness floor, or `denied` (its budget spent; shed with
/// reason `pressure`) (docs/decision.md "Devices").
pub const FRESHNESS: &str = "shedgate_freshness_total";
/// The silence each delivered fix ended, seconds, by `stream`: the time since its device's
/// previous delivered fix, by the proxy's clock (docs/decision.md "Devices").
pub const DEVICE_SILENCE: &str = "shedgate_device_silence_seconds";
/// Devices past their freshness floor now: still sending (a fresh fix within their
/// `max_silence`) and none delivered within it; counted a tenth of the table a second.
pub const DEVICES_PAST_FLOOR: &str = "shedgate_devices_past_floor";
/// Devices the replica's device table remembers now.
pub const DEVICES: &str = "shedgate_devices";
/// Bytes the device table takes now (40 a device, grown in steps; room for `--max-devices` at
/// most, 54 bytes a device).
pub const DEVICE_TABLE_BYTES: &str = "shedgate_device_table_bytes";
/// Devices forgotten because the table was full (the longest-silent of a set).
pub const DEVICE_EVICTIONS: &str = "shedgate_device_evictions_total";
/// Sheddable requests whose device id was not trusted, so decided as naming no device, by
/// `stream` and `reason` (`placeholder`: an id that names no device; `implausible`: farther
/// from the device's newest delivered fix than it could have moved): docs/decision.md
/// "Devices".
pub const DEVICE_UNTRUSTED: &str = "shedgate_device_untrusted_total";
/// Client connections that spoke another protocol than HTTP/1.x, closed, by `reason`
/// (`http2_preface`: answered `GOAWAY` `HTTP_1_1_REQUIRED`; `tls_client_hello`): a peer is
/// told this port speaks h2c or HTTPS.
pub const PROTOCOL_MISMATCHES: &str = "shedgate_client_protocol_mismatches_total";
/// Times the proxy found its open-file descriptors short, by `reason`
/// ([`DescriptorShortage`](super::DescriptorShortage)): `reserve` (the sockets held reached
/// the soft limit less its reserve: idle connections closed before accepting), `accept`,
/// `admin_accept`, `upstream_connect` (`EMFILE` or `ENFILE` there).
pub const DESCRIPTOR_SHORTAGES: &str = "shedgate_descriptor_shortages_total";
/// TLS handshakes on the proxy listener, by `outcome`
/// ([`HandshakeOutcome`](super::HandshakeOutcome)): `completed`, `failed` (an alert),
/// `timed_out`, `wrong_protocol` (plain HTTP to the TLS port), `displaced` (closed to make
/// room for newer ones, or to free a descriptor).
pub const TLS_HANDSHAKES: &str = "shedgate_tls_handshakes_total";
/// Certificate reloads on new file content, by `outcome` (`swapped`, `refused`: the previous
/// pair keeps serving).
pub const TLS_RELOADS: &str = "shedgate_tls_reloads_total";
/// TLS connections whose handshake completed, by the `protocol` ALPN chose for them
/// ([`AlpnProtocol`](super::AlpnProtocol)): `h2` or `http/1.1` (which counts clients that
/// offered no ALPN).
pub const TLS_CONNECTIONS: &str = "shedgate_tls_connections_total";
/// HTTP/2 streams handed to the proxy as requests (each decided alone, as an HTTP/1.1
/// request is); streams the HTTP/2 layer refused or the client reset before that are not.
pub const HTTP2_STREAMS: &str = "shedgate_http2_streams_total";
/// The serving certificate's expiry (its leaf's notAfter), unix seconds; 0 without TLS.
pub const TLS_CERTIFICATE_EXPIRY: &str = "shedgate_tls_certificate_expiry_timestamp_seconds";
/// Idle keep-alive client connections parked now: hyper's buffers freed, only the socket held
/// (`edge::keepalive`).
pub const PARKED_CONNECTIONS: &str = "shedgate_client_connections_parked";
/// Requests the admin listener refused, by `reason` ([`AdminRefusal`](super::AdminRefusal)):
/// not addressed to it, from a browser, or a state-changing request without its credential.
pub const ADMIN_REFUSALS: &str = "shedgate_admin_refusals_total";
/// Access-log lines written whole (`--access-log`): each one a reader can parse.
pub const ACCESS_LOG_LINES: &str = "shedgate_access_log_lines_total";
/// Access-log lines dropped, by `reason` (`behind`: the queue was full, the writer behind;
/// `write_error`: the write failed, a disk full or a pipe closed, and no part of the line is
/// left in the file). Requests are never slowed to write a line.
pub const ACCESS_LOG_DROPPED: &str = "shedgate_access_log_dropped_total";
/// Requests a policy preview decided in shadow (`POST /policy/preview`), by `stream`,
/// `candidate_area` and `band` (the candidate's), `live` and `candidate` (`admitted`, `shed`,
/// `undecidable`): what the candidate would do beside what the live policy did.
pub const PREVIEW_DECISIONS: &str = "shedgate_preview_decisions_total";
/// 1 for the live policy's `version` (content hash), 0 for earlier ones.
pub const POLICY_INFO: &str = "shedgate_policy_info";
/// Policy loads by `outcome` (`success`, `failure`).
pub const POLICY_RELOADS: &str = "shedgate_policy_reloads_total";
/// 1 when the last policy load succeeded, 0 when it failed (the previous policy stays live).
pub const POLICY_RELOAD_SUCCESS: &str = "shedgate_policy_reload_success";
/// Unix time of the last policy load attempt that read new content (success or failure).
pub const POLICY_LAST_RELOAD: &str = "shedgate_policy_last_reload_timestamp_seconds";

/// What is live-disabled: `scope` (`stream` or `class`) and `name`; the value is the unix
/// time it re-enables itself, `+Inf` when disabled until further notice, 0 when enabled.
pub const DISABLED_UNTIL: &str = "shedgate_disabled_until_timestamp_seconds";

/// Every metric: name, kind, unit and description (docs/metrics.md lists each).
pub const CATALOG: &[(&str, &str, &str)] = &[
    (
        REQUESTS,
        "counter",
        "Requests by stream, outcome (forwarded, shed, rejected, upstream_error) and upstream (none: answered before one was chosen).",
    ),
    (
        SHED,
        "counter",
        "Requests shed, by stream, area and reason (pressure, stale, superseded, disabled, budget, memory).",
    ),
    (
        WOULD_SHED,
        "counter",
        "Warn-mode would-sheds (forwarded), by stream, area and reason; measured at the observed pressure.",
    ),
    (
        UNREADABLE,
        "counter",
        "Sheddable requests with unreadable facts, by stream, route (its prefix, or none) and fact (body, coordinates, time, time_implausible, ambiguous: stated twice, differently; counted on unknown streams too).",
    ),
    (
        ADMITTED,
        "counter",
        "Sheddable requests admitted by the decision, by stream and area (beside shedgate_shed_total: the offered sheddable events).",
    ),
    (
        OPAQUE,
        "counter",
        "Opaque envelopes (encrypted OwnTracks messages, which may hold a geofence transition), by route: forwarded unread, never shed.",
    ),
    (
        CLOCK_OFFSET,
        "gauge",
        "Offset of the local clock from an upstream's, seconds (positive: the upstream is ahead), from its responses' Date headers, by upstream.",
    ),
    (
        CLOCK_CORRECTED,
        "gauge",
        "1 while event ages are judged against an upstream's clock (offset beyond 5 s), else 0; by upstream.",
    ),
    (
        CLOCK_PROBES,
        "counter",
        "OPTIONS * probes sent to read an upstream's clock while every answer was stale, by upstream.",
    ),
    (
        EVENT_AGE,
        "histogram",
        "Event age at the decision, seconds, by stream (sheddable events with a readable time at or before now).",
    ),
    (
        EVENT_LEAD,
        "histogram",
        "How far ahead of now an event's time was, seconds, by stream (a device clock ahead).",
    ),
    (
        PRESSURE,
        "gauge",
        "Current pressure of each upstream, 0.0-1.0, by upstream; 0.5 = the upstream fully used at its latency target.",
    ),
    (
        PRESSURE_PINNED,
        "gauge",
        "1 while an operator pins an upstream's pressure, by upstream.",
    ),
    (
        INFLIGHT,
        "gauge",
        "Requests admitted to an upstream whose response body has not ended, by upstream.",
    ),
    (
        BUFFERED_BYTES,
        "gauge",
        "Sheddable body bytes buffered now (read or being forwarded), against --max-buffered-bytes.",
    ),
    (
        RANK_CUTOFF,
        "gauge",
        "Ranks above this are being pressure-shed at an upstream, by upstream; 100 when nothing is.",
    ),
    (
        SHEDDING_SECONDS,
        "counter",
        "Seconds an upstream spent with pressure above 0.5, by upstream.",
    ),
    (
        UPSTREAM_LATENCY,
        "histogram",
        "Upstream latency to response headers, seconds, by upstream.",
    ),
    (
        UPSTREAM_LOAD_REPORTS,
        "counter",
        "Upstream load reports (--load-report) by upstream and outcome (read, invalid).",
    ),
    (
        PROXY_ERRORS,
        "counter",
        "Errors answered by the proxy, by kind.",
    ),
    (
        SCHEDULE_ACTIVE,
        "gauge",
        "1 while a schedule's window is open (its pressure floor applies), by schedule.",
    ),
    (
        CONNECTION_CLOSES,
        "counter",
        "Client connections closed by shedgate, by reason (idle_timeout, header_timeout, \
         early_answer, lame_duck, drain_cut, descriptors, http2_enhance_your_calm, \
         http2_protocol_error).",
    ),
    (
        DESCRIPTOR_SHORTAGES,
        "counter",
        "Times open-file descriptors ran short, by reason (reserve: the sockets held reached the \
         soft limit less its reserve; accept, admin_accept, upstream_connect: EMFILE or ENFILE \
         there); idle connections are closed first.",
    ),
    (
        DEVICE_GAP,
        "histogram",
        "Time between a device's admitted fixes, seconds, by area (never by device).",
    ),
    (
        FRESHNESS,
        "counter",
        "Fixes of devices silent past their max_silence that the curve shed, by stream and outcome (admitted by the freshness floor, denied: its budget spent).",
    ),
    (
        DEVICE_SILENCE,
        "histogram",
        "The silence each delivered fix ended (time since its device's previous delivered fix), seconds, by stream.",
    ),
    (
        DEVICES_PAST_FLOOR,
        "gauge",
        "Devices past their freshness floor: still sending (a fresh fix within max_silence) and none delivered within it.",
    ),
    (
        DEVICES,
        "gauge",
        "Devices the replica's device table remembers now.",
    ),
    (
        DEVICE_TABLE_BYTES,
        "gauge",
        "Bytes the device table takes now (40 a device, grown in steps; at most 54 a device of --max-devices).",
    ),
    (
        DEVICE_EVICTIONS,
        "counter",
        "Devices forgotten because the device table was full (the longest-silent of a set).",
    ),
    (
        DEVICE_UNTRUSTED,
        "counter",
        "Sheddable requests decided as naming no device because their device id was not trusted, by stream and reason (placeholder: an id such as unknown that names no device; implausible: farther from the device's newest delivered fix than it could have moved).",
    ),
    (
        PROTOCOL_MISMATCHES,
        "counter",
        "Client connections that spoke another protocol than HTTP/1.x, closed, by reason (http2_preface: answered GOAWAY HTTP_1_1_REQUIRED; tls_client_hello).",
    ),
    (
        TLS_HANDSHAKES,
        "counter",
        "TLS handshakes on the proxy listener, by outcome (completed, failed: an alert; timed_out; wrong_protocol: plain HTTP to the TLS port; displaced: closed to make room).",
    ),
    (
        TLS_RELOADS,
        "counter",
        "Certificate reloads on new file content, by outcome (swapped; refused: the previous pair keeps serving).",
    ),
    (
        TLS_CONNECTIONS,
        "counter",
        "TLS connections whose handshake completed, by the protocol ALPN chose (h2, http/1.1).",
    ),
    (
        HTTP2_STREAMS,
        "counter",
        "HTTP/2 streams handed to the proxy as requests.",
    ),
    (
        TLS_CERTIFICATE_EXPIRY,
        "gauge",
        "The serving certificate's notAfter (its leaf's), unix seconds; 0 without TLS.",
    ),
    (
        PARKED_CONNECTIONS,
        "gauge",
        "Idle keep-alive client connections parked now (buffers freed, only the socket held).",
    ),
    (
        ACCESS_LOG_LINES,
        "counter",
        "Access-log lines written whole (each one a reader can parse).",
    ),
    (
        ADMIN_REFUSALS,
        "counter",
        "Admin requests refused, by reason (host, origin, content_type, not_loopback, token_missing, token_invalid).",
    ),
    (
        ACCESS_LOG_DROPPED,
        "counter",
        "Access-log lines dropped, by reason (behind: the queue was full; write_error: the write failed, no part of the line left).",
    ),
    (
        PREVIEW_DECISIONS,
        "counter",
        "Requests a policy preview decided in shadow, by stream, candidate_area, band, live and candidate (admitted, shed, undecidable).",
    ),
    (
        POLICY_INFO,
        "gauge",
        "1 for the live policy version (content hash).",
    ),
    (
        POLICY_RELOADS,
        "counter",
        "Policy loads by outcome (success, failure).",
    ),
    (
        POLICY_RELOAD_SUCCESS,
        "gauge",
        "1 when the last policy load succeeded.",
    ),
    (
        DISABLED_UNTIL,
        "gauge",
        "Live-disabled streams and classes: unix time they re-enable, +Inf until further notice, 0 enabled.",
    ),
    (
        POLICY_LAST_RELOAD,
        "gauge",
        "Unix time of the last policy load attempt on new content.",
    ),
];
