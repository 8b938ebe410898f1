//! The policy files' schema: serde only, `deny_unknown_fields`, with single-value checks done
//! by the value types themselves so that a bad value is reported at its own line.

use std::collections::BTreeMap;
use std::time::Duration;

use h3o::{CellIndex, Resolution};
use serde::Deserialize;

use super::Rank;
use super::{Class, Mode, Supersession};
use crate::extract::JsonPointer;

/// `streams.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamsFile {
    /// Policy-wide defaults.
    #[serde(default)]
    pub defaults: DefaultsSection,
    /// Stream name → its policy. Names are matched exactly against the request's stream.
    #[serde(default)]
    pub streams: BTreeMap<String, StreamSection>,
    /// Routes: path prefixes with their own format and stream source.
    #[serde(default)]
    pub routes: Vec<RouteSection>,
    /// Priority classes: budgets, mode, live disable.
    #[serde(default)]
    pub classes: BTreeMap<Class, ClassSection>,
    /// `Retry-After` policy.
    pub retry_after: Option<RetryAfterSection>,
    /// Known peaks: pressure floors on a weekly schedule.
    #[serde(default)]
    pub schedules: Vec<ScheduleSection>,
    /// Upstream name → where it is and its own settings, besides `default` (`--upstream`).
    #[serde(default)]
    pub upstreams: BTreeMap<String, UpstreamSection>,
}

/// `[upstreams.NAME]` in `streams.toml` (docs/policy.md "`[upstreams.NAME]`"): an upstream
/// routes and streams name with `upstream = "NAME"`. Each key left out is the command line's
/// value (the flag named beside it).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSection {
    /// Base URL, `http://host:port[/prefix]`, as `--upstream`. Spanned: its errors point at it.
    pub url: toml::Spanned<String>,
    /// Latency considered at target, pressure 0.5 (`--latency-target`). Spanned, as `url`.
    pub latency_target: Option<toml::Spanned<DurationValue>>,
    /// Safety cap on in-flight requests to this upstream, positive (`--max-inflight`).
    /// Spanned, as `url`.
    pub max_inflight: Option<toml::Spanned<u32>>,
    /// Time it has to send response headers (`--upstream-timeout`). Spanned, as `url`.
    pub timeout: Option<toml::Spanned<DurationValue>>,
    /// Time to connect to it (`--connect-timeout`).
    pub connect_timeout: Option<DurationValue>,
    /// Time an idle connection to it may be reused (`--pool-idle-timeout`).
    pub pool_idle_timeout: Option<DurationValue>,
    /// Idle connections to it kept (`--pool-max-idle`).
    pub pool_max_idle: Option<u32>,
    /// The ORCA metric read as its utilisation (`--load-report`). Spanned, as `url`.
    pub load_report: Option<toml::Spanned<String>>,
}

/// `[[schedules]]` in `streams.toml` (docs/decision.md "Schedules").
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSection {
    /// Name, the `schedule` metric label: 1..=64 characters of `[A-Za-z0-9_.-]`, unique.
    pub name: String,
    /// Days the window opens (`mon` … `sun`); all days when absent.
    pub days: Option<Vec<String>>,
    /// Opening civil time, `HH:MM`.
    pub start: String,
    /// Closing civil time, `HH:MM`; before `start` when the window crosses midnight.
    pub end: String,
    /// IANA time zone name (`Europe/Berlin`).
    pub timezone: String,
    /// Pressure is at least this while the window is open, `(0, 1]`.
    pub pressure_floor: f64,
}

/// `[classes.NAME]` in `streams.toml` (docs/decision.md "Priority classes and budgets").
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassSection {
    /// Share of this replica's in-flight capacity this class may hold, `(0, 1]`: the
    /// `--max-inflight` cap if set, else the in-flight the controller holds at full use (its
    /// learned concurrency share times 1.25). Sheddable requests over it are shed (reason
    /// `budget`) unless capacity is idle (borrowing).
    pub budget: Option<f64>,
    /// For `never` streams of this class over the budget: wait up to this long for room, then
    /// answer 503 + `Retry-After` (reason `budget`). Without it, `never` streams ignore the
    /// budget.
    pub wait: Option<DurationValue>,
    /// An admitted request of this class whose upstream answer has not begun within this
    /// long of its admission is answered 504 (`kind="class_timeout"`), its slot and budget
    /// share freed at once.
    pub max_request_time: Option<DurationValue>,
    /// `enforce` or `warn` for every stream of the class.
    pub mode: Option<Mode>,
    /// `false` sheds every sheddable stream of the class (reason `disabled`).
    pub enabled: Option<bool>,
    /// With `enabled = false`: re-enable at this time (RFC 3339).
    pub until: Option<UntilValue>,
}

/// `[retry_after]` in `streams.toml`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryAfterSection {
    /// Seconds at pressure 0.5; grows to 5 × this at pressure 1. Default 1.
    pub base: Option<u32>,
    /// Largest value, seconds. Default 30 (well under common sender timeouts).
    pub max: Option<u32>,
}

/// A time given as RFC 3339 (`2026-12-01T06:00:00Z`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct UntilValue(pub crate::clock::UnixMillis);

impl TryFrom<String> for UntilValue {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        time::OffsetDateTime::parse(&text, &time::format_description::well_known::Rfc3339)
            .ok()
            .and_then(|t| i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok())
            .map(|ms| UntilValue(crate::clock::UnixMillis(ms)))
            .ok_or_else(|| {
                format!("until must be an RFC 3339 time like 2026-12-01T06:00:00Z, got {text:?}")
            })
    }
}

/// `[[routes]]` in `streams.toml`: requests whose path starts with `prefix` (at a segment
/// boundary) are read with this format and take their stream from this source. At most one
/// of `stream`, `stream_header` and `stream_field`; without any, the format's default.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSection {
    /// Path prefix, starting with `/`.
    pub prefix: String,
    /// Format preset; default `pointers`.
    pub format: Option<crate::extract::formats::Format>,
    /// Every request on this route is of this stream (senders that cannot set headers).
    pub stream: Option<String>,
    /// The stream is this header's value.
    pub stream_header: Option<String>,
    /// The stream is this body field's value (per event in a batch).
    pub stream_field: Option<JsonPointer>,
    /// Put before a body field's value to make the stream name (`owntracks.` for OwnTracks).
    pub stream_prefix: Option<String>,
    /// Body field value → stream name; a value not listed is the prefix plus the value.
    pub stream_map: Option<BTreeMap<String, String>>,
    /// Latitude pointer, relative to the event (overrides the preset).
    pub lat: Option<JsonPointer>,
    /// Longitude pointer, relative to the event.
    pub lon: Option<JsonPointer>,
    /// Time pointer, relative to the event.
    pub time: Option<JsonPointer>,
    /// Device id pointer, relative to the event (overrides the preset's): the field unique
    /// to one device (docs/decision.md "Devices").
    pub device: Option<JsonPointer>,
    /// Query or form keys that hold the facts, read before the JSON pointers (see
    /// [`crate::extract::ParamKeys`]); overrides a preset's (`osmand`).
    pub params: Option<ParamsSection>,
    /// The JSON body answered (as `application/json`) to a stale event on this route,
    /// instead of the format's success body or the problem document: what this route's
    /// sender counts as delivered. Must be valid JSON.
    pub stale_body: Option<toml::Spanned<String>>,
    /// The freshness floor of this route's devices (overrides the stream's `max_silence`).
    pub max_silence: Option<DurationValue>,
    /// The upstream this route's requests go to, by name (over its streams' `upstream`).
    /// Spanned: an unknown name points at it.
    pub upstream: Option<toml::Spanned<String>>,
}

/// `params = { lat = "…", lon = "…", time = "…" }` on a route: query or form keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamsSection {
    /// Latitude key.
    pub lat: String,
    /// Longitude key.
    pub lon: String,
    /// Time key; without it, an event read from the query or a form has no readable time
    /// (never stale).
    pub time: Option<String>,
    /// Device id key (GPSLogger's `%AID`, say: its `%SER` is `unknown` from Android 8 on);
    /// without it, such requests name no device.
    pub device: Option<String>,
}

/// `[defaults]` in `streams.toml`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefaultsSection {
    /// Curve band in ranks, `[0, 50]`; default 25. Spanned: a range error points at it.
    pub band: Option<toml::Spanned<f64>>,
    /// Curve ramp in pressure units, `[0, 0.5]`; default 0.05. Spanned, as `band`.
    pub ramp: Option<toml::Spanned<f64>>,
    /// Default `stale_after` for streams that set none; default 30 s.
    pub stale_after: Option<DurationValue>,
    /// Global mode: `warn` makes every stream warn-only; default `enforce`.
    pub mode: Option<Mode>,
    /// Status answered to stale sheds; default 202.
    pub stale_status: Option<StaleStatus>,
    /// The fastest a device moves, metres per second: a fix farther from its device's newest
    /// delivered one than this allows was sent by another device; default 300. Spanned, as
    /// `band`.
    pub max_speed: Option<toml::Spanned<f64>>,
    /// Device ids that name no device, besides the built-in ones
    /// ([`crate::extract::placeholder::PLACEHOLDERS`]), compared case-insensitively.
    pub device_placeholders: Option<Vec<String>>,
    /// Share of the in-flight capacity the freshness floor may hold, `(0, 1]`; default 0.1.
    /// Spanned, as `band`.
    pub freshness_share: Option<toml::Spanned<f64>>,
}

/// `[streams."NAME"]` in `streams.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamSection {
    /// Required: whether a later event supersedes this one.
    pub supersession: Supersession,
    /// Priority class; default `important` (budgets come with classes).
    pub class: Option<Class>,
    /// Age past which an event is stale; default from `[defaults]`.
    pub stale_after: Option<DurationValue>,
    /// `enforce` (default) or `warn`.
    pub mode: Option<Mode>,
    /// `false` sheds every event of a sheddable stream (reason `disabled`); default `true`.
    pub enabled: Option<bool>,
    /// With `enabled = false`: re-enable at this time (RFC 3339), so a forgotten switch does
    /// not shed forever.
    pub until: Option<UntilValue>,
    /// JSON pointer to the latitude; default `/lat`.
    pub lat: Option<JsonPointer>,
    /// JSON pointer to the longitude; default `/lon`.
    pub lon: Option<JsonPointer>,
    /// JSON pointer to the event time; default `/occurred_at`.
    pub time: Option<JsonPointer>,
    /// JSON pointer to the device id; default none (the preset's, if it has one).
    pub device: Option<JsonPointer>,
    /// Format preset of this stream's bodies when the stream comes from a header; default
    /// `pointers`. `lat`, `lon`, `time` override the preset's pointers.
    pub format: Option<crate::extract::formats::Format>,
    /// The freshness floor: a fresh fix of a device silent longer than this is admitted
    /// even where the curve sheds its whole rank; default none (off).
    pub max_silence: Option<DurationValue>,
    /// The upstream its requests go to, by name, where their route names none; default
    /// `default` (`--upstream`). Spanned: an unknown name points at it.
    pub upstream: Option<toml::Spanned<String>>,
}

/// `areas.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AreasFile {
    /// Rank of places no area covers; default 50.
    pub default_rank: Option<Rank>,
    /// The configured areas.
    #[serde(default)]
    pub areas: Vec<AreaSection>,
}

/// `[[areas]]` in `areas.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AreaSection {
    /// Name, used as the metric label; unique, `[A-Za-z0-9_.-]`, at most 64 characters.
    pub name: String,
    /// Rank, `1..=100`, lower is more important.
    pub rank: Rank,
    /// H3 cells at resolution 0..=4 (a coarser cell stands for all its resolution-4 children).
    #[serde(default)]
    pub cells: Vec<CellSpec>,
    /// A GeoJSON file of Polygons / MultiPolygons, relative to the policy directory.
    pub geojson: Option<RegionPath>,
    /// With `geojson`: only the features whose `properties.name` equals this.
    pub feature: Option<String>,
}

/// A path to a region file: relative, inside the policy directory (no `..`), so the
/// directory is the whole policy (what is watched and hashed).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub struct RegionPath(pub String);

impl TryFrom<String> for RegionPath {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let path = std::path::Path::new(&text);
        let inside = !text.is_empty()
            && path.is_relative()
            && path.components().all(|c| {
                matches!(
                    c,
                    std::path::Component::Normal(_) | std::path::Component::CurDir
                )
            });
        if inside {
            Ok(RegionPath(text))
        } else {
            Err(format!(
                "geojson path {text:?} must be relative and inside the policy directory"
            ))
        }
    }
}

/// A duration written the humane way (`"30s"`, `"1m 30s"`, `"250ms"`); must be positive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct DurationValue(pub Duration);

impl TryFrom<String> for DurationValue {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        match humantime::parse_duration(&text) {
            Ok(d) if !d.is_zero() => Ok(DurationValue(d)),
            Ok(_) => Err(format!("duration must be positive, got {text:?}")),
            Err(e) => Err(format!(
                "invalid duration {text:?} ({e}); write e.g. \"30s\" or \"250ms\""
            )),
        }
    }
}

/// A status for stale sheds: 2xx or a non-retryable 4xx. Never 410 (webhook senders disable
/// an endpoint on it), never 408/425/429 (senders retry those, and retrying a stale event is
/// what this status exists to prevent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "u16")]
pub struct StaleStatus(pub http::StatusCode);

impl TryFrom<u16> for StaleStatus {
    type Error = String;

    fn try_from(code: u16) -> Result<Self, String> {
        let ok = (200..300).contains(&code)
            || ((400..500).contains(&code) && ![408, 410, 425, 429].contains(&code));
        match http::StatusCode::from_u16(code) {
            Ok(s) if ok => Ok(StaleStatus(s)),
            _ => Err(format!(
                "stale_status must be 2xx or a non-retryable 4xx other than 410, got {code}"
            )),
        }
    }
}

/// An H3 cell given as a hex string, at resolution 0..=4, and the text it was written as.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct CellSpec {
    /// The cell.
    pub cell: CellIndex,
    /// As written in the file (its canonical form is `cell`'s `Display`).
    pub written: String,
}

/// Reads an H3 cell id as tools print it: hexadecimal digits, in either case, optionally after
/// `0x` (MobilityDB PR #1830, h3-js#79), with surrounding whitespace ignored. Nothing else: a
/// sign (`+8…`, which `u64::from_str_radix` and so h3o would take), inner whitespace, or other
/// characters are refused, with the form expected, rather than read one way.
///
/// # Errors
/// Text in another form, or a number that is no valid H3 cell.
pub fn parse_cell(text: &str) -> Result<CellIndex, String> {
    let trimmed = text.trim();
    let hex = trimmed
        .strip_prefix("0x")
        .or_else(|| trimmed.strip_prefix("0X"))
        .unwrap_or(trimmed);
    if hex.is_empty() || hex.len() > 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "{text:?} is not an H3 cell id: write it as its 15 hexadecimal digits, e.g. \
             \"841f1d5ffffffff\" (upper case and a 0x prefix are read too; a sign, spaces or \
             other characters are not)"
        ));
    }
    let n = u64::from_str_radix(hex, 16).map_err(|e| format!("H3 cell {text:?}: {e}"))?;
    CellIndex::try_from(n).map_err(|e| format!("{text:?} is not a valid H3 cell: {e}"))
}

impl TryFrom<String> for CellSpec {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let cell = parse_cell(&text)?;
        if cell.resolution() > Resolution::Four {
            return Err(format!(
                "H3 cell {text:?} is at resolution {}, finer than the area key's resolution 4; \
                 use its resolution-4 parent {}",
                u8::from(cell.resolution()),
                cell.parent(Resolution::Four)
                    .map(|p| p.to_string())
                    .unwrap_or_default()
            ));
        }
        Ok(CellSpec {
            cell,
            written: text,
        })
    }
}

impl TryFrom<String> for JsonPointer {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        JsonPointer::parse(&text).map_err(|e| e.to_string())
    }
}

impl<'de> Deserialize<'de> for JsonPointer {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        JsonPointer::try_from(text).map_err(serde::de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for Rank {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = i64::deserialize(d)?;
        u8::try_from(n).ok().and_then(Rank::new).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "rank must be an integer in 1..=100 (1 is the most important), got {n}"
            ))
        })
    }
}
