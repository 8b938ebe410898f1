//! `POST|GET|DELETE /policy/preview`: a candidate policy decided in shadow on the live traffic
//! for a window (docs/operations.md "Replay and preview"; [`crate::record::preview`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::{AdminState, problem};
use crate::clock::UnixMillis;
use crate::policy::{PolicyFiles, compile};
use crate::record::Preview;

/// Longest preview window, seconds: a day.
pub const MAX_SECONDS: u64 = 24 * 3600;

/// Preview window when the request names none, seconds.
pub const DEFAULT_SECONDS: u64 = 600;

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
}

/// `POST /policy/preview`: compiles the candidate and starts deciding in its shadow now, for
/// the window asked, replacing any preview before it. 200 with the candidate's version and
/// window; 422 problem+json naming file, line and field when it does not compile; 400 for a
/// window out of range. The live policy is untouched either way.
pub(super) async fn start(State(s): State<AdminState>, Json(body): Json<Start>) -> Response {
    let seconds = body.seconds.unwrap_or(DEFAULT_SECONDS);
    if !(1..=MAX_SECONDS).contains(&seconds) {
        return problem(
            StatusCode::BAD_REQUEST,
            "Preview window out of range",
            &format!("seconds is {seconds}; give 1 to {MAX_SECONDS}"),
        );
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
    let now = s.store.sources().now();
    #[expect(clippy::cast_possible_wrap, reason = "at most a day of milliseconds")]
    let until = UnixMillis(now.0 + (seconds * 1000) as i64);
    let preview = Preview::new(compiled.policy, now, until, s.max_devices);
    let report = preview.report(now);
    s.records.preview.store(Some(Arc::new(preview)));
    tracing::info!(
        candidate = %report.candidate,
        seconds,
        "policy preview started: requests are decided in its shadow"
    );
    let warnings: Vec<String> = compiled.warnings.iter().map(ToString::to_string).collect();
    Json(serde_json::json!({
        "candidate": report.candidate,
        "live": s.store.load().policy.version(),
        "started": report.started,
        "until": report.until,
        "warnings": warnings,
    }))
    .into_response()
}

/// `GET /policy/preview`: the counts so far (running or ended), by stream, area and band; 404
/// when no preview was started.
pub(super) async fn show(State(s): State<AdminState>) -> Response {
    match s.records.preview.load().as_deref() {
        Some(p) => Json(p.report(s.store.sources().now())).into_response(),
        None => problem(
            StatusCode::NOT_FOUND,
            "No policy preview",
            "start one with POST /policy/preview (shedgate preview DIR)",
        ),
    }
}

/// `DELETE /policy/preview`: stops the preview and forgets its counts (204).
pub(super) async fn stop(State(s): State<AdminState>) -> Response {
    s.records.preview.store(None);
    StatusCode::NO_CONTENT.into_response()
}
