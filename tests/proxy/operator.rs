//! What ships for operators beside the proxy: the Grafana dashboard and `shedgate curve`.

use std::collections::BTreeSet;

/// The dashboard is provisioning-ready JSON, and every metric its queries name is one the
/// proxy declares (`shedgate::metrics::CATALOG`; a histogram's `_bucket`, `_sum` and `_count`
/// series count as the histogram).
#[test]
fn the_grafana_dashboard_queries_only_declared_metrics() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/shedgate.json");
    let dash: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .expect("the dashboard parses as JSON");
    assert_eq!(dash["uid"], "shedgate");
    let mut exprs = Vec::new();
    for panel in dash["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            exprs.push(target["expr"].as_str().expect("expr").to_owned());
        }
    }
    assert!(exprs.len() >= 10, "{exprs:?}");
    let declared: BTreeSet<&str> = shedgate::metrics::CATALOG
        .iter()
        .map(|(n, _, _)| *n)
        .collect();
    let histogram = |name: &str| {
        shedgate::metrics::CATALOG
            .iter()
            .any(|(n, kind, _)| *n == name && *kind == "histogram")
    };
    let mut named = BTreeSet::new();
    for expr in &exprs {
        let bytes = expr.as_bytes();
        let mut i = 0;
        while let Some(at) = expr[i..].find("shedgate_") {
            let start = i + at;
            let end = start
                + bytes[start..]
                    .iter()
                    .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
                    .count();
            named.insert(expr[start..end].to_owned());
            i = end;
        }
    }
    for name in &named {
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|b| histogram(b)))
            .unwrap_or(name);
        assert!(declared.contains(base), "{name} is not a declared metric");
    }
    // The panels the operator steers by.
    for wanted in [
        "shedgate_pressure",
        "shedgate_rank_cutoff",
        "shedgate_shed_total",
        "shedgate_inflight_requests",
        "shedgate_upstream_latency_seconds_bucket",
        "shedgate_policy_info",
        "shedgate_policy_reloads_total",
        "shedgate_devices_past_floor",
        "shedgate_freshness_total",
        "shedgate_disabled_until_timestamp_seconds",
    ] {
        assert!(named.contains(wanted), "no panel shows {wanted}");
    }
    // Each upstream has its own controller: an `upstream` variable, and every query of a
    // per-upstream series filters by it and keeps it apart.
    let variables = dash["templating"]["list"].as_array().expect("variables");
    let upstream = variables
        .iter()
        .find(|v| v["name"] == "upstream")
        .expect("an upstream variable");
    assert!(
        upstream["query"]
            .as_str()
            .is_some_and(|q| q.contains(", upstream)")),
        "{upstream}"
    );
    for expr in &exprs {
        let per_upstream = [
            "shedgate_pressure{",
            "shedgate_rank_cutoff{",
            "shedgate_inflight_requests{",
            "shedgate_upstream_latency_seconds_bucket{",
            "shedgate_clock_offset_seconds{",
        ];
        if per_upstream.iter().any(|m| expr.contains(m)) {
            assert!(expr.contains("upstream=~\"$upstream\""), "{expr}");
            assert!(
                expr.contains("by (instance, upstream)") || expr.contains("by (upstream, le)"),
                "{expr} sums the upstreams together"
            );
        }
    }
    assert!(
        exprs
            .iter()
            .any(|e| e.contains("shedgate_requests_total") && e.contains("sum by (upstream)")),
        "no panel shows the share shed per upstream"
    );
}

/// Runs `shedgate ARGS`; returns the exit code, stdout and stderr.
#[cfg(feature = "plot")]
fn shedgate(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shedgate"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `shedgate curve` draws the example policy as SVG with what a reader needs in the text: the
/// title with the policy version, the axis labels, a legend entry per pressure saying which
/// ranks it keeps, every area and `default_rank` at their ranks. The PNG decodes at the
/// stated size, and each pressure's colour is on it.
#[cfg(feature = "plot")]
#[test]
fn the_curve_picture_names_its_policy_pressures_and_areas() {
    use shedgate::plot::{PALETTE, curve::SIZE};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let policies = root.join("policies");
    let version = shedgate::policy::load_dir(&policies)
        .unwrap()
        .policy
        .version()
        .to_owned();
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("curve.svg");
    let (code, out, err) = shedgate(&[
        "curve".as_ref(),
        "--policies".as_ref(),
        policies.as_os_str(),
        "--out".as_ref(),
        svg.as_os_str(),
        "--pressures".as_ref(),
        "0.75,0.6".as_ref(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains(&version), "{out}");
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{}", &text[..80]);
    // The text of each `<text>` element, trimmed.
    let texts: Vec<&str> = text
        .split("<text")
        .skip(1)
        .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim()))
        .collect();
    for needle in [
        format!("Shed curve of policy {version} (enforce mode)"),
        "area rank (1 = most important, shed last; 100 = shed first)".to_owned(),
        "shed probability (0–1)".to_owned(),
        "pressure 0.60: ranks ≤ 40 kept".to_owned(),
        "pressure 0.75: ranks ≤ 25 kept".to_owned(),
        "rank 5: berlin".to_owned(),
        "rank 10: tokyo, new-york".to_owned(),
        "default_rank 50: every unlisted place".to_owned(),
    ] {
        assert!(
            texts.contains(&needle.as_str()),
            "{needle:?} is not in {texts:?}"
        );
    }
    // Tick values on both axes.
    for tick in ["0.0", "0.5", "1.0", "0", "50", "100"] {
        assert!(texts.contains(&tick), "tick {tick} is not in {texts:?}");
    }

    // The spec's view: against pressure, one line per rank that has areas.
    let by_pressure = dir.path().join("by-pressure.svg");
    let (code, out, err) = shedgate(&[
        "curve".as_ref(),
        "--policies".as_ref(),
        policies.as_os_str(),
        "--out".as_ref(),
        by_pressure.as_os_str(),
        "--against".as_ref(),
        "pressure".as_ref(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let text = std::fs::read_to_string(&by_pressure).unwrap();
    for needle in [
        "pressure (0–1; nothing is shed at or below 0.5)",
        "rank 5: berlin",
        "rank 20: sao-paulo, lagos, mumbai, delhi",
        "default_rank 50: every unlisted place",
        "0.50",
        "0.75",
    ] {
        assert!(text.contains(needle), "{needle:?} is not in the SVG");
    }
    let policy = shedgate::policy::load_dir(&policies).unwrap().policy;
    let lines = shedgate::plot::curve::pressure_lines(&policy);
    let at = |rank: u8, p: f64| {
        let (_, _, line) = lines.iter().find(|(r, _, _)| r.get() == rank).unwrap();
        line.iter().find(|(x, _)| (x - p).abs() < 1e-9).unwrap().1
    };
    // The seed's example: at 0.75, rank 50 is always shed and rank 5 never; nothing at 0.5.
    assert_eq!((at(5, 0.75), at(50, 0.75)), (0.0, 1.0));
    assert_eq!((at(5, 0.5), at(50, 0.5)), (0.0, 0.0));
    assert_eq!((at(5, 1.0), at(50, 1.0)), (1.0, 1.0));

    let png = dir.path().join("curve.png");
    let (code, out, err) = shedgate(&[
        "curve".as_ref(),
        "--policies".as_ref(),
        policies.as_os_str(),
        "--out".as_ref(),
        png.as_os_str(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let decoder = png::Decoder::new(std::fs::File::open(&png).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut pixels = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut pixels).unwrap();
    assert_eq!((frame.width, frame.height), SIZE);
    assert_eq!(frame.color_type, png::ColorType::Rgb);
    let pixels = &pixels[..frame.buffer_size()];
    let default_lines = shedgate::plot::curve::DEFAULT_PRESSURES.split(',').count();
    for colour in &PALETTE[..default_lines] {
        let n = pixels
            .chunks_exact(3)
            .filter(|p| *p == [colour.0, colour.1, colour.2])
            .count();
        assert!(n > 200, "{colour:?}: {n} pixels");
    }
}

/// Arguments the command cannot honour are refused with exit 2 and what was wrong; a policy
/// that does not compile is exit 1 with its error; nothing is written either way.
#[cfg(feature = "plot")]
#[test]
fn the_curve_command_refuses_what_it_cannot_draw() {
    let dir = tempfile::tempdir().unwrap();
    let out = |name: &str| dir.path().join(name).into_os_string();
    let policies: &std::ffi::OsStr = concat!(env!("CARGO_MANIFEST_DIR"), "/policies").as_ref();
    let cases: [(Vec<std::ffi::OsString>, i32, &str); 6] = [
        (
            vec![
                "--out".into(),
                out("a.png"),
                "--against".into(),
                "pressure".into(),
                "--pressures".into(),
                "0.6".into(),
            ],
            2,
            "--pressures draws the rank view",
        ),
        (
            vec![
                "--out".into(),
                out("a.png"),
                "--format".into(),
                "svg".into(),
            ],
            2,
            "names another format",
        ),
        (
            vec!["--out".into(), out("a")],
            2,
            "name a .png or .svg file",
        ),
        (
            vec![
                "--out".into(),
                out("a.png"),
                "--pressures".into(),
                "0.6,1.5".into(),
            ],
            2,
            "1.5 is outside [0, 1]",
        ),
        (
            vec!["--out".into(), out("a"), "--format".into(), "gif".into()],
            2,
            "unknown picture format",
        ),
        (
            vec![
                "--out".into(),
                out("a.svg"),
                "--policies".into(),
                dir.path().join("missing").into_os_string(),
            ],
            1,
            "missing",
        ),
    ];
    for (args, want, says) in cases {
        let mut all: Vec<&std::ffi::OsStr> = vec!["curve".as_ref()];
        if !args.iter().any(|a| a == "--policies") {
            all.extend(["--policies".as_ref(), policies]);
        }
        all.extend(args.iter().map(|a| a.as_os_str()));
        let (code, _, err) = shedgate(&all);
        assert_eq!(code, want, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// The Kubernetes manifest autoscales shedgate without a per-replica concurrency number: a
/// HorizontalPodAutoscaler (autoscaling/v2, on CPU) owns the Deployment's replica count, a
/// PodDisruptionBudget keeps voluntary disruptions to one pod, and no `--max-inflight` ties
/// the replicas to a count that the autoscaler changes.
#[test]
fn the_kubernetes_manifest_autoscales_without_a_concurrency_number() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/kubernetes/shedgate.yaml"
    );
    let text = std::fs::read_to_string(path).unwrap();
    let docs: Vec<&str> = text.split("\n---\n").collect();
    let kind = |k: &str| {
        docs.iter()
            .copied()
            .find(|d| d.lines().any(|l| l.trim() == format!("kind: {k}")))
            .unwrap_or_else(|| panic!("no {k} in {path}"))
    };
    let deployment = kind("Deployment");
    assert!(!deployment.contains("--max-inflight"), "{deployment}");
    assert!(
        !deployment
            .lines()
            .any(|l| l.trim_start().starts_with("replicas:")),
        "the autoscaler owns the count: {deployment}"
    );
    assert!(deployment.contains("\"--latency-target\""), "{deployment}");
    assert!(deployment.contains("requests: {cpu: "), "{deployment}");
    let hpa = kind("HorizontalPodAutoscaler");
    for needle in [
        "apiVersion: autoscaling/v2",
        "kind: Deployment",
        "name: shedgate",
        "name: cpu",
        "minReplicas: ",
        "maxReplicas: ",
    ] {
        assert!(hpa.contains(needle), "{needle}: {hpa}");
    }
    let pdb = kind("PodDisruptionBudget");
    assert!(pdb.contains("apiVersion: policy/v1"), "{pdb}");
    assert!(pdb.contains("matchLabels: {app: shedgate}"), "{pdb}");
}
