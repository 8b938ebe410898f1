//! Policy scale: compile time of a 100,000-cell policy and of one area per country outline,
//! and resident memory per cell of the compiled policy.
//!
//! Run with `cargo bench --bench policy`. Compiling happens off the request path (on a
//! blocking thread, then an atomic swap), so these figures bound reload latency, not request
//! latency.

#![allow(missing_docs, reason = "criterion's macros' items")]

use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use h3o::{CellIndex, Resolution};
use shedgate::policy;

const STREAMS: &str = "[streams.\"vehicle.position\"]\nsupersession = \"self-superseding\"\n";

/// 100 areas of 1,000 explicit resolution-4 cells each.
fn hundred_thousand_cells() -> String {
    let mut cells = CellIndex::base_cells().flat_map(|b| b.children(Resolution::Four));
    let mut areas = String::from("default_rank = 50\n");
    for a in 0..100 {
        let list: Vec<String> = cells
            .by_ref()
            .take(1000)
            .map(|c| format!("\"{c}\""))
            .collect();
        areas.push_str(&format!(
            "[[areas]]\nname = \"a{a}\"\nrank = {}\ncells = [{}]\n",
            1 + a % 100,
            list.join(",")
        ));
    }
    areas
}

/// One area per country outline, from `data/countries.geojson`.
fn countries(dir: &Path) -> String {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/countries.geojson"),
    )
    .unwrap();
    std::fs::write(dir.join("countries.geojson"), &text).unwrap();
    let doc: geojson::FeatureCollection = text.parse().unwrap();
    let mut areas = String::from("default_rank = 50\n");
    for (i, f) in doc.features.iter().enumerate() {
        let name = f.property("name").and_then(|v| v.as_str()).unwrap();
        areas.push_str(&format!(
            "[[areas]]\nname = \"c{i}\"\nrank = {}\ngeojson = \"countries.geojson\"\nfeature = {name:?}\n",
            1 + i % 100
        ));
    }
    areas
}

fn resident_bytes() -> u64 {
    // Linux: the second field of /proc/self/statm is resident pages.
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn bench(c: &mut Criterion) {
    let mut cases = Vec::new();
    for (name, make) in [
        (
            "100k-cells",
            &(|_: &Path| hundred_thousand_cells()) as &dyn Fn(&Path) -> String,
        ),
        ("countries", &countries),
    ] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("streams.toml"), STREAMS).unwrap();
        let areas = make(dir.path());
        std::fs::write(dir.path().join("areas.toml"), areas).unwrap();
        let files = policy::PolicyFiles::read(dir.path()).unwrap();
        cases.push((name, dir, files));
    }
    // Memory: the resident growth of five copies (allocator reuse makes this noisy) and the
    // cell table's own size from its capacity.
    let mut kept = Vec::new();
    for (name, _, files) in &cases {
        let before = resident_bytes();
        let copies: Vec<_> = (0..5)
            .map(|_| policy::compile(files).unwrap().policy)
            .collect();
        let after = resident_bytes();
        let cells = copies[0].cell_count();
        #[expect(clippy::cast_precision_loss, reason = "counts below 2^52")]
        let (rss, table) = (
            (after.saturating_sub(before)) as f64 / 5.0 / cells as f64,
            copies[0].cell_table_bytes() as f64 / cells as f64,
        );
        println!(
            "{name}: {cells} cells; cell table {table:.1} bytes per cell; resident growth {rss:.1} bytes per cell"
        );
        kept.push(copies);
    }
    drop(kept);
    let mut group = c.benchmark_group("policy-compile");
    group.sample_size(10);
    for (name, _dir, files) in &cases {
        group.bench_function(*name, |b| b.iter(|| policy::compile(files).unwrap()));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
