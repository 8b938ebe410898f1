//! The hand-written problem document against serde_json's writing of the same `Problem`.

use super::*;
use crate::admission::DeviceHistory;

fn explanation(text: &str, number: f64, some: bool) -> Explanation {
    Explanation {
        decision: "shed",
        reason: "pressure",
        would_shed: some.then_some("budget"),
        stream: format!("vehicle.{text}"),
        class: "best-effort",
        upstream: text.to_owned(),
        area: format!("{text}-area"),
        rank: 50,
        probability: number,
        pressure: 0.8,
        age_seconds: some.then_some(number),
        schedule: some.then(|| text.to_owned()),
        policy_version: "0123456789ab".to_owned(),
        device: some.then(|| DeviceHistory {
            credit: number,
            since_admitted_ms: Some(-3),
            interval_ms: None,
            newest_delivered: Some(crate::clock::UnixMillis(i64::MIN)),
            since_delivered_ms: Some(i64::MAX),
            ..DeviceHistory::new(0.25)
        }),
    }
}

#[test]
fn the_document_is_written_as_serde_json_writes_it() {
    let texts = [
        "plain",
        "quo\"te",
        "back\\slash",
        "new\nline\ttab\u{1}",
        "\u{8}\u{c}\r\u{1f}\u{0}\\\"",
        "é ü 東京",
        "del\u{7f}",
        "/slash",
        "",
        "a longer name with a \" quote past its eighth byte,\n a newline and \u{1f} after",
        "eight by\\tes then \u{7}",
    ];
    let numbers = [
        0.0,
        -0.0,
        1.0,
        0.1 + 0.2,
        1e-7,
        1e21,
        123_456.789,
        f64::NAN,
        f64::INFINITY,
    ];
    let mut compared = 0;
    for text in texts {
        for number in numbers {
            for some in [false, true] {
                let e = explanation(text, number, some);
                for explanation in [None, Some(&e)] {
                    let problem = Problem {
                        kind: "urn:shedgate:problem:shed",
                        title: text,
                        status: 503,
                        detail: format!("stream {text:?} shed; retry after {number} s"),
                        retry_after: some.then_some(7),
                        explanation,
                    };
                    assert_eq!(
                        String::from_utf8(problem.to_json()).unwrap(),
                        serde_json::to_string(&problem).unwrap()
                    );
                    compared += 1;
                }
            }
        }
    }
    assert_eq!(compared, texts.len() * numbers.len() * 4);
}

/// Stream and area names for the shed's detail and document: plain, needing JSON escapes,
/// non-ASCII, a combining mark, empty.
const TEXTS: [&str; 10] = [
    "plain",
    "vehicle.position",
    "quo\"te",
    "back\\slash",
    "new\nline\ttab\u{1}",
    "apo'strophe",
    "é ü 東京",
    "del\u{7f}",
    "combining \u{301} mark",
    "",
];

#[test]
fn the_shed_detail_is_the_format_it_replaces() {
    for text in TEXTS {
        for (rank, retry) in [(1, 1), (50, 7), (100, u32::MAX)] {
            let mut e = explanation(text, 0.5, false);
            e.rank = rank;
            assert_eq!(
                document::shed_detail(&e, retry),
                format!(
                    "stream {:?} shed ({}) in area {:?} (rank {}); retry after {} s",
                    e.stream, e.reason, e.area, e.rank, retry
                )
            );
        }
    }
}

#[test]
fn a_sheds_document_is_the_problem_document_of_its_detail() {
    for text in TEXTS {
        for some in [false, true] {
            for (rank, secs) in [(1, 0), (50, 7), (100, u32::MAX)] {
                let mut e = explanation(text, 0.1 + 0.2, some);
                e.rank = rank;
                let problem = Problem {
                    kind: "urn:shedgate:problem:shed",
                    title: "Shed under load",
                    status: 503,
                    detail: document::shed_detail(&e, secs),
                    retry_after: Some(secs),
                    explanation: Some(&e),
                };
                assert_eq!(
                    String::from_utf8(document::shed_json(&e, secs)).unwrap(),
                    serde_json::to_string(&problem).unwrap()
                );
            }
        }
    }
}

#[test]
fn a_sheds_answer_has_its_headers_in_order_and_retry_after_in_seconds() {
    for secs in [1, 7, 30, 60, 61, 3600, u32::MAX] {
        let e = explanation("plain", 0.5, false);
        let response = Rejection::Shed {
            explanation: e.clone(),
            retry_after: secs,
        }
        .into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        assert_eq!(
            headers,
            [
                ("content-type".to_owned(), PROBLEM_JSON.to_owned()),
                ("retry-after".to_owned(), secs.to_string()),
                (X_SHED_REASON.to_owned(), e.reason.to_owned()),
            ]
        );
    }
}
