//! Reading a policy directory and compiling it into a [`Policy`]: validation, defaults,
//! tiling of regions, and warnings.

use std::collections::HashMap;
use std::path::Path;

use super::error::{line_col, parse_toml, table_line};
use super::file::{AreasFile, StreamsFile};
use super::routes::{compile_routes, mode_reading};
use super::upstreams::UpstreamTable;
use super::*;

/// A compiled policy and the warnings its compilation produced.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The policy.
    pub policy: Policy,
    /// Risky content, in file order.
    pub warnings: Vec<Warning>,
    /// What `check` also says, in file order: cells written in another form than their
    /// canonical one, with that form.
    pub notes: Vec<Warning>,
    /// Positions in the region files read, counted once per file (at most
    /// [`MAX_REGION_POSITIONS`]).
    pub region_positions: usize,
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
    let mut notes = Vec::new();
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
        d.band
            .as_ref()
            .map_or(Curve::DEFAULT_BAND, |v| *v.get_ref()),
        d.ramp
            .as_ref()
            .map_or(Curve::DEFAULT_RAMP, |v| *v.get_ref()),
    )
    .map_err(|e| {
        let (field, span) = match e {
            crate::policy::curve::CurveError::Band(_) => ("defaults.band", d.band.as_ref()),
            crate::policy::curve::CurveError::Ramp(_) => ("defaults.ramp", d.ramp.as_ref()),
        };
        let mut err = at(streams_path, field.into(), e.to_string());
        err.location.line_col = span.map(|v| line_col(streams_text, v.span().start));
        err
    })?;
    let trust = device_trust(d).map_err(|(field, span, message)| {
        let mut err = at(streams_path, field.into(), message);
        err.location.line_col = span.map(|start| line_col(streams_text, start));
        err
    })?;
    let default_stale = d.stale_after.map_or(DEFAULT_STALE_AFTER, |v| v.0);
    let freshness_share = d
        .freshness_share
        .as_ref()
        .map_or(DEFAULT_FRESHNESS_SHARE, |v| *v.get_ref());
    if !(freshness_share > 0.0 && freshness_share <= 1.0) {
        let mut err = at(
            streams_path,
            "defaults.freshness_share".into(),
            format!(
                "freshness_share must be in (0, 1] (a share of the in-flight capacity), got \
                 {freshness_share}"
            ),
        );
        err.location.line_col = d
            .freshness_share
            .as_ref()
            .map(|v| line_col(streams_text, v.span().start));
        return Err(err);
    }
    let mode = d.mode.unwrap_or(Mode::Enforce);
    if mode == Mode::Warn {
        warnings.push(Warning {
            file: streams_path.to_owned(),
            message: "defaults.mode = \"warn\": nothing is shed, only counted as would-shed".into(),
        });
    }

    let mut upstreams = UpstreamTable::compile(sf.upstreams, streams_path, streams_text)?;
    let mut streams = Vec::with_capacity(sf.streams.len());
    let mut stream_index = Lookup::with_capacity_and_hasher(sf.streams.len(), Default::default());
    for (name, mut s) in sf.streams {
        let field = |f: &str| format!("streams.{name:?}.{f}");
        if !label_name_ok(&name) {
            let mut e = at(
                streams_path,
                format!("streams.{name:?}"),
                format!(
                    "stream name {name:?} must be 1..=64 characters of [A-Za-z0-9_.-], as area \
                     names: it is matched against a header value and becomes a metric label, \
                     where names differing only by \\ or \" would collide"
                ),
            );
            e.location.line_col = table_line(streams_text, "streams", &name);
            return Err(e);
        }
        if name == crate::policy::UNKNOWN_STREAM {
            return Err(at(
                streams_path,
                format!("streams.{name:?}"),
                format!("stream name {name:?} is reserved for streams the policy does not name"),
            ));
        }
        let upstream = upstreams.resolve(s.upstream.take(), field("upstream"))?;
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
            if s.max_silence.is_some() {
                warnings.push(Warning {
                    file: streams_path.to_owned(),
                    message: format!(
                        "stream {name:?} is `never` and sets `max_silence`: a stream that is \
                         never shed needs no freshness floor"
                    ),
                });
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
            let (shape, _, time_header) = mode_reading(
                format,
                mode,
                s.lat.clone(),
                s.lon.clone(),
                s.time.clone(),
                s.device.clone(),
            );
            modes.push(StreamMode {
                mode,
                extractor: Extractor::new(shape)
                    .map_err(|e| at(streams_path, field("lat"), e.to_string()))?,
                time_header: time_header.map(http::HeaderName::from_static),
                device_headers: super::routes::device_headers(format, mode, s.device.as_ref()),
            });
        }
        let id = StreamId(u32::try_from(streams.len()).unwrap_or(u32::MAX));
        stream_index.insert(name.clone(), id);
        streams.push(StreamPolicy {
            cost_slot: crate::pressure::CostSlot::of(&name),
            name,
            supersession: s.supersession,
            class: s.class.unwrap_or(Class::Important),
            stale_after: s.stale_after.map_or(default_stale, |v| v.0),
            mode: stream_mode,
            disabled: Disable::from_parts(s.enabled, s.until),
            format,
            modes,
            max_silence: s.max_silence.map(|v| v.0),
            upstream,
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

    let schedules = super::schedule::compile_schedules(sf.schedules, streams_path, streams_text)?;
    let routes = compile_routes(
        sf.routes,
        &stream_index,
        &mut upstreams,
        streams_path,
        streams_text,
        &mut warnings,
    )?;
    let upstreams = upstreams.finish(&mut warnings);
    super::upstreams::warn_body_streams_across_upstreams(
        &streams,
        &routes,
        &upstreams.specs,
        streams_path,
        &mut warnings,
    );
    super::opaque::check_opaque(
        &streams,
        &stream_index,
        &routes,
        streams_path,
        &mut warnings,
    )?;
    let mut classes = [ClassPolicy::default(); 3];
    for (class, c) in &sf.classes {
        let field = |f: &str| format!("classes.{}.{f}", class.as_str());
        if let Some(b) = c.budget
            && !(b > 0.0 && b <= 1.0)
        {
            return Err(at(
                streams_path,
                field("budget"),
                format!("budget is a share of in-flight capacity in (0, 1], got {b}"),
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
            max_request_time: c.max_request_time.map(|w| w.0),
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
    // Regions first: every file parsed once and the tiling cost summed, so that a policy over
    // the limits is refused before any tiling time is spent.
    let (parsed_regions, region_positions) =
        super::regions::parse_regions(&files.regions, &af.areas, &areas_path)?;
    let mut areas: Vec<Area> = Vec::with_capacity(af.areas.len());
    let mut cells: Lookup<u64, AreaId> = Lookup::default();
    for (i, a) in af.areas.into_iter().enumerate() {
        let field = |f: &str| format!("areas[{i}].{f}");
        if !label_name_ok(&a.name) {
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
        if a.name == crate::policy::UNCONFIGURED_AREA {
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
            let regions = &parsed_regions[&path.0];
            let tiled = geo::tile(regions, a.feature.as_deref()).map_err(|err| {
                at(
                    &areas_path,
                    field("geojson"),
                    format!("area {:?} from {}: {err}", a.name, path.0),
                )
            })?;
            for w in tiled.warnings {
                warnings.push(Warning {
                    file: areas_path.clone(),
                    message: format!("area {:?} from {}: {w}", a.name, path.0),
                });
            }
            region_cells = tiled.cells;
        }
        let id = AreaId(u32::try_from(i).unwrap_or(u32::MAX));
        let mut own: std::collections::HashSet<u64> = std::collections::HashSet::new();
        let mut overlaps: HashMap<AreaId, usize> = HashMap::new();
        let explicit = a
            .cells
            .iter()
            .flat_map(|spec| spec.cell.children(AREA_RESOLUTION));
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
        for spec in a.cells.iter().filter(|s| s.written != s.cell.to_string()) {
            notes.push(Warning {
                file: areas_path.clone(),
                message: format!(
                    "area {:?}: cell {:?} is {} (its canonical form)",
                    a.name, spec.written, spec.cell
                ),
            });
        }
        areas.push(Area {
            name: a.name,
            rank: a.rank,
            cells: count,
            listed_cells: a.cells.iter().map(|s| s.cell.to_string()).collect(),
        });
    }

    let stale_status = sf
        .defaults
        .stale_status
        .map_or(http::StatusCode::ACCEPTED, |s| s.0);
    let bodiless = !stale_status.is_success() || matches!(stale_status.as_u16(), 204 | 205);
    for r in routes.iter().filter(|r| bodiless && r.stale_body.is_some()) {
        warnings.push(Warning {
            file: streams_path.to_owned(),
            message: format!(
                "route {:?} answers stale events with a success body, but stale_status {} \
                 carries none: its sender may resend stale events forever",
                r.prefix,
                stale_status.as_u16()
            ),
        });
    }

    let version = files.version();

    // Whether a body naming its own stream may go elsewhere than `default`: read by the
    // request path and the body-memory shares, so computed once here.
    let streams_leave_default = streams
        .iter()
        .any(|s| s.upstream.is_some_and(|u| u != UpstreamId::DEFAULT));
    let coverage = super::coverage::Coverage::of(
        cells
            .keys()
            .filter_map(|&cell| h3o::CellIndex::try_from(cell).ok()),
    );
    Ok(Compiled {
        policy: Policy {
            version,
            streams,
            stream_index,
            routes,
            areas,
            cells,
            coverage,
            default_rank,
            curve,
            mode,
            stale_status,
            freshness_share,
            classes,
            retry_after,
            schedules,
            trust,
            upstreams: upstreams.specs,
            upstream_index: upstreams.index,
            upstreams_named_at: upstreams.first,
            upstreams_at: upstreams.at,
            streams_leave_default,
        },
        warnings,
        notes,
        region_positions,
    })
}

// The switch as the files state it (`enabled`, `until`): compiled here, beside the files'
// schema, so that class.rs knows nothing of the schema.
impl Disable {
    pub(super) fn from_parts(enabled: Option<bool>, until: Option<file::UntilValue>) -> Self {
        match (enabled.unwrap_or(true), until) {
            (true, _) => Disable::No,
            (false, None) => Disable::Indefinitely,
            (false, Some(u)) => Disable::Until(u.0),
        }
    }
}

/// `[defaults] max_speed` and `device_placeholders` compiled; an error names the field, the
/// offset of its value when known, and what is wrong.
fn device_trust(
    d: &crate::policy::file::DefaultsSection,
) -> Result<crate::policy::DeviceTrust, (&'static str, Option<usize>, String)> {
    let mut trust = crate::policy::DeviceTrust::default();
    if let Some(v) = &d.max_speed {
        let speed = *v.get_ref();
        if !(speed.is_finite() && speed > 0.0) {
            return Err((
                "defaults.max_speed",
                Some(v.span().start),
                format!("max_speed is metres per second, finite and above 0, got {speed}"),
            ));
        }
        trust.max_speed = speed;
    }
    trust.placeholders = d
        .device_placeholders
        .iter()
        .flatten()
        .map(|p| p.trim().to_ascii_lowercase().into_boxed_str())
        .collect();
    Ok(trust)
}
