//! The hot path: one admission decision on a 300-byte body (extraction, h3o cell, area
//! lookup, curve, metrics), its parts, and a naive baseline.
//!
//! Run with `cargo bench --bench decision`. Floors measured on a 2-core machine when the hot path was designed:
//! h3o lat/lon → res-4 cell 200–290 ns; borrowed-struct extraction ~350 ns (a
//! `serde_json::Value` plus three pointers ~1.7 µs); RFC 3339 parse 15–50 ns; ArcSwap load
//! plus a hash lookup ~6 ns; a pre-registered counter ~5 ns. Target for one decision: ~0.7 µs.

#![allow(missing_docs, reason = "criterion's macros' items")]

use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use shedgate::admission;
use shedgate::clock::{Sources, UnixMillis};
use shedgate::extract;
use shedgate::live::PolicyStore;
use shedgate::metrics::{Metrics, PolicyMetrics};
use shedgate::policy;
use shedgate::pressure::Pressure;

/// A 300-byte vehicle position, Berlin, fresh.
fn body(now: UnixMillis) -> Vec<u8> {
    let t = time::OffsetDateTime::from_unix_timestamp(now.0 / 1000)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let mut b = format!(
        r#"{{"device_id":"veh-00421","lat":52.52001,"lon":13.40495,"occurred_at":"{t}","speed_kmh":47.5,"heading":182,"accuracy_m":4.2,"battery":0.81,"fleet":"berlin-north","driver":"d-1187","odometer_km":48213.7,"status":"moving","tags":["urban","delivery"]"#
    );
    while b.len() < 299 {
        b.push(' ');
    }
    b.push('}');
    b.into_bytes()
}

fn bench(c: &mut Criterion) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let metrics = Arc::new(Metrics::new());
    let sources = Sources::system();
    let (store, _) = PolicyStore::open(&dir, Arc::clone(&metrics), sources.clone()).unwrap();
    let now = sources.now();
    let body = body(now);
    assert_eq!(body.len(), 300);
    let pressure = Pressure::new(0.75).unwrap();
    let headers = http::HeaderMap::new();

    // The whole decision as the middleware takes it (minus the socket and body collection).
    c.bench_function("decision/full", |b| {
        b.iter(|| {
            let snapshot = store.load();
            let policy = &snapshot.policy;
            let stream = policy.stream(black_box("vehicle.position"));
            let reading = admission::Reading {
                route: None,
                known: Some(stream),
                ambiguous: false,
            };
            let (stream, facts) =
                admission::assess(policy, reading, &headers, None, black_box(&body));
            let d = admission::decide(
                policy,
                stream,
                &facts,
                now,
                pressure,
                black_box(0.3),
                &admission::Load::IDLE,
                None,
            );
            snapshot.metrics.shed(stream, d.area, d.verdict);
            snapshot.metrics.request(
                stream,
                Some(shedgate::policy::UpstreamId::DEFAULT),
                shedgate::metrics::Outcome::Forwarded,
            );
            black_box(d)
        });
    });

    let policy = policy::load_dir(&dir).unwrap().policy;
    let extractor = extract::Extractor::default();
    c.bench_function("part/extract-3-fields", |b| {
        b.iter(|| black_box(extractor.extract_one(black_box(&body))));
    });
    c.bench_function("part/h3o-cell-and-area-lookup", |b| {
        b.iter(|| black_box(policy.area_at(black_box(52.52001), black_box(13.40495))));
    });
    c.bench_function("part/h3o-cell", |b| {
        b.iter(|| {
            h3o::LatLng::new(black_box(52.52001), black_box(13.40495))
                .unwrap()
                .to_cell(h3o::Resolution::Four)
        });
    });
    c.bench_function("part/rfc3339-parse", |b| {
        b.iter(|| extract::time::parse_time_text(black_box("2026-05-28T20:26:40.250Z")));
    });
    c.bench_function("part/arcswap-load-and-stream-lookup", |b| {
        b.iter(|| {
            let s = store.load();
            black_box(s.policy.stream(black_box("vehicle.position")))
        });
    });
    let pm = PolicyMetrics::new(&metrics, &policy);
    let id = policy.stream("vehicle.position");
    c.bench_function("part/counter-handle", |b| {
        b.iter(|| {
            pm.request(
                black_box(id),
                Some(shedgate::policy::UpstreamId::DEFAULT),
                shedgate::metrics::Outcome::Forwarded,
            )
        });
    });
    let curve = policy.curve();
    let rank = policy::Rank::new(50).unwrap();
    c.bench_function("part/curve", |b| {
        b.iter(|| black_box(curve.shed_probability(black_box(rank), black_box(pressure))));
    });

    // A device's history, looked up and recorded as a decision of a device's fix does, in a
    // table of 1 million devices (docs/decision.md "Devices"): the device's id keyed (SipHash
    // of scope and id), one shard locked and one set scanned, twice.
    let table = shedgate::devices::DeviceTable::new(1 << 20, now);
    let ids: Vec<String> = (0..1_000_000u32).map(|i| format!("veh-{i:07}")).collect();
    let kept = admission::Decision::shed_by(admission::ShedReason::Pressure, &policy, pressure);
    let kept = admission::Decision {
        credit: Some(0.5),
        ..kept
    };
    for id in &ids {
        table.record(extract::DeviceId::of("vehicle.position", id), now, &kept);
    }
    #[expect(clippy::cast_precision_loss, reason = "bytes below 2^52")]
    let mib = |b: usize| b as f64 / f64::from(1 << 20);
    println!(
        "device table: {} devices in {:.1} MiB (at most {:.1} MiB), {} evicted",
        table.len(),
        mib(table.bytes()),
        mib(table.max_bytes()),
        table.evictions()
    );
    let mut i = 0usize;
    c.bench_function("part/device-key", |b| {
        b.iter(|| {
            i = (i + 7919) % ids.len();
            black_box(extract::DeviceId::of(
                "vehicle.position",
                black_box(&ids[i]),
            ))
        });
    });
    // What a device adds to a decision: its key, and its history looked up and the decision
    // recorded under one lock (`DeviceTable::decide_with`), the decision itself aside.
    c.bench_function("part/device-key-lookup-and-record-1m", |b| {
        b.iter(|| {
            i = (i + 7919) % ids.len();
            let key = extract::DeviceId::of("vehicle.position", black_box(&ids[i]));
            black_box(table.decide_with(key, now, |h| {
                black_box(h);
                kept
            }))
        });
    });

    // The upstream's load report, read per answer when `--load-report` is set.
    let mut orca = http::HeaderMap::new();
    orca.insert(
        shedgate::upstream::load_report::HEADER,
        http::HeaderValue::from_static(
            "TEXT cpu_utilization=0.3, mem_utilization=0.8, application_utilization=1.25",
        ),
    );
    let field = shedgate::upstream::load_report::LoadReportField::Application;
    c.bench_function("part/load-report-text", |b| {
        b.iter(|| shedgate::upstream::load_report::read(black_box(&orca), &field));
    });

    // Naive baseline: a full `serde_json::Value` and three pointer look-ups.
    c.bench_function("baseline/serde-json-value-pointers", |b| {
        b.iter(|| {
            let v: serde_json::Value = serde_json::from_slice(black_box(&body)).unwrap();
            black_box((
                v.pointer("/lat").and_then(serde_json::Value::as_f64),
                v.pointer("/lon").and_then(serde_json::Value::as_f64),
                v.pointer("/occurred_at")
                    .and_then(serde_json::Value::as_str)
                    .map(str::len),
            ))
        });
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
