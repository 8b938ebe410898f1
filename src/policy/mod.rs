//! The policy: stream classes and extraction, areas and ranks, the curve. Parsed from the
//! files in a policy directory, validated and compiled into an immutable [`Policy`]
//! (PRODUCT.md "Policy files and hot reload", "Areas").

pub mod file;
pub mod geo;
pub mod reload;
pub mod store;

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use h3o::{CellIndex, LatLng, Resolution};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use store::PolicyStore;

use crate::admission::extract::Shape;
use crate::admission::formats::{ContentMode, Format, PresetStream};
use crate::admission::{Curve, Extractor, JsonPointer, Rank};
use file::{AreasFile, StreamsFile};

/// The stream file's name inside a policy directory. Required.
pub const STREAMS_FILE: &str = "streams.toml";
/// The area file's name inside a policy directory. Optional: without it every place has the
/// default rank.
pub const AREAS_FILE: &str = "areas.toml";
/// Default `stale_after`: 30 s (the geographic seed's `STALE_AFTER_SECONDS`).
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(30);
/// The H3 resolution of the area key (PRODUCT.md "Areas": about a metropolitan area).
pub const AREA_RESOLUTION: Resolution = Resolution::Four;

/// Whether a later event supersedes this one (PRODUCT.md "Supersession first").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Supersession {
    /// A later event replaces this one: sheddable.
    SelfSuperseding,
    /// Nothing resends it: never shed, at any pressure.
    Never,
}

/// Priority class (PRODUCT.md "Priority classes and budgets").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Class {
    /// Must get through. Unknown streams are `never` and `critical`.
    Critical,
    /// The default for a classified stream.
    Important,
    /// First to go.
    BestEffort,
}

impl Class {
    /// All classes, in index order.
    pub const ALL: [Class; 3] = [Class::Critical, Class::Important, Class::BestEffort];

    /// Index into per-class tables.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Critical => "critical",
            Class::Important => "important",
            Class::BestEffort => "best-effort",
        }
    }
}

/// A live-disable switch (PRODUCT.md "Priority classes and budgets").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Disable {
    /// Enabled.
    #[default]
    No,
    /// Disabled until an operator re-enables it.
    Indefinitely,
    /// Disabled until this time, then enabled again by itself (a forgotten switch must not
    /// shed forever).
    Until(crate::admission::UnixMillis),
}

impl Disable {
    /// Whether the switch is on at `now`.
    pub fn active(self, now: crate::admission::UnixMillis) -> bool {
        match self {
            Disable::No => false,
            Disable::Indefinitely => true,
            Disable::Until(until) => now < until,
        }
    }

    fn from_parts(enabled: Option<bool>, until: Option<file::UntilValue>) -> Self {
        match (enabled.unwrap_or(true), until) {
            (true, _) => Disable::No,
            (false, None) => Disable::Indefinitely,
            (false, Some(u)) => Disable::Until(u.0),
        }
    }
}

/// A class's compiled policy.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ClassPolicy {
    /// Share of `--max-inflight` this class may hold, `(0, 1]`; `None`: unlimited.
    pub budget: Option<f64>,
    /// How long a `never` request over the budget waits for room; `None`: it does not wait
    /// and ignores the budget.
    pub wait: Option<Duration>,
    /// Warn mode for the whole class.
    pub mode: Option<Mode>,
    /// Live disable of the class's sheddable streams.
    pub disabled: Disable,
}

impl ClassPolicy {
    /// In-flight requests the class may hold out of `capacity` (at least 1), if budgeted.
    pub fn limit(&self, capacity: u32) -> Option<u32> {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        self.budget
            .map(|b| ((b * f64::from(capacity)).ceil() as u32).max(1))
    }
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

/// Enforce decisions, or only count them (PRODUCT.md "Decision rule", step 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Shed what the rule says.
    Enforce,
    /// Count would-sheds, admit everything.
    Warn,
}

/// Index of a stream in a [`Policy`]. Valid only for the policy that issued it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamId(u32);

impl StreamId {
    /// The index, for per-stream tables built beside a policy.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Index of an area in a [`Policy`]. Valid only for the policy that issued it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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

/// How a content mode of `format` is read, with the policy's pointer overrides (relative to
/// the event's data) applied: its shape, where the preset names the stream, and its time
/// header, which an explicit `time` pointer overrides (`ce-time`). One rule for routes and
/// streams.
fn mode_reading(
    format: Format,
    mode: ContentMode,
    lat: Option<JsonPointer>,
    lon: Option<JsonPointer>,
    time: Option<JsonPointer>,
) -> (Shape, PresetStream, Option<&'static str>) {
    let (mut shape, preset, time_header) = format.preset(mode);
    let time_header = time_header.filter(|_| time.is_none());
    override_pointers(&mut shape, format.data_root(mode), lat, lon, time);
    (shape, preset, time_header)
}

/// Replaces a shape's pointers with the ones given, which are relative to the event's data:
/// under `root` (see [`Format::data_root`]) when the mode has one.
fn override_pointers(
    shape: &mut Shape,
    root: Option<&str>,
    lat: Option<JsonPointer>,
    lon: Option<JsonPointer>,
    time: Option<JsonPointer>,
) {
    let rooted = |p: Option<JsonPointer>| match (p, root) {
        (Some(p), Some(root)) => JsonPointer::parse(&format!("{root}{}", p.as_str())).ok(),
        (p, _) => p,
    };
    let (lat, lon, time) = (rooted(lat), rooted(lon), rooted(time));
    if lat.is_some() || lon.is_some() {
        shape.lonlat = None;
        let (dlat, dlon, _) = Extractor::default_pointers();
        shape.lat = Some(lat.or_else(|| shape.lat.clone()).unwrap_or(dlat));
        shape.lon = Some(lon.or_else(|| shape.lon.clone()).unwrap_or(dlon));
    }
    if let Some(t) = time {
        shape.time = vec![t];
    }
}

fn compile_routes(
    sections: Vec<file::RouteSection>,
    streams: &HashMap<String, StreamId>,
    path: &Path,
    warnings: &mut Vec<Warning>,
) -> Result<Vec<Route>, PolicyError> {
    let mut routes: Vec<Route> = Vec::with_capacity(sections.len());
    for (i, r) in sections.into_iter().enumerate() {
        let err = |f: &str, message: String| PolicyError {
            location: Location {
                file: path.to_owned(),
                line_col: None,
                field: Some(format!("routes[{i}].{f}")),
            },
            message,
        };
        if !r.prefix.starts_with('/') {
            return Err(err(
                "prefix",
                format!("prefix {:?} must start with '/'", r.prefix),
            ));
        }
        if routes.iter().any(|o| o.prefix == r.prefix) {
            return Err(err(
                "prefix",
                format!("duplicate route prefix {:?}", r.prefix),
            ));
        }
        let sources = [
            r.stream.is_some(),
            r.stream_header.is_some(),
            r.stream_field.is_some(),
        ];
        if sources.iter().filter(|s| **s).count() > 1 {
            return Err(err(
                "stream",
                "give at most one of stream, stream_header, stream_field".into(),
            ));
        }
        if (r.stream_prefix.is_some() || r.stream_map.is_some()) && r.stream_field.is_none() {
            let (_, preset, _) = r.format.unwrap_or_default().preset(ContentMode::Structured);
            if r.stream.is_some()
                || r.stream_header.is_some()
                || !matches!(preset, PresetStream::Field(..))
            {
                return Err(err(
                    "stream_map",
                    "stream_prefix and stream_map apply to a stream named in the body                      (stream_field, or a preset's own: owntracks `_type`, cloudevents `type`                      and `ce-type`, standard-webhooks `type`), not to `stream` or                      `stream_header`"
                        .into(),
                ));
            }
        }
        let known = |name: &str, warnings: &mut Vec<Warning>| {
            if !streams.contains_key(name) {
                warnings.push(Warning {
                    file: path.to_owned(),
                    message: format!(
                        "route {:?} names stream {name:?}, which the policy does not classify: \
                         its events are never shed",
                        r.prefix
                    ),
                });
            }
        };
        if let Some(name) = &r.stream {
            known(name, warnings);
        }
        for name in r.stream_map.iter().flat_map(|m| m.values()) {
            known(name, warnings);
        }
        let format = r.format.unwrap_or_default();
        let stream_pointers =
            format == Format::Pointers && r.lat.is_none() && r.lon.is_none() && r.time.is_none();
        let mut modes = Vec::new();
        for &mode in format.modes() {
            let (mut shape, preset, time_header) =
                mode_reading(format, mode, r.lat.clone(), r.lon.clone(), r.time.clone());
            let source = if let Some(name) = &r.stream {
                StreamSource::Fixed(name.clone())
            } else if let Some(h) = &r.stream_header {
                StreamSource::Header(
                    http::HeaderName::try_from(h.as_str())
                        .map_err(|_| err("stream_header", format!("{h:?} is not a header name")))?,
                )
            } else if let Some(field) = &r.stream_field {
                shape.stream = Some(field.clone());
                StreamSource::Field {
                    map: r.stream_map.clone().unwrap_or_default(),
                    prefix: r.stream_prefix.clone().unwrap_or_default(),
                }
            } else {
                match preset {
                    PresetStream::Header => StreamSource::DefaultHeader,
                    PresetStream::NamedHeader(h) => StreamSource::MappedHeader {
                        name: http::HeaderName::from_static(h),
                        map: r.stream_map.clone().unwrap_or_default(),
                        prefix: r.stream_prefix.clone().unwrap_or_default(),
                    },
                    PresetStream::Field(field, prefix) => {
                        shape.stream = Some(field);
                        StreamSource::Field {
                            map: r.stream_map.clone().unwrap_or_default(),
                            prefix: r.stream_prefix.clone().unwrap_or_else(|| prefix.to_owned()),
                        }
                    }
                }
            };
            let extractor = Extractor::new(shape).map_err(|e| err("lat", e.to_string()))?;
            modes.push((
                mode,
                RouteMode {
                    extractor,
                    stream: source,
                    time_header: time_header.map(http::HeaderName::from_static),
                    stream_pointers: stream_pointers && r.stream_field.is_none(),
                },
            ));
        }
        routes.push(Route {
            prefix: r.prefix,
            format,
            modes,
        });
    }
    Ok(routes)
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
}

/// A compiled, validated, immutable policy.
#[derive(Debug, Clone)]
pub struct Policy {
    version: String,
    streams: Vec<StreamPolicy>,
    stream_index: HashMap<String, StreamId>,
    routes: Vec<Route>,
    areas: Vec<Area>,
    cells: HashMap<u64, AreaId>,
    default_rank: Rank,
    curve: Curve,
    mode: Mode,
    stale_status: http::StatusCode,
    classes: [ClassPolicy; 3],
    retry_after: RetryAfterPolicy,
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
    /// that matches at a segment boundary.
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

    /// The status answered to stale sheds.
    pub fn stale_status(&self) -> http::StatusCode {
        self.stale_status
    }

    /// A class's policy.
    pub fn class(&self, class: Class) -> &ClassPolicy {
        &self.classes[class.index()]
    }

    /// The `Retry-After` policy.
    pub fn retry_after(&self) -> RetryAfterPolicy {
        self.retry_after
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
    /// see [`crate::admission::Coordinates::new`]). Unconfigured places get
    /// `(None, default_rank)`.
    pub fn area_at(&self, lat: f64, lon: f64) -> (Option<AreaId>, Rank) {
        let Ok(ll) = LatLng::new(lat, lon) else {
            return (None, self.default_rank);
        };
        self.area_of_cell(ll.to_cell(AREA_RESOLUTION))
    }

    /// The area and rank of a resolution-4 cell.
    pub fn area_of_cell(&self, cell: CellIndex) -> (Option<AreaId>, Rank) {
        match self.cells.get(&u64::from(cell)) {
            Some(&id) => (Some(id), self.areas[id.index()].rank),
            None => (None, self.default_rank),
        }
    }
}

/// Where a policy error is: file, line and column (1-based), and the field's path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The file.
    pub file: PathBuf,
    /// Line and column, when the error points into the file.
    pub line_col: Option<(usize, usize)>,
    /// Dotted path of the field (`streams."vehicle.position".stale_after`), when known.
    pub field: Option<String>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some((line, col)) = self.line_col {
            write!(f, ":{line}:{col}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": field `{field}`")?;
        }
        Ok(())
    }
}

/// A policy that cannot be loaded: where, and what is wrong.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{location}: {message}")]
pub struct PolicyError {
    /// Where.
    pub location: Location,
    /// What is wrong.
    pub message: String,
}

/// Risky but valid content that `check` reports (PRODUCT.md "Policy files and hot reload").
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    /// The file the warning is about.
    pub file: PathBuf,
    /// What is risky.
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: warning: {}", self.file.display(), self.message)
    }
}

/// A compiled policy and the warnings its compilation produced.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The policy.
    pub policy: Policy,
    /// Risky content, in file order.
    pub warnings: Vec<Warning>,
}

/// The raw contents of a policy directory: the two TOML files and every region file
/// `areas.toml` refers to. Its [`PolicyFiles::version`] is the policy's version, so a reload
/// can tell "unchanged" without compiling (tiling regions can take a while).
#[derive(Debug, Clone)]
pub struct PolicyFiles {
    dir: PathBuf,
    streams: String,
    areas: Option<String>,
    /// Relative path → contents (or the read error, reported by the area that uses it).
    regions: std::collections::BTreeMap<String, Result<String, String>>,
}

impl PolicyFiles {
    /// Reads `dir`: `streams.toml` (required), `areas.toml` (optional), and the region files
    /// `areas.toml` names.
    ///
    /// # Errors
    /// [`PolicyError`] when `streams.toml` is missing or a file cannot be read.
    pub fn read(dir: &Path) -> Result<Self, PolicyError> {
        let streams_path = dir.join(STREAMS_FILE);
        let areas_path = dir.join(AREAS_FILE);
        let streams =
            std::fs::read_to_string(&streams_path).map_err(|e| io_error(&streams_path, &e))?;
        let areas = match std::fs::read_to_string(&areas_path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_error(&areas_path, &e)),
        };
        let mut regions = std::collections::BTreeMap::new();
        // A loose parse just for the region paths; the real parse reports any error.
        if let Some(af) = areas
            .as_deref()
            .and_then(|t| toml::from_str::<AreasFile>(t).ok())
        {
            for path in af.areas.iter().filter_map(|a| a.geojson.as_ref()) {
                regions.entry(path.0.clone()).or_insert_with(|| {
                    std::fs::read_to_string(dir.join(&path.0)).map_err(|e| e.to_string())
                });
            }
        }
        Ok(PolicyFiles {
            dir: dir.to_owned(),
            streams,
            areas,
            regions,
        })
    }

    /// Policy contents given as text (tests, tools), as if read from a directory `p`.
    pub fn from_texts(streams: &str, areas: Option<&str>) -> Self {
        PolicyFiles {
            dir: PathBuf::from("p"),
            streams: streams.to_owned(),
            areas: areas.map(str::to_owned),
            regions: std::collections::BTreeMap::new(),
        }
    }

    /// Content hash: the first 12 hex digits of SHA-256 over each file's name and bytes.
    /// Equal contents give equal versions.
    pub fn version(&self) -> String {
        let mut hasher = Sha256::new();
        let mut add = |name: &str, text: &str| {
            hasher.update((name.len() as u64).to_le_bytes());
            hasher.update(name);
            hasher.update((text.len() as u64).to_le_bytes());
            hasher.update(text);
        };
        add(STREAMS_FILE, &self.streams);
        if let Some(areas) = &self.areas {
            add(AREAS_FILE, areas);
        }
        for (path, text) in &self.regions {
            add(path, text.as_deref().unwrap_or("<unreadable>"));
        }
        let digest = hasher.finalize();
        digest[..6].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Reads and compiles the policy in `dir`.
///
/// # Errors
/// [`PolicyError`] naming the file (and line and field where it can) for an unreadable or
/// missing `streams.toml`, a TOML syntax error, an unknown field, a value out of range, or a
/// cross-field problem (duplicate area names, overlapping pointers, an area without cells or
/// a region that covers nothing, a disabled `never` stream).
pub fn load_dir(dir: &Path) -> Result<Compiled, PolicyError> {
    compile(&PolicyFiles::read(dir)?)
}

fn io_error(path: &Path, e: &std::io::Error) -> PolicyError {
    PolicyError {
        location: Location {
            file: path.to_owned(),
            line_col: None,
            field: None,
        },
        message: format!("cannot read: {e}"),
    }
}

/// Compiles a policy directory's contents.
///
/// # Errors
/// As [`load_dir`].
pub fn compile(files: &PolicyFiles) -> Result<Compiled, PolicyError> {
    let streams_path = files.dir.join(STREAMS_FILE);
    let streams_path = streams_path.as_path();
    let streams_text = files.streams.as_str();
    let areas_path = files.dir.join(AREAS_FILE);
    let mut warnings = Vec::new();
    let sf: StreamsFile = parse_toml(streams_path, streams_text)?;
    let af: AreasFile = match &files.areas {
        Some(text) => parse_toml(&areas_path, text)?,
        None => {
            warnings.push(Warning {
                file: areas_path.clone(),
                message: "no areas file: every place has the default rank, so pressure sheds \
                          all areas alike"
                    .into(),
            });
            AreasFile {
                default_rank: None,
                areas: Vec::new(),
            }
        }
    };

    let at = |path: &Path, field: String, message: String| PolicyError {
        location: Location {
            file: path.to_owned(),
            line_col: None,
            field: Some(field),
        },
        message,
    };

    let d = &sf.defaults;
    let curve = Curve::new(
        d.band.unwrap_or(Curve::DEFAULT_BAND),
        d.ramp.unwrap_or(Curve::DEFAULT_RAMP),
    )
    .map_err(|e| {
        let field = match e {
            crate::admission::curve::CurveError::Band(_) => "defaults.band",
            crate::admission::curve::CurveError::Ramp(_) => "defaults.ramp",
        };
        let mut err = at(streams_path, field.into(), e.to_string());
        err.location.line_col =
            find_key_line(streams_text, field.rsplit('.').next().unwrap_or(field));
        err
    })?;
    let default_stale = d.stale_after.map_or(DEFAULT_STALE_AFTER, |v| v.0);
    let mode = d.mode.unwrap_or(Mode::Enforce);
    if mode == Mode::Warn {
        warnings.push(Warning {
            file: streams_path.to_owned(),
            message: "defaults.mode = \"warn\": nothing is shed, only counted as would-shed".into(),
        });
    }

    let mut streams = Vec::with_capacity(sf.streams.len());
    let mut stream_index = HashMap::with_capacity(sf.streams.len());
    for (name, s) in sf.streams {
        let field = |f: &str| format!("streams.{name:?}.{f}");
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(at(
                streams_path,
                format!("streams.{name:?}"),
                "a stream name must be non-empty printable ASCII without spaces (it is matched \
                 against a header value)"
                    .into(),
            ));
        }
        if name == crate::metrics::UNKNOWN_STREAM {
            return Err(at(
                streams_path,
                format!("streams.{name:?}"),
                format!("stream name {name:?} is reserved for streams the policy does not name"),
            ));
        }
        let enabled = s.enabled.unwrap_or(true);
        if enabled && s.until.is_some() {
            return Err(at(
                streams_path,
                field("until"),
                "`until` belongs with `enabled = false` (disabled until then)".into(),
            ));
        }
        let stream_mode = s.mode.unwrap_or(Mode::Enforce);
        if s.supersession == Supersession::Never {
            if !enabled {
                return Err(at(
                    streams_path,
                    field("enabled"),
                    "a `never` stream cannot be disabled: nothing resends its events".into(),
                ));
            }
            if stream_mode == Mode::Warn {
                warnings.push(Warning {
                    file: streams_path.to_owned(),
                    message: format!(
                        "stream {name:?} is `never` and `mode = \"warn\"`: warn mode has no \
                         effect on a stream that is never shed"
                    ),
                });
            }
        }
        let format = s.format.unwrap_or_default();
        let mut modes = Vec::new();
        for &mode in format.modes() {
            let (shape, _, time_header) =
                mode_reading(format, mode, s.lat.clone(), s.lon.clone(), s.time.clone());
            modes.push(StreamMode {
                mode,
                extractor: Extractor::new(shape)
                    .map_err(|e| at(streams_path, field("lat"), e.to_string()))?,
                time_header: time_header.map(http::HeaderName::from_static),
            });
        }
        let id = StreamId(u32::try_from(streams.len()).unwrap_or(u32::MAX));
        stream_index.insert(name.clone(), id);
        streams.push(StreamPolicy {
            name,
            supersession: s.supersession,
            class: s.class.unwrap_or(Class::Important),
            stale_after: s.stale_after.map_or(default_stale, |v| v.0),
            mode: stream_mode,
            disabled: Disable::from_parts(s.enabled, s.until),
            format,
            modes,
        });
    }
    if streams.is_empty() {
        warnings.push(Warning {
            file: streams_path.to_owned(),
            message: "no streams: every stream is unknown, so nothing is ever shed".into(),
        });
    } else if streams
        .iter()
        .all(|s| s.supersession == Supersession::Never)
    {
        warnings.push(Warning {
            file: streams_path.to_owned(),
            message: "no self-superseding stream: nothing is ever shed".into(),
        });
    }

    let routes = compile_routes(sf.routes, &stream_index, streams_path, &mut warnings)?;
    let mut classes = [ClassPolicy::default(); 3];
    for (class, c) in &sf.classes {
        let field = |f: &str| format!("classes.{}.{f}", class.as_str());
        if let Some(b) = c.budget
            && !(b > 0.0 && b <= 1.0)
        {
            return Err(at(
                streams_path,
                field("budget"),
                format!("budget is a share of --max-inflight in (0, 1], got {b}"),
            ));
        }
        if c.wait.is_some() && c.budget.is_none() {
            return Err(at(
                streams_path,
                field("wait"),
                "`wait` needs a `budget`".into(),
            ));
        }
        if c.enabled.unwrap_or(true) && c.until.is_some() {
            return Err(at(
                streams_path,
                field("until"),
                "`until` belongs with `enabled = false` (disabled until then)".into(),
            ));
        }
        classes[class.index()] = ClassPolicy {
            budget: c.budget,
            wait: c.wait.map(|w| w.0),
            mode: c.mode,
            disabled: Disable::from_parts(c.enabled, c.until),
        };
        if c.enabled == Some(false)
            && streams
                .iter()
                .any(|s| s.class == *class && s.supersession == Supersession::Never)
        {
            warnings.push(Warning {
                file: streams_path.to_owned(),
                message: format!(
                    "class {} is disabled; its `never` streams stay enabled (they are never shed)",
                    class.as_str()
                ),
            });
        }
    }
    let retry_after = match &sf.retry_after {
        None => RetryAfterPolicy::default(),
        Some(r) => {
            let d = RetryAfterPolicy::default();
            let policy = RetryAfterPolicy {
                base: r.base.unwrap_or(d.base),
                max: r.max.unwrap_or(d.max),
            };
            if policy.base == 0 || policy.max == 0 || policy.base > policy.max {
                return Err(at(
                    streams_path,
                    "retry_after".into(),
                    format!(
                        "retry_after needs 1 <= base <= max (seconds), got base {} max {}",
                        policy.base, policy.max
                    ),
                ));
            }
            policy
        }
    };

    let default_rank = af.default_rank.unwrap_or(Rank::DEFAULT);
    let mut parsed_regions: HashMap<String, geo::Regions> = HashMap::new();
    let mut areas: Vec<Area> = Vec::with_capacity(af.areas.len());
    let mut cells: HashMap<u64, AreaId> = HashMap::new();
    for (i, a) in af.areas.into_iter().enumerate() {
        let field = |f: &str| format!("areas[{i}].{f}");
        let name_ok = !a.name.is_empty()
            && a.name.len() <= 64
            && a.name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !name_ok {
            return Err(at(
                &areas_path,
                field("name"),
                format!(
                    "area name {:?} must be 1..=64 characters of [A-Za-z0-9_.-] (it becomes a \
                     metric label)",
                    a.name
                ),
            ));
        }
        if a.name == crate::metrics::UNCONFIGURED_AREA {
            return Err(at(
                &areas_path,
                field("name"),
                format!(
                    "area name {:?} is reserved for places no area covers",
                    a.name
                ),
            ));
        }
        if areas.iter().any(|b| b.name == a.name) {
            return Err(at(
                &areas_path,
                field("name"),
                format!("duplicate area name {:?}", a.name),
            ));
        }
        if a.cells.is_empty() && a.geojson.is_none() {
            return Err(at(
                &areas_path,
                field("cells"),
                format!(
                    "area {:?} has neither cells nor geojson: it would cover nothing",
                    a.name
                ),
            ));
        }
        if a.feature.is_some() && a.geojson.is_none() {
            return Err(at(
                &areas_path,
                field("feature"),
                "`feature` selects features of a `geojson` file; this area has none".into(),
            ));
        }
        let mut region_cells = Vec::new();
        if let Some(path) = &a.geojson {
            let text = match files.regions.get(&path.0) {
                Some(Ok(text)) => text,
                Some(Err(e)) => {
                    return Err(at(
                        &areas_path,
                        field("geojson"),
                        format!("{}: cannot read: {e}", path.0),
                    ));
                }
                None => {
                    return Err(at(
                        &areas_path,
                        field("geojson"),
                        format!("{}: not read", path.0),
                    ));
                }
            };
            let regions = match parsed_regions.entry(path.0.clone()) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(e) => {
                    let parsed = geo::Regions::parse(text).map_err(|err| {
                        at(&areas_path, field("geojson"), format!("{}: {err}", path.0))
                    })?;
                    e.insert(parsed)
                }
            };
            region_cells = geo::tile(regions, a.feature.as_deref()).map_err(|err| {
                at(
                    &areas_path,
                    field("geojson"),
                    format!("area {:?} from {}: {err}", a.name, path.0),
                )
            })?;
        }
        let id = AreaId(u32::try_from(i).unwrap_or(u32::MAX));
        let mut own: std::collections::HashSet<u64> = std::collections::HashSet::new();
        let mut overlaps: HashMap<AreaId, usize> = HashMap::new();
        let explicit = a
            .cells
            .iter()
            .flat_map(|spec| spec.0.children(AREA_RESOLUTION));
        for cell in explicit.chain(region_cells) {
            let key = u64::from(cell);
            if !own.insert(key) {
                continue;
            }
            match cells.get(&key).copied() {
                None => {
                    cells.insert(key, id);
                }
                Some(other) => {
                    *overlaps.entry(other).or_default() += 1;
                    // The most important (lowest) rank wins.
                    if a.rank < areas[other.index()].rank {
                        cells.insert(key, id);
                    }
                }
            }
        }
        let count = own.len();
        let mut overlaps: Vec<_> = overlaps.into_iter().collect();
        overlaps.sort_by_key(|(other, _)| other.0);
        for (other, n) in overlaps {
            let o = &areas[other.index()];
            let (winner, rank) = if a.rank < o.rank {
                (&a.name, a.rank)
            } else {
                (&o.name, o.rank)
            };
            warnings.push(Warning {
                file: areas_path.clone(),
                message: format!(
                    "areas {:?} and {:?} overlap in {n} cell(s); {winner:?} (rank {rank}) wins \
                     there",
                    o.name, a.name
                ),
            });
        }
        if a.rank.get() == 100 && count > 343 {
            warnings.push(Warning {
                file: areas_path.clone(),
                message: format!(
                    "area {:?} has rank 100 over {count} cells: it is the first shed anywhere \
                     pressure rises above 0.5",
                    a.name
                ),
            });
        }
        areas.push(Area {
            name: a.name,
            rank: a.rank,
            cells: count,
        });
    }

    let version = files.version();

    Ok(Compiled {
        policy: Policy {
            version,
            streams,
            stream_index,
            routes,
            areas,
            cells,
            default_rank,
            curve,
            mode,
            stale_status: sf
                .defaults
                .stale_status
                .map_or(http::StatusCode::ACCEPTED, |s| s.0),
            classes,
            retry_after,
        },
        warnings,
    })
}

/// Parses one TOML file into its schema, reporting file, line, column and field path.
fn parse_toml<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T, PolicyError> {
    let location = |span: Option<std::ops::Range<usize>>, field: Option<String>| Location {
        file: path.to_owned(),
        line_col: span.map(|s| line_col(text, s.start)),
        field,
    };
    if text.trim().is_empty() {
        return Err(PolicyError {
            location: location(None, None),
            message: "the file is empty (a truncated save is never a valid policy)".into(),
        });
    }
    let de = toml::de::Deserializer::parse(text).map_err(|e| PolicyError {
        location: location(e.span(), None),
        message: e.message().trim().to_owned(),
    })?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let field = (field != "." && !field.is_empty()).then_some(field);
        let inner = e.into_inner();
        PolicyError {
            location: location(inner.span(), field),
            message: inner.message().trim().to_owned(),
        }
    })
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1)
        + 1;
    (line, col)
}

/// The line of the first `key = …` assignment, for cross-field errors found after parsing.
fn find_key_line(text: &str, key: &str) -> Option<(usize, usize)> {
    text.lines().enumerate().find_map(|(i, l)| {
        let t = l.trim_start();
        let rest = t.strip_prefix(key)?;
        rest.trim_start()
            .starts_with('=')
            .then_some((i + 1, l.len() - t.len() + 1))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compile_str(streams: &str, areas: &str) -> Result<Compiled, PolicyError> {
        compile(&PolicyFiles {
            dir: PathBuf::from("p"),
            streams: streams.to_owned(),
            areas: (!areas.is_empty()).then(|| areas.to_owned()),
            regions: std::collections::BTreeMap::new(),
        })
    }

    const STREAMS: &str = r#"
[streams."vehicle.position"]
supersession = "self-superseding"
"#;

    /// Pointer overrides are relative to the event's data in every content mode: under
    /// `/data` in CloudEvents structured and batched mode, the body in binary mode; an
    /// explicit `time` pointer wins over `ce-time`.
    #[test]
    fn cloudevents_overrides_are_relative_to_the_data() {
        let streams = r#"
[streams."vehicle.position"]
supersession = "self-superseding"
format = "cloudevents"
lat = "/position/lat"
lon = "/position/lon"
time = "/position/at"

[[routes]]
prefix = "/ce"
format = "cloudevents"
lat = "/position/lat"
lon = "/position/lon"
"#;
        let c = compile_str(streams, "").unwrap();
        let route = &c.policy.routes()[0];
        let id = c.policy.stream("vehicle.position").unwrap();
        let stream = c.policy.stream_policy(id);
        for (content_type, lat) in [
            (None, "/position/lat"),
            (Some("application/cloudevents+json"), "/data/position/lat"),
            (
                Some("application/cloudevents-batch+json"),
                "/data/position/lat",
            ),
        ] {
            let ct = content_type.map(str::as_bytes);
            let r = route.mode_at(route.mode_index(ct));
            assert_eq!(
                r.extractor.shape().describe()["lat"],
                lat,
                "{content_type:?}"
            );
            let m = stream.read_mode(ct);
            assert_eq!(
                m.extractor.shape().describe()["lat"],
                lat,
                "{content_type:?}"
            );
            // The stream names its time pointer: ce-time does not override it.
            assert!(m.time_header.is_none(), "{content_type:?}");
        }
        // The route names no time pointer: binary mode keeps ce-time.
        let binary = route.mode_at(route.mode_index(None));
        assert_eq!(
            binary.time_header.as_ref().map(http::HeaderName::as_str),
            Some("ce-time")
        );
    }

    #[test]
    fn a_stream_map_that_nothing_would_use_is_refused() {
        for source in [
            "stream = \"vehicle.position\"",
            "stream_header = \"x-kind\"",
        ] {
            let streams = format!(
                "{STREAMS}\n[[routes]]\nprefix = \"/ce\"\nformat = \"cloudevents\"\n{source}\n\
                 stream_map = {{ a = \"vehicle.position\" }}\n"
            );
            let e = compile_str(&streams, "").unwrap_err();
            assert_eq!(
                e.location.field.as_deref(),
                Some("routes[0].stream_map"),
                "{e}"
            );
        }
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let e =
            compile_str(STREAMS, "[[areas]]\nname = \"x\"\nrank = 0\ncells = []\n").unwrap_err();
        assert_eq!(e.location.file, Path::new("p/areas.toml"));
        assert_eq!(e.location.line_col.map(|l| l.0), Some(3));
        assert_eq!(e.location.field.as_deref(), Some("areas[0].rank"));
        assert!(e.message.contains("1..=100"), "{e}");

        let e = compile_str("[streams.a]\nsupersession = \"sometimes\"\n", "").unwrap_err();
        assert_eq!(e.location.line_col.map(|l| l.0), Some(2));
        assert!(e.to_string().contains("supersession"), "{e}");

        let e = compile_str("[streams.a]\nsupersession = \"never\"\ncolour = 1\n", "").unwrap_err();
        assert!(e.message.contains("unknown field"), "{e}");
        assert_eq!(e.location.line_col.map(|l| l.0), Some(3));

        let e = compile_str("[streams.a\n", "").unwrap_err();
        assert_eq!(e.location.line_col.map(|l| l.0), Some(1));
    }

    #[test]
    fn finer_cells_are_refused_and_coarser_cells_expand() {
        // Resolution 5 (finer): refused.
        let fine = "851f1d4bfffffff";
        let e = compile_str(
            STREAMS,
            &format!("[[areas]]\nname=\"x\"\nrank=5\ncells=[\"{fine}\"]\n"),
        )
        .unwrap_err();
        assert!(e.message.contains("resolution 5"), "{e}");
        // Resolution 3: seven resolution-4 children.
        let coarse = LatLng::new(52.52, 13.405)
            .unwrap()
            .to_cell(Resolution::Three);
        let c = compile_str(
            STREAMS,
            &format!("[[areas]]\nname=\"x\"\nrank=5\ncells=[\"{coarse}\"]\n"),
        )
        .unwrap();
        assert_eq!(c.policy.cell_count(), 7);
        assert_eq!(c.policy.area_at(52.52, 13.405).1.get(), 5);
    }

    #[test]
    fn overlaps_take_the_lowest_rank_and_warn() {
        let berlin = LatLng::new(52.52, 13.405)
            .unwrap()
            .to_cell(Resolution::Four);
        let areas = format!(
            "[[areas]]\nname=\"a\"\nrank=30\ncells=[\"{berlin}\"]\n[[areas]]\nname=\"b\"\nrank=5\ncells=[\"{berlin}\"]\n"
        );
        let c = compile_str(STREAMS, &areas).unwrap();
        assert_eq!(c.policy.area_at(52.52, 13.405).1.get(), 5);
        assert!(c.warnings.iter().any(|w| w.message.contains("overlap")));
    }

    #[test]
    fn never_stream_cannot_be_disabled() {
        let e = compile_str(
            "[streams.a]\nsupersession = \"never\"\nenabled = false\n",
            "",
        )
        .unwrap_err();
        assert!(e.message.contains("cannot be disabled"), "{e}");
    }

    #[test]
    fn version_is_a_content_hash() {
        let a = compile_str(STREAMS, "").unwrap().policy;
        let b = compile_str(STREAMS, "").unwrap().policy;
        let c = compile_str(STREAMS, "default_rank = 40\n").unwrap().policy;
        assert_eq!(a.version(), b.version());
        assert_ne!(a.version(), c.version());
    }

    #[test]
    fn empty_file_is_an_error() {
        let e = compile_str("", "").unwrap_err();
        assert!(e.message.contains("empty"));
    }
}
