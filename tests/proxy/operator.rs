//! What ships for operators beside the binary: the Grafana dashboard.

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
        "shedgate_disabled_until_timestamp_seconds",
    ] {
        assert!(named.contains(wanted), "no panel shows {wanted}");
    }
}
