//! The framing guard's tests: verdicts, progress and split independence.

use super::*;

fn verdicts(stream: &[u8], split_every: usize) -> Vec<Option<String>> {
    head_verdicts(stream, split_every, usize::MAX)
        .into_iter()
        .map(|v| match v {
            Some(HeadVerdict::Framing(why)) => Some(why),
            _ => None,
        })
        .collect()
}

fn head_verdicts(stream: &[u8], split_every: usize, max_line: usize) -> Vec<Option<HeadVerdict>> {
    let mut t = Tracker {
        sniffed: None,
        first: ([0; 12], 0),
        max_line,
        phase: Phase::Head,
        pending: Vec::new(),
        verdicts: VecDeque::new(),
        complete: 0,
    };
    for chunk in stream.chunks(split_every) {
        t.feed(chunk);
    }
    t.verdicts.into_iter().collect()
}

const PIPELINE: &[u8] = b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello\
POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n\
GET /c HTTP/1.1\r\nHost: x\r\n\r\n\
POST /d HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";

/// Several `Transfer-Encoding` lines are refused whatever their values; with several
/// `Content-Length` lines the first frames the body (hyper refuses differing ones itself), and
/// the last `Transfer-Encoding` value's final coding frames a chunked body.
#[test]
fn several_framing_lines_are_read_as_hyper_frames_them() {
    let two_te = b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    assert_eq!(
        verdicts(two_te, usize::MAX),
        vec![Some(
            "more than one Transfer-Encoding header line".to_owned()
        )]
    );
    let two_cl =
        b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\nhello\
GET /b HTTP/1.1\r\nHost: x\r\n\r\n";
    for split in [1, 7, usize::MAX] {
        assert_eq!(verdicts(two_cl, split), vec![None, None], "split {split}");
    }
    let list = b"POST /a HTTP/1.1\r\nHost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n\
GET /b HTTP/1.1\r\nHost: x\r\n\r\n";
    let v = verdicts(list, usize::MAX);
    assert_eq!(
        v.len(),
        2,
        "the chunked body was followed to the next head: {v:?}"
    );
    assert!(
        v[0].as_deref()
            .is_some_and(|why| why.contains("gzip, chunked")),
        "{v:?}"
    );
    assert_eq!(v[1], None);
}

#[test]
fn header_lines_over_the_limit_are_flagged() {
    let long = format!(
        "POST / HTTP/1.1\r\nHost: x\r\nX-Stream: {}\r\nContent-Length: 0\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "a".repeat(30_000)
    );
    let v = head_verdicts(long.as_bytes(), 4096, 8192);
    assert_eq!(v, vec![Some(HeadVerdict::LineTooLong(8192)), None]);
    // Exactly at the limit: "X-Stream: " + value + CRLF.
    let at = format!(
        "POST / HTTP/1.1\r\nX-Stream: {}\r\n\r\n",
        "a".repeat(8192 - 12)
    );
    assert_eq!(head_verdicts(at.as_bytes(), 100, 8192), vec![None]);
}

/// The progress the connection's lifecycle reads: requests received whole, and whether a
/// head or a body is part-way, at every byte of the pipeline.
#[test]
fn progress_counts_requests_received_whole() {
    let tracker = Verdicts(Arc::new(Mutex::new(Tracker {
        sniffed: None,
        first: ([0; 12], 0),
        max_line: usize::MAX,
        phase: Phase::Head,
        pending: Vec::new(),
        verdicts: VecDeque::new(),
        complete: 0,
    })));
    assert_eq!(tracker.progress(), Progress::Between(0));
    let mut seen = Vec::new();
    for b in PIPELINE {
        tracker.0.lock().unwrap().feed(std::slice::from_ref(b));
        let p = tracker.progress();
        if seen.last() != Some(&p) {
            seen.push(p);
        }
    }
    use Progress::*;
    assert_eq!(
        seen,
        [
            InHead(0),
            InBody(0),
            Between(1),
            InHead(1),
            InBody(1),
            Between(2),
            InHead(2),
            Between(3),
            InHead(3),
            InBody(3),
            Between(4)
        ]
    );
    assert_eq!(InBody(3).received(2), Some(true));
    assert_eq!(InBody(3).received(3), Some(false));
    assert_eq!(Unknown.received(0), None);
    // A CONNECT cannot be followed.
    tracker
        .0
        .lock()
        .unwrap()
        .feed(b"CONNECT x:1 HTTP/1.1\r\n\r\n");
    assert_eq!(tracker.progress(), Unknown);
}

#[test]
fn follows_pipelined_requests_at_any_split() {
    for split in [1, 2, 3, 7, 64, 10_000] {
        let v = verdicts(PIPELINE, split);
        assert_eq!(v.len(), 4, "split {split}");
        assert!(v[..3].iter().all(Option::is_none), "split {split}: {v:?}");
        assert!(
            v[3].as_deref().is_some_and(|w| w.contains("beside")),
            "{v:?}"
        );
    }
}

#[test]
fn flags_codings_that_are_not_exactly_chunked() {
    for te in [
        "chunked\t",
        "Chunked ",
        "gzip, chunked",
        "chunked, chunked",
        " chunked",
    ] {
        let req = format!("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: {te}\r\n\r\n0\r\n\r\n");
        let v = verdicts(req.as_bytes(), 5);
        // httparse trims surrounding whitespace of a value; codings that stay ambiguous
        // after that are flagged.
        if te.trim().eq_ignore_ascii_case("chunked") {
            assert_eq!(v, vec![None], "{te:?}");
        } else {
            assert!(v[0].is_some(), "{te:?}");
        }
    }
    let twice = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    assert!(verdicts(twice, 9)[0].is_some());
}

/// A bare-LF header line followed by a CRLF empty line: hyper accepts it, so the tracker
/// must end the head exactly there (a reviewer's desync case).
#[test]
fn mixed_line_ends_keep_the_boundaries() {
    let stream = b"GET /a HTTP/1.1\nHost: x\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\nPOST /c HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    for split in [1, 5, 100] {
        let v = verdicts(stream, split);
        assert_eq!(v.len(), 3, "split {split}: {v:?}");
        assert!(v[0].is_none() && v[1].is_none() && v[2].is_some(), "{v:?}");
    }
    // An Upgrade header does not end the tracking (no upgrades are served).
    let up = b"GET /a HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\nPOST /c HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n";
    let v = verdicts(up, 7);
    assert_eq!(v.len(), 2);
    assert!(v[1].is_some());
}

#[test]
fn the_case_file() {
    let raw = b"POST /ingest HTTP/1.1\r\nHost: a\r\nX-Stream: vehicle.position\r\nContent-Length: 44\r\nTransfer-Encoding: chunked\t\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: a\r\n\r\n";
    let v = verdicts(raw, 11);
    assert!(v[0].is_some());
    assert_eq!(v.len(), 2);
}

/// The first bytes of a connection say whether it speaks another protocol, however they are
/// split across reads; a plain request, or a method that merely starts like one, does not.
#[test]
fn first_bytes_tell_an_http2_preface_or_a_tls_hello_however_split() {
    let hello = [
        0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
    ];
    let cases: [(&[u8], Option<WrongProtocol>); 4] = [
        (
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            Some(WrongProtocol::Http2Preface),
        ),
        (&hello, Some(WrongProtocol::TlsClientHello)),
        (b"POST /a HTTP/1.1\r\nHost: x\r\n\r\n", None),
        (b"PRIVATE / HTTP/1.1\r\nHost: x\r\n\r\n", None),
    ];
    for (bytes, expected) in cases {
        for split in [1, 2, 5, 64] {
            let (mut guard, verdicts) = FramingGuard::new((), usize::MAX);
            let _ = &mut guard;
            for chunk in bytes.chunks(split) {
                verdicts.0.lock().unwrap().feed(chunk);
            }
            assert_eq!(
                verdicts.wrong_protocol(),
                expected,
                "{bytes:?} split {split}"
            );
        }
    }
    assert_eq!(sniff(b"PRI"), None, "too few bytes to tell");
    assert_eq!(sniff(&[0x16]), None);
    assert_eq!(sniff(&[0x16, 0x41]), Some(None));
}

/// A chunk-size line hyper refuses (a `+` sign, a bare LF, more hex digits than a u64 holds)
/// is one the guard stops following, never one it reads another way.
#[test]
fn chunk_size_lines_hyper_refuses_are_not_followed() {
    for line in [
        &b"+5\r\n"[..],
        b"5\n",
        b"10000000000000000\r\n",
        b"\r\n",
        b"0x5\r\n",
    ] {
        let mut stream =
            b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
        stream.extend_from_slice(line);
        let tracker = Verdicts(Arc::new(Mutex::new(Tracker {
            sniffed: None,
            first: ([0; 12], 0),
            max_line: usize::MAX,
            phase: Phase::Head,
            pending: Vec::new(),
            verdicts: VecDeque::new(),
            complete: 0,
        })));
        tracker.0.lock().unwrap().feed(&stream);
        assert_eq!(
            tracker.progress(),
            Progress::Unknown,
            "{:?}",
            String::from_utf8_lossy(line)
        );
    }
}
