//! Named upstreams: the `[upstreams.NAME]` tables of `streams.toml` compiled into
//! [`UpstreamSpec`]s, and the `upstream = "NAME"` keys of routes and streams resolved to
//! [`UpstreamId`]s (docs/policy.md "`[upstreams.NAME]`"). `default`, the `--upstream` one, is
//! always there and always first; the policy cannot define it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use http::Uri;
use toml::Spanned;

use super::error::{line_col, table_line};
use super::file::UpstreamSection;
use super::{Location, Lookup, Policy, PolicyError, StreamId, Warning, label_name_ok};
use crate::pressure::report::LoadReportField;

/// The name of the upstream `--upstream` sets: [`UpstreamId::DEFAULT`], where every request
/// goes whose route and stream name no other. Reserved: `[upstreams.default]` is refused.
pub const DEFAULT_UPSTREAM: &str = "default";

/// Most upstreams one policy has, `default` among them (so at most 63 `[upstreams.NAME]`
/// tables): each is a controller the proxy ticks and a set of metric series labelled with
/// its name, so their number is bounded as the policy's other label values are.
pub const MAX_UPSTREAMS: usize = 64;

/// The `upstream` label value of a request answered before an upstream was chosen
/// (`crate::metrics::NO_UPSTREAM`): no upstream may take it.
pub const NO_UPSTREAM_LABEL: &str = "none";

/// Index of an upstream in a [`Policy`] ([`Policy::upstreams`]): `UpstreamId(0)` is always
/// `default` (`--upstream`), the others follow in name order. Valid only for the policy that
/// issued it: a reload that adds or removes an upstream renumbers the ones after it. A `u16`,
/// as at most [`MAX_UPSTREAMS`] exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct UpstreamId(u16);

impl UpstreamId {
    /// `default`, the `--upstream` one.
    pub const DEFAULT: UpstreamId = UpstreamId(0);

    /// The index, for per-upstream tables built beside a policy.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// One upstream as the policy states it. Each `None` is the command line's value for it (the
/// flag named beside the field), which whoever builds the upstream merges in; `default`'s
/// fields are all `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamSpec {
    /// The name: the `[upstreams.NAME]` key, or `default`. A metric label's grammar.
    pub name: String,
    /// Base URL, `http://host:port[/prefix]`, checked by [`parse_url`] (`--upstream`).
    pub url: Option<Uri>,
    /// Latency considered at target, pressure 0.5 (`--latency-target`). When `timeout` is
    /// given too, it is below it.
    pub latency_target: Option<Duration>,
    /// Safety cap on in-flight requests to this upstream (`--max-inflight`).
    pub max_inflight: Option<NonZeroU32>,
    /// Time the upstream has to send response headers (`--upstream-timeout`).
    pub timeout: Option<Duration>,
    /// Time to connect to the upstream (`--connect-timeout`).
    pub connect_timeout: Option<Duration>,
    /// Time an idle connection to it may be reused (`--pool-idle-timeout`).
    pub pool_idle_timeout: Option<Duration>,
    /// Idle connections to it kept; 0 keeps none (`--pool-max-idle`).
    pub pool_max_idle: Option<usize>,
    /// The ORCA metric read as its utilisation (`--load-report`).
    pub load_report: Option<LoadReportField>,
}

impl UpstreamSpec {
    fn default_upstream() -> Self {
        UpstreamSpec {
            name: DEFAULT_UPSTREAM.to_owned(),
            url: None,
            latency_target: None,
            max_inflight: None,
            timeout: None,
            connect_timeout: None,
            pool_idle_timeout: None,
            pool_max_idle: None,
            load_report: None,
        }
    }
}

/// Checks an upstream base URL, `http://host:port[/prefix]`: the one rule for `--upstream`
/// and for `url` in `[upstreams.NAME]`. Plain HTTP only: the proxy speaks no TLS to its
/// upstreams.
///
/// # Errors
/// What is wrong, for the caller to place: not a URL, a scheme other than `http`, no host, a
/// query string.
pub fn parse_url(text: &str) -> Result<Uri, String> {
    let url: Uri = text
        .parse()
        .map_err(|e| format!("invalid URL {text:?}: {e}"))?;
    match url.scheme_str() {
        Some("http") => {}
        Some(other) => {
            return Err(format!(
                "scheme {other:?} is not supported at the upstream, which shedgate speaks plain \
                 HTTP to; use http:// (terminate TLS in front of the upstream)"
            ));
        }
        None => return Err(format!("{text:?} needs http://")),
    }
    // `http://:80` has an authority but no host.
    if url.host().is_none_or(str::is_empty) {
        return Err(format!("{text:?} has no host"));
    }
    if url.query().is_some() {
        return Err("must not have a query string".into());
    }
    Ok(url)
}

/// The proxy's own address `url` names, when it names `listen` (or its port on an
/// unspecified `listen` address): an upstream there would send requests round in a loop.
/// `None` for a name (not resolved here) or an ephemeral `listen` (port 0).
pub fn loops_to(url: &http::Uri, listen: SocketAddr) -> Option<SocketAddr> {
    let authority = url.authority().map_or("", |a| a.as_str());
    let addr = authority.parse::<SocketAddr>().ok()?;
    (listen.port() != 0
        && (addr == listen || (addr.port() == listen.port() && listen.ip().is_unspecified())))
    .then_some(addr)
}

/// The policy's upstreams while it compiles: the specs, their names, which ones a route or
/// stream named, and where the files first name one.
pub(super) struct UpstreamTable<'a> {
    path: &'a Path,
    text: &'a str,
    specs: Vec<UpstreamSpec>,
    index: Lookup<String, UpstreamId>,
    named: Vec<bool>,
    first: Option<Location>,
    at: Vec<Option<Location>>,
}

/// The compiled upstreams, for [`Policy`]'s fields.
pub(super) struct Upstreams {
    pub(super) specs: Vec<UpstreamSpec>,
    pub(super) index: Lookup<String, UpstreamId>,
    pub(super) first: Option<Location>,
    /// Where each is defined, by id (`None` for `default`).
    pub(super) at: Vec<Option<Location>>,
}

impl<'a> UpstreamTable<'a> {
    /// Compiles the `[upstreams.NAME]` tables of `streams.toml` (`path`, whose contents are
    /// `text`), after `default`.
    pub(super) fn compile(
        sections: BTreeMap<String, UpstreamSection>,
        path: &'a Path,
        text: &'a str,
    ) -> Result<Self, PolicyError> {
        let mut table = UpstreamTable {
            path,
            text,
            specs: vec![UpstreamSpec::default_upstream()],
            index: Lookup::default(),
            named: vec![false],
            first: None,
            at: vec![None],
        };
        table
            .index
            .insert(DEFAULT_UPSTREAM.to_owned(), UpstreamId::DEFAULT);
        for (name, section) in sections {
            let header = table_line(text, "upstreams", &name);
            let err = |field: String, lc, message: String| PolicyError {
                location: Location {
                    file: path.to_owned(),
                    line_col: lc,
                    field: Some(field),
                },
                message,
            };
            let at = |span: std::ops::Range<usize>| Some(line_col(text, span.start));
            let table_err = |message: String| err(format!("upstreams.{name:?}"), header, message);
            let field = |f: &str| format!("upstreams.{name:?}.{f}");
            if name == DEFAULT_UPSTREAM {
                return Err(table_err(
                    "`default` is the upstream --upstream sets, where requests go that name no \
                     other: a policy cannot redefine it; give this upstream another name"
                        .into(),
                ));
            }
            if name == NO_UPSTREAM_LABEL {
                return Err(table_err(
                    "`none` is the metric label of requests answered before an upstream was \
                     chosen (shedgate_requests_total{upstream=\"none\"}): give this upstream \
                     another name"
                        .into(),
                ));
            }
            if !label_name_ok(&name) {
                return Err(table_err(format!(
                    "upstream name {name:?} must be 1..=64 characters of [A-Za-z0-9_.-], as \
                     stream and area names: it becomes a metric label"
                )));
            }
            if table.specs.len() == MAX_UPSTREAMS {
                return Err(table_err(format!(
                    "too many upstreams: at most {} [upstreams.NAME] tables, {MAX_UPSTREAMS} \
                     upstreams with `default` (each is a controller and its own metric series)",
                    MAX_UPSTREAMS - 1
                )));
            }
            let url = parse_url(section.url.get_ref())
                .map_err(|m| err(field("url"), at(section.url.span()), m))?;
            let max_inflight = match &section.max_inflight {
                None => None,
                Some(n) => Some(NonZeroU32::new(*n.get_ref()).ok_or_else(|| {
                    err(
                        field("max_inflight"),
                        at(n.span()),
                        "max_inflight must be positive; leave it out for no cap of its own \
                         (--max-inflight's then applies)"
                            .into(),
                    )
                })?),
            };
            let load_report = match &section.load_report {
                None => None,
                Some(m) => Some(
                    m.get_ref()
                        .parse::<LoadReportField>()
                        .map_err(|e| err(field("load_report"), at(m.span()), e))?,
                ),
            };
            if let (Some(target), Some(timeout)) = (&section.latency_target, &section.timeout)
                && target.get_ref().0 >= timeout.get_ref().0
            {
                return Err(err(
                    field("latency_target"),
                    at(target.span()),
                    format!(
                        "latency_target {:?} is not below timeout {:?}: requests would time out \
                         before pressure rises",
                        target.get_ref().0,
                        timeout.get_ref().0
                    ),
                ));
            }
            let id = UpstreamId(u16::try_from(table.specs.len()).unwrap_or(u16::MAX));
            table.index.insert(name.clone(), id);
            table.named.push(false);
            let at = Location {
                file: path.to_owned(),
                line_col: header,
                field: Some(format!("upstreams.{name:?}")),
            };
            table.first.get_or_insert_with(|| at.clone());
            table.at.push(Some(at));
            table.specs.push(UpstreamSpec {
                name,
                url: Some(url),
                latency_target: section.latency_target.map(|v| v.into_inner().0),
                max_inflight,
                timeout: section.timeout.map(|v| v.into_inner().0),
                connect_timeout: section.connect_timeout.map(|v| v.0),
                pool_idle_timeout: section.pool_idle_timeout.map(|v| v.0),
                pool_max_idle: section
                    .pool_max_idle
                    .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
                load_report,
            });
        }
        Ok(table)
    }

    /// The upstream an `upstream = "NAME"` key at `field` names (`None` without the key).
    ///
    /// # Errors
    /// A name the policy does not define, with the names it does.
    pub(super) fn resolve(
        &mut self,
        key: Option<Spanned<String>>,
        field: String,
    ) -> Result<Option<UpstreamId>, PolicyError> {
        let Some(key) = key else {
            return Ok(None);
        };
        let location = Location {
            file: self.path.to_owned(),
            line_col: Some(line_col(self.text, key.span().start)),
            field: Some(field),
        };
        let Some(&id) = self.index.get(key.get_ref()) else {
            let defined: Vec<&str> = self.specs.iter().map(|s| s.name.as_str()).collect();
            return Err(PolicyError {
                location,
                message: format!(
                    "no upstream {:?} (defined: {})",
                    key.get_ref(),
                    defined.join(", ")
                ),
            });
        };
        self.named[id.index()] = true;
        self.first.get_or_insert(location);
        Ok(Some(id))
    }

    /// The compiled upstreams, with a warning for each defined one nothing names.
    pub(super) fn finish(self, warnings: &mut Vec<Warning>) -> Upstreams {
        for (spec, _) in self
            .specs
            .iter()
            .zip(&self.named)
            .skip(1)
            .filter(|(_, named)| !**named)
        {
            warnings.push(Warning {
                file: self.path.to_owned(),
                message: format!(
                    "upstream {:?} is defined but no route or stream names it (`upstream = \
                     {:?}`): nothing is sent there",
                    spec.name, spec.name
                ),
            });
        }
        Upstreams {
            specs: self.specs,
            index: self.index,
            first: self.first,
            at: self.at,
        }
    }
}

/// Warns about each route that reads its stream from the body (a `stream_field`, a format
/// reading it) and names no upstream, while the streams it may read go to different
/// upstreams (an unknown one goes to `default`): its bodies are read before their upstream is
/// known, on the memory of the account no upstream owns (docs/operations.md "The proxy's own
/// memory"); the fix is `upstream` on the route. A mode's candidate streams are its map's
/// values and every stream whose name has its prefix.
pub(super) fn warn_body_streams_across_upstreams(
    streams: &[super::StreamPolicy],
    routes: &[super::Route],
    specs: &[UpstreamSpec],
    path: &Path,
    warnings: &mut Vec<Warning>,
) {
    for route in routes.iter().filter(|r| r.upstream.is_none()) {
        let mut bound = std::collections::BTreeSet::from([UpstreamId::DEFAULT]);
        for (_, mode) in &route.modes {
            let super::StreamSource::Field { map, prefix } = &mode.stream else {
                continue;
            };
            let candidates = streams.iter().filter(|s| {
                s.name.starts_with(prefix.as_str()) || map.values().any(|v| *v == s.name)
            });
            bound.extend(candidates.map(|s| s.upstream.unwrap_or(UpstreamId::DEFAULT)));
        }
        if bound.len() > 1 {
            let names: Vec<&str> = bound
                .iter()
                .filter_map(|id| specs.get(id.index()))
                .map(|s| s.name.as_str())
                .collect();
            warnings.push(Warning {
                file: path.to_owned(),
                message: format!(
                    "route {:?} reads its stream from the body and names no upstream, while the \
                     streams it may read go to different upstreams ({}): each body is read \
                     before its upstream is known, on buffered-bytes memory no upstream's share \
                     holds; set `upstream` on the route",
                    route.prefix,
                    names.join(", ")
                ),
            });
        }
    }
}

impl Policy {
    /// The upstreams, in id order: `default` (`--upstream`) first, then the
    /// `[upstreams.NAME]` tables in name order.
    pub fn upstreams(&self) -> &[UpstreamSpec] {
        &self.upstreams
    }

    /// Looks an upstream up by its exact name (`default` included).
    pub fn upstream(&self, name: &str) -> Option<UpstreamId> {
        self.upstream_index.get(name).copied()
    }

    /// The spec of an upstream id this policy issued.
    pub fn upstream_spec(&self, id: UpstreamId) -> &UpstreamSpec {
        &self.upstreams[id.index()]
    }

    /// The upstream a request goes to that came on `route` (an index into
    /// [`Policy::routes`]) and is of `stream`: the route's `upstream`, else the stream's,
    /// else `default`. A stream named in the body is known only once the body is read: the
    /// route's own upstream ([`super::Route::upstream`]) says whether it matters.
    pub fn upstream_of(&self, route: Option<usize>, stream: Option<StreamId>) -> UpstreamId {
        route
            .and_then(|i| self.routes.get(i))
            .and_then(|r| r.upstream)
            .or_else(|| stream.and_then(|id| self.streams.get(id.index())?.upstream))
            .unwrap_or(UpstreamId::DEFAULT)
    }

    /// Where the policy files define upstream `id` (its `[upstreams.NAME]` table's header,
    /// field `upstreams."NAME"`); `None` for `default`, which the command line defines.
    pub fn upstream_at(&self, id: UpstreamId) -> Option<&Location> {
        self.upstreams_at.get(id.index())?.as_ref()
    }

    /// Where the policy files first name an upstream (an `[upstreams.NAME]` table, else an
    /// `upstream = "NAME"` key); `None` when they name none and every request goes to
    /// `--upstream`.
    pub fn upstreams_named_at(&self) -> Option<&Location> {
        self.upstreams_named_at.as_ref()
    }

    /// Whether a stream names an upstream other than `default`: else every stream goes to
    /// `default` unless its route names another, so a body naming its own stream has its
    /// upstream settled before it is read. Computed when the policy compiles.
    pub fn streams_leave_default(&self) -> bool {
        self.streams_leave_default
    }
}

#[cfg(test)]
mod tests;
