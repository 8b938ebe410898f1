//! Compile tests: policy texts in, a compiled policy or an error with its location out.

use std::path::{Path, PathBuf};

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
    let e = compile_str(STREAMS, "[[areas]]\nname = \"x\"\nrank = 0\ncells = []\n").unwrap_err();
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

/// A range error found after parsing points at the value itself (toml spans), not at the
/// first line that happens to start with the key's name.
#[test]
fn curve_range_errors_point_at_the_value() {
    let streams = "[defaults]\nstale_after = \"30s\"\n  ramp =   0.9\n[streams.a]\nsupersession = \"never\"\n";
    let e = compile_str(streams, "").unwrap_err();
    assert_eq!(e.location.line_col, Some((3, 12)), "{e}");
    assert_eq!(e.location.field.as_deref(), Some("defaults.ramp"));
    let e = compile_str("[defaults]\nband = 51\n", "").unwrap_err();
    assert_eq!(e.location.line_col, Some((2, 8)), "{e}");
    assert_eq!(e.location.field.as_deref(), Some("defaults.band"));
    let e = compile_str("[defaults]\nramp = \"steep\"\n", "").unwrap_err();
    assert_eq!(e.location.line_col.map(|l| l.0), Some(2), "{e}");
    assert_eq!(e.location.field.as_deref(), Some("defaults.ramp"), "{e}");
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

/// Stale answers: a route's `stale_body` must be JSON (refused at its line otherwise); the
/// format's success body applies without one; a status that carries no success body is
/// warned about.
#[test]
fn stale_bodies() {
    let bad = format!("{STREAMS}\n[[routes]]\nprefix = \"/a\"\nstale_body = \"ok\"\n");
    let e = compile_str(&bad, "").unwrap_err();
    assert_eq!(e.location.field.as_deref(), Some("routes[0].stale_body"));
    assert_eq!(e.location.line_col.map(|(l, _)| l), Some(7), "{e}");
    let routes = format!(
        "{STREAMS}\n[[routes]]\nprefix = \"/ot\"\nformat = \"owntracks\"\n\n[[routes]]\nprefix = \"/ol\"\nformat = \"overland\"\nstream = \"vehicle.position\"\n\n[[routes]]\nprefix = \"/p\"\n"
    );
    let c = compile_str(&routes, "").unwrap();
    let body = |i: usize| c.policy.stale_body(Some(i), None);
    assert_eq!(body(0).as_deref(), Some(&b"[]"[..]));
    assert_eq!(body(1).as_deref(), Some(&br#"{"result":"ok"}"#[..]));
    assert_eq!(body(2), None);
    // A route that only names the stream answers in the stream's format.
    let own = "[streams.\"ot\"]\nsupersession = \"never\"\nformat = \"owntracks\"\n\n[[routes]]\nprefix = \"/o\"\nstream = \"ot\"\n";
    let c2 = compile_str(own, "").unwrap();
    let ot = c2.policy.stream("ot");
    assert_eq!(
        c2.policy.stale_body(Some(0), ot).as_deref(),
        Some(&b"[]"[..])
    );
    assert!(
        c.warnings
            .iter()
            .all(|w| !w.message.contains("stale_status"))
    );
    let conflict = format!("[defaults]\nstale_status = 409\n{routes}");
    let c = compile_str(&conflict, "").unwrap();
    assert_eq!(
        c.policy.stale_body(Some(0), None),
        None,
        "a 4xx is no success"
    );
    let no_content = format!("[defaults]\nstale_status = 204\n{routes}");
    let c = compile_str(&no_content, "").unwrap();
    assert_eq!(c.policy.stale_body(Some(0), None), None);
    assert!(
        c.warnings
            .iter()
            .any(|w| w.message.contains("\"/ot\"") && w.message.contains("stale_status 204")),
        "{:?}",
        c.warnings
    );
}

/// An encrypted OwnTracks envelope may hold a geofence transition: `check` refuses a
/// sheddable stream that an owntracks route maps it to, by prefix or by `stream_map`.
#[test]
fn opaque_envelopes_must_map_to_never_streams() {
    let route = "\n[[routes]]\nprefix = \"/ot\"\nformat = \"owntracks\"\n";
    let sheddable = "[streams.\"owntracks.encrypted\"]\nsupersession = \"self-superseding\"\n";
    let e = compile_str(&format!("{sheddable}{route}"), "").unwrap_err();
    assert_eq!(
        e.location.field.as_deref(),
        Some("streams.\"owntracks.encrypted\".supersession")
    );
    assert!(
        e.message.contains("\"/ot\"") && e.message.contains("owntracks"),
        "{e}"
    );
    let mapped = format!("{STREAMS}{route}stream_map = {{ encrypted = \"vehicle.position\" }}\n");
    assert!(compile_str(&mapped, "").is_err());
    let never = "[streams.\"owntracks.encrypted\"]\nsupersession = \"never\"\n";
    assert!(compile_str(&format!("{never}{route}"), "").is_ok());
    // Undeclared: unknown, so never shed.
    assert!(compile_str(&format!("{STREAMS}{route}"), "").is_ok());
    // A fixed sheddable stream on an owntracks route, or a sheddable stream read as owntracks.
    let fixed = format!("{STREAMS}{route}stream = \"vehicle.position\"\n");
    let e = compile_str(&fixed, "").unwrap_err();
    assert_eq!(e.location.field.as_deref(), Some("routes[0].stream"), "{e}");
    let own = "[streams.\"ot\"]\nsupersession = \"self-superseding\"\nformat = \"owntracks\"\n";
    let e = compile_str(own, "").unwrap_err();
    assert_eq!(
        e.location.field.as_deref(),
        Some("streams.\"ot\".format"),
        "{e}"
    );
    // A header-named owntracks route cannot be checked: warned about.
    let header = format!("{STREAMS}{route}stream_header = \"x-kind\"\n");
    let c = compile_str(&header, "").unwrap();
    assert!(
        c.warnings
            .iter()
            .any(|w| w.message.contains("encrypted envelope")),
        "{:?}",
        c.warnings
    );
}

/// Stream names follow the area names' grammar: `dock\A` and `dock\\A` would render as one
/// label value. Refused with file, line and field.
#[test]
fn stream_names_are_label_safe() {
    for (toml_key, name) in [
        (r#""dock\\A""#, "dock\\A"),
        (r#"'dock\\A'"#, "dock\\\\A"),
        (r#""a\"b""#, "a\"b"),
        (r#""has space""#, "has space"),
    ] {
        let text = format!(
            "[streams.\"ok\"]\nsupersession = \"never\"\n\n[streams.{toml_key}]\nsupersession = \"never\"\n"
        );
        let e = compile_str(&text, "").unwrap_err();
        assert_eq!(e.location.field, Some(format!("streams.{name:?}")), "{e}");
        assert_eq!(
            e.location.line_col.map(|(l, _)| l),
            Some(4),
            "{toml_key}: {e}"
        );
    }
    let long = format!("[streams.{}]\nsupersession = \"never\"\n", "a".repeat(65));
    assert!(compile_str(&long, "").is_err());
    assert!(
        compile_str(
            "[streams.\"com.example-fleet_pos.v2\"]\nsupersession = \"never\"\n",
            ""
        )
        .is_ok()
    );
}

/// Route prefixes are normalised paths, as requests are matched: one that is not could never
/// match, so it is refused.
#[test]
fn route_prefixes_are_normalised_paths() {
    for prefix in ["/a//b", "/a/./b", "/~%7Euser", "/a/../b"] {
        let text = format!("{STREAMS}\n[[routes]]\nprefix = \"{prefix}\"\n");
        let e = compile_str(&text, "").unwrap_err();
        assert_eq!(
            e.location.field.as_deref(),
            Some("routes[0].prefix"),
            "{prefix}: {e}"
        );
    }
    assert!(compile_str(&format!("{STREAMS}\n[[routes]]\nprefix = \"/a/b/\"\n"), "").is_ok());
}

/// MobilityDB PR #1830, h3-js#79: H3 ids as tools print them. A `0x` prefix and upper case
/// are read; a leading `+` (which `u64::from_str_radix`, and so h3o, would take), inner
/// whitespace and other spellings are refused with the form expected.
#[test]
fn h3_cells_are_read_as_tools_print_them_and_nothing_else() {
    use super::file::parse_cell;
    let berlin = "841f1d5ffffffff";
    for text in [
        berlin,
        "841F1D5FFFFFFFF",
        "0x841f1d5ffffffff",
        "0X841F1D5FFFFFFFF",
        " 841f1d5ffffffff ",
    ] {
        assert_eq!(parse_cell(text).unwrap().to_string(), berlin, "{text:?}");
    }
    for text in [
        "+841f1d5ffffffff",
        "841f1d5 ffffffff",
        "841f1d5-ffffffff",
        "0x",
        "",
        "h841f1d5ffffffff",
        "0x+841f1d5ffffffff",
    ] {
        let err = parse_cell(text).unwrap_err();
        assert!(err.contains("15 hexadecimal digits"), "{text:?}: {err}");
    }
    // In a policy: the canonical form is what GET /policy lists and what check notes.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("streams.toml"), "[defaults]\n").unwrap();
    std::fs::write(
        dir.path().join("areas.toml"),
        "[[areas]]\nname = \"berlin\"\nrank = 5\ncells = [\"0x841F1D5FFFFFFFF\"]\n",
    )
    .unwrap();
    let compiled = super::load_dir(dir.path()).unwrap();
    assert_eq!(
        compiled.policy.areas()[0].listed_cells,
        vec![berlin.to_owned()]
    );
    assert_eq!(compiled.notes.len(), 1);
    assert!(compiled.notes[0].message.contains(berlin));
    std::fs::write(
        dir.path().join("areas.toml"),
        "[[areas]]\nname = \"berlin\"\nrank = 5\ncells = [\"+841f1d5ffffffff\"]\n",
    )
    .unwrap();
    let err = super::load_dir(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains("areas.toml") && err.contains("15 hexadecimal digits"),
        "{err}"
    );
}

/// `[defaults] max_speed` and `device_placeholders`: compiled, their defaults, and a bad
/// speed named by file, line and field.
#[test]
fn device_trust_keys() {
    let c = compile_str("[defaults]\n", "").unwrap();
    let trust = c.policy.device_trust();
    assert!((trust.max_speed - 300.0).abs() < f64::EPSILON);
    assert!(trust.placeholders.is_empty());
    let c = compile_str(
        "[defaults]\nmax_speed = 70\ndevice_placeholders = [\"N/A\", \" test \"]\n",
        "",
    )
    .unwrap();
    let trust = c.policy.device_trust();
    assert!((trust.max_speed - 70.0).abs() < f64::EPSILON);
    assert_eq!(
        trust.placeholders,
        vec![Box::<str>::from("n/a"), Box::from("test")]
    );
    for bad in ["0", "-5", "nan", "inf"] {
        let e = compile_str(&format!("[defaults]\nmax_speed = {bad}\n"), "").unwrap_err();
        assert_eq!(
            e.location.field.as_deref(),
            Some("defaults.max_speed"),
            "{e}"
        );
        assert_eq!(e.location.line_col, Some((2, 13)), "{e}");
        assert!(e.to_string().contains("metres per second"), "{e}");
    }
    let e = compile_str("[defaults]\ndevice_placeholders = \"unknown\"\n", "").unwrap_err();
    assert!(e.to_string().contains("device_placeholders"), "{e}");
}

/// GPSLogger's `%SER` is `unknown` on Android 8 and later: a route reading the device from
/// `ser` is warned about, with the key to use instead.
#[test]
fn a_route_keyed_on_gpsloggers_ser_is_warned_about() {
    let route = |key: &str| {
        format!(
            "[streams.v]\nsupersession = \"self-superseding\"\n[[routes]]\nprefix = \"/g\"\n\
             stream = \"v\"\nparams = {{ lat = \"lat\", lon = \"lon\", device = \"{key}\" }}\n"
        )
    };
    let c = compile_str(&route("ser"), "").unwrap();
    assert!(
        c.warnings
            .iter()
            .any(|w| w.message.contains("%SER") && w.message.contains("%AID")),
        "{:?}",
        c.warnings
    );
    let c = compile_str(&route("SER"), "").unwrap();
    assert!(c.warnings.iter().any(|w| w.message.contains("%SER")));
    let c = compile_str(&route("aid"), "").unwrap();
    assert!(!c.warnings.iter().any(|w| w.message.contains("%SER")));
}
