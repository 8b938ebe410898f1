//! The descriptor accounting, the drain and the waits, with paused time.

use super::*;

fn connections(d: &Arc<Descriptors>, n: usize) -> Vec<(Arc<Activity>, Client)> {
    (0..n)
        .map(|_| {
            let a = Arc::new(Activity::new());
            let c = d.accepted(&a);
            (a, c)
        })
        .collect()
}

fn evicted(a: &Activity) -> bool {
    a.reuse.evicted.load(Ordering::Acquire)
}

#[test]
fn the_reserve_is_a_sixteenth_of_the_limit_within_bounds() {
    assert_eq!(reserve_for(256), 64);
    assert_eq!(reserve_for(1024), 64);
    assert_eq!(reserve_for(4096), 256);
    assert_eq!(reserve_for(100), 50);
    assert_eq!(needed(None, 524_288), 2048 + 32_768);
    assert_eq!(needed(Some(100), 1024), 264);
}

#[test]
fn a_drain_tells_the_oldest_reusable_connections_a_bounded_round() {
    let d = Arc::new(Descriptors::new(Some(1 << 20), None));
    let conns = connections(&d, 400);
    // The first one is in use: never told.
    d.in_use(&conns[0].0);
    assert_eq!(d.drain(), 32, "min(32, 399 / 8)");
    for (i, (a, _)) in conns.iter().enumerate() {
        assert_eq!(evicted(a), (1..=32).contains(&i), "connection {i}");
    }
    // A parked connection is queued anew, the newest.
    d.reusable(&conns[33].0);
    assert_eq!(d.drain(), 32, "min(32, 367 / 8)");
    let told: Vec<usize> = (0..conns.len()).filter(|&i| evicted(&conns[i].0)).collect();
    assert_eq!(told, (1..=32).chain(34..=65).collect::<Vec<_>>());
    assert_eq!(d.open(), 400);
}

#[test]
fn closing_and_declining_settle_and_uncount() {
    let d = Arc::new(Descriptors::new(Some(1 << 20), None));
    let mut conns = connections(&d, 3);
    assert_eq!(d.drain(), 1, "max(min(32, 3 / 8), 1)");
    assert_eq!(d.closing.load(Ordering::Acquire), 1);
    let (_, client) = conns.remove(0);
    drop(client);
    assert_eq!((d.open(), d.settled()), (2, 1));
    d.drain();
    d.declined(&conns[0].0);
    assert_eq!((d.open(), d.settled()), (2, 2));
    assert_eq!(d.closing.load(Ordering::Acquire), 0);
    assert!(!evicted(&conns[0].0));
    // Declined, it is off the queue: the next drain takes the next one.
    d.drain();
    assert!(evicted(&conns[1].0));
}

#[tokio::test(start_paused = true)]
async fn at_the_reserve_the_proxy_listener_waits_for_a_close() {
    // Limit 128, reserve 64: the proxy listener accepts while fewer than 64 are held.
    let d = Arc::new(Descriptors::new(Some(128), None));
    let conns = connections(&d, 64);
    let room = tokio::spawn({
        let d = Arc::clone(&d);
        async move { d.room().await }
    });
    tokio::task::yield_now().await;
    let told: Vec<usize> = (0..64).filter(|&i| evicted(&conns[i].0)).collect();
    assert_eq!(told, (0..8).collect::<Vec<_>>(), "64 / 8, oldest first");
    assert!(!room.is_finished());
    let mut conns = conns;
    drop(conns.remove(0));
    room.await.unwrap();
    assert_eq!(d.open(), 63);
}

#[tokio::test(start_paused = true)]
async fn with_nothing_to_close_the_reserve_is_checked_every_pause() {
    let d = Arc::new(Descriptors::new(Some(128), None));
    let conns = connections(&d, 64);
    for (a, _) in &conns {
        d.in_use(a);
    }
    let start = Instant::now();
    let room = tokio::spawn({
        let d = Arc::clone(&d);
        async move { d.room().await }
    });
    tokio::time::sleep(PAUSE * 3 + PAUSE / 2).await;
    assert!(!room.is_finished());
    drop(conns);
    room.await.unwrap();
    assert_eq!(
        Instant::now() - start,
        PAUSE * 4,
        "checked again after each pause"
    );
}

#[tokio::test(start_paused = true)]
async fn emfile_on_accept_closes_idle_connections_or_pauses() {
    let d = Arc::new(Descriptors::new(Some(1 << 20), None));
    let emfile = std::io::Error::from_raw_os_error(libc::EMFILE);
    let now = Instant::now();
    // Nothing idle: a pause, not a spin.
    let b = d.accept_failed(&emfile, Listener::Admin);
    assert_eq!(
        b,
        Backoff {
            until: now + PAUSE,
            on_close: None
        }
    );
    // Idle connections: the oldest told, and the wait ends when one closes.
    let mut conns = connections(&d, 2);
    let b = d.accept_failed(&emfile, Listener::Proxy);
    assert_eq!(b.on_close, Some(0));
    assert!(evicted(&conns[0].0));
    let wait = tokio::spawn({
        let d = Arc::clone(&d);
        async move { d.wait(b).await }
    });
    tokio::time::sleep(PAUSE / 5).await;
    assert!(!wait.is_finished());
    drop(conns.remove(0));
    wait.await.unwrap();
    assert_eq!(Instant::now() - now, PAUSE / 5);
    // Another error: 50 ms.
    let reset = std::io::Error::from(std::io::ErrorKind::ConnectionAborted);
    assert_eq!(
        d.accept_failed(&reset, Listener::Proxy).until,
        now + PAUSE / 5 + OTHER_ERROR_PAUSE
    );
}

#[tokio::test(start_paused = true)]
async fn an_upstream_connect_short_of_descriptors_waits_for_a_close() {
    let d = Arc::new(Descriptors::new(Some(1 << 20), None));
    let enfile = std::io::Error::from_raw_os_error(libc::ENFILE);
    let deadline = Instant::now() + Duration::from_secs(5);
    assert!(
        !d.connect_failed(&enfile, deadline).await,
        "nothing to close"
    );
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    assert!(!d.connect_failed(&refused, deadline).await);
    let mut conns = connections(&d, 1);
    let retry = tokio::spawn({
        let d = Arc::clone(&d);
        async move { d.connect_failed(&enfile, deadline).await }
    });
    tokio::task::yield_now().await;
    assert!(evicted(&conns[0].0));
    drop(conns.remove(0));
    assert!(retry.await.unwrap(), "one closed: worth trying again");
}

#[test]
fn warnings_are_rate_limited_and_say_how_many_were_held_back() {
    let mut w = Warning::default();
    let t = Instant::now();
    assert_eq!(w.allow(t), Some(0));
    assert_eq!(w.allow(t + Duration::from_secs(1)), None);
    assert_eq!(w.allow(t + Duration::from_secs(9)), None);
    assert_eq!(w.allow(t + WARN_EVERY), Some(2));
    assert_eq!(w.allow(t + WARN_EVERY), None);
}
