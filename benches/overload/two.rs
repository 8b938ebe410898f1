//! The overload bench's `--two-upstreams` (a module of `benches/overload.rs`): two upstreams
//! of fixed capacity (each [`WORKERS`] × [`SERVICE`]) behind one shedgate, `default` and `b`
//! (every request under `/b` goes to `b`). Each is offered half its capacity, except in its
//! own overload window, where it is offered three times it: first `default` is overloaded
//! while `b` is not, then both are calm, then the two swap, then both are calm again. Beside it, in the same round, each
//! upstream alone with the same calm load (the other offered nothing), for the healthy one's
//! latency without the other. Per round, per upstream: in the other's overload window, its
//! requests shed or lost and its p99 beside its solo p99 in the same window; in its own, its
//! goodput and p99; after its own, the seconds until every request is delivered again.

use std::path::Path;

use super::{AFTER, OVERLOAD, Run, SERVICE, TARGET, Traffic, WARM, WORKERS, load};
use shedgate::clock::Sources;
use shedgate::config::{Config, ServeArgs};
use shedgate::demo::sim::{ServiceTime, Simulator, Spread};
use std::sync::Arc;

/// The two windows: (first second, seconds) of `default`'s overload and of `b`'s, [`AFTER`]
/// seconds of calm between them (so that `default` has recovered before it is the healthy one).
const WINDOWS: [(u64, u64); 2] = [(WARM, OVERLOAD), (WARM + OVERLOAD + AFTER, OVERLOAD)];

/// One upstream's figures of one round.
#[derive(Debug, Clone, Copy)]
struct Side {
    /// In the other's overload: its requests not delivered (shed or lost), and sent.
    healthy_lost: (u64, u64),
    /// In the other's overload: its p99, ms, and alone (the other offered nothing).
    healthy_p99: (f64, f64),
    /// In its own overload (from its third second): mean delivered per second over its
    /// capacity, and its p99, ms.
    overloaded: (f64, f64),
    /// Seconds after its overload until a second in which all it was sent was delivered
    /// (`None`: not within [`AFTER`] s).
    recovered: Option<u64>,
}

/// Latency quantile `q` of the delivered requests in seconds `from..to`, ms.
fn p(run: &Run, (from, to): (u64, u64), q: f64) -> f64 {
    let mut lat: Vec<f64> = run.secs[from as usize..to as usize]
        .iter()
        .flat_map(|s| s.lat_ms.iter().copied())
        .collect();
    lat.sort_by(f64::total_cmp);
    lat.get(((lat.len() as f64 - 1.0) * q) as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// The proxy with `policies` and `b` added, in front of two fresh simulators; the load of
/// `phases[0]` to `default` and `phases[1]` to `b` (`None`: nothing), at once.
async fn run(
    policies: &Path,
    traffic: &Traffic,
    phases: [Option<&[(u64, f64)]>; 2],
) -> [Option<Run>; 2] {
    let mut ups = Vec::new();
    for seed in [9, 10] {
        let sim = Simulator::new(WORKERS, ServiceTime::Fixed(SERVICE), Vec::new(), seed);
        let (addr, task) = Arc::clone(&sim).serve_http().await.unwrap();
        ups.push((sim, addr, task));
    }
    let capacity = ups[0].0.capacity();
    let copy = tempfile::tempdir().unwrap();
    for entry in walkdir::WalkDir::new(policies) {
        let entry = entry.unwrap();
        let to = copy
            .path()
            .join(entry.path().strip_prefix(policies).unwrap());
        if entry.file_type().is_dir() {
            std::fs::create_dir_all(&to).unwrap();
        } else {
            std::fs::copy(entry.path(), &to).unwrap();
        }
    }
    let streams = copy.path().join("streams.toml");
    let text = std::fs::read_to_string(&streams).unwrap();
    std::fs::write(
        &streams,
        format!(
            "{text}\n[upstreams.b]\nurl = \"http://{}\"\n\n[[routes]]\nprefix = \"/b\"\nupstream = \"b\"\n",
            ups[1].1
        ),
    )
    .unwrap();
    let config = Config::from_args(ServeArgs {
        listen: Some("127.0.0.1:0".parse().unwrap()),
        admin_listen: Some("127.0.0.1:0".parse().unwrap()),
        upstream: Some(format!("http://{}", ups[0].1)),
        policies: Some(copy.path().to_owned()),
        latency_target: Some(TARGET.into()),
        ..ServeArgs::default()
    })
    .unwrap();
    let (proxy, _) = shedgate::app::start(config, Sources::default())
        .await
        .expect("the proxy starts with two upstreams");
    let urls = [
        vec![format!("http://{}/ingest", proxy.proxy_addr)],
        vec![format!("http://{}/b/ingest", proxy.proxy_addr)],
    ];
    let fleet = traffic.fleet(capacity, 3.0);
    let go = |i: usize| {
        let (urls, fleet) = (&urls[i], &fleet);
        async move {
            match phases[i] {
                Some(phases) => Some(
                    load(
                        urls,
                        Spread::RoundRobin,
                        capacity,
                        phases,
                        (&traffic.evs, fleet),
                        3 + i as u64,
                    )
                    .await,
                ),
                None => None,
            }
        }
    };
    let (a, b) = tokio::join!(go(0), go(1));
    proxy.shutdown().await;
    for (_, _, task) in ups {
        task.abort();
    }
    [a, b]
}

/// `--two-upstreams [--rounds N]`: per round the pair, then each upstream alone; then each
/// round's figures and the medians over rounds.
pub(crate) async fn two_upstreams(rounds: usize, policies: &Path, traffic: &Traffic) {
    let capacity = f64::from(WORKERS) / SERVICE.as_secs_f64();
    let calm: &[(u64, f64)] = &[
        (WARM, 0.5),
        (OVERLOAD, 0.5),
        (AFTER, 0.5),
        (OVERLOAD, 0.5),
        (AFTER, 0.5),
    ];
    let first: &[(u64, f64)] = &[
        (WARM, 0.5),
        (OVERLOAD, 3.0),
        (AFTER, 0.5),
        (OVERLOAD, 0.5),
        (AFTER, 0.5),
    ];
    let second: &[(u64, f64)] = &[
        (WARM, 0.5),
        (OVERLOAD, 0.5),
        (AFTER, 0.5),
        (OVERLOAD, 3.0),
        (AFTER, 0.5),
    ];
    println!(
        "two upstreams behind one proxy, each {WORKERS} workers x {} ms = {capacity:.0} req/s, \
         latency target {} ms; default offered 3x in {}..{} s and b in {}..{} s, each 0.5x \
         otherwise; solo: one upstream offered its calm load alone; {rounds} round(s)",
        SERVICE.as_millis(),
        TARGET.as_millis(),
        WINDOWS[0].0,
        WINDOWS[0].0 + WINDOWS[0].1,
        WINDOWS[1].0,
        WINDOWS[1].0 + WINDOWS[1].1,
    );
    println!(
        "| round | upstream | healthy: not delivered / sent | healthy p99 ms (solo) | \
         overloaded goodput / capacity | overloaded p99 ms | all delivered after |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut sides: Vec<[Side; 2]> = Vec::new();
    for round in 1..=rounds {
        let [a, b] = run(policies, traffic, [Some(first), Some(second)]).await;
        let [solo_a, _] = run(policies, traffic, [Some(calm), None]).await;
        let [_, solo_b] = run(policies, traffic, [None, Some(calm)]).await;
        let runs = [
            (a.unwrap(), solo_a.unwrap(), 0usize),
            (b.unwrap(), solo_b.unwrap(), 1usize),
        ];
        let pair = runs.map(|(run, solo, i)| {
            let own = WINDOWS[i];
            let other = WINDOWS[1 - i];
            let other = (other.0, other.0 + other.1);
            let (sent, ok) = run.secs[other.0 as usize..other.1 as usize]
                .iter()
                .fold((0, 0), |acc, s| (acc.0 + s.sent, acc.1 + s.ok));
            let steady = &run.secs[(own.0 + 2) as usize..(own.0 + own.1) as usize];
            let goodput =
                steady.iter().map(|s| s.ok as f64).sum::<f64>() / steady.len() as f64 / capacity;
            let end = (own.0 + own.1) as usize;
            let recovered = run.secs[end..]
                .iter()
                .take(AFTER as usize)
                .position(|s| s.sent > 0 && s.ok == s.sent)
                .map(|i| i as u64 + 1);
            Side {
                healthy_lost: (sent - ok, sent),
                healthy_p99: (p(&run, other, 0.99), p(&solo, other, 0.99)),
                overloaded: (goodput, p(&run, (own.0 + 2, own.0 + own.1), 0.99)),
                recovered,
            }
        });
        for (name, s) in ["default", "b"].iter().zip(&pair) {
            println!(
                "| {round} | {name} | {} / {} | {:.1} ({:.1}) | {:.1}% | {:.1} | {} |",
                s.healthy_lost.0,
                s.healthy_lost.1,
                s.healthy_p99.0,
                s.healthy_p99.1,
                s.overloaded.0 * 100.0,
                s.overloaded.1,
                s.recovered
                    .map_or(format!(">{AFTER} s"), |r| format!("{r} s")),
            );
        }
        sides.push(pair);
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for (i, name) in ["default", "b"].iter().enumerate() {
        let col = |f: &dyn Fn(&Side) -> f64| sides.iter().map(|s| f(&s[i])).collect::<Vec<_>>();
        let lost: u64 = sides.iter().map(|s| s[i].healthy_lost.0).sum();
        let beside = median(col(&|s| s.healthy_p99.0));
        let alone = median(col(&|s| s.healthy_p99.1));
        println!(
            "{name}: healthy, {lost} not delivered over {rounds} round(s); p99 median {beside:.1} \
             ms beside the overloaded one, {alone:.1} ms alone ({:+.1}%); overloaded, goodput \
             median {:.1}%, p99 median {:.1} ms",
            (beside / alone - 1.0) * 100.0,
            median(col(&|s| s.overloaded.0)) * 100.0,
            median(col(&|s| s.overloaded.1)),
        );
    }
}
