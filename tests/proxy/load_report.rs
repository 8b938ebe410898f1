//! The upstream's load report (`--load-report`, the ORCA `endpoint-load-metrics` header)
//! through a real proxy over real sockets: read into the controller and counted, or counted
//! as invalid and left unread; the answer passes either way.

use std::time::Duration;

use super::support::*;

/// The proxy's view of the reported utilisation, once a tick has folded the reports in
/// (bounded: 100 looks 20 ms apart).
async fn reported(proxy: &shedgate::app::Running) -> Option<f64> {
    for _ in 0..100 {
        let view = admin_get(proxy, "/pressure").await.json();
        if let Some(u) = view["controller"]["reported_utilisation"].as_f64() {
            return Some(u);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// The seeded proxy in front of an upstream that sends `report` with every answer, reading
/// `application_utilization` if `read`; `answers` vehicle positions sent, each answered 200.
async fn proxy_with_report(
    report: &'static str,
    read: bool,
    answers: usize,
) -> (MockUpstream, PolicyDir, shedgate::app::Running, Vec<Answer>) {
    let behaviour = Behaviour {
        load_report: Some(report),
        ..Behaviour::default()
    };
    let (upstream, policy, proxy) = seeded_with(behaviour, |a| {
        a.load_report = read.then(|| "application_utilization".into());
    })
    .await;
    let mut sent = Vec::new();
    for _ in 0..answers {
        let a = post(&proxy, "vehicle.position", event(BERLIN, 0)).await;
        assert_eq!(a.status, http::StatusCode::OK);
        sent.push(a);
    }
    (upstream, policy, proxy, sent)
}

#[tokio::test]
async fn a_load_report_reaches_the_controller_and_is_counted() {
    let (_upstream, _policy, proxy, answers) = proxy_with_report(
        "TEXT cpu_utilization=0.9, application_utilization=1.5",
        true,
        5,
    )
    .await;
    for a in answers {
        assert_eq!(
            a.header("endpoint-load-metrics"),
            Some("TEXT cpu_utilization=0.9, application_utilization=1.5"),
            "the report passes through to the client"
        );
    }
    let u = reported(&proxy).await.expect("a reported utilisation");
    assert!((u - 1.5).abs() < 1e-6, "{u}");
    let text = scrape(&proxy).await;
    let read = metric(
        &text,
        "shedgate_upstream_load_reports_total",
        &[("upstream", "default"), ("outcome", "read")],
    );
    assert!((read - 5.0).abs() < f64::EPSILON, "{read}");
}

#[tokio::test]
async fn an_unreadable_load_report_is_counted_and_the_answer_passes() {
    let (_upstream, _policy, proxy, _) =
        proxy_with_report("BIN CZqZmZmZmbk/MQAAAAAAAABA", true, 3).await;
    let text = scrape(&proxy).await;
    let count = |outcome| {
        metric(
            &text,
            "shedgate_upstream_load_reports_total",
            &[("upstream", "default"), ("outcome", outcome)],
        )
    };
    assert!((count("invalid") - 3.0).abs() < f64::EPSILON, "{text}");
    assert!(count("read").abs() < f64::EPSILON, "{text}");
    let view = admin_get(&proxy, "/pressure").await.json();
    assert!(
        view["controller"]["reported_utilisation"].is_null(),
        "{view}"
    );
}

#[tokio::test]
async fn without_the_flag_a_report_is_not_read() {
    let (_upstream, _policy, proxy, _) =
        proxy_with_report("TEXT application_utilization=3", false, 1).await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    let view = admin_get(&proxy, "/pressure").await.json();
    assert!(
        view["controller"]["reported_utilisation"].is_null(),
        "{view}"
    );
    let text = scrape(&proxy).await;
    assert!(
        metric(
            &text,
            "shedgate_upstream_load_reports_total",
            &[("upstream", "default")]
        )
        .abs()
            < f64::EPSILON,
        "{text}"
    );
}
