//! Open-file descriptors, with the real binary under `prlimit` (util-linux): a low soft limit
//! is raised to the hard one at start; under a low hard limit the oldest idle connections
//! are closed so that a never-shed request and the admin listener are still answered, and
//! accept failures neither spin nor flood the log (`edge::descriptors`).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{BERLIN, MockUpstream, PolicyDir, event, metric, read_head};

/// Longest wait for anything in these tests: a bound, not a measurement.
const BOUND: Duration = Duration::from_secs(60);

/// The binary under `prlimit --nofile=SOFT:HARD`, its stderr lines collected.
struct Limited {
    child: Child,
    proxy: SocketAddr,
    admin: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
    started: tokio::time::Instant,
}

impl Limited {
    fn start(soft: u64, hard: u64, upstream: &MockUpstream, policy: &PolicyDir) -> Self {
        Self::start_with(soft, hard, upstream, policy, &[])
    }

    /// As [`Limited::start`], with `extra` arguments to `serve`.
    fn start_with(
        soft: u64,
        hard: u64,
        upstream: &MockUpstream,
        policy: &PolicyDir,
        extra: &[&std::ffi::OsStr],
    ) -> Self {
        use std::io::BufRead as _;
        let mut child = Command::new("prlimit")
            .arg(format!("--nofile={soft}:{hard}"))
            .arg("--")
            .arg(env!("CARGO_BIN_EXE_shedgate"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(["--admin-listen", "127.0.0.1:0"])
            .args(["--upstream", &upstream.url()])
            .arg("--policies")
            .arg(policy.path())
            .args(extra)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stderr(Stdio::piped())
            .spawn()
            .expect("prlimit (util-linux) runs the binary");
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn({
            let log = Arc::clone(&log);
            move || {
                for line in std::io::BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    log.lock().unwrap().push(line.clone());
                    let _ = tx.send(line);
                }
            }
        });
        let field = |line: &str, name: &str| -> Option<SocketAddr> {
            let at = line.find(&format!("{name}="))? + name.len() + 1;
            line[at..].split_whitespace().next()?.parse().ok()
        };
        let (proxy, admin) = loop {
            let line = rx
                .recv_timeout(BOUND)
                .unwrap_or_else(|_| panic!("no 'shedgate serving' line: {log:#?}"));
            if line.contains("shedgate serving") {
                break (
                    field(&line, "proxy_addr").unwrap(),
                    field(&line, "admin_addr").unwrap(),
                );
            }
        };
        Limited {
            child,
            proxy,
            admin,
            log,
            started: tokio::time::Instant::now(),
        }
    }

    /// The running binary's soft and hard open-files limits (`prlimit` execs it: same pid).
    fn limits(&self) -> (u64, u64) {
        let text = std::fs::read_to_string(format!("/proc/{}/limits", self.child.id())).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap();
        let mut n = line.split_whitespace().skip(3).map(|v| v.parse().unwrap());
        (n.next().unwrap(), n.next().unwrap())
    }

    fn log_lines(&self, needle: &str) -> Vec<String> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|l| l.contains(needle)).cloned().collect()
    }

    /// How many descriptor warnings rate limiting allows since start: one every 10 s.
    fn warnings_allowed(&self) -> usize {
        1 + usize::try_from(self.started.elapsed().as_secs() / 10).unwrap()
    }
}

impl Drop for Limited {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The test process's own soft limit raised: it holds the idle connections.
fn raise_own_limit() {
    let raised = rlimit::increase_nofile_limit(4096).unwrap();
    assert!(
        raised >= 2048,
        "the test needs 2048 descriptors, has {raised}"
    );
}

/// `n` idle connections to `addr`, opened one after the other (accepted in that order).
async fn idle(addr: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        let c = tokio::time::timeout(BOUND, TcpStream::connect(addr))
            .await
            .unwrap_or_else(|_| panic!("connect {i} of {n} timed out"))
            .unwrap();
        conns.push(c);
    }
    conns
}

/// Sends a never-shed geofence transition on a new connection; the answer's head.
async fn transition(proxy: SocketAddr) -> String {
    let body = event(BERLIN, 1);
    let request = format!(
        "POST /ingest HTTP/1.1\r\nHost: x\r\nX-Stream: geofence.transition\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    exchange(proxy, request.as_bytes()).await
}

async fn exchange(addr: SocketAddr, request: &[u8]) -> String {
    tokio::time::timeout(BOUND, async {
        let mut tcp = TcpStream::connect(addr).await.unwrap();
        tcp.write_all(request).await.unwrap();
        read_head(&mut tcp).await
    })
    .await
    .unwrap_or_else(|_| panic!("no answer from {addr} within {BOUND:?}"))
}

async fn admin_get(admin: SocketAddr, path: &str) -> String {
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tokio::time::timeout(BOUND, async {
        let mut tcp = TcpStream::connect(admin).await.unwrap();
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut all = Vec::new();
        tcp.read_to_end(&mut all).await.unwrap();
        String::from_utf8_lossy(&all).into_owned()
    })
    .await
    .unwrap_or_else(|_| panic!("no answer to {path} within {BOUND:?}"))
}

/// Whether the peer has closed `tcp`: waits for it (EOF or a reset).
async fn closed(tcp: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(BOUND, tcp.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// Whether `tcp` is still open now: nothing to read and no EOF, asked of the kernel (a
/// `peek` on a duplicate of the descriptor; tokio's `try_read` would answer from readiness
/// it may not have updated yet).
fn open_now(tcp: &TcpStream) -> bool {
    use std::os::fd::AsFd as _;
    let fd = tcp.as_fd().try_clone_to_owned().unwrap();
    let std_tcp = std::net::TcpStream::from(fd);
    std_tcp.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    matches!(std_tcp.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_soft_open_files_limit_is_raised_to_the_hard_one() {
    raise_own_limit();
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::seed();
    let proxy = Limited::start(256, 4096, &upstream, &policy);
    assert_eq!(proxy.limits(), (4096, 4096));
    let raised = proxy.log_lines("open-files limit: soft raised");
    assert!(
        raised
            .iter()
            .any(|l| l.contains("soft_before=256") && l.contains("soft=4096")),
        "{raised:?}"
    );
    // 1,100 idle connections, more than the soft limit the binary was given.
    let conns = idle(proxy.proxy, 1100).await;
    // Accepted after all of them (the kernel's accept queue is in order).
    let head = transition(proxy.proxy).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(upstream.count(), 1);
    let open = conns.iter().filter(|c| open_now(c)).count();
    assert_eq!(
        open, 1100,
        "no idle connection was closed: the limit was room enough"
    );
    assert!(
        proxy.log_lines("open files running out").is_empty(),
        "{:?}",
        proxy.log_lines("WARN")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_low_hard_limit_the_oldest_idle_connections_are_closed_first() {
    raise_own_limit();
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::seed();
    let proxy = Limited::start(256, 256, &upstream, &policy);
    assert_eq!(proxy.limits(), (256, 256), "raising cannot help");
    assert_eq!(proxy.log_lines("soft already at the hard limit").len(), 1);
    let short = proxy.log_lines("hard limit below what the configured connections need");
    assert_eq!(short.len(), 1, "{:?}", proxy.log_lines("WARN"));
    // 300 idle connections: more than the limit, with no request yet.
    let mut conns = idle(proxy.proxy, 300).await;
    let head = transition(proxy.proxy).await;
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "a never-shed transition: {head}"
    );
    assert_eq!(upstream.count(), 1);
    let livez = admin_get(proxy.admin, "/livez").await;
    assert!(livez.starts_with("HTTP/1.1 200"), "{livez}");
    // The reserve is 64 of 256: at most 192 sockets held, so at least 300 - 192 of the idle
    // ones were closed, oldest first; a round closes at most 32 more than needed.
    for (i, c) in conns.iter_mut().enumerate().take(100) {
        assert!(
            closed(c).await,
            "idle connection {i} (of the oldest) still open"
        );
    }
    for (i, c) in conns.iter().enumerate().skip(200) {
        assert!(
            open_now(c),
            "idle connection {i} (of the newest) was closed"
        );
    }
    let metrics = admin_get(proxy.admin, "/metrics").await;
    let closes = metric(
        &metrics,
        "shedgate_client_connection_closes_total",
        &[("reason", "descriptors")],
    );
    assert!((100.0..=200.0).contains(&closes), "{closes} closed");
    let reserve = metric(
        &metrics,
        "shedgate_descriptor_shortages_total",
        &[("reason", "reserve")],
    );
    assert!(reserve >= 1.0, "{reserve}");
    let warnings = proxy.log_lines("open files running out");
    assert!(
        !warnings.is_empty() && warnings.len() <= proxy.warnings_allowed(),
        "{warnings:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_out_of_descriptors_close_idle_connections_instead_of_spinning() {
    raise_own_limit();
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::seed();
    let proxy = Limited::start(256, 256, &upstream, &policy);
    // The admin listener does not wait for the reserve: 300 idle connections to it run the
    // process out of descriptors, and its accepts fail with EMFILE.
    let mut conns = idle(proxy.admin, 300).await;
    let livez = admin_get(proxy.admin, "/livez").await;
    assert!(livez.starts_with("HTTP/1.1 200"), "{livez}");
    let head = transition(proxy.proxy).await;
    assert!(
        head.starts_with("HTTP/1.1 200"),
        "a never-shed transition: {head}"
    );
    // About 240 fit beside the process's own descriptors: the oldest of the rest closed.
    for (i, c) in conns.iter_mut().enumerate().take(40) {
        assert!(
            closed(c).await,
            "idle admin connection {i} (of the oldest) still open"
        );
    }
    assert!(
        open_now(&conns[299]),
        "the newest idle admin connection was closed"
    );
    let metrics = admin_get(proxy.admin, "/metrics").await;
    let emfile = metric(
        &metrics,
        "shedgate_descriptor_shortages_total",
        &[("reason", "admin_accept")],
    );
    assert!(emfile >= 1.0, "{emfile}");
    // Warned at most once every 10 s, with no line per failed accept.
    let warnings = proxy.log_lines("open files running out");
    assert!(
        !warnings.is_empty() && warnings.len() <= proxy.warnings_allowed(),
        "{warnings:#?}"
    );
    // Not the line per failed accept, 20 a second, of before.
    assert!(proxy.log_lines("accept failed error=").is_empty());
}

/// HTTP/2 connections among the reusable ones: one with no stream open is closed first when
/// descriptors run low, with the graceful `GOAWAY` (its client told which streams were
/// processed), and one with a stream in flight is never closed for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_is_closed_first_with_goaway_and_a_busy_one_is_kept() {
    use crate::h2_frames::{ACK, GOAWAY, HEADERS, PING, Raw, frame, request, status};
    raise_own_limit();
    let (ca, dir) = (crate::tls::Ca::new(), tempfile::tempdir().unwrap());
    crate::tls::install(dir.path(), &ca.leaf(90));
    let upstream = MockUpstream::start().await;
    let policy = PolicyDir::seed();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let proxy = Limited::start_with(
        256,
        256,
        &upstream,
        &policy,
        &[
            "--tls-cert".as_ref(),
            cert.as_os_str(),
            "--tls-key".as_ref(),
            key.as_os_str(),
        ],
    );
    // The oldest: HTTP/2, no stream yet, and one that will never acknowledge the GOAWAY's
    // PING. Then one with a stream in flight (its body half sent).
    let mut quiet = Raw::open(proxy.proxy, &ca).await;
    let mut mute = Raw::open(proxy.proxy, &ca).await;
    let mut busy = Raw::open(proxy.proxy, &ca).await;
    let body = event(BERLIN, 1);
    let length = body.len().to_string();
    let fields = request(
        "POST",
        "/ingest",
        &[
            ("x-stream", "geofence.transition"),
            ("content-length", &length),
        ],
    );
    busy.headers(1, &fields, false).await;
    let (head, tail) = body.as_bytes().split_at(body.len() / 2);
    busy.data(1, head, false).await;
    // The stream has reached the proxy before the flood.
    loop {
        let m = admin_get(proxy.admin, "/metrics").await;
        if metric(&m, "shedgate_http2_streams_total", &[]) == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Each HTTP/2 client answers as it reads, meanwhile the flood: the quiet one acknowledges
    // the GOAWAY's PING at once (the proxy waits half a second for it), the mute one never.
    let quiet = tokio::spawn(async move {
        let seen = quiet.until(|f| f.kind == GOAWAY).await;
        assert_eq!(seen.last().unwrap().goaway(), (0x7fff_ffff, 0));
        let ping = quiet
            .until(|f| f.kind == PING && f.flags & ACK == 0)
            .await
            .pop()
            .unwrap();
        quiet.write(&frame(PING, ACK, 0, &ping.payload)).await;
        let seen = quiet.until(|f| f.kind == GOAWAY).await;
        assert_eq!(seen.last().unwrap().goaway(), (0, 0));
        quiet.until_closed().await;
    });
    // How long after its GOAWAY the mute one is cut, and what it saw meanwhile.
    let mute = tokio::spawn(async move {
        mute.until(|f| f.kind == GOAWAY).await;
        let goaway = tokio::time::Instant::now();
        let seen = mute.until_closed().await;
        (goaway.elapsed(), seen)
    });
    let _flood = idle(proxy.proxy, 300).await;
    quiet.await.unwrap();
    // The mute one is cut half a second after its GOAWAY, freeing its descriptor for the
    // waiting accepts as an idle HTTP/1 connection would, not after the 5 s a draining
    // connection's client has to acknowledge: a margin against that known interval.
    let (cut, seen) = mute.await.unwrap();
    assert!(seen.iter().any(|f| f.kind == PING), "{seen:?}");
    assert!(cut < Duration::from_secs(4), "cut {cut:?} after its GOAWAY");
    // The busy one was kept: its stream finishes.
    busy.data(1, tail, true).await;
    let seen = busy.until(|f| f.kind == HEADERS && f.stream == 1).await;
    assert_eq!(status(&seen.last().unwrap().payload), Some(200));
    assert!(seen.iter().all(|f| f.kind != GOAWAY), "{seen:?}");
    assert_eq!(upstream.count(), 1);
}
