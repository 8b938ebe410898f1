//! The freshness floor on the wall clock (docs/decision.md "Devices"): what
//! `tests/proxy/freshness.rs` asserts under paused time, measured over real loopback sockets
//! and the real clock. An upstream answering 200 at once; the proxy in-process
//! (`shedgate::app::start`, no `--max-inflight`, the default `freshness_share`) with one
//! sheddable stream whose fixes name their device and `max_silence = "5s"`; its pressure
//! pinned at 1.0 through the admin listener (`PUT /pressure`), so the curve sheds the default
//! rank whole. 20 devices around Munich (no areas: the default rank) each send one fresh fix
//! a second for 16 s, each from a phase of its own within the second (a seeded draw).
//!
//! Prints per device when its fixes were delivered (answered 2xx by the proxy, seconds since
//! the start, at the answer) and its longest silence: the longest time between two delivered
//! fixes, or from the start to its first, or from its last to the end (16 s); the median and
//! the most over devices beside the bound `max_silence + one interval + 0.5 s` = 6.5 s; the
//! share of fixes shed (503); and the proxy's `shedgate_freshness_total` counts. It measures
//! and prints; it asserts nothing.
//!
//! Run: `cargo bench --bench freshness` (about 20 s once built).

#![allow(missing_docs, reason = "a bench binary: its items are not an API")]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use shedgate::clock::{Sources, UnixMillis};
use shedgate::config::{Config, ServeArgs};
use tokio::net::TcpListener;
use tokio::time::Instant;

const DEVICES: usize = 20;
const SECONDS: u32 = 16;
const INTERVAL: Duration = Duration::from_secs(1);
const MAX_SILENCE: &str = "5s";
/// `max_silence` (5 s) + one interval + 0.5 s.
const BOUND_S: f64 = 6.5;
const SEED: u64 = 16;
/// The default rank (no areas in the policy): shed whole at pressure 1.0.
const MUNICH: (f64, f64) = (48.1372, 11.5756);

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// One device's fixes: `(second, status, answered at s since the start)`; the status of a
/// 2xx the proxy gave itself (a stale or superseded fix, `X-Shed-Reason` set) is `None`, as
/// no answer is: neither is a delivery.
type Fixes = Vec<(u32, Option<StatusCode>, f64)>;

/// An upstream over loopback that reads each request's body and answers 200 `{}`.
async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a listener");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async {
                    let _ = req.into_body().collect().await;
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// A fresh fix of device `d` (its place jittered around Munich), stamped `now`.
fn fix(url: &str, d: usize, now: UnixMillis) -> Request<Full<Bytes>> {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(now.0) * 1_000_000)
        .expect("a time")
        .format(&time::format_description::well_known::Rfc3339)
        .expect("RFC 3339");
    #[expect(clippy::cast_precision_loss, reason = "a device index below 2^52")]
    let step = d as f64 * 0.001;
    let body = format!(
        r#"{{"device_id":"veh-{d:03}","lat":{:.5},"lon":{:.5},"occurred_at":"{t}"}}"#,
        MUNICH.0 + step,
        MUNICH.1 - step
    );
    Request::post(url)
        .header("x-stream", "vehicle.position")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a request")
}

/// The status of `req`'s answer once its body has ended (`None`: no answer in 5 s, or a 2xx
/// of the proxy's own).
async fn send(client: &HttpClient, req: Request<Full<Bytes>>) -> Option<StatusCode> {
    let answer = tokio::time::timeout(Duration::from_secs(5), async {
        let resp = client.request(req).await.ok()?;
        let own = resp.status().is_success() && resp.headers().contains_key("x-shed-reason");
        let status = resp.status();
        resp.into_body().collect().await.ok()?;
        (!own).then_some(status)
    });
    answer.await.ok().flatten()
}

/// The longest silence in `0..end` seconds given the delivery times.
fn longest_silence(delivered: &[f64], end: f64) -> f64 {
    let mut last = 0.0f64;
    let mut longest = 0.0f64;
    for &t in delivered {
        longest = longest.max(t - last);
        last = t;
    }
    longest.max(end - last)
}

/// The sum of the samples of `name` whose labels contain `filter`, in Prometheus text; 0 with
/// none (an empty sum of floats is −0.0).
fn metric(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |sum, v| sum + v)
}

async fn run() {
    let policy = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(
        policy.path().join("streams.toml"),
        format!(
            "[streams.\"vehicle.position\"]\nsupersession = \"self-superseding\"\n\
             device = \"/device_id\"\nmax_silence = \"{MAX_SILENCE}\"\n"
        ),
    )
    .expect("streams.toml");
    let up = upstream().await;
    let config = Config::from_args(ServeArgs {
        listen: Some("127.0.0.1:0".parse().expect("an address")),
        admin_listen: Some("127.0.0.1:0".parse().expect("an address")),
        upstream: Some(format!("http://{up}")),
        policies: Some(policy.path().to_owned()),
        ..ServeArgs::default()
    })
    .expect("a configuration");
    let sources = Sources::system();
    let (proxy, _) = shedgate::app::start(config, sources.clone())
        .await
        .expect("the proxy starts");
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let pin = Request::put(format!("http://{}/pressure", proxy.admin_addr))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{\"pin\":1.0}")))
        .expect("a request");
    let pinned = send(&client, pin).await;
    println!(
        "freshness floor on the wall clock: {DEVICES} devices at the default rank, one fresh fix \
         a second each for {SECONDS} s; max_silence {MAX_SILENCE}; pressure pinned at 1.0 \
         (PUT /pressure: {})",
        pinned.map_or("no answer".to_owned(), |s| s.to_string())
    );
    let url = format!("http://{}/ingest", proxy.proxy_addr);
    let mut rng = fastrand::Rng::with_seed(SEED);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for d in 0..DEVICES {
        let phase = INTERVAL.mul_f64(rng.f64());
        let (client, url, sources) = (client.clone(), url.clone(), sources.clone());
        tasks.push(tokio::spawn(async move {
            let mut fixes: Fixes = Vec::new();
            for second in 0..SECONDS {
                tokio::time::sleep_until(start + phase + INTERVAL * second).await;
                let status = send(&client, fix(&url, d, sources.now())).await;
                fixes.push((second, status, start.elapsed().as_secs_f64()));
            }
            fixes
        }));
    }
    let mut per_device = Vec::new();
    for t in tasks {
        per_device.push(t.await.expect("a device's task"));
    }
    let end = f64::from(SECONDS);
    let (mut sent, mut shed, mut other) = (0usize, 0usize, 0usize);
    let mut silences = Vec::new();
    println!("| device | delivered at, s | longest silence s |");
    println!("|---|---|---|");
    for (d, fixes) in per_device.iter().enumerate() {
        let delivered: Vec<f64> = fixes
            .iter()
            .filter(|(_, s, _)| s.is_some_and(|s| s.is_success()))
            .map(|f| f.2)
            .collect();
        sent += fixes.len();
        shed += fixes
            .iter()
            .filter(|(_, s, _)| *s == Some(StatusCode::SERVICE_UNAVAILABLE))
            .count();
        other += fixes
            .iter()
            .filter(|(_, s, _)| !s.is_some_and(|s| s.is_success() || s.as_u16() == 503))
            .count();
        let longest = longest_silence(&delivered, end);
        silences.push(longest);
        let at: Vec<String> = delivered.iter().map(|t| format!("{t:.2}")).collect();
        println!("| veh-{d:03} | {} | {longest:.2} |", at.join(", "));
    }
    silences.sort_by(f64::total_cmp);
    let most = silences[silences.len() - 1];
    println!(
        "\nlongest silence over {DEVICES} devices: median {:.2} s, most {most:.2} s; bound \
         {BOUND_S} s (max_silence + one interval + 0.5 s): {}",
        silences[silences.len() / 2],
        if most <= BOUND_S {
            "every device within it"
        } else {
            "NOT every device within it"
        }
    );
    #[expect(clippy::cast_precision_loss, reason = "counts below 2^52")]
    let share = shed as f64 * 100.0 / sent.max(1) as f64;
    println!("fixes shed (503): {shed} of {sent} ({share:.1}%); other answers: {other}");
    let text = proxy.parts.metrics.render();
    println!(
        "shedgate_freshness_total: admitted {}, denied {}",
        metric(&text, "shedgate_freshness_total", "outcome=\"admitted\""),
        metric(&text, "shedgate_freshness_total", "outcome=\"denied\"")
    );
    proxy.shutdown().await;
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(run());
}
