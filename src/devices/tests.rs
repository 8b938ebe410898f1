//! The device table's unit tests: what it remembers, deliveries, bounds and eviction.

use super::*;
use crate::admission::{Rule, ShedReason};
use crate::policy::Rank;
use crate::pressure::Pressure;

fn decision(admitted: bool, credit: f64) -> Decision {
    Decision {
        verdict: if admitted {
            Verdict::Admit
        } else {
            Verdict::Shed(ShedReason::Pressure)
        },
        rule: if admitted { Rule::Kept } else { Rule::Pressure },
        area: None,
        cell: None,
        rank: Rank::DEFAULT,
        probability: 0.5,
        pressure: Pressure::ZERO,
        age_ms: None,
        schedule: None,
        implausible_time: false,
        device: None,
        credit: Some(credit),
        floor: None,
        max_silence_ms: None,
    }
}

#[test]
fn a_device_is_remembered_with_its_interval_credit_and_deliveries() {
    let t = DeviceTable::new(1000, UnixMillis(0));
    let id = DeviceId::of("/r", "dev-1");
    assert_eq!(t.history(id, UnixMillis(0)), None);
    assert_eq!(t.record(id, UnixMillis(1_000), &decision(true, 0.25)), None);
    assert_eq!(
        t.record(id, UnixMillis(6_000), &decision(false, 0.75)),
        None
    );
    let gap = t.record(id, UnixMillis(11_000), &decision(true, 0.5));
    assert_eq!(gap, Some(std::time::Duration::from_secs(10)));
    let h = t.history(id, UnixMillis(12_000)).unwrap();
    assert_eq!(h.interval_ms, Some(5_000));
    assert_eq!(h.since_admitted_ms, Some(1_000));
    assert!((h.credit - 0.5).abs() < 1e-6);
    assert_eq!(h.newest_delivered, None);
    t.delivered(
        id,
        Some(UnixMillis(10_500)),
        None,
        UnixMillis(12_000),
        UnixMillis(12_000),
    );
    // Ahead of the clock: never the newest.
    t.delivered(
        id,
        Some(UnixMillis(99_000)),
        None,
        UnixMillis(12_000),
        UnixMillis(12_000),
    );
    t.delivered(
        id,
        Some(UnixMillis(9_000)),
        None,
        UnixMillis(12_000),
        UnixMillis(12_000),
    );
    let h = t.history(id, UnixMillis(12_000)).unwrap();
    // Whole seconds, rounded down: a retry within that second is not older.
    assert_eq!(h.newest_delivered, Some(UnixMillis(10_000)));
    // Before the table's epoch (a backlog older than the process).
    t.delivered(
        DeviceId::of("/r", "old"),
        Some(UnixMillis(-5_500)),
        None,
        UnixMillis(12_000),
        UnixMillis(12_000),
    );
    let old = t
        .history(DeviceId::of("/r", "old"), UnixMillis(12_000))
        .unwrap();
    assert_eq!(old.newest_delivered, Some(UnixMillis(-6_000)));
    assert_eq!(t.len(), 2);
}

/// A device's silence runs from its last delivery by the proxy's own clock, whatever its
/// fixes' event times (none, or ahead of the clock), and each delivery returns the
/// silence it ended.
#[test]
fn a_delivery_ends_the_silence_by_the_proxys_clock() {
    let t = DeviceTable::new(64, UnixMillis(0));
    let id = DeviceId::of("/r", "a");
    assert_eq!(
        t.delivered(id, None, None, UnixMillis(2_000), UnixMillis(2_000)),
        None
    );
    let ended = t.delivered(
        id,
        Some(UnixMillis(99_000)),
        None,
        UnixMillis(9_000),
        UnixMillis(9_000),
    );
    assert_eq!(ended, Some(std::time::Duration::from_secs(7)));
    let h = t.history(id, UnixMillis(12_500)).unwrap();
    assert_eq!(h.since_delivered_ms, Some(3_500));
    assert_eq!(h.newest_delivered, None);
    // Remembered but never delivered: silent.
    let b = DeviceId::of("/r", "b");
    t.record(b, UnixMillis(1_000), &decision(false, 1.0));
    assert_eq!(
        t.history(b, UnixMillis(1_000)).unwrap().since_delivered_ms,
        None
    );
}

/// Full, the longest-silent device of a set goes, and is counted; the table never holds
/// more than its maximum, and grows only as devices come.
#[test]
fn bounded_growing_and_evicting_the_longest_silent() {
    let t = DeviceTable::new(3072, UnixMillis(0));
    assert_eq!(t.bytes(), SHARDS * WAYS * ENTRY_BYTES, "small while idle");
    for i in 0..20_000u32 {
        let id = DeviceId::of("/r", &i.to_string());
        t.record(id, UnixMillis(i64::from(i) * 100), &decision(true, 0.0));
    }
    assert!(t.bytes() <= t.max_bytes());
    assert_eq!(
        t.max_bytes(),
        4096 * ENTRY_BYTES,
        "3,072 devices and a third more room"
    );
    assert!(t.len() <= 4096);
    assert_eq!(
        t.evictions() + t.len() as u64,
        20_000,
        "every device kept or counted"
    );
    // The most recent devices are there; the earliest are gone.
    let recent = DeviceId::of("/r", "19999");
    assert!(t.history(recent, UnixMillis(2_000_000)).is_some());
    let early = (0..100)
        .filter(|i| {
            t.history(DeviceId::of("/r", &i.to_string()), UnixMillis(0))
                .is_some()
        })
        .count();
    assert!(early < 10, "{early} of the 100 earliest remembered");
    // As many devices as it was made for: two choices of a set hold every one.
    let full = DeviceTable::new(60_000, UnixMillis(0));
    for i in 0..60_000u32 {
        let id = DeviceId::of("/r", &i.to_string());
        full.record(id, UnixMillis(0), &decision(true, 0.0));
    }
    assert_eq!(full.evictions(), 0);
    assert!(full.max_bytes() <= 60_000 * BYTES_PER_DEVICE + SHARDS * WAYS * ENTRY_BYTES);
}

/// The newest delivered fix's position is kept beside its time, for the plausibility of
/// the next fix; an older delivery changes neither, a newer one without a position
/// clears it.
#[test]
fn the_newest_delivered_position_is_kept_with_its_time() {
    use crate::extract::Coordinates;
    let t = DeviceTable::new(1000, UnixMillis(0));
    let id = DeviceId::of("/r", "dev-1");
    let point = |lat, lon| PackedPoint::of(Coordinates::new(lat, lon));
    let now = UnixMillis(100_000);
    t.delivered(id, Some(UnixMillis(50_000)), point(52.52, 13.405), now, now);
    let h = t.history(id, now).unwrap();
    assert_eq!(h.newest_position, point(52.52, 13.405));
    t.delivered(
        id,
        Some(UnixMillis(40_000)),
        point(48.1372, 11.5756),
        now,
        now,
    );
    assert_eq!(
        t.history(id, now).unwrap().newest_position,
        point(52.52, 13.405),
        "older"
    );
    t.delivered(
        id,
        Some(UnixMillis(60_000)),
        point(-33.8688, 151.2093),
        now,
        now,
    );
    let h = t.history(id, now).unwrap();
    assert_eq!(h.newest_position, point(-33.8688, 151.2093));
    assert_eq!(h.newest_delivered, Some(UnixMillis(60_000)));
    t.delivered(id, Some(UnixMillis(70_000)), None, now, now);
    assert_eq!(t.history(id, now).unwrap().newest_position, None);
    // A device only decided, never delivered, has none.
    let other = DeviceId::of("/r", "dev-2");
    t.record(other, now, &decision(true, 0.5));
    assert_eq!(t.history(other, now).unwrap().newest_position, None);
}

#[test]
fn the_same_id_on_two_scopes_is_two_devices() {
    assert_ne!(DeviceId::of("/a", "7"), DeviceId::of("/b", "7"));
    assert_eq!(DeviceId::of("/a", "7"), DeviceId::of("/a", "7"));
}

/// A device past its floor is one still sending (a fresh fix within its `max_silence`) that
/// none was delivered of within it: counted over the shards asked for, never a device gone
/// quiet or one without a floor.
#[test]
fn devices_past_their_floor_are_those_still_sending_and_not_delivered() {
    let t = DeviceTable::new(1000, UnixMillis(0));
    let all = 0..SHARDS;
    let floored = |ms| Decision {
        max_silence_ms: Some(ms),
        ..decision(false, 0.5)
    };
    let (a, b) = (DeviceId::of("/r", "a"), DeviceId::of("/r", "b"));
    t.record(a, UnixMillis(0), &floored(5_000));
    t.record(b, UnixMillis(0), &decision(false, 0.5));
    // Never delivered and just seen: past its floor; `b` has none.
    assert_eq!(t.past_floor(all.clone(), UnixMillis(1_000)), 1);
    t.delivered(a, None, None, UnixMillis(2_000), UnixMillis(2_000));
    assert_eq!(t.past_floor(all.clone(), UnixMillis(3_000)), 0);
    // Quiet for longer than its floor: no longer sending, not counted.
    assert_eq!(t.past_floor(all.clone(), UnixMillis(8_000)), 0);
    // Sending again, 6.5 s after its last delivery: past it.
    t.record(a, UnixMillis(8_500), &floored(5_000));
    assert_eq!(t.past_floor(all, UnixMillis(8_500)), 1);
    // The shards asked for bound the count (and the work).
    let empty = 0..0;
    assert_eq!(t.past_floor(empty, UnixMillis(8_500)), 0);
    assert_eq!(t.past_floor(0..SHARDS + 4, UnixMillis(8_500)), 1);
}
