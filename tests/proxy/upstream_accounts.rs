//! The accounts of buffered body bytes across reloads that replace upstreams
//! (docs/operations.md "Changing upstreams live"), over real sockets: 128 of them, two for
//! each of the 64 upstreams a policy may have. One reload can replace all 63 named upstreams
//! while each old one still has a request in flight; a second replacement before those
//! requests end is refused, and loads once they have ended.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use shedgate::app::Running;
use shedgate::policy::MAX_UPSTREAMS;

use crate::support::*;

/// Named upstreams one policy may have (`default` is the 64th).
const NAMED: usize = MAX_UPSTREAMS - 1;

/// The seed policy with [`NAMED`] upstreams `{set}00`, `{set}01`, … all at `url`, each with
/// a route `/{set}NN` of never-shed `dlq.replay` events sent to it.
fn upstreams(set: char, url: &str) -> String {
    let mut streams = SEED_STREAMS.to_owned();
    for i in 0..NAMED {
        streams.push_str(&format!(
            "\n[upstreams.{set}{i:02}]\nurl = \"{url}\"\n\n[[routes]]\nprefix = \"/{set}{i:02}\"\nstream = \"dlq.replay\"\nupstream = \"{set}{i:02}\"\n"
        ));
    }
    streams
}

/// Writes `streams` as the policy's `streams.toml` and asks the proxy to reload.
async fn reload(proxy: &Running, policy: &PolicyDir, streams: &str) -> Answer {
    let tmp = policy.path().join(".streams.tmp");
    std::fs::write(&tmp, streams).unwrap();
    std::fs::rename(&tmp, policy.path().join("streams.toml")).unwrap();
    let req = Request::post(format!("http://{}/reload", proxy.admin_addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    send(req).await
}

fn event_to(proxy: &Running, path: &str) -> Request<Full<Bytes>> {
    Request::post(format!("http://{}{path}", proxy.proxy_addr))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap()
}

/// 63 upstreams each with a request held in flight are replaced by 63 new names (64
/// accounts held, 63 taken: 127 of 128); a second replacement while those requests are still
/// in flight would need 63 more with one free, and is refused with how to retry; once they
/// have ended, the same files load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replacement_of_every_upstream_fits_and_a_second_waits_for_the_first() {
    let default = MockUpstream::start().await;
    let hold = Arc::new(tokio::sync::Semaphore::new(0));
    let upstream = MockUpstream::with(Behaviour {
        hold: Some(Arc::clone(&hold)),
        ..Behaviour::default()
    })
    .await;
    let policy = PolicyDir::new(&upstreams('u', &upstream.url()), Some(BERLIN_AREA));
    let proxy = Arc::new(spawn_proxy(&default.url(), policy.path()).await);
    let in_flight: Vec<_> = (0..NAMED)
        .map(|i| {
            let proxy = Arc::clone(&proxy);
            tokio::spawn(async move { send(event_to(&proxy, &format!("/u{i:02}"))).await })
        })
        .collect();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while upstream.count() < NAMED {
        assert!(tokio::time::Instant::now() < deadline, "never all held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let first = reload(&proxy, &policy, &upstreams('v', &upstream.url())).await;
    assert_eq!(first.status, StatusCode::OK, "{:?}", first.body);
    let second = upstreams('w', &upstream.url());
    let refused = reload(&proxy, &policy, &second).await;
    assert_eq!(refused.status, StatusCode::UNPROCESSABLE_ENTITY);
    let detail = refused.json()["detail"].as_str().unwrap().to_owned();
    assert!(
        detail.contains("every account of the buffered bytes is held")
            && detail.contains("reload again"),
        "{detail}"
    );
    hold.add_permits(NAMED);
    for a in in_flight {
        let a = a.await.unwrap();
        assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    }
    // The last of them frees its upstream's account as it ends, just after its answer.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let a = reload(&proxy, &policy, &second).await;
        if a.status == StatusCode::OK {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{:?}", a.body);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    hold.add_permits(1);
    let a = send(event_to(&proxy, "/w62")).await;
    assert_eq!(a.status, StatusCode::OK, "{:?}", a.body);
    assert_eq!((default.count(), upstream.count()), (0, NAMED + 1));
}
