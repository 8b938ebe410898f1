//! Fuzzing on the stable toolchain, as property tests over arbitrary bytes: body extraction
//! under every format preset and content mode, time parsing, and the framing guard. Each must
//! never panic, always return, and give the same answer for the same bytes.
//!
//! Inputs are of three kinds: arbitrary bytes; arbitrary JSON (deep, wide, odd numbers and
//! keys); and the shared sender cases (`tests/cases/formats`) with bytes flipped, inserted
//! and cut, which reach deeper into each preset than random bytes do. The case count is
//! proptest's (256 per property); `PROPTEST_CASES=N` runs a long mode.

use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;
use shedgate::admission::{self, Reading};
use shedgate::edge::framing::FramingGuard;
use shedgate::extract::time::{parse_param_time, parse_time_text};
use shedgate::policy::Policy;

use crate::support::cases_policy;

fn policy() -> &'static Policy {
    static POLICY: OnceLock<Policy> = OnceLock::new();
    POLICY.get_or_init(|| shedgate::policy::load_dir(&cases_policy()).unwrap().policy)
}

/// The bodies of the shared format cases, as seeds for mutation.
fn seeds() -> &'static [Vec<u8>] {
    static SEEDS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cases/formats");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            let at = bytes
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map(|i| i + 4)
                .or_else(|| bytes.windows(2).position(|w| w == b"\n\n").map(|i| i + 2));
            if let Some(at) = at {
                out.push(bytes[at..].to_vec());
            }
        }
        assert!(out.len() >= 10, "{} seeds", out.len());
        out
    })
}

const CONTENT_TYPES: [Option<&str>; 5] = [
    None,
    Some("application/json"),
    Some("application/cloudevents+json"),
    Some("application/cloudevents-batch+json"),
    Some("application/x-www-form-urlencoded"),
];

/// Every route and content mode, each with the stream unknown before the body and with the
/// first stream named: the facts of `body` (and `query`), as text.
fn assess_everywhere(body: &[u8], query: Option<&str>) -> Vec<String> {
    let policy = policy();
    let mut out = Vec::new();
    for (i, route) in policy.routes().iter().enumerate() {
        for ct in CONTENT_TYPES {
            let mut headers = HeaderMap::new();
            if let Some(ct) = ct {
                headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static(ct));
            }
            headers.insert("ce-time", HeaderValue::from_static("2026-12-01T00:00:00Z"));
            let mode = route.mode_index(ct.map(str::as_bytes));
            for known in [None, Some(policy.stream("vehicle.position"))] {
                let reading = Reading {
                    route: Some((i, mode)),
                    known,
                    ambiguous: false,
                };
                let facts = admission::assess(policy, reading, &headers, query, body);
                out.push(format!("{facts:?}"));
            }
        }
    }
    out
}

/// A seed with edits: each `(position, op, byte)` flips, inserts or cuts at a position.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    (
        0..seeds().len(),
        prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, any::<u8>()), 0..8),
    )
        .prop_map(|(seed, edits)| {
            let mut b = seeds()[seed].clone();
            for (at, op, byte) in edits {
                if b.is_empty() {
                    b.push(byte);
                    continue;
                }
                let i = at.index(b.len());
                match op {
                    0 => b[i] ^= byte | 1,
                    1 => b.insert(i, byte),
                    _ => {
                        b.remove(i);
                    }
                }
            }
            b
        })
}

/// Arbitrary JSON text: nesting up to 6 levels, keys from the presets' vocabulary and
/// random ones, numbers from the edges of f64.
fn json() -> impl Strategy<Value = Vec<u8>> {
    let key = prop_oneof![
        Just("lat".to_owned()),
        Just("lon".to_owned()),
        Just("tst".to_owned()),
        Just("time".to_owned()),
        Just("_type".to_owned()),
        Just("data".to_owned()),
        Just("type".to_owned()),
        Just("locations".to_owned()),
        Just("geometry".to_owned()),
        Just("coordinates".to_owned()),
        Just("properties".to_owned()),
        Just("timestamp".to_owned()),
        Just("position".to_owned()),
        Just("features".to_owned()),
        "[a-z_]{0,6}",
    ];
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<f64>().prop_map(|f| serde_json::json!(f)),
        any::<i64>().prop_map(|i| serde_json::json!(i)),
        ".{0,24}".prop_map(serde_json::Value::String),
        Just(serde_json::json!("2026-12-01T00:00:00Z")),
        Just(serde_json::json!(1e308)),
    ];
    leaf.prop_recursive(6, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
        ]
    })
    .prop_map(|v| v.to_string().into_bytes())
}

proptest! {
    /// Extraction of arbitrary bytes: no panic, and the same facts twice.
    #[test]
    fn extraction_of_arbitrary_bytes_is_total_and_deterministic(
        body in prop::collection::vec(any::<u8>(), 0..512),
        query in prop::option::of(".{0,64}"),
    ) {
        let first = assess_everywhere(&body, query.as_deref());
        prop_assert_eq!(first, assess_everywhere(&body, query.as_deref()));
    }

    /// Extraction of arbitrary JSON and of mutated sender cases.
    #[test]
    fn extraction_of_json_and_mutated_cases_is_total_and_deterministic(
        body in prop_oneof![json(), mutated()],
        query in prop::option::of("(lat|lon|timestamp|id)=[-0-9.eE+:%T ]{0,24}(&(lat|lon|timestamp)=[-0-9.eE+]{0,12}){0,3}"),
    ) {
        let first = assess_everywhere(&body, query.as_deref());
        prop_assert_eq!(first, assess_everywhere(&body, query.as_deref()));
    }

    /// Time parsing of arbitrary text and of near-timestamps.
    #[test]
    fn time_parsing_is_total_and_deterministic(
        text in prop_oneof![
            ".{0,40}",
            "[0-9]{1,4}-[0-9]{1,2}-[0-9]{1,2}[T ][0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(\\.[0-9]{0,12})?(Z|[+-][0-9]{2}:?[0-9]{2})?",
            "-?[0-9]{0,20}(\\.[0-9]{0,20})?([eE][+-]?[0-9]{1,4})?",
        ],
    ) {
        prop_assert_eq!(parse_time_text(&text), parse_time_text(&text));
        prop_assert_eq!(parse_param_time(&text), parse_param_time(&text));
    }

    /// The framing guard over arbitrary bytes, cut anywhere: no panic, and the same verdicts
    /// and progress however the bytes arrive.
    #[test]
    fn the_framing_guard_is_total_and_split_independent(
        stream in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..2048),
            framing_like(),
        ],
        cuts in prop::collection::vec(1usize..64, 1..16),
    ) {
        let whole = guard(&stream, &[usize::MAX]);
        prop_assert_eq!(&whole, &guard(&stream, &cuts));
        prop_assert_eq!(&whole, &guard(&stream, &[1]));
    }
}

/// Request heads with the framing headers in random order, case and count, and bodies.
fn framing_like() -> impl Strategy<Value = Vec<u8>> {
    let header = prop_oneof![
        "(Content-Length|content-length|Content-length): ?[0-9 ,]{0,6}",
        "(Transfer-Encoding|transfer-encoding): ?(chunked|gzip, chunked|chunked, chunked| chunked|Chunked|identity)",
        "Host: x",
        "X-[a-z]{1,8}: [ -~]{0,16}",
    ];
    let message = (
        "(GET|POST|PUT|CONNECT|OPTIONS) (/[a-z]{0,6}|\\*) HTTP/1\\.[01]",
        prop::collection::vec(header, 0..6),
        prop_oneof!["\r\n", "\n"],
        "([0-9a-f]{1,3}(;x=y)?\r\n[a-z]{0,16}\r\n){0,3}(0\r\n(X-T: 1\r\n)?\r\n)?|[a-z]{0,32}",
    )
        .prop_map(|(line, headers, eol, body)| {
            let mut m = line;
            m.push_str(&eol);
            for h in headers {
                m.push_str(&h);
                m.push_str(&eol);
            }
            m.push_str(&eol);
            m.push_str(&body);
            m
        });
    prop::collection::vec(message, 1..4).prop_map(|ms| ms.concat().into_bytes())
}

/// Feeds `stream` through a framing guard in pieces of the `cuts` sizes (cycled); returns the
/// verdicts and the final progress, as text.
fn guard(stream: &[u8], cuts: &[usize]) -> String {
    let io = Chunks {
        data: stream.to_vec(),
        at: 0,
        cuts: cuts.to_vec(),
        turn: 0,
    };
    let (mut guard, verdicts) = FramingGuard::new(io, 8192);
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);
    let mut buf = [0u8; 8192];
    loop {
        let mut rb = hyper::rt::ReadBuf::new(&mut buf);
        match hyper::rt::Read::poll_read(Pin::new(&mut guard), &mut cx, rb.unfilled()) {
            Poll::Ready(Ok(())) if rb.filled().is_empty() => break,
            Poll::Ready(Ok(())) => {}
            other => panic!("{other:?}"),
        }
    }
    let mut out = Vec::new();
    // Verdicts of every head the guard followed, in order (`next` is `None` past the end and
    // for clean heads alike, so the progress below counts them).
    for _ in 0..64 {
        out.push(format!("{:?}", verdicts.next()));
    }
    format!("{out:?} {:?}", verdicts.progress())
}

/// An IO that yields its bytes in pieces of the given sizes.
struct Chunks {
    data: Vec<u8>,
    at: usize,
    cuts: Vec<usize>,
    turn: usize,
}

impl hyper::rt::Read for Chunks {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        mut buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let cut = this.cuts[this.turn % this.cuts.len()];
        this.turn += 1;
        let n = cut.min(this.data.len() - this.at).min(buf.remaining());
        buf.put_slice(&this.data[this.at..this.at + n]);
        this.at += n;
        Poll::Ready(Ok(()))
    }
}
