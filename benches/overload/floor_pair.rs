//! The overload bench's `--floor-pair` (a module of `benches/overload.rs`): shedgate with the
//! example policy's copies with a freshness floor that can act within the 8 s overload
//! (`max_silence` on every sheddable stream, 2 s by default) and with none (floor off), at 3x
//! and 10x, round by round, the order of on and off alternating between rounds.

use std::path::Path;
use std::time::Duration;

use shedgate::demo::floor::{MaxSilence, policy_copy};

use super::summary::Row;
use super::{SERVICE, Traffic, WORKERS, print_fleet, run_case};

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

/// `--floor-pair [--rounds N] [--max-silence D]`: per round, at 3x then 10x, shedgate with a
/// copy of `policies` whose sheddable streams have `max_silence` D (floor on) and one without
/// any (floor off), on first in odd rounds and off first in even ones; then per factor the
/// median and spread over rounds of goodput, p99, never-shed delivered, the devices' silence
/// p99 and the floor's admissions.
pub(crate) async fn floor_pair(
    rounds: usize,
    max_silence: Duration,
    policies: &Path,
    traffic: &Traffic,
) {
    let on = policy_copy(policies, MaxSilence::On(max_silence)).expect("the floor-on copy");
    let off = policy_copy(policies, MaxSilence::Off).expect("the floor-off copy");
    let factors = [3.0, 10.0];
    println!(
        "floor pair: shedgate with a copy of policies/ whose sheddable streams have max_silence \
         {max_silence:?} (floor on) and one with none (floor off); {rounds} round(s), each at {}, \
         on first in odd rounds, off first in even ones",
        factors.map(|f| format!("{f}x")).join(" then ")
    );
    let on_policy = shedgate::policy::load_dir(on.path())
        .expect("the floor-on copy compiles")
        .policy;
    print_fleet(
        f64::from(WORKERS) / SERVICE.as_secs_f64(),
        &factors,
        &on_policy,
    );
    let mut runs: Vec<(f64, bool, Row)> = Vec::new();
    for round in 1..=rounds {
        for factor in factors {
            let mut pair = [(true, on.path()), (false, off.path())];
            if round % 2 == 0 {
                pair.reverse();
            }
            for (on, dir) in pair {
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
