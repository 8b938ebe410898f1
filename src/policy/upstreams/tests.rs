//! Named upstreams: `[upstreams.NAME]` tables and `upstream = "NAME"` keys compiled, each
//! error with its file, line and field, and the unused-upstream warning.

use std::path::PathBuf;
use std::time::Duration;

use crate::policy::{Compiled, PolicyError, PolicyFiles, UpstreamId, compile};
use crate::pressure::report::LoadReportField;

fn compile_str(streams: &str) -> Result<Compiled, PolicyError> {
    compile(&PolicyFiles {
        dir: PathBuf::from("p"),
        streams: streams.to_owned(),
        areas: Some("default_rank = 50\n".to_owned()),
        regions: std::collections::BTreeMap::new(),
    })
}

/// Two upstreams; `tracking` is named by a stream and a route, `events` by a route.
const TWO: &str = r#"
[upstreams.tracking]
url = "http://127.0.0.1:3001/v1"
latency_target = "50ms"
timeout = "2s"
max_inflight = 32
load_report = "named_metrics.queue"

[upstreams.events]
url = "http://events.internal:8080"
connect_timeout = "500ms"
pool_idle_timeout = "1s"
pool_max_idle = 0

[streams."vehicle.position"]
supersession = "self-superseding"
upstream = "tracking"

[streams."geofence.transition"]
supersession = "never"

[[routes]]
prefix = "/fleet"
stream = "vehicle.position"

[[routes]]
prefix = "/events"
stream_header = "x-kind"
upstream = "events"

[[routes]]
prefix = "/track"
upstream = "tracking"
"#;

/// The error of `streams`, with the line and field it must name and a text its message must
/// hold.
fn assert_error(streams: &str, line: usize, field: &str, says: &str) {
    let e = compile_str(streams).unwrap_err();
    assert_eq!(e.location.file, PathBuf::from("p/streams.toml"), "{e}");
    assert_eq!(e.location.line_col.map(|l| l.0), Some(line), "{e}");
    assert_eq!(e.location.field.as_deref(), Some(field), "{e}");
    assert!(e.message.contains(says), "{e}");
}

#[test]
fn upstreams_compile_with_default_first_and_overrides_kept() {
    let c = compile_str(TWO).unwrap();
    let p = &c.policy;
    let names: Vec<&str> = p.upstreams().iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["default", "events", "tracking"]);
    assert_eq!(p.upstream("default"), Some(UpstreamId::DEFAULT));
    assert_eq!(p.upstream("nowhere"), None);
    let default = p.upstream_spec(UpstreamId::DEFAULT);
    assert!(default.url.is_none() && default.latency_target.is_none());
    assert!(default.max_inflight.is_none() && default.load_report.is_none());
    let tracking = p.upstream_spec(p.upstream("tracking").unwrap());
    assert_eq!(
        tracking.url.as_ref().map(ToString::to_string).as_deref(),
        Some("http://127.0.0.1:3001/v1")
    );
    assert_eq!(tracking.latency_target, Some(Duration::from_millis(50)));
    assert_eq!(tracking.timeout, Some(Duration::from_secs(2)));
    assert_eq!(tracking.max_inflight.map(|n| n.get()), Some(32));
    assert_eq!(
        tracking.load_report,
        Some(LoadReportField::Named("queue".into()))
    );
    assert_eq!(tracking.connect_timeout, None);
    let events = p.upstream_spec(p.upstream("events").unwrap());
    assert_eq!(events.connect_timeout, Some(Duration::from_millis(500)));
    assert_eq!(events.timeout, None);
    assert_eq!(
        (events.pool_idle_timeout, events.pool_max_idle),
        (Some(Duration::from_secs(1)), Some(0)),
        "0 is a cap: none kept"
    );
    assert_eq!(
        (tracking.pool_idle_timeout, tracking.pool_max_idle),
        (None, None)
    );
    assert!(c.warnings.iter().all(|w| !w.message.contains("upstream")));
    // The first table in name order is where the files first name an upstream.
    let at = p.upstreams_named_at().unwrap();
    assert_eq!(at.field.as_deref(), Some("upstreams.\"events\""));
    assert_eq!(at.line_col.map(|l| l.0), Some(9));
}

/// A route's upstream wins; a stream's applies where the route names none; else `default`.
#[test]
fn upstream_of_takes_the_route_then_the_stream_then_default() {
    let p = compile_str(TWO).unwrap().policy;
    let tracking = p.upstream("tracking").unwrap();
    let events = p.upstream("events").unwrap();
    let position = p.stream("vehicle.position");
    let fence = p.stream("geofence.transition");
    let route = |prefix: &str| p.routes().iter().position(|r| r.prefix == prefix);
    // The route names `events`; its stream names `tracking`: the route wins.
    assert_eq!(p.upstream_of(route("/events"), position), events);
    assert_eq!(p.upstream_of(route("/events"), fence), events);
    assert_eq!(p.upstream_of(route("/events"), None), events);
    // The route names none: the stream's, else default.
    assert_eq!(p.upstream_of(route("/fleet"), position), tracking);
    assert_eq!(p.upstream_of(route("/fleet"), fence), UpstreamId::DEFAULT);
    assert_eq!(p.upstream_of(route("/fleet"), None), UpstreamId::DEFAULT);
    // No route.
    assert_eq!(p.upstream_of(None, position), tracking);
    assert_eq!(p.upstream_of(None, fence), UpstreamId::DEFAULT);
    assert_eq!(p.upstream_of(None, None), UpstreamId::DEFAULT);
    assert_eq!(p.upstream_of(route("/track"), fence), tracking);
    assert_eq!(p.routes()[0].upstream, None);
}

#[test]
fn a_policy_without_upstreams_sends_everything_to_default() {
    let p = compile_str("[streams.a]\nsupersession = \"never\"\n")
        .unwrap()
        .policy;
    assert_eq!(p.upstreams().len(), 1);
    assert!(p.upstreams_named_at().is_none());
    assert_eq!(p.upstream_of(None, p.stream("a")), UpstreamId::DEFAULT);
    // Naming `default` is naming an upstream: where it is said is known.
    let p = compile_str("[streams.a]\nsupersession = \"never\"\nupstream = \"default\"\n")
        .unwrap()
        .policy;
    assert_eq!(p.upstream_of(None, p.stream("a")), UpstreamId::DEFAULT);
    let at = p.upstreams_named_at().unwrap();
    assert_eq!(at.field.as_deref(), Some("streams.\"a\".upstream"));
    assert_eq!(at.line_col, Some((3, 12)));
}

#[test]
fn an_unknown_upstream_name_is_refused_with_the_names_defined() {
    let route = "[upstreams.b]\nurl = \"http://b:1\"\n[upstreams.a]\nurl = \"http://a:1\"\n\
                 [[routes]]\nprefix = \"/x\"\nupstream = \"billing\"\n";
    assert_error(
        route,
        7,
        "routes[0].upstream",
        "no upstream \"billing\" (defined: default, a, b)",
    );
    let stream = "[streams.s]\nsupersession = \"never\"\n\nupstream = \"Default\"\n";
    assert_error(
        stream,
        4,
        "streams.\"s\".upstream",
        "no upstream \"Default\" (defined: default)",
    );
}

#[test]
fn upstream_urls_are_plain_http_with_a_host_and_no_query() {
    let table = |url: &str| format!("[upstreams.a]\n\nurl = {url:?}\n");
    assert_error(
        &table("https://a.internal"),
        3,
        "upstreams.\"a\".url",
        "scheme \"https\" is not supported at the upstream, which shedgate speaks plain HTTP \
         to; use http:// (terminate TLS in front of the upstream)",
    );
    assert_error(
        &table("a.internal:8080"),
        3,
        "upstreams.\"a\".url",
        "\"a.internal:8080\" needs http://",
    );
    assert_error(
        &table("http://a:1/ingest?key=1"),
        3,
        "upstreams.\"a\".url",
        "must not have a query string",
    );
    assert_error(
        &table("http://:8080"),
        3,
        "upstreams.\"a\".url",
        "\"http://:8080\" has no host",
    );
    assert_error(&table("http://"), 3, "upstreams.\"a\".url", "invalid URL");
    assert_error(&table("/ingest"), 3, "upstreams.\"a\".url", "needs http://");
    // A table without a URL, or with a key no upstream has.
    assert_error(
        "[upstreams.a]\nlatency_target = \"1s\"\n",
        1,
        "upstreams.a",
        "missing field `url`",
    );
    assert_error(
        "[upstreams.a]\nurl = \"http://a:1\"\npool = 4\n",
        3,
        "upstreams.a.pool",
        "unknown field `pool`",
    );
}

/// The rule `--upstream` and `url` share: a port without a host (`http://:80`, which
/// `http::Uri` reads as an authority) has no host.
#[test]
fn parse_url_is_the_upstream_flags_rule() {
    let url = crate::policy::parse_url("http://127.0.0.1:3000/base").unwrap();
    assert_eq!(url.path(), "/base");
    for bad in ["https://x", "ftp://x", "x", "http://x/?q", "", "http://:80"] {
        assert!(crate::policy::parse_url(bad).is_err(), "{bad}");
    }
}

#[test]
fn upstream_settings_are_checked_where_they_are_written() {
    assert_error(
        "[upstreams.a]\nurl = \"http://a:1\"\nmax_inflight = 0\n",
        3,
        "upstreams.\"a\".max_inflight",
        "max_inflight must be positive",
    );
    assert_error(
        "[upstreams.a]\nurl = \"http://a:1\"\nload_report = \"queue_depth\"\n",
        3,
        "upstreams.\"a\".load_report",
        "\"queue_depth\" is not an ORCA utilisation",
    );
    assert_error(
        "[upstreams.a]\nurl = \"http://a:1\"\nlatency_target = \"2s\"\ntimeout = \"2s\"\n",
        3,
        "upstreams.\"a\".latency_target",
        "is not below timeout",
    );
    assert_error(
        "[upstreams.a]\nurl = \"http://a:1\"\nconnect_timeout = \"0s\"\n",
        3,
        "upstreams.a.connect_timeout",
        "duration must be positive",
    );
    assert_error(
        "[upstreams.a]\nurl = \"http://a:1\"\npool_idle_timeout = \"0s\"\n",
        3,
        "upstreams.a.pool_idle_timeout",
        "duration must be positive",
    );
    assert_error(
        "[upstreams.a]\nurl = \"http://a:1\"\npool_max_idle = -1\n",
        3,
        "upstreams.a.pool_max_idle",
        "invalid value",
    );
}

#[test]
fn default_cannot_be_defined_and_names_are_label_safe() {
    assert_error(
        "[streams.s]\nsupersession = \"never\"\n[upstreams.default]\nurl = \"http://a:1\"\n",
        3,
        "upstreams.\"default\"",
        "`default` is the upstream --upstream sets",
    );
    assert_error(
        "[upstreams.\"a b\"]\nurl = \"http://a:1\"\n",
        1,
        "upstreams.\"a b\"",
        "must be 1..=64 characters of [A-Za-z0-9_.-]",
    );
    // `none` labels requests answered before an upstream was chosen: two series would share
    // one label set.
    assert_error(
        "[upstreams.none]\nurl = \"http://a:1\"\n",
        1,
        "upstreams.\"none\"",
        "`none` is the metric label of requests answered before an upstream was chosen",
    );
}

#[test]
fn at_most_64_upstreams_with_default() {
    let tables = |n: usize| {
        (0..n)
            .map(|i| format!("[upstreams.u{i:02}]\nurl = \"http://a:{i}\"\n"))
            .collect::<String>()
    };
    let c = compile_str(&tables(63)).unwrap();
    assert_eq!(c.policy.upstreams().len(), crate::policy::MAX_UPSTREAMS);
    // The 64th table, in name order, is one too many.
    assert_error(&tables(64), 127, "upstreams.\"u63\"", "too many upstreams");
}

#[test]
fn an_upstream_nothing_names_is_warned_about() {
    let streams = TWO.replace("upstream = \"events\"\n", "");
    let c = compile_str(&streams).unwrap();
    let unused: Vec<&str> = c
        .warnings
        .iter()
        .filter(|w| w.message.contains("no route or stream names it"))
        .map(|w| w.message.as_str())
        .collect();
    assert_eq!(unused.len(), 1, "{:?}", c.warnings);
    assert!(
        unused[0].starts_with("upstream \"events\" is defined"),
        "{unused:?}"
    );
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
}

/// A route that reads its stream from the body and names no upstream, while the streams it
/// may read go to different upstreams, is warned about (its bodies are read before their
/// upstream is known); one whose candidates all go to one upstream, or that names its own
/// upstream, or that reads its stream from a header, is not.
#[test]
fn a_body_stream_route_across_upstreams_is_warned_about() {
    const BASE: &str = r#"
[upstreams.tracking]
url = "http://tracking:1"

[streams."fleet.position"]
supersession = "self-superseding"
upstream = "tracking"

[streams."fleet.fence"]
supersession = "never"

[streams."other.reading"]
supersession = "self-superseding"
"#;
    let warned = |routes: &str| -> Vec<String> {
        compile_str(&format!("{BASE}{routes}"))
            .unwrap()
            .warnings
            .into_iter()
            .map(|w| w.message)
            .filter(|m| m.contains("reads its stream from the body"))
            .collect()
    };
    let w = warned("[[routes]]\nprefix = \"/mixed\"\nstream_field = \"/kind\"\n");
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains("route \"/mixed\"")
            && w[0].contains("(default, tracking)")
            && w[0].contains("set `upstream` on the route"),
        "{w:?}"
    );
    // Through a map too: the map's values are what the field may name.
    let w = warned(
        "[[routes]]\nprefix = \"/mapped\"\nstream_field = \"/kind\"\nstream_prefix = \"x.\"\n\
         stream_map = { pos = \"fleet.position\" }\n",
    );
    assert_eq!(w.len(), 1, "{w:?}");
    // Named on the route: its upstream is known before the body.
    assert!(
        warned(
            "[[routes]]\nprefix = \"/fleet\"\nstream_field = \"/kind\"\nupstream = \"tracking\"\n"
        )
        .is_empty()
    );
    // Every stream it may read goes to `default` (unknown ones too).
    assert!(warned("[[routes]]\nprefix = \"/other\"\nstream_field = \"/kind\"\nstream_prefix = \"other.\"\n").is_empty());
    // A header names the stream before the body.
    assert!(warned("[[routes]]\nprefix = \"/h\"\nstream_header = \"x-kind\"\n").is_empty());
}
