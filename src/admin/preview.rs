//! `POST|GET|DELETE /policy/preview`: a candidate policy decided in shadow on the live traffic
//! for a window, one at a time, each named by an id (docs/operations.md "Replay and preview";
//! [`crate::record::preview`]).

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{AdminState, problem};
use crate::clock::UnixMillis;
use crate::edge::rejection::PROBLEM_JSON;
use crate::policy::{PolicyFiles, compile};
use crate::record::Preview;
use crate::record::preview::{Busy, Fate, Found, Report};

/// Longest preview window, seconds: a day.
pub const MAX_SECONDS: u64 = 24 * 3600;

/// Preview window when the request names none, seconds.
pub const DEFAULT_SECONDS: u64 = 600;

/// Longest `by` a `POST` may give, characters.
pub const MAX_BY: usize = 200;

/// The body of `POST /policy/preview`.
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Start {
    /// The candidate's files by name: `streams.toml`, `areas.toml`, region files by the path
    /// `areas.toml` names them by.
    pub files: BTreeMap<String, String>,
    /// How long it decides, seconds, in `[1, 86400]` (default 600).
    #[serde(default)]
    pub seconds: Option<u64>,
    /// Who starts it, for the operator a second `POST` is refused in favour of: at most
    /// [`MAX_BY`] characters, no control characters (`shedgate preview` sends
    /// `user@host (shedgate preview, pid N)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// `POST /policy/preview`: compiles the candidate and, unless a preview is running, starts
/// deciding in its shadow now for the window asked. 200 with its `id`, the candidate's version
/// and the window; 409 problem+json naming the running one (`holder`: its id, candidate, `by`
/// and window); 422 naming file, line and field when the candidate does not compile; 400 for a
/// window out of range or a bad `by`. The live policy is untouched either way.
pub(super) async fn start(State(s): State<AdminState>, Json(body): Json<Start>) -> Response {
    let seconds = body.seconds.unwrap_or(DEFAULT_SECONDS);
    if !(1..=MAX_SECONDS).contains(&seconds) {
        return problem(
            StatusCode::BAD_REQUEST,
            "Preview window out of range",
            &format!("seconds is {seconds}; give 1 to {MAX_SECONDS}"),
        );
    }
    if let Some(by) = &body.by
        && (by.chars().count() > MAX_BY || by.chars().any(char::is_control))
    {
        return problem(
            StatusCode::BAD_REQUEST,
            "Bad preview owner",
            &format!("by is at most {MAX_BY} characters, without control characters"),
        );
    }
    // Refused before compiling: a busy slot should not cost a candidate's compilation.
    let sources = s.store.sources();
    if let Some(running) = s
        .records
        .preview
        .current(sources.now())
        .filter(|r| r.running)
    {
        return busy(&Busy(Box::new(running)));
    }
    let dir = std::path::Path::new("preview");
    let compiled = match PolicyFiles::from_files(dir, &body.files) {
        // Tiling regions can take a while: off the admin listener's workers.
        Ok(files) => match tokio::task::spawn_blocking(move || compile(&files)).await {
            Ok(compiled) => compiled,
            Err(e) => {
                return problem(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Candidate policy not compiled",
                    &e.to_string(),
                );
            }
        },
        Err(e) => Err(e),
    };
    let compiled = match compiled {
        Ok(c) => c,
        Err(e) => {
            return problem(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Candidate policy does not compile",
                &e.to_string(),
            );
        }
    };
    let now = sources.now();
    #[expect(clippy::cast_possible_wrap, reason = "at most a day of milliseconds")]
    let until = UnixMillis(now.0 + (seconds * 1000) as i64);
    let preview = Preview::new(
        compiled.policy,
        (now, until),
        s.max_devices,
        body.by.as_deref(),
    );
    // Checked again: another may have started while this one compiled.
    let preview = match s.records.preview.start(preview, now, || sources.draw()) {
        Ok(p) => p,
        Err(holder) => return busy(&holder),
    };
    let report = preview.report(now);
    tracing::info!(
        id = %report.id,
        candidate = %report.candidate,
        by = report.by.as_deref().unwrap_or("-"),
        seconds,
        "policy preview started: requests are decided in its shadow"
    );
    let warnings: Vec<String> = compiled.warnings.iter().map(ToString::to_string).collect();
    Json(serde_json::json!({
        "id": report.id,
        "candidate": report.candidate,
        "live": s.store.load().policy.version(),
        "by": report.by,
        "started": report.started,
        "until": report.until,
        "warnings": warnings,
    }))
    .into_response()
}

/// 409: a preview runs; the problem document names it.
fn busy(Busy(holder): &Busy) -> Response {
    let detail = format!(
        "preview {} of candidate {}{} runs until {}: wait for it to end, or stop it with \
         DELETE /policy/preview?id={}",
        holder.id,
        holder.candidate,
        holder
            .by
            .as_deref()
            .map(|by| format!(", started by {by},"))
            .unwrap_or_default(),
        holder.until,
        holder.id,
    );
    problem_with(
        StatusCode::CONFLICT,
        "A policy preview is running",
        &detail,
        &summary(holder),
    )
}

/// A problem document (RFC 9457) with a `holder` member.
fn problem_with(
    status: StatusCode,
    title: &str,
    detail: &str,
    holder: &serde_json::Value,
) -> Response {
    let body = serde_json::json!({
        "type": "about:blank",
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
        "holder": holder,
    });
    (
        status,
        [(header::CONTENT_TYPE, PROBLEM_JSON)],
        body.to_string(),
    )
        .into_response()
}

/// The `id` of a query string, if given.
fn id_of(uri: &axum::http::Uri) -> Option<String> {
    form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "id")
        .map(|(_, v)| v.into_owned())
}

/// `GET /policy/preview?id=ID`: that preview's counts (running or ended), by stream, area and
/// band; 410 when it was stopped; 404 when this proxy has no preview by that id. Without `id`:
/// the current preview's counts, or 404.
pub(super) async fn show(State(s): State<AdminState>, uri: axum::http::Uri) -> Response {
    let now = s.store.sources().now();
    let Some(id) = id_of(&uri) else {
        return match s.records.preview.current(now) {
            Some(report) => Json(report).into_response(),
            None => problem(
                StatusCode::NOT_FOUND,
                "No policy preview",
                "start one with POST /policy/preview (shedgate preview DIR)",
            ),
        };
    };
    found(&id, s.records.preview.find(&id, now))
}

/// A preview's report (running or ended), 410 for one stopped, 404 for one unknown.
fn found(id: &str, found: Found) -> Response {
    match found {
        Found::Current(report) | Found::Past(Fate::Ended(report)) => Json(report).into_response(),
        Found::Past(Fate::Stopped(at)) => problem(
            StatusCode::GONE,
            "Policy preview stopped",
            &format!("preview {id} was stopped by DELETE at {at}; its counts are gone"),
        ),
        Found::Unknown(current) => problem(
            StatusCode::NOT_FOUND,
            "No such policy preview",
            &format!(
                "no preview {id} on this proxy (restarted since, or older than the last {} \
                 previews); {}",
                crate::record::preview::REMEMBERED,
                current.as_deref().map_or_else(
                    || "none is current".to_owned(),
                    |c| format!("the current one is {c}")
                ),
            ),
        ),
    }
}

/// `DELETE /policy/preview?id=ID`: stops that preview and forgets its counts; 200 naming what
/// it stopped (`stopped`: its id, candidate, `by` and window). 400 without `id` (naming the
/// current one), 410 when it was stopped already, 404 when unknown: a `DELETE` never stops a
/// preview its sender did not name.
pub(super) async fn stop(State(s): State<AdminState>, uri: axum::http::Uri) -> Response {
    let now = s.store.sources().now();
    let Some(id) = id_of(&uri) else {
        let current = s.records.preview.current(now);
        return problem(
            StatusCode::BAD_REQUEST,
            "Which policy preview?",
            &match current {
                Some(c) => format!(
                    "name the preview to stop: DELETE /policy/preview?id=ID (the current one is \
                     {}, candidate {}{})",
                    c.id,
                    c.candidate,
                    c.by.map(|by| format!(", started by {by}"))
                        .unwrap_or_default()
                ),
                None => "name the preview to stop: DELETE /policy/preview?id=ID (none is \
                         current)"
                    .to_owned(),
            },
        );
    };
    match s.records.preview.stop(&id, now) {
        Ok(report) => {
            tracing::info!(id = %report.id, candidate = %report.candidate, "policy preview stopped");
            Json(serde_json::json!({ "stopped": summary(&report) })).into_response()
        }
        Err(what) => found(&id, what),
    }
}

/// A preview named: its id, candidate, owner and window.
fn summary(report: &Report) -> serde_json::Value {
    serde_json::json!({
        "id": report.id,
        "candidate": report.candidate,
        "by": report.by,
        "started": report.started,
        "until": report.until,
    })
}
