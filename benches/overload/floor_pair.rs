//! The overload bench's `--floor-pair` (a module of `benches/overload.rs`): shedgate with the
//! example policy as it is (floor on: whatever `max_silence` it sets) and with `max_silence`
//! removed from a copy of it (floor off), at 3x and 10x, round by round, on and off in turn.

use std::path::Path;

use super::summary::Row;
use super::{SERVICE, Traffic, WORKERS, print_fleet, run_case};

/// A copy of the policy directory `dir` with every `max_silence` key removed from its
/// `streams.toml` (streams and routes), compiled to check that no floor is left. Keep the
/// directory alive while a proxy reads it.
fn without_floor(dir: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().expect("a temporary directory");
    for entry in walkdir::WalkDir::new(dir) {
        let entry = entry.expect("a policy directory entry");
        let to = copy
            .path()
            .join(entry.path().strip_prefix(dir).expect("under the directory"));
        if entry.file_type().is_dir() {
            std::fs::create_dir_all(&to).expect("a directory");
        } else {
            std::fs::copy(entry.path(), &to).expect("a copy");
        }
    }
    let path = copy.path().join("streams.toml");
    let mut streams: toml::Table = std::fs::read_to_string(&path)
        .expect("streams.toml")
        .parse()
        .expect("streams.toml is TOML");
    strip(&mut streams, "max_silence");
    std::fs::write(&path, toml::to_string(&streams).expect("TOML")).expect("streams.toml");
    let policy = shedgate::policy::load_dir(copy.path())
        .expect("the policy without max_silence compiles")
        .policy;
    let left = policy.streams().iter().any(|s| s.max_silence.is_some())
        || policy.routes().iter().any(|r| r.max_silence.is_some());
    assert!(!left, "a max_silence is left in {}", path.display());
    copy
}

/// Removes `key` from `table` and every table within it.
fn strip(table: &mut toml::Table, key: &str) {
    table.remove(key);
    for (_, value) in table.iter_mut() {
        match value {
            toml::Value::Table(t) => strip(t, key),
            toml::Value::Array(items) => {
                for item in items {
                    if let toml::Value::Table(t) = item {
                        strip(t, key);
                    }
                }
            }
            _ => {}
        }
    }
}

/// `value` of the rows: its median over rounds and its spread, `median (min–max)`.
fn spread(rows: &[&Row], value: impl Fn(&Row) -> f64, digits: usize) -> String {
    let mut v: Vec<f64> = rows.iter().map(|r| value(r)).collect();
    v.sort_by(f64::total_cmp);
    if v.iter().any(|x| x.is_nan()) {
        return "–".to_owned();
    }
    let median = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        f64::midpoint(v[v.len() / 2 - 1], v[v.len() / 2])
    };
    format!(
        "{median:.digits$} ({:.digits$}–{:.digits$})",
        v[0],
        v[v.len() - 1]
    )
}

/// `--floor-pair [--rounds N]`: per round, at 3x then 10x, shedgate with `policies` as it is
/// (floor on), then with `max_silence` removed (floor off); then per factor the median and
/// spread over rounds of goodput, p99, never-shed delivered and the devices' silence p99.
pub(crate) async fn floor_pair(rounds: usize, policies: &Path, traffic: &Traffic) {
    let off = without_floor(policies);
    let factors = [3.0, 10.0];
    println!(
        "floor pair: shedgate with policies/ as it is (floor on) and with max_silence removed \
         from a copy (floor off); {rounds} round(s), each at {}, floor on then off",
        factors.map(|f| format!("{f}x")).join(" then ")
    );
    print_fleet(
        f64::from(WORKERS) / SERVICE.as_secs_f64(),
        &factors,
        &traffic.policy,
    );
    if traffic
        .policy
        .streams()
        .iter()
        .all(|s| s.max_silence.is_none())
        && traffic
            .policy
            .routes()
            .iter()
            .all(|r| r.max_silence.is_none())
    {
        println!("note: policies/ sets no max_silence, so floor on and floor off are alike");
    }
    let mut runs: Vec<(f64, bool, Row)> = Vec::new();
    for round in 1..=rounds {
        for factor in factors {
            for (on, dir) in [(true, policies), (false, off.path())] {
                let (row, _) = run_case("shedgate", dir, factor, traffic, false).await;
                eprintln!(
                    "round {round}, {factor}x, floor {}: goodput {:.1}%, p99 {} ms, never \
                     delivered {:.1}%, device silence p99 {:.2} s, floor admitted {:.0}, denied {:.0}",
                    if on { "on" } else { "off" },
                    row.goodput * 100.0,
                    super::ms(row.p99),
                    row.never * 100.0,
                    row.silence_p99,
                    row.floor.0,
                    row.floor.1,
                );
                runs.push((factor, on, row));
            }
        }
    }
    println!(
        "| load | floor | goodput / capacity % | p99 ms | never delivered % | device silence p99 s | \
         floor admitted |"
    );
    println!("|---|---|---|---|---|---|---|");
    for factor in factors {
        for on in [true, false] {
            let rows: Vec<&Row> = runs
                .iter()
                .filter(|(f, o, _)| *f == factor && *o == on)
                .map(|r| &r.2)
                .collect();
            println!(
                "| {factor}x | {} | {} | {} | {} | {} | {} |",
                if on { "on" } else { "off" },
                spread(&rows, |r| r.goodput * 100.0, 1),
                spread(&rows, |r| r.p99, 1),
                spread(&rows, |r| r.never * 100.0, 1),
                spread(&rows, |r| r.silence_p99, 2),
                spread(&rows, |r| r.floor.0, 0),
            );
        }
    }
    println!("each cell: the median over rounds (min–max)");
}
