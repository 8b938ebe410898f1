//! The device table: what this replica remembers of each device, the history its decisions
//! read (docs/decision.md "Devices"; [`crate::admission::DeviceHistory`]).
//!
//! Bounded and safe: room for `--max-devices` devices at 54 bytes each (a 40-byte entry, a
//! quarter of the room kept free so that two-choice sets rarely overflow: 1 million devices in
//! 54 MiB), starting small and growing on demand, so an idle proxy's memory does not move; keyed by the
//! per-process keyed hash of the device's id ([`crate::extract::DeviceId`]), so ids a client
//! chooses cannot collide on purpose; when full, the device silent longest in its set is
//! evicted (counted). Each replica keeps its own: a balancer that hashes by device sends one
//! device to one replica (docs/decision.md "Devices").
//!
//! The table is 64 shards, each behind its own lock, each a set-associative array of 8-way
//! sets (a set is four cache lines) where a device may live in either of two sets (two-choice
//! hashing): a lookup hashes nothing more (the key is a hash already), locks one shard and
//! scans two sets. A shard doubles when both sets a device could go in are full, until its
//! share of the maximum; then the longest-silent device of the two is evicted.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::admission::trust::PackedPoint;
use crate::admission::{Decision, DeviceHistory, Verdict};
use crate::clock::UnixMillis;
use crate::extract::DeviceId;

/// The time from `previous` to `tick` (deciseconds of the table), `None` when `previous` is
/// 0 (never).
fn since(previous: u32, tick: u32) -> Option<std::time::Duration> {
    (previous != 0)
        .then(|| std::time::Duration::from_millis(u64::from(tick.saturating_sub(previous)) * 100))
}

/// Shards of the table (by the top bits of a device's key).
pub const SHARDS: usize = 64;
/// Devices per set.
const WAYS: usize = 8;
/// Bytes of one device's entry.
pub const ENTRY_BYTES: usize = std::mem::size_of::<Entry>();
/// Bytes the table takes per device of `--max-devices`: its entry and a third more of room,
/// rounded up.
pub const BYTES_PER_DEVICE: usize = (ENTRY_BYTES * 4).div_ceil(3);
/// The default `--max-devices`: 1 million devices, 54 MiB at most.
pub const DEFAULT_MAX_DEVICES: usize = 1 << 20;
/// Smoothing step of a device's report interval (a quarter of each new gap).
const INTERVAL_STEP: f64 = 0.25;

/// One device: 40 bytes (36 of fields, padded to the key's alignment). Times are deciseconds
/// since the table's epoch, plus one (0: never), so a `u32` spans 13 years.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[repr(C)]
struct Entry {
    /// The device's key (0: the entry is free; a key of 0 is stored as 1).
    key: u64,
    /// When its last fresh fix arrived.
    last_seen: u32,
    /// When its last fix was admitted.
    last_admitted: u32,
    /// Event time of its newest delivered fix, whole seconds since the table's epoch, rounded
    /// down (so a retry within the same second of it is never taken for older);
    /// `i32::MIN`: none.
    newest_delivered: i32,
    /// Its smoothed report interval, deciseconds (0: unknown; at most 109 minutes).
    interval: u16,
    /// Its credit ([`DeviceHistory::credit`]), in 65,536ths.
    credit: u16,
    /// Where its newest delivered fix was ([`PackedPoint`]; a latitude of `i32::MIN`: not
    /// known), for the plausibility of its next fix ([`crate::admission::trust::judge`]).
    position: [i32; 2],
    /// When the upstream last answered 2xx to one of its fixes, by the proxy's clock (its
    /// silence, for the freshness floor).
    last_delivered: u32,
    /// The `max_silence` of its last fresh fix, deciseconds rounded up (0: none; at most 109
    /// minutes), to count the devices past their floor ([`DeviceTable::past_floor`]).
    max_silence: u16,
}

const _: () = assert!(ENTRY_BYTES == 40);

#[derive(Debug)]
struct Shard {
    entries: Vec<Entry>,
    /// Entries in use.
    len: usize,
    /// Devices forgotten (evicted, or lost in a growth), not yet added to the table's count.
    forgotten: u64,
}

impl Shard {
    fn sets(&self) -> usize {
        self.entries.len() / WAYS
    }

    /// The two sets a key may live in (two-choice hashing, from two halves of the key, each
    /// mapped onto the set count by a multiply-high, so it need not be a power of two).
    fn sets_of(&self, key: u64) -> [std::ops::Range<usize>; 2] {
        let sets = u64::try_from(self.sets()).unwrap_or(u64::MAX);
        let pick = |bits: u64| {
            let set = usize::try_from((bits * sets) >> 32).unwrap_or(0);
            set * WAYS..(set + 1) * WAYS
        };
        [pick(key & 0xffff_ffff), pick((key >> 26) & 0xffff_ffff)]
    }

    fn position(&self, key: u64) -> Option<usize> {
        self.sets_of(key).into_iter().find_map(|range| {
            self.entries[range.clone()]
                .iter()
                .position(|e| e.key == key)
                .map(|i| range.start + i)
        })
    }

    fn find(&self, key: u64) -> Option<&Entry> {
        self.position(key).map(|i| &self.entries[i])
    }

    /// A free way for `key` in the emptier of its two sets (greedy two-choice: the sets fill
    /// evenly), `None` when both are full.
    fn free_slot(&self, key: u64) -> Option<usize> {
        let [a, b] = self.sets_of(key);
        let free = |r: &std::ops::Range<usize>| {
            self.entries[r.clone()]
                .iter()
                .filter(|e| e.key == 0)
                .count()
        };
        let set = if free(&b) > free(&a) { b } else { a };
        self.entries[set.clone()]
            .iter()
            .position(|e| e.key == 0)
            .map(|i| set.start + i)
    }

    /// The entry of `key`, inserted if new: in a free way of the emptier of its sets; else,
    /// below `max_sets`, after the shard grew; else in place of the longest-silent device of
    /// its two sets (counted in `forgotten`).
    fn entry(&mut self, key: u64, max_sets: usize) -> &mut Entry {
        loop {
            if let Some(i) = self.position(key) {
                return &mut self.entries[i];
            }
            if let Some(i) = self.slot_or_room(key) {
                self.len += 1;
                self.entries[i] = Entry::fresh(key);
                return &mut self.entries[i];
            }
            if self.sets() < max_sets {
                self.grow(max_sets);
                continue;
            }
            let [a, b] = self.sets_of(key);
            let oldest = a
                .chain(b)
                .min_by_key(|&i| self.entries[i].last_seen)
                .unwrap_or(0);
            self.entries[oldest] = Entry::fresh(key);
            self.forgotten += 1;
            return &mut self.entries[oldest];
        }
    }

    /// A free way for `key`, making one if need be by moving a device of one of its sets to
    /// that device's other set (one step of cuckoo hashing), `None` when none can move.
    fn slot_or_room(&mut self, key: u64) -> Option<usize> {
        if let Some(i) = self.free_slot(key) {
            return Some(i);
        }
        let [a, b] = self.sets_of(key);
        for i in a.chain(b) {
            let other = self.entries[i].key;
            let [x, y] = self.sets_of(other);
            let home = if x.contains(&i) { y } else { x };
            if let Some(j) = self.entries[home.clone()]
                .iter()
                .position(|e| e.key == 0)
                .map(|j| home.start + j)
            {
                self.entries[j] = self.entries[i];
                self.entries[i] = Entry::default();
                return Some(i);
            }
        }
        None
    }

    /// Doubles the number of sets (at most to `max_sets`) and puts every device in the emptier
    /// of its new sets.
    fn grow(&mut self, max_sets: usize) {
        let old = std::mem::take(&mut self.entries);
        let sets = (old.len() / WAYS * 2).min(max_sets);
        self.entries = vec![Entry::default(); sets * WAYS];
        for e in old.into_iter().filter(|e| e.key != 0) {
            match self.slot_or_room(e.key) {
                Some(i) => self.entries[i] = e,
                // Both new sets full (not seen: twice the room): the device is forgotten.
                None => {
                    self.len -= 1;
                    self.forgotten += 1;
                }
            }
        }
    }
}

impl Entry {
    fn fresh(key: u64) -> Entry {
        Entry {
            key,
            newest_delivered: i32::MIN,
            position: [i32::MIN, 0],
            ..Entry::default()
        }
    }
}

/// What the table remembers of one device, for `GET /devices`.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct DeviceView {
    /// Seconds since its last fresh fix arrived.
    pub last_seen_seconds_ago: f64,
    /// Seconds since its last admitted fix (`None`: none remembered).
    pub last_admitted_seconds_ago: Option<f64>,
    /// Its report interval, seconds (`None`: one fix seen).
    pub interval_seconds: Option<f64>,
    /// Its credit.
    pub credit: f64,
    /// The event time of its newest delivered fix, unix milliseconds.
    pub newest_delivered_unix_ms: Option<i64>,
}

/// The device table of one replica.
#[derive(Debug)]
pub struct DeviceTable {
    shards: Box<[Mutex<Shard>]>,
    /// Sets a shard may grow to.
    max_sets: usize,
    epoch: UnixMillis,
    evictions: AtomicU64,
    len: AtomicUsize,
}

impl DeviceTable {
    /// A table with room for `max_devices` devices ([`BYTES_PER_DEVICE`] each, at least one
    /// set per shard), its times counted from `epoch` (the proxy's clock at start).
    pub fn new(max_devices: usize, epoch: UnixMillis) -> Self {
        let entries = max_devices.saturating_mul(4).div_ceil(3);
        let max_sets = entries.div_ceil(SHARDS * WAYS).max(1);
        DeviceTable {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        entries: vec![Entry::default(); WAYS],
                        len: 0,
                        forgotten: 0,
                    })
                })
                .collect(),
            max_sets,
            epoch,
            evictions: AtomicU64::new(0),
            len: AtomicUsize::new(0),
        }
    }

    /// The shard of a device and its key. Keys are SipHash outputs ([`DeviceId::of`]): every
    /// bit is as good as any other, so the shard is the top bits and the two sets others.
    fn shard(&self, id: DeviceId) -> (std::sync::MutexGuard<'_, Shard>, u64) {
        let key = id.0.max(1);
        let i = usize::try_from(key >> 58).unwrap_or(0) % SHARDS;
        (
            self.shards[i].lock().unwrap_or_else(|p| p.into_inner()),
            key,
        )
    }

    /// Deciseconds since the epoch, plus one.
    fn tick(&self, now: UnixMillis) -> u32 {
        u32::try_from(now.since(self.epoch).max(0) / 100)
            .unwrap_or(u32::MAX - 1)
            .saturating_add(1)
    }

    fn ms_since(&self, then: u32, now: UnixMillis) -> i64 {
        i64::from(self.tick(now).saturating_sub(then)) * 100
    }

    /// The device's history at `now`, `None` for a device the table does not remember.
    pub fn history(&self, id: DeviceId, now: UnixMillis) -> Option<DeviceHistory> {
        let (shard, key) = self.shard(id);
        shard.find(key).map(|e| self.history_of(e, now))
    }

    /// Decides a fix of the device at `now` with its history (`decide` is the pure decision,
    /// given the history, `None` for a device the table does not remember) and records the
    /// decision ([`DeviceTable::record`]), under one lock of the device's shard: one lookup
    /// for both. Returns the decision and the gap [`DeviceTable::record`] returns.
    pub fn decide_with(
        &self,
        id: DeviceId,
        now: UnixMillis,
        decide: impl FnOnce(Option<DeviceHistory>) -> Decision,
    ) -> (Decision, Option<std::time::Duration>) {
        let (mut shard, key) = self.shard(id);
        let history = shard.find(key).map(|e| self.history_of(e, now));
        let decision = decide(history);
        let gap = self.record_in(&mut shard, key, now, &decision);
        (decision, gap)
    }

    fn history_of(&self, e: &Entry, now: UnixMillis) -> DeviceHistory {
        DeviceHistory {
            credit: f64::from(e.credit) / 65_536.0,
            since_admitted_ms: (e.last_admitted != 0).then(|| self.ms_since(e.last_admitted, now)),
            interval_ms: (e.interval != 0).then(|| i64::from(e.interval) * 100),
            newest_delivered: self.delivered_at(e),
            newest_position: (e.position[0] != i32::MIN).then_some(PackedPoint {
                lat: e.position[0],
                lon: e.position[1],
            }),
            since_delivered_ms: (e.last_delivered != 0)
                .then(|| self.ms_since(e.last_delivered, now)),
        }
    }

    /// The newest delivered event time an entry holds, unix milliseconds.
    fn delivered_at(&self, e: &Entry) -> Option<UnixMillis> {
        (e.newest_delivered != i32::MIN)
            .then(|| UnixMillis(self.epoch.0 + i64::from(e.newest_delivered) * 1000))
    }

    /// Records the decision of a fresh fix of the device at `now` (one the curve weighed: its
    /// credit is set): its interval, its credit, and when it was admitted. Returns the time
    /// since its previous admitted fix when this one was admitted (for
    /// `shedgate_device_gap_seconds`).
    pub fn record(
        &self,
        id: DeviceId,
        now: UnixMillis,
        decision: &Decision,
    ) -> Option<std::time::Duration> {
        let (mut shard, key) = self.shard(id);
        self.record_in(&mut shard, key, now, decision)
    }

    fn record_in(
        &self,
        shard: &mut Shard,
        key: u64,
        now: UnixMillis,
        decision: &Decision,
    ) -> Option<std::time::Duration> {
        let credit = decision.credit?;
        let admitted = matches!(decision.verdict, Verdict::Admit | Verdict::WouldShed(_));
        let tick = self.tick(now);
        let before = shard.len;
        let e = shard.entry(key, self.max_sets);
        if e.last_seen != 0 {
            let gap = f64::from(tick.saturating_sub(e.last_seen));
            let interval = if e.interval == 0 {
                gap
            } else {
                f64::from(e.interval) + INTERVAL_STEP * (gap - f64::from(e.interval))
            };
            #[expect(clippy::cast_possible_truncation, reason = "clamped to u16")]
            #[expect(clippy::cast_sign_loss, reason = "clamped to u16")]
            {
                e.interval = interval.round().clamp(1.0, f64::from(u16::MAX)) as u16;
            }
        }
        e.last_seen = tick;
        e.max_silence = decision.max_silence_ms.map_or(0, |ms| {
            u16::try_from(ms.max(1).div_euclid(100) + i64::from(ms % 100 != 0)).unwrap_or(u16::MAX)
        });
        #[expect(clippy::cast_possible_truncation, reason = "credit in 65,536ths")]
        #[expect(clippy::cast_sign_loss, reason = "a credit in [0, 1)")]
        {
            e.credit = (credit * 65_536.0).floor().clamp(0.0, 65_535.0) as u16;
        }
        let gap = if admitted {
            let previous = e.last_admitted;
            e.last_admitted = tick;
            since(previous, tick)
        } else {
            None
        };
        self.settle(shard, before);
        gap
    }

    /// Moves a shard's changes since it had `before` entries into the table's counts.
    fn settle(&self, shard: &mut Shard, before: usize) {
        let forgotten = std::mem::take(&mut shard.forgotten);
        if forgotten > 0 {
            self.evictions.fetch_add(forgotten, Ordering::Relaxed);
        }
        if shard.len >= before {
            self.len.fetch_add(shard.len - before, Ordering::Relaxed);
        } else {
            self.len.fetch_sub(before - shard.len, Ordering::Relaxed);
        }
    }

    /// The upstream answered 2xx to a fix of the device, at `local` (the proxy's own clock,
    /// as decisions read it): the end of its silence. `at` is the fix's (newest) event time,
    /// if readable, and `position` where it was (`None`: it had none): its newest delivered
    /// time and position, unless `at` is ahead of `corrected` (the proxy's clock corrected by
    /// the upstream's): one bad device clock must not supersede the real fixes after it. An
    /// older delivery leaves both. Returns the silence this delivery ended (the time since
    /// the device's previous delivered fix; `None` for its first on this replica).
    pub fn delivered(
        &self,
        id: DeviceId,
        at: Option<UnixMillis>,
        position: Option<PackedPoint>,
        corrected: UnixMillis,
        local: UnixMillis,
    ) -> Option<std::time::Duration> {
        let (mut shard, key) = self.shard(id);
        let before = shard.len;
        let tick = self.tick(local);
        let e = shard.entry(key, self.max_sets);
        if let Some(at) = at.filter(|&at| at <= corrected) {
            let seconds = at.since(self.epoch).div_euclid(1000);
            let seconds =
                i32::try_from(seconds).unwrap_or(if seconds < 0 { i32::MIN + 1 } else { i32::MAX });
            if seconds >= e.newest_delivered {
                e.newest_delivered = seconds;
                e.position = position.map_or([i32::MIN, 0], |p| [p.lat, p.lon]);
            }
        }
        let previous = e.last_delivered;
        e.last_delivered = previous.max(tick);
        if e.last_seen == 0 {
            e.last_seen = tick;
        }
        self.settle(&mut shard, before);
        since(previous, tick)
    }

    /// Devices past their freshness floor at `now`, in shards `shards` (of [`SHARDS`]): still
    /// sending (a fresh fix arrived within their `max_silence`) and none delivered within it.
    /// Work is bounded by the part of the table asked for: the metrics task counts the table a
    /// tenth at a time, one lock of a shard at a time.
    pub fn past_floor(&self, shards: std::ops::Range<usize>, now: UnixMillis) -> u64 {
        let tick = self.tick(now);
        let mut past = 0;
        let shards = shards.start.min(SHARDS)..shards.end.min(SHARDS);
        for shard in self.shards.get(shards).unwrap_or_default() {
            let shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            past += shard
                .entries
                .iter()
                .filter(|e| {
                    let floor = u32::from(e.max_silence);
                    e.key != 0
                        && floor != 0
                        && tick.saturating_sub(e.last_seen) <= floor
                        && (e.last_delivered == 0 || tick.saturating_sub(e.last_delivered) > floor)
                })
                .count() as u64;
        }
        past
    }

    /// What the table remembers of one device at `now`.
    pub fn view(&self, id: DeviceId, now: UnixMillis) -> Option<DeviceView> {
        let (shard, key) = self.shard(id);
        let e = *shard.find(key)?;
        drop(shard);
        #[expect(clippy::cast_precision_loss, reason = "milliseconds below 2^52")]
        let secs = |ms: i64| ms as f64 / 1000.0;
        Some(DeviceView {
            last_seen_seconds_ago: secs(self.ms_since(e.last_seen, now)),
            last_admitted_seconds_ago: (e.last_admitted != 0)
                .then(|| secs(self.ms_since(e.last_admitted, now))),
            interval_seconds: (e.interval != 0).then(|| f64::from(e.interval) / 10.0),
            credit: f64::from(e.credit) / 65_536.0,
            newest_delivered_unix_ms: self.delivered_at(&e).map(|t| t.0),
        })
    }

    /// Devices remembered.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Whether no device is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Devices evicted so far (the table full, the longest-silent of a set replaced).
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// Bytes the table's entries take now.
    pub fn bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).entries.len() * ENTRY_BYTES)
            .sum()
    }

    /// Bytes the entries take at the most (`--max-devices`, with its room).
    pub fn max_bytes(&self) -> usize {
        self.max_sets * WAYS * SHARDS * ENTRY_BYTES
    }
}

#[cfg(test)]
mod tests;
