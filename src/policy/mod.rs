//! The policy: stream classes and extraction, areas and ranks, the curve. Parsed from the
//! files in a policy directory, validated and compiled into an immutable [`Policy`]
//! (docs/operations.md "Policy files and hot reload";
//! docs/decision.md "Areas").

mod class;
mod compile;
pub mod coverage;
pub mod curve;
mod error;
pub mod file;
pub mod geo;
mod opaque;
pub mod path;
mod region_file;
mod regions;
mod routes;
pub mod schedule;
mod source;
#[cfg(test)]
mod tests;
mod upstreams;

use std::time::Duration;

use h3o::{CellIndex, LatLng, Resolution};
use serde::{Deserialize, Serialize};

pub use class::{Class, ClassPolicy, Disable};
pub use compile::{Compiled, compile, load_dir};
pub use curve::{BANDS, Curve, Rank, band};
pub use error::{Location, PolicyError, Warning};
pub use regions::{MAX_REGION_FILE_BYTES, MAX_REGION_POSITIONS};
pub use source::PolicyFiles;
pub use upstreams::{
    DEFAULT_UPSTREAM, MAX_UPSTREAMS, NO_UPSTREAM_LABEL, UpstreamId, UpstreamSpec, loops_to,
    parse_url,
};

use crate::extract::Extractor;
use crate::extract::formats::{ContentMode, Format};

/// The stream file's name inside a policy directory. Required.
pub const STREAMS_FILE: &str = "streams.toml";
/// The area file's name inside a policy directory. Optional: without it every place has the
/// default rank.
pub const AREAS_FILE: &str = "areas.toml";
/// Stream name (and metric label) for streams the policy does not name. Reserved: a stream
/// of this name in `streams.toml` is refused.
pub const UNKNOWN_STREAM: &str = "unknown";
/// Area name (and metric label) for places no configured area covers. Reserved: an area of
/// this name in `areas.toml` is refused.
pub const UNCONFIGURED_AREA: &str = "unconfigured";
/// Default `stale_after`: 30 s (the geographic seed's `STALE_AFTER_SECONDS`).
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(30);
/// Default `[defaults] freshness_share`: a tenth of the in-flight capacity may be floor
/// admissions at once, so the floor keeps devices on the map without becoming the overload
/// (docs/decision.md "Devices").
pub const DEFAULT_FRESHNESS_SHARE: f64 = 0.1;
/// The H3 resolution of the area key (docs/decision.md "Areas": about a metropolitan area).
pub const AREA_RESOLUTION: Resolution = Resolution::Four;

/// The grammar of names that become metric labels (streams, areas and schedules): 1..=64
/// characters of `[A-Za-z0-9_.-]`, so no two names can render as one label value (`\` and `"`
/// are escaped in the exposition format, which made `dock\A` and `dock\\A` collide) and a
/// header value can name any of them.
fn label_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Whether a later event supersedes this one (docs/decision.md "Supersession first").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Supersession {
    /// A later event replaces this one: sheddable.
    SelfSuperseding,
    /// Nothing resends it: never shed, at any pressure.
    Never,
}

/// `Retry-After` policy: delay-seconds grow from `base` at pressure 0.5 to `5 × base` at
/// pressure 1, jittered, clamped to `[1, max]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryAfterPolicy {
    /// Seconds at pressure 0.5 (at least 1).
    pub base: u32,
    /// Largest value, seconds (at least 1).
    pub max: u32,
}

impl Default for RetryAfterPolicy {
    fn default() -> Self {
        RetryAfterPolicy { base: 1, max: 30 }
    }
}

/// Enforce decisions, or only count them (docs/decision.md "Decision rule", step 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Shed what the rule says.
    Enforce,
    /// Count would-sheds, admit everything.
    Warn,
}

/// Index of a stream in a [`Policy`]. Valid only for the policy that issued it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(u32);

impl StreamId {
    /// The index, for per-stream tables built beside a policy.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Index of an area in a [`Policy`]. Valid only for the policy that issued it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AreaId(u32);

impl AreaId {
    /// The index, for per-area tables built beside a policy.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One stream's compiled policy.
#[derive(Debug, Clone)]
pub struct StreamPolicy {
    /// The stream name, as matched against requests.
    pub name: String,
    /// Sheddable or not.
    pub supersession: Supersession,
    /// Priority class.
    pub class: Class,
    /// Events older than this are stale.
    pub stale_after: Duration,
    /// Enforce or warn.
    pub mode: Mode,
    /// Live disable: while active, every event of this (sheddable) stream is shed, reason
    /// `disabled`.
    pub disabled: Disable,
    /// Its format preset (for bodies of this stream read without a route).
    pub format: Format,
    /// How its bodies are read, per content mode of the format (at least one; the first is
    /// the default).
    pub modes: Vec<StreamMode>,
    /// Where its latency samples are learned, by name ([`crate::pressure::costs`]).
    pub cost_slot: crate::pressure::CostSlot,
    /// The freshness floor of its devices (`max_silence`; `None`: off), unless the route
    /// sets its own ([`Policy::max_silence`]).
    pub max_silence: Option<Duration>,
    /// The upstream its requests go to where their route names none (`None`: `default`;
    /// [`Policy::upstream_of`]).
    pub upstream: Option<UpstreamId>,
}

/// How one content mode of a stream's bodies is read (without a route).
#[derive(Debug, Clone)]
pub struct StreamMode {
    /// The content mode (from `Content-Type`).
    pub mode: ContentMode,
    /// Where its events keep their facts.
    pub extractor: Extractor,
    /// A header holding the event time (CloudEvents binary mode: `ce-time`).
    pub time_header: Option<http::HeaderName>,
    /// Headers naming the device when the body does not ([`Format::device_headers`]).
    pub device_headers: Vec<http::HeaderName>,
}

impl StreamPolicy {
    /// The default mode's extractor (the first).
    pub fn extractor(&self) -> &Extractor {
        &self.modes[0].extractor
    }

    /// The mode a body with this `Content-Type` is read in: the format's mode for it, else
    /// the first.
    pub fn read_mode(&self, content_type: Option<&[u8]>) -> &StreamMode {
        &self.modes[ContentMode::pick(content_type, self.modes.iter().map(|m| m.mode))]
    }
}

/// Where a route's requests name their stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamSource {
    /// The proxy's stream header (`--stream-header`).
    DefaultHeader,
    /// A named header.
    Header(http::HeaderName),
    /// Fixed for the route.
    Fixed(String),
    /// A named header whose value is mapped, else prefixed, like a body field: CloudEvents'
    /// `ce-type` in binary mode is the same attribute as `/type` in structured mode, so it
    /// must name the same stream.
    MappedHeader {
        /// The header.
        name: http::HeaderName,
        /// Header value → stream name.
        map: std::collections::BTreeMap<String, String>,
        /// Put before an unmapped value.
        prefix: String,
    },
    /// A body field (per event), mapped, else prefixed.
    Field {
        /// Field value → stream name.
        map: std::collections::BTreeMap<String, String>,
        /// Put before an unmapped value.
        prefix: String,
    },
}

impl StreamSource {
    /// The stream name a body field value (or a mapped header's value) stands for.
    pub fn map_field(&self, value: &str) -> Option<String> {
        match self {
            StreamSource::Field { map, prefix }
            | StreamSource::MappedHeader { map, prefix, .. } => Some(
                map.get(value)
                    .cloned()
                    .unwrap_or_else(|| format!("{prefix}{value}")),
            ),
            _ => None,
        }
    }
}

/// How one content mode of a route is read.
#[derive(Debug, Clone)]
pub struct RouteMode {
    /// Where its events and facts are.
    pub extractor: Extractor,
    /// Where its stream comes from.
    pub stream: StreamSource,
    /// A header holding the event time (CloudEvents binary mode: `ce-time`).
    pub time_header: Option<http::HeaderName>,
    /// Headers naming the device when the body does not, all of them together
    /// ([`Format::device_headers`]).
    pub device_headers: Vec<http::HeaderName>,
    /// The route only names the stream: its events are read with the stream's own pointers
    /// (format `pointers` without pointer overrides).
    pub stream_pointers: bool,
}

/// A route: a path prefix with its format and stream source.
#[derive(Debug, Clone)]
pub struct Route {
    /// The prefix.
    pub prefix: String,
    /// The format preset.
    pub format: Format,
    /// The JSON body answered to a stale event on this route: the route's `stale_body`, else
    /// the format's success body ([`Format::success_body`]); `None`: the problem document.
    pub stale_body: Option<bytes::Bytes>,
    /// The route's `max_silence` (`None`: its stream's applies).
    pub max_silence: Option<Duration>,
    /// The upstream its requests go to, whatever their stream (`None`: the stream's, else
    /// `default`; [`Policy::upstream_of`]).
    pub upstream: Option<UpstreamId>,
    modes: Vec<(ContentMode, RouteMode)>,
}

impl Route {
    /// Index of the mode for this `Content-Type` (CloudEvents has three content modes; every
    /// other format one), for [`Route::mode_at`].
    pub fn mode_index(&self, content_type: Option<&[u8]>) -> usize {
        ContentMode::pick(content_type, self.modes.iter().map(|(m, _)| *m))
    }

    /// The mode at an index from [`Route::mode_index`] (the first mode if out of range).
    pub fn mode_at(&self, index: usize) -> &RouteMode {
        &self.modes.get(index).unwrap_or(&self.modes[0]).1
    }
}

/// One configured area.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Area {
    /// Name (metric label).
    pub name: String,
    /// Rank.
    pub rank: Rank,
    /// Number of resolution-4 cells it covers (after expanding coarser cells).
    pub cells: usize,
    /// The cells its `cells` key lists, in their canonical form (15 lower-case hex digits),
    /// as written order.
    pub listed_cells: Vec<String>,
}

/// The policy's lookup tables on the request path (stream name to stream, resolution-4 cell
/// to area), hashed with foldhash instead of std's SipHash. Their keys are the operator's
/// (the policy files'), never a client's, so a client cannot choose colliding keys; a request
/// only looks up. `scripts/instructions.sh` (callgrind, 4,000 POSTs): 64,853 instructions per
/// request with SipHash, 64,525 with this; `cargo bench --bench decision`,
/// `part/arcswap-load-and-stream-lookup`: 54 ns with SipHash, 24–25 ns with this.
pub(crate) type Lookup<K, V> = foldhash::HashMap<K, V>;

/// A compiled, validated, immutable policy. Its upstreams' methods are in `upstreams.rs`.
#[derive(Debug, Clone)]
pub struct Policy {
    version: String,
    streams: Vec<StreamPolicy>,
    stream_index: Lookup<String, StreamId>,
    routes: Vec<Route>,
    areas: Vec<Area>,
    cells: Lookup<u64, AreaId>,
    /// Where `cells` may be: a point elsewhere is in no area without its cell computed.
    coverage: coverage::Coverage,
    default_rank: Rank,
    curve: Curve,
    mode: Mode,
    stale_status: http::StatusCode,
    freshness_share: f64,
    classes: [ClassPolicy; 3],
    retry_after: RetryAfterPolicy,
    schedules: Vec<schedule::Schedule>,
    trust: DeviceTrust,
    upstreams: Vec<UpstreamSpec>,
    upstream_index: Lookup<String, UpstreamId>,
    upstreams_named_at: Option<Location>,
    upstreams_at: Vec<Option<Location>>,
    streams_leave_default: bool,
}

/// What a device id must be for a decision to read its device's history (docs/decision.md
/// "Devices", "What is trusted"): `[defaults] device_placeholders` and `max_speed`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceTrust {
    /// Ids that name no device besides the built-in ones, lower case
    /// ([`crate::extract::placeholder::is_placeholder`]).
    pub placeholders: Vec<Box<str>>,
    /// The fastest a device moves, metres per second (finite, positive).
    pub max_speed: f64,
}

impl DeviceTrust {
    /// `max_speed` when the policy sets none: 300 m/s, an airliner's cruise with room
    /// (about 250 m/s), so no vehicle a fleet tracks is taken for two.
    pub const DEFAULT_MAX_SPEED: f64 = 300.0;
}

impl Default for DeviceTrust {
    fn default() -> Self {
        DeviceTrust {
            placeholders: Vec::new(),
            max_speed: DeviceTrust::DEFAULT_MAX_SPEED,
        }
    }
}

impl Policy {
    /// Content hash of the policy files: the first 12 hex digits of SHA-256 over each file's
    /// name and bytes. Equal files give equal versions.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Looks a stream up by its exact name.
    pub fn stream(&self, name: &str) -> Option<StreamId> {
        self.stream_index.get(name).copied()
    }

    /// The policy of a stream id this policy issued.
    pub fn stream_policy(&self, id: StreamId) -> &StreamPolicy {
        &self.streams[id.index()]
    }

    /// All streams, in id order.
    pub fn streams(&self) -> &[StreamPolicy] {
        &self.streams
    }

    /// All routes, in file order.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// Index (into [`Policy::routes`]) of the route of a request path: the longest prefix
    /// that matches at a segment boundary. The proxy passes the normalised path
    /// ([`path::route_path`]).
    pub fn route_index(&self, path: &str) -> Option<usize> {
        self.routes
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                path.strip_prefix(r.prefix.as_str()).is_some_and(|rest| {
                    rest.is_empty() || rest.starts_with('/') || r.prefix.ends_with('/')
                })
            })
            .max_by_key(|(_, r)| r.prefix.len())
            .map(|(i, _)| i)
    }

    /// All areas, in id order.
    pub fn areas(&self) -> &[Area] {
        &self.areas
    }

    /// The area of an id this policy issued.
    pub fn area(&self, id: AreaId) -> &Area {
        &self.areas[id.index()]
    }

    /// Rank of places no area covers.
    pub fn default_rank(&self) -> Rank {
        self.default_rank
    }

    /// The shed curve.
    pub fn curve(&self) -> Curve {
        self.curve
    }

    /// The global mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// What a device id must be to be trusted.
    pub fn device_trust(&self) -> &DeviceTrust {
        &self.trust
    }

    /// The status answered to stale sheds.
    pub fn stale_status(&self) -> http::StatusCode {
        self.stale_status
    }

    /// `[defaults] freshness_share`: the share of the in-flight capacity class budgets use
    /// that floor admissions may hold at once, in `(0, 1]` (docs/decision.md "Devices").
    pub fn freshness_share(&self) -> f64 {
        self.freshness_share
    }

    /// The freshness floor of a fix of `stream` that came on `route` (an index into
    /// [`Policy::routes`]): the route's `max_silence`, else the stream's; `None`: off.
    pub fn max_silence(&self, stream: StreamId, route: Option<usize>) -> Option<Duration> {
        route
            .and_then(|i| self.routes.get(i))
            .and_then(|r| r.max_silence)
            .or(self.stream_policy(stream).max_silence)
    }

    /// The body answered (as `application/json`) to a stale event that came on `route` (an
    /// index into [`Policy::routes`]) of `stream`: the route's stale body (its `stale_body`
    /// or its format's), else the success body of the stream's own format
    /// ([`Format::success_body`]; a route that only names the stream reads it in the
    /// stream's format). `None` (the problem
    /// document) when neither has one, and whenever the stale status is not a 2xx that
    /// carries content (a 4xx is no success, and 204 and 205 have no body, RFC 9110
    /// sections 15.3.5 and 15.3.6). Only stale answers use it: a 503 never carries a
    /// success body.
    pub fn stale_body(
        &self,
        route: Option<usize>,
        stream: Option<StreamId>,
    ) -> Option<bytes::Bytes> {
        let status = self.stale_status.as_u16();
        if !self.stale_status.is_success() || status == 204 || status == 205 {
            return None;
        }
        let of_stream = || {
            stream
                .and_then(|id| self.streams[id.index()].format.success_body())
                .map(|b| bytes::Bytes::from_static(b.as_bytes()))
        };
        route
            .and_then(|i| self.routes.get(i))
            .and_then(|r| r.stale_body.clone())
            .or_else(of_stream)
    }

    /// A class's policy.
    pub fn class(&self, class: Class) -> &ClassPolicy {
        &self.classes[class.index()]
    }

    /// The schedules (`[[schedules]]`), in file order.
    pub fn schedules(&self) -> &[schedule::Schedule] {
        &self.schedules
    }

    /// The `Retry-After` policy.
    pub fn retry_after(&self) -> RetryAfterPolicy {
        self.retry_after
    }

    /// The cost slot of `stream`'s latency samples ([`crate::pressure::costs`]); requests of
    /// no known stream share [`crate::pressure::CostSlot::NONE`].
    pub fn cost_slot(&self, stream: Option<StreamId>) -> crate::pressure::CostSlot {
        stream.map_or(crate::pressure::CostSlot::NONE, |id| {
            self.stream_policy(id).cost_slot
        })
    }

    /// The class of a stream (`None`: unknown, which is `critical`).
    pub fn class_of(&self, stream: Option<StreamId>) -> Class {
        stream.map_or(Class::Critical, |id| self.streams[id.index()].class)
    }

    /// Number of resolution-4 cells with a configured area.
    pub fn cell_count(&self) -> usize {
        self.cells.len()
    }

    /// Bytes held by the cell table, estimated from its capacity: each slot holds a `u64`
    /// cell and a `u32` area id (16 bytes with padding) plus one control byte (hashbrown).
    pub fn cell_table_bytes(&self) -> usize {
        self.cells.capacity() * (std::mem::size_of::<(u64, AreaId)>() + 1)
    }

    /// The area and rank at validated coordinates (degrees; the caller checked the ranges,
    /// see [`crate::extract::Coordinates::new`]). Unconfigured places get
    /// `(None, default_rank)`.
    pub fn area_at(&self, lat: f64, lon: f64) -> (Option<AreaId>, Rank) {
        match self.locate(lat, lon) {
            Some(cell) => self.area_of_cell(cell),
            None => (None, self.default_rank),
        }
    }

    /// The resolution-4 cell of a point (degrees, range-checked) that may be in a configured
    /// area; `None` for a point far from every area ([`coverage`]: its area is none and its
    /// rank the default, without the 200–400 ns of [`Policy::cell_at`]) or not finite.
    pub fn locate(&self, lat: f64, lon: f64) -> Option<CellIndex> {
        if !self.coverage.may_hold(lat, lon) {
            return None;
        }
        Self::cell_at(lat, lon)
    }

    /// The resolution-4 cell of a point, degrees (`None`: not finite; range-check first, as
    /// [`crate::extract::Coordinates::new`] does). 200–400 ns (docs/dependencies.md "h3o").
    pub fn cell_at(lat: f64, lon: f64) -> Option<CellIndex> {
        LatLng::new(lat, lon)
            .ok()
            .map(|ll| ll.to_cell(AREA_RESOLUTION))
    }

    /// The area and rank of a resolution-4 cell.
    pub fn area_of_cell(&self, cell: CellIndex) -> (Option<AreaId>, Rank) {
        match self.cells.get(&u64::from(cell)) {
            Some(&id) => (Some(id), self.areas[id.index()].rank),
            None => (None, self.default_rank),
        }
    }
}
