//! The admin listener: `GET /metrics` (Prometheus text), `GET /healthz` (readiness: 503 in
//! the lame duck), `GET /livez` (liveness), `GET /policy`,
//! `POST /reload`, `GET|PUT|DELETE /pressure`, `GET /stats`, `GET /devices`, and
//! `POST|GET|DELETE /policy/preview` (docs/operations.md "Observability",
//! "Policy files and hot reload"; docs/pressure.md "Pressure").
//!
//! It binds to loopback by default: it can pin pressure, so it is an operator's tool, not a
//! public one. Wherever it binds, [`guard`] answers only requests addressed to it, and
//! state-changing ones only from a client that is not a browser, on loopback or with the
//! `--admin-token-file` token.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::edge::rejection::PROBLEM_JSON;
use crate::edge::serve::LameDuck;
use crate::live::PolicyStore;
use crate::metrics::Metrics;
use crate::policy::{Area, Class, Mode, Supersession};
use crate::pressure::Pressure;
use crate::upstream::{LiveUpstreams, Upstream};

/// What the admin handlers read and change.
#[derive(Debug, Clone)]
pub struct AdminState {
    /// The live policy.
    pub store: Arc<PolicyStore>,
    /// The live upstreams: `/pressure` is the one `?upstream=` names (`default` without),
    /// `/stats` the default one's and a line for each, as the last reload left them.
    pub upstreams: Arc<LiveUpstreams>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// Set on SIGTERM: `/healthz` answers 503 so that readiness fails while traffic is
    /// still served (the shutdown delay).
    pub lame_duck: LameDuck,
    /// What this replica remembers of each device.
    pub devices: Arc<crate::devices::DeviceTable>,
    /// The access log and the policy preview.
    pub records: crate::record::Records,
    /// `--max-devices`: the room a preview's own device table gets.
    pub max_devices: usize,
    /// Who may address the listener, and the token (`--admin-allow-host`,
    /// `--admin-token-file`).
    pub access: guard::AdminAccess,
    /// The proxy listener's TLS certificate pair, reloaded beside the policy by
    /// `POST /reload` (`None`: plain HTTP).
    pub certificates: Option<Arc<crate::edge::tls::pair::CertificateStore>>,
}

pub mod guard;
pub mod preview;

/// Largest `POST /policy/preview` body, bytes: two TOML files and region files of at most
/// [`crate::policy::MAX_REGION_FILE_BYTES`] each, a few of them.
const PREVIEW_BODY_LIMIT: usize = 64 << 20;

/// The admin routes, behind the [`guard`].
pub fn router(state: AdminState) -> Router {
    let guard = Arc::new(guard::Guard::new(
        state.access.clone(),
        Arc::clone(&state.metrics),
    ));
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        // Liveness: 200 while the process serves, lame duck included.
        .route("/livez", get(|| async { "ok\n" }))
        .route("/policy", get(policy))
        .route("/reload", axum::routing::post(reload))
        .route("/stats", get(stats))
        .route("/devices", get(device))
        .route(
            "/policy/preview",
            get(preview::show)
                .post(preview::start)
                .delete(preview::stop)
                .layer(axum::extract::DefaultBodyLimit::max(PREVIEW_BODY_LIMIT)),
        )
        .route(
            "/pressure",
            get(get_pressure).put(pin_pressure).delete(unpin_pressure),
        )
        .with_state(state)
        // Outermost, over every route and the fallback: a request not addressed to this
        // listener gets 421 whatever its path, and a refused one never reaches a handler
        // (nor has its body read).
        .layer(axum::middleware::from_fn_with_state(guard, guard::enforce))
}

/// 200 `ok` while serving; 503 `shutting down` from SIGTERM on, so that a readiness probe
/// takes the replica out of the Service while it still answers (docs/responses.md
/// "Connections").
async fn healthz(State(s): State<AdminState>) -> Response {
    if s.lame_duck.is_set() {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n").into_response()
    } else {
        "ok\n".into_response()
    }
}

async fn metrics(State(s): State<AdminState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

#[derive(Serialize)]
struct StreamView<'a> {
    name: &'a str,
    supersession: Supersession,
    class: Class,
    mode: Mode,
    enabled: bool,
    stale_after_seconds: f64,
    format: crate::extract::formats::Format,
    /// The first content mode's pointers.
    pointers: serde_json::Value,
    /// Every content mode of the format, with its pointers and time header.
    modes: Vec<serde_json::Value>,
}

#[derive(Serialize)]
struct RouteView<'a> {
    prefix: &'a str,
    format: crate::extract::formats::Format,
}

#[derive(Serialize)]
struct PolicyView<'a> {
    version: &'a str,
    directory: String,
    mode: Mode,
    band: f64,
    ramp: f64,
    default_rank: u8,
    stale_status: u16,
    cells: usize,
    streams: Vec<StreamView<'a>>,
    routes: Vec<RouteView<'a>>,
    areas: &'a [Area],
    last_error: Option<String>,
    last_reload_unix_ms: Option<i64>,
}

async fn policy(State(s): State<AdminState>) -> Response {
    let snapshot = s.store.load();
    let status = s.store.status();
    let p = &snapshot.policy;
    let now = s.store.sources().now();
    let view = PolicyView {
        version: p.version(),
        directory: s.store.dir().display().to_string(),
        mode: p.mode(),
        band: p.curve().band(),
        ramp: p.curve().ramp(),
        default_rank: p.default_rank().get(),
        stale_status: p.stale_status().as_u16(),
        cells: p.cell_count(),
        streams: p
            .streams()
            .iter()
            .map(|st| StreamView {
                name: &st.name,
                supersession: st.supersession,
                class: st.class,
                mode: st.mode,
                enabled: !st.disabled.active(now),
                stale_after_seconds: st.stale_after.as_secs_f64(),
                format: st.format,
                pointers: st.extractor().shape().describe(),
                modes: st
                    .modes
                    .iter()
                    .map(|m| {
                        serde_json::json!({
                            "content_mode": m.mode,
                            "pointers": m.extractor.shape().describe(),
                            "time_header": m.time_header.as_ref().map(http::HeaderName::as_str),
                        })
                    })
                    .collect(),
            })
            .collect(),
        routes: p
            .routes()
            .iter()
            .map(|r| RouteView {
                prefix: &r.prefix,
                format: r.format,
            })
            .collect(),
        areas: p.areas(),
        last_error: status.last_error,
        last_reload_unix_ms: status.last_attempt_unix_ms,
    };
    Json(view).into_response()
}

/// `POST /reload`: reads and compiles the policy directory now; answers the outcome
/// (`swapped` or `unchanged` with the version, 200) or the error (422 problem+json; the
/// previous policy stays live). With TLS, the certificate pair is read again too: its outcome
/// is the answer's `certificate` (`swapped`, `unchanged`), and a refused pair is a 422 whose
/// detail names the file and the reason (the previous pair keeps serving); with a policy
/// error too, the detail holds both.
async fn reload(State(s): State<AdminState>) -> Response {
    use crate::edge::tls::pair::Reload;
    use crate::live::store::ReloadOutcome;
    let outcome = crate::live::reload::reload(&s.store, crate::live::reload::Trigger::Admin).await;
    let certificate = match &s.certificates {
        Some(store) => Some(crate::edge::tls::watch::reload(store).await),
        None => None,
    };
    if let (Some(Reload::Refused(e)), false) = (
        &certificate,
        matches!(outcome, ReloadOutcome::Failed { .. }),
    ) {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "TLS certificate pair refused; the previous pair keeps serving",
            &e.to_string(),
        );
    }
    if let Some(done) = &certificate
        && !matches!(outcome, ReloadOutcome::Failed { .. })
    {
        let mut body = serde_json::to_value(&outcome).unwrap_or_default();
        if let Some(map) = body.as_object_mut() {
            let said = if matches!(done, Reload::Swapped { .. }) {
                "swapped"
            } else {
                "unchanged"
            };
            map.insert("certificate".into(), said.into());
        }
        return Json(body).into_response();
    }
    match &outcome {
        ReloadOutcome::Failed { live, error } => {
            // A refused pair too: both reasons, so that both are fixed before the next try.
            let detail = match &certificate {
                Some(Reload::Refused(e)) => format!(
                    "{error}; and the TLS certificate pair was refused (the previous pair \
                     keeps serving): {e}"
                ),
                _ => error.clone(),
            };
            let mut r = problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Policy does not compile; the previous policy stays live",
                &detail,
            );
            if let Ok(v) = axum::http::HeaderValue::from_str(live) {
                r.headers_mut().insert("x-policy-version", v);
            }
            r
        }
        _ => Json(outcome).into_response(),
    }
}

/// `GET /stats`: accepted, shed by reason, active and shed rate per stream and per class,
/// over the last minute and since start, the current rank cut-off, and what is disabled.
async fn stats(State(s): State<AdminState>) -> Response {
    let snapshot = s.store.load();
    let policy = &snapshot.policy;
    let now = s.store.sources().now();
    let (streams, classes) = s.metrics.stats.report(now, |name| {
        if name == crate::policy::UNKNOWN_STREAM {
            return Some(crate::policy::Class::Critical.as_str());
        }
        policy
            .stream(name)
            .map(|id| policy.stream_policy(id).class.as_str())
    });
    let table = s.upstreams.table();
    let gauge = &table.default_upstream().pressure;
    let pressure = gauge.pressure();
    let mut disabled = Vec::new();
    for st in policy.streams() {
        if st.disabled.active(now) {
            disabled.push(serde_json::json!({"stream": st.name, "until": until_text(st.disabled)}));
        }
    }
    for class in crate::policy::Class::ALL {
        let c = policy.class(class);
        if c.disabled.active(now) {
            disabled.push(
                serde_json::json!({"class": class.as_str(), "until": until_text(c.disabled)}),
            );
        }
    }
    Json(serde_json::json!({
        "pressure": pressure.get(),
        "pinned": gauge.is_pinned(),
        "rank_cutoff": crate::policy::Curve::threshold(pressure),
        "inflight": gauge.inflight(),
        "streams": streams,
        "classes": classes,
        "disabled": disabled,
        "warn_note": "warn-mode would-sheds are counted at the observed pressure, which is higher than enforcing would leave it",
        "policy_version": policy.version(),
        "upstreams": table.iter().map(|up| serde_json::json!({
            "name": &*up.name,
            "pressure": up.pressure.pressure().get(),
            "pinned": up.pressure.is_pinned(),
            "inflight": up.pressure.inflight(),
            "capacity": up.pressure.capacity(),
        })).collect::<Vec<_>>(),
    }))
    .into_response()
}

/// `GET /devices?route=PREFIX&id=ID` (or `?stream=NAME&id=ID` for a stream named by a header,
/// read without a route): what this replica remembers of one device (docs/decision.md
/// "Devices"): 200 with its history, 404 when it remembers none, 400 for a route or stream the
/// live policy does not have. The id is keyed as requests key it, so the answer is about the
/// device the table holds; the table is this replica's own.
async fn device(State(s): State<AdminState>, uri: axum::http::Uri) -> Response {
    let (mut route, mut stream, mut id) = (None, None, None);
    for (k, v) in form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()) {
        match &*k {
            "route" => route = Some(v.into_owned()),
            "stream" => stream = Some(v.into_owned()),
            "id" => id = Some(v.into_owned()),
            _ => {}
        }
    }
    let snapshot = s.store.load();
    let policy = &snapshot.policy;
    let scope = match (&route, &stream) {
        (Some(r), None) if policy.routes().iter().any(|x| x.prefix == *r) => r.clone(),
        (None, Some(n)) if policy.stream(n).is_some() => n.clone(),
        _ => {
            return problem(
                StatusCode::BAD_REQUEST,
                "Which device?",
                "give id and either route (a route prefix of the live policy) or stream (a \
                 stream it names)",
            );
        }
    };
    let Some(id) = id.filter(|i| !i.is_empty()) else {
        return problem(StatusCode::BAD_REQUEST, "Which device?", "give id");
    };
    let key = crate::extract::DeviceId::of(&scope, &id);
    let upstream = device_upstream(policy, route.as_deref(), stream.as_deref());
    match s.devices.view(key, s.store.sources().now()) {
        Some(view) => Json(serde_json::json!({
            "scope": scope,
            "id": id,
            "upstream": upstream,
            "device": view,
        }))
        .into_response(),
        None => problem(
            StatusCode::NOT_FOUND,
            "Device not remembered",
            &format!(
                "this replica remembers no device {id:?} of {scope:?} (never seen here, or \
                 forgotten when its table was full)"
            ),
        ),
    }
}

/// The upstream a device's requests go to, by name: a stream's (else `default`); a route's
/// own, else the stream it fixes, else `default` when no stream names an upstream. `None`
/// for a route that names none and reads its stream from each request while the policy's
/// streams go to different upstreams: each request's stream decides.
fn device_upstream(
    policy: &crate::policy::Policy,
    route: Option<&str>,
    stream: Option<&str>,
) -> Option<String> {
    let name = |id: crate::policy::UpstreamId| policy.upstream_spec(id).name.clone();
    if let Some(id) = stream.and_then(|n| policy.stream(n)) {
        return Some(name(policy.upstream_of(None, Some(id))));
    }
    let i = route.and_then(|r| policy.routes().iter().position(|x| x.prefix == r))?;
    let r = &policy.routes()[i];
    if let Some(id) = r.upstream {
        return Some(name(id));
    }
    if let crate::policy::StreamSource::Fixed(fixed) = &r.mode_at(0).stream {
        return Some(name(policy.upstream_of(Some(i), policy.stream(fixed))));
    }
    policy
        .streams()
        .iter()
        .all(|s| s.upstream.is_none())
        .then(|| name(crate::policy::UpstreamId::DEFAULT))
}

fn until_text(d: crate::policy::Disable) -> Option<String> {
    match d {
        crate::policy::Disable::Until(t) => {
            time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(t.0) * 1_000_000)
                .ok()
                .and_then(|t| {
                    t.format(&time::format_description::well_known::Rfc3339)
                        .ok()
                })
        }
        _ => None,
    }
}

/// The upstream `?upstream=NAME` names (none: `default`), or the 404 problem naming the
/// upstreams there are.
fn named_upstream(s: &AdminState, uri: &axum::http::Uri) -> Result<Arc<Upstream>, String> {
    let name = form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "upstream")
        .map(|(_, v)| v.into_owned());
    let table = s.upstreams.table();
    let Some(name) = name else {
        return Ok(Arc::clone(table.default_upstream()));
    };
    table.named(&name).cloned().ok_or_else(|| {
        let names: Vec<&str> = table.iter().map(|up| &*up.name).collect();
        format!(
            "no upstream {name:?}; this proxy's are {}",
            names.join(", ")
        )
    })
}

/// `up`'s pressure view, with its name under `upstream`.
fn pressure_view(up: &Upstream) -> Response {
    let mut view = serde_json::to_value(up.pressure.view()).unwrap_or_default();
    if let Some(fields) = view.as_object_mut() {
        fields.insert("upstream".into(), serde_json::Value::from(&*up.name));
    }
    Json(view).into_response()
}

fn no_such_upstream(detail: &str) -> Response {
    problem(StatusCode::NOT_FOUND, "No such upstream", detail)
}

/// `GET /pressure[?upstream=NAME]`: that upstream's pressure (`default` without a name).
async fn get_pressure(State(s): State<AdminState>, uri: axum::http::Uri) -> Response {
    match named_upstream(&s, &uri) {
        Ok(up) => pressure_view(&up),
        Err(detail) => no_such_upstream(&detail),
    }
}

/// `PUT /pressure` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pin {
    pin: f64,
}

/// `PUT /pressure[?upstream=NAME]`: pins that upstream's pressure (`default` without a name);
/// the others keep theirs.
async fn pin_pressure(
    State(s): State<AdminState>,
    uri: axum::http::Uri,
    body: axum::body::Bytes,
) -> Response {
    let up = match named_upstream(&s, &uri) {
        Ok(up) => up,
        Err(detail) => return no_such_upstream(&detail),
    };
    let pin = serde_json::from_slice::<Pin>(&body)
        .map_err(|e| format!("expected {{\"pin\": <0.0..=1.0>}}: {e}"))
        .and_then(|p| {
            Pressure::new(p.pin).ok_or_else(|| format!("pin must be in [0, 1], got {}", p.pin))
        });
    let gauge = &up.pressure;
    match pin {
        Ok(p) => {
            gauge.pin(Some(p));
            up.metrics.pressure.set(p.get());
            up.metrics.pressure_pinned.set(1.0);
            tracing::warn!(
                upstream = &*up.name,
                pressure = p.get(),
                "pressure pinned by operator"
            );
            pressure_view(&up)
        }
        Err(detail) => problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid pressure pin",
            &detail,
        ),
    }
}

/// `DELETE /pressure[?upstream=NAME]`: unpins that upstream's pressure (`default` without a
/// name).
async fn unpin_pressure(State(s): State<AdminState>, uri: axum::http::Uri) -> Response {
    let up = match named_upstream(&s, &uri) {
        Ok(up) => up,
        Err(detail) => return no_such_upstream(&detail),
    };
    up.pressure.pin(None);
    up.metrics.pressure_pinned.set(0.0);
    tracing::info!(upstream = &*up.name, "pressure unpinned");
    pressure_view(&up)
}

fn problem(status: StatusCode, title: &str, detail: &str) -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    (
        status,
        [(header::CONTENT_TYPE, PROBLEM_JSON)],
        body.to_string(),
    )
        .into_response()
}
