//! When an HTTP/2 connection's graceful close begins and when a client that never
//! acknowledges the `GOAWAY`'s `PING` is cut, with paused time, over an in-memory pipe: the
//! connection's task as the listener runs it, a client of raw frames (RFC 9113 section 4).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::edge::descriptors::{Descriptors, PAUSE};
use crate::edge::keepalive::Activity;
use crate::edge::serve::{LameDuck, Shared};
use crate::edge::tls::Http2Limits;

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// The test service's answer: this long after the request, this many bytes in one chunk
/// (more than the client's initial window of 65,535).
const ANSWER_AFTER: Duration = Duration::from_millis(4900);
const ANSWER_BYTES: usize = 100_000;

async fn answer(_: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    tokio::time::sleep(ANSWER_AFTER).await;
    Ok(Response::new(Full::new(Bytes::from(vec![
        b'x';
        ANSWER_BYTES
    ]))))
}

type Answering = Pin<Box<dyn Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send>>;
type Stack = tower::util::ServiceFn<fn(Request<Incoming>) -> Answering>;
/// A connection's task.
type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A listener's shared state with `--idle-timeout` `idle_timeout` and `descriptors`.
fn shared(idle_timeout: Duration, descriptors: Arc<Descriptors>) -> Arc<Shared<Stack>> {
    let answering: fn(Request<Incoming>) -> Answering = |req| Box::pin(answer(req));
    let stack: Stack = tower::service_fn(answering);
    Arc::new(Shared {
        stack,
        builder: hyper::server::conn::http1::Builder::new(),
        idle_timeout,
        header_read_timeout: Duration::from_secs(10),
        lame_duck: LameDuck::default(),
        metrics: None,
        refusals: None,
        descriptors,
        tls: true,
        http2: Some(super::builder(&Http2Limits::default(), 32 * 1024)),
        draining: AtomicBool::new(false),
        drain: std::array::from_fn(|_| Notify::new()),
    })
}

fn unlimited() -> Arc<Descriptors> {
    Arc::new(Descriptors::new(None, None))
}

/// One frame as read.
#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut out = vec![len[1], len[2], len[3], kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// A client that sends the preface and never acknowledges a `PING`.
struct Client {
    io: DuplexStream,
    buf: Vec<u8>,
}

impl Client {
    /// The connection's task on a new pipe, spawned (`serving` wraps it, as the listener's
    /// descriptor count does), and the client's end with the preface sent.
    async fn open<F: Future<Output = ()> + Send + 'static>(
        shared: &Arc<Shared<Stack>>,
        activity: &Arc<Activity>,
        serving: impl FnOnce(Task) -> F,
    ) -> Client {
        let (server, io) = tokio::io::duplex(1 << 20);
        let peer = "127.0.0.1:40000".parse().unwrap();
        let task = super::connection(
            server,
            peer,
            Arc::clone(shared),
            0,
            8192,
            Arc::clone(activity),
        );
        tokio::spawn(serving(Box::pin(task)));
        let mut client = Client {
            io,
            buf: Vec::new(),
        };
        let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        preface.extend(frame(SETTINGS, 0, 0, &[]));
        client.write(&preface).await;
        client
    }

    /// Writes `bytes`, ignoring a closed pipe (the test reads what the server did).
    async fn write(&mut self, bytes: &[u8]) {
        let _ = self.io.write_all(bytes).await;
    }

    /// The next frame, `None` once the server has closed the pipe.
    async fn next(&mut self) -> Option<Frame> {
        loop {
            if self.buf.len() >= 9 {
                let len = usize::from(self.buf[0]) << 16
                    | usize::from(self.buf[1]) << 8
                    | usize::from(self.buf[2]);
                if self.buf.len() >= 9 + len {
                    let head: Vec<u8> = self.buf.drain(..9).collect();
                    return Some(Frame {
                        kind: head[3],
                        flags: head[4],
                        stream: u32::from_be_bytes(head[5..9].try_into().unwrap()) & 0x7fff_ffff,
                        payload: self.buf.drain(..len).collect(),
                    });
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            match self.io.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Frames until one of `kind` (returned last); panics if the pipe closes first.
    async fn until(&mut self, kind: u8) -> Vec<Frame> {
        let mut seen = Vec::new();
        loop {
            let f = self
                .next()
                .await
                .unwrap_or_else(|| panic!("closed before frame type {kind}; saw {seen:?}"));
            let done = f.kind == kind;
            seen.push(f);
            if done {
                return seen;
            }
        }
    }

    /// Every frame until the server closes the pipe.
    async fn until_closed(&mut self) -> Vec<Frame> {
        let mut seen = Vec::new();
        while let Some(f) = self.next().await {
            seen.push(f);
        }
        seen
    }
}

/// Lets every task run until each waits (paused time advances only then): the preface read,
/// the handshake done.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(1)).await;
}

fn plain(task: Task) -> Task {
    task
}

/// `--idle-timeout` below [`super::PARK_AFTER`]: a connection with no stream is sent its
/// `GOAWAY` at the idle timeout, not at the park's second.
#[tokio::test(start_paused = true)]
async fn an_idle_timeout_below_a_second_is_kept() {
    let shared = shared(Duration::from_millis(500), unlimited());
    let start = Instant::now();
    let mut client = Client::open(&shared, &Arc::new(Activity::new()), plain).await;
    client.until(GOAWAY).await;
    let at = start.elapsed();
    assert!(
        at >= Duration::from_millis(500) && at < Duration::from_millis(510),
        "GOAWAY at {at:?}"
    );
}

/// At the idle timeout, a client that never acknowledges the `PING` is cut [`PAUSE`] after the
/// `GOAWAY`, as an idle HTTP/1 connection is closed at once.
#[tokio::test(start_paused = true)]
async fn at_the_idle_timeout_a_client_that_ignores_the_ping_is_cut_after_the_pause() {
    let shared = shared(Duration::from_secs(2), unlimited());
    let mut client = Client::open(&shared, &Arc::new(Activity::new()), plain).await;
    client.until(GOAWAY).await;
    let goaway = Instant::now();
    let rest = client.until_closed().await;
    assert!(rest.iter().any(|f| f.kind == PING), "{rest:?}");
    let cut = goaway.elapsed();
    assert!(
        cut >= PAUSE && cut < PAUSE + Duration::from_millis(10),
        "cut after {cut:?}"
    );
}

/// The proxy listener at its reserve with only an idle HTTP/2 connection to close, whose client
/// never acknowledges the `PING`: the connection is cut, and the listener may accept again,
/// [`PAUSE`] after it was told to close, not [`super::GOAWAY_GRACE`].
#[tokio::test(start_paused = true)]
async fn an_evicted_connection_that_ignores_the_ping_frees_its_descriptor_after_the_pause() {
    // Limit 128, reserve 64: the listener accepts while fewer than 64 are held.
    let descriptors = Arc::new(Descriptors::new(Some(128), None));
    let _upstream: Vec<_> = (0..63).map(|_| descriptors.hold()).collect();
    let shared = shared(Duration::from_secs(75), Arc::clone(&descriptors));
    let activity = Arc::new(Activity::new());
    let counted = descriptors.accepted(&activity);
    let mut client = Client::open(&shared, &activity, |task| counted.serving(task)).await;
    settle().await;
    assert_eq!(descriptors.open(), 64);
    let start = Instant::now();
    let room = tokio::spawn({
        let descriptors = Arc::clone(&descriptors);
        async move { descriptors.room().await }
    });
    client.until(GOAWAY).await;
    client.until_closed().await;
    room.await.unwrap();
    let waited = start.elapsed();
    assert!(
        waited <= PAUSE + Duration::from_millis(10),
        "accepts waited {waited:?}"
    );
    assert_eq!(descriptors.open(), 63);
}

/// A drain's `GOAWAY`, a client that never acknowledges the `PING`, and a stream whose answer
/// ends just before the grace would run out, its last bytes still queued for a client that
/// has not opened its window: the client gets [`super::GOAWAY_GRACE`] after the answer's end
/// to read them, and reads the answer whole.
#[tokio::test(start_paused = true)]
async fn an_answer_that_ends_near_the_grace_reaches_a_slow_reader_whole() {
    let shared = shared(Duration::from_secs(75), unlimited());
    let start = Instant::now();
    let mut client = Client::open(&shared, &Arc::new(Activity::new()), plain).await;
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/"),
        (":authority", "localhost"),
    ] {
        block.push(0);
        block.push(u8::try_from(name.len()).unwrap());
        block.extend_from_slice(name.as_bytes());
        block.push(u8::try_from(value.len()).unwrap());
        block.extend_from_slice(value.as_bytes());
    }
    client
        .write(&frame(HEADERS, END_HEADERS | END_STREAM, 1, &block))
        .await;
    settle().await;
    shared.begin_drain();
    // The answer's first 65,535 bytes (the client's window), then nothing until the client
    // opens its window, a second after the grace began would have run out.
    let mut got = 0;
    while got < 65_535 {
        let f = client.next().await.expect("the answer's first bytes");
        if f.kind == DATA && f.stream == 1 {
            got += f.payload.len();
        }
    }
    tokio::time::sleep_until(start + Duration::from_secs(6)).await;
    let more = u32::try_from(ANSWER_BYTES).unwrap().to_be_bytes();
    client.write(&frame(WINDOW_UPDATE, 0, 0, &more)).await;
    client.write(&frame(WINDOW_UPDATE, 0, 1, &more)).await;
    let rest = client.until_closed().await;
    let data: Vec<&Frame> = rest
        .iter()
        .filter(|f| f.kind == DATA && f.stream == 1)
        .collect();
    got += data.iter().map(|f| f.payload.len()).sum::<usize>();
    assert_eq!(got, ANSWER_BYTES, "{rest:?}");
    assert!(data.last().is_some_and(|f| f.flags & END_STREAM != 0));
}
