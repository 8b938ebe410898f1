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

#[test]
fn the_shed_detail_is_the_format_it_replaces() {
    let texts = [
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
    for text in texts {
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
