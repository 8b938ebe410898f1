//! Schedules: known peaks (a fleet's shift change, a city event) during which pressure is at
//! least a floor (docs/decision.md "Schedules"; seed 002: "time-based shedding: shed during
//! predicted peak hours"). Civil times in an IANA zone, with daylight saving time handled by
//! jiff and its bundled time zone database, so a policy reads the same on every host.

use std::path::Path;

use jiff::civil::{Date, DateTime, Time, Weekday};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{Timestamp, ToSpan};

use super::error::{Location, PolicyError};
use super::file::ScheduleSection;
use crate::clock::UnixMillis;
use crate::pressure::Pressure;

/// One schedule: on its days, from `start` to `end` civil time in its zone, pressure is at
/// least its floor. `start > end` crosses midnight: the window opens on a listed day and
/// closes the next morning.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// The name (the `schedule` metric label).
    pub name: String,
    /// Listed days, Monday first.
    days: [bool; 7],
    start: Time,
    end: Time,
    tz: TimeZone,
    /// The floor, `(0, 1]`.
    pub floor: Pressure,
}

impl Schedule {
    /// Whether the window is open at `at`.
    pub fn is_open(&self, at: UnixMillis) -> bool {
        let Ok(ts) = Timestamp::from_millisecond(at.0) else {
            return false;
        };
        let local = self.tz.to_datetime(ts);
        let (day, time) = (weekday_index(local.weekday()), local.time());
        if self.start < self.end {
            self.days[day] && self.start <= time && time < self.end
        } else {
            // Crosses midnight: tonight's part, or the part after last night's start.
            (self.days[day] && time >= self.start) || (self.days[(day + 6) % 7] && time < self.end)
        }
    }
}

/// The highest floor among `schedules` open at `at`, with the schedule's index.
pub fn floor_at(schedules: &[Schedule], at: UnixMillis) -> Option<(usize, Pressure)> {
    schedules
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_open(at))
        .map(|(i, s)| (i, s.floor))
        .max_by(|a, b| a.1.get().total_cmp(&b.1.get()))
}

fn weekday_index(d: Weekday) -> usize {
    usize::try_from(d.to_monday_zero_offset()).unwrap_or(0)
}

const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// Compiles `[[schedules]]` from `path` (whose text is `text`, for line numbers).
///
/// # Errors
/// [`PolicyError`] with the file, the line when found, and the field
/// (`schedules[0].timezone`): a name that is not a label, a repeated name, an unknown day,
/// a time that is not `HH:MM`, `start` equal to `end`, an unknown zone, a floor outside
/// `(0, 1]`, or a `start` or `end` that falls in a daylight-saving gap or fold on one of the
/// listed days (2000–2099): such a time happens never, or twice, that day.
pub(super) fn compile_schedules(
    sections: Vec<ScheduleSection>,
    path: &Path,
    text: &str,
) -> Result<Vec<Schedule>, PolicyError> {
    let mut out: Vec<Schedule> = Vec::with_capacity(sections.len());
    for (i, s) in sections.into_iter().enumerate() {
        let err = |f: &str, message: String| PolicyError {
            location: Location {
                file: path.to_owned(),
                line_col: line_of(text, i, f),
                field: Some(format!("schedules[{i}].{f}")),
            },
            message,
        };
        if !super::label_name_ok(&s.name) {
            return Err(err(
                "name",
                format!(
                    "schedule name {:?} must be 1..=64 characters of [A-Za-z0-9_.-] (it \
                     becomes a metric label)",
                    s.name
                ),
            ));
        }
        if out.iter().any(|o| o.name == s.name) {
            return Err(err(
                "name",
                format!("schedule {:?} is defined twice", s.name),
            ));
        }
        let mut days = [s.days.is_none(); 7];
        for d in s.days.iter().flatten() {
            let Some(k) = DAYS.iter().position(|n| n.eq_ignore_ascii_case(d)) else {
                return Err(err(
                    "days",
                    format!("unknown day {d:?}: use mon, tue, wed, thu, fri, sat, sun"),
                ));
            };
            days[k] = true;
        }
        if !days.iter().any(|d| *d) {
            return Err(err("days", "no day listed".into()));
        }
        let start = hh_mm(&s.start)
            .ok_or_else(|| err("start", format!("{:?} is not a time of day HH:MM", s.start)))?;
        let end = hh_mm(&s.end)
            .ok_or_else(|| err("end", format!("{:?} is not a time of day HH:MM", s.end)))?;
        if start == end {
            return Err(err(
                "end",
                format!("end equals start ({}): the window would be empty", s.end),
            ));
        }
        let tz = TimeZone::get(&s.timezone).map_err(|e| {
            err(
                "timezone",
                format!(
                    "unknown time zone {:?} (an IANA name such as Europe/Berlin): {e}",
                    s.timezone
                ),
            )
        })?;
        let floor = Pressure::new(s.pressure_floor)
            .filter(|p| p.get() > 0.0)
            .ok_or_else(|| {
                err(
                    "pressure_floor",
                    format!("pressure_floor must be in (0, 1], got {}", s.pressure_floor),
                )
            })?;
        // A start on a listed day; an end on the day after one when the window crosses
        // midnight.
        let end_days = if start < end {
            days
        } else {
            std::array::from_fn(|k| days[(k + 6) % 7])
        };
        for (f, time, on) in [("start", start, days), ("end", end, end_days)] {
            if let Some((change, day)) = dst_trouble(&tz, time, on) {
                let (kind, happens) = match change {
                    Change::Gap => ("gap", "never"),
                    Change::Fold => ("fold", "twice"),
                };
                return Err(err(
                    f,
                    format!(
                        "{f} {} falls in a daylight-saving {kind} on {day} in {}: that day it \
                         happens {happens}; pick a time outside the change",
                        s_time(time),
                        s.timezone,
                    ),
                ));
            }
        }
        out.push(Schedule {
            name: s.name,
            days,
            start,
            end,
            tz,
            floor,
        });
    }
    Ok(out)
}

fn s_time(t: Time) -> String {
    format!("{:02}:{:02}", t.hour(), t.minute())
}

/// `HH:MM`, 00:00 to 23:59.
fn hh_mm(text: &str) -> Option<Time> {
    let (h, m) = text.split_once(':')?;
    if h.len() != 2 || m.len() != 2 {
        return None;
    }
    let (h, m): (i8, i8) = (h.parse().ok()?, m.parse().ok()?);
    Time::new(h, m, 0, 0).ok()
}

/// A daylight-saving change a local time can fall in.
#[derive(Debug, Clone, Copy)]
enum Change {
    /// The clocks jump over it: that day it never happens.
    Gap,
    /// The clocks repeat it: that day it happens twice.
    Fold,
}

/// The first daylight-saving change in 2000–2099 on one of `days` in which `time` falls in
/// the gap or the fold, and that local date.
fn dst_trouble(tz: &TimeZone, time: Time, days: [bool; 7]) -> Option<(Change, Date)> {
    let from = Timestamp::from_second(946_684_800).ok()?; // 2000-01-01T00:00:00Z
    let until = Timestamp::from_second(4_102_444_800).ok()?; // 2100-01-01T00:00:00Z
    for transition in tz.following(from).take(1000) {
        let at = transition.timestamp();
        if at >= until {
            break;
        }
        // Local dates around the change: the day before, of and after, in the new offset.
        let date = tz.to_datetime(at).date();
        for delta in [-1i64, 0, 1] {
            let Ok(day) = date.checked_add(delta.days()) else {
                continue;
            };
            if !days[weekday_index(day.weekday())] {
                continue;
            }
            match tz
                .to_ambiguous_timestamp(DateTime::from_parts(day, time))
                .offset()
            {
                AmbiguousOffset::Unambiguous { .. } => {}
                AmbiguousOffset::Gap { .. } => return Some((Change::Gap, day)),
                AmbiguousOffset::Fold { .. } => return Some((Change::Fold, day)),
            }
        }
    }
    None
}

/// Best effort: the line and column of `field = …` in the `index`-th `[[schedules]]` table
/// of `text`, or of the table's header when the field is not written.
fn line_of(text: &str, index: usize, field: &str) -> Option<(usize, usize)> {
    let mut seen = 0;
    let mut header = None;
    for (n, line) in text.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with('[') {
            if header.is_some() {
                break;
            }
            if t.trim_end() == "[[schedules]]" {
                if seen == index {
                    header = Some(n + 1);
                }
                seen += 1;
            }
            continue;
        }
        if header.is_some()
            && let Some(rest) = t.strip_prefix(field)
            && rest.trim_start().starts_with('=')
        {
            return Some((n + 1, line.len() - t.len() + 1));
        }
    }
    header.map(|n| (n, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(days: Option<&[&str]>, start: &str, end: &str, tz: &str) -> ScheduleSection {
        ScheduleSection {
            name: "peak".into(),
            days: days.map(|d| d.iter().map(|s| (*s).to_owned()).collect()),
            start: start.into(),
            end: end.into(),
            timezone: tz.into(),
            pressure_floor: 0.6,
        }
    }

    fn compile(s: ScheduleSection) -> Result<Schedule, PolicyError> {
        let text = "[[schedules]]\nname = \"peak\"\nstart = \"x\"\nend = \"y\"\ntimezone = \"z\"\n";
        compile_schedules(vec![s], Path::new("streams.toml"), text).map(|mut v| v.remove(0))
    }

    /// `2026-03-27T16:30:00Z` → unix milliseconds.
    fn at(text: &str) -> UnixMillis {
        UnixMillis(text.parse::<Timestamp>().unwrap().as_millisecond())
    }

    const WEEKDAYS: &[&str] = &["mon", "tue", "wed", "thu", "fri"];

    /// The evening peak keeps its civil hours across both changes of Europe/Berlin: UTC+1
    /// before the last Sunday of March, UTC+2 after it, UTC+1 again after the last Sunday of
    /// October.
    #[test]
    fn civil_hours_hold_across_daylight_saving_changes() {
        let s = compile(section(Some(WEEKDAYS), "17:00", "19:30", "Europe/Berlin")).unwrap();
        // Friday 2026-03-27, CET: 17:30 local is 16:30Z.
        assert!(s.is_open(at("2026-03-27T16:30:00Z")));
        assert!(!s.is_open(at("2026-03-27T15:59:59Z")));
        // Monday 2026-03-30, CEST: 17:30 local is 15:30Z; 19:30 local (17:30Z) is closed.
        assert!(s.is_open(at("2026-03-30T15:30:00Z")));
        assert!(!s.is_open(at("2026-03-30T17:30:00Z")));
        assert!(s.is_open(at("2026-03-30T17:29:59Z")));
        // Friday 2026-10-23, CEST; Monday 2026-10-26, CET.
        assert!(s.is_open(at("2026-10-23T15:30:00Z")));
        assert!(!s.is_open(at("2026-10-26T15:30:00Z")), "16:30 CET");
        assert!(s.is_open(at("2026-10-26T16:30:00Z")), "17:30 CET");
        // Not on Saturday.
        assert!(!s.is_open(at("2026-03-28T16:30:00Z")));
    }

    /// A window that crosses midnight opens on a listed day and closes the next morning,
    /// also over the night of a change (Berlin, 2026-03-28/29, 02:00 → 03:00).
    #[test]
    fn windows_cross_midnight() {
        let s = compile(section(Some(&["sat"]), "22:00", "01:30", "Europe/Berlin")).unwrap();
        assert!(s.is_open(at("2026-03-28T21:00:00Z")), "Saturday 22:00 CET");
        assert!(s.is_open(at("2026-03-28T23:59:00Z")), "Sunday 00:59 CET");
        assert!(
            !s.is_open(at("2026-03-29T00:30:00Z")),
            "Sunday 01:30 CET: closed"
        );
        assert!(
            !s.is_open(at("2026-03-27T22:00:00Z")),
            "Friday night: not listed"
        );
        // Sunday night: the window belongs to Saturday only.
        assert!(!s.is_open(at("2026-03-29T21:00:00Z")));
    }

    /// A start or end the clocks skip (a gap) or pass twice (a fold) on a listed day is
    /// refused, with the field and line; on days without a change it is fine.
    #[test]
    fn times_in_a_gap_or_fold_are_refused() {
        let e = compile(section(Some(&["sun"]), "02:30", "05:00", "Europe/Berlin")).unwrap_err();
        assert_eq!(e.location.field.as_deref(), Some("schedules[0].start"));
        assert_eq!(e.location.line_col, Some((3, 1)));
        assert!(e.message.contains("gap on 2000-03-26"), "{e}");
        // The end of a window that crosses midnight falls on the next day: Sunday 02:30.
        let e = compile(section(Some(&["sat"]), "22:00", "02:30", "Europe/Berlin")).unwrap_err();
        assert_eq!(e.location.field.as_deref(), Some("schedules[0].end"));
        assert!(e.message.contains("gap on"), "{e}");
        // New York's autumn fold is 01:00–02:00: 01:30 happens twice that Sunday.
        let e = compile(section(
            Some(&["sun"]),
            "01:30",
            "05:00",
            "America/New_York",
        ))
        .unwrap_err();
        assert_eq!(e.location.field.as_deref(), Some("schedules[0].start"));
        assert!(e.message.contains("fold on 2000-10-29"), "{e}");
        assert!(e.message.contains("happens twice"), "{e}");
        // European changes fall on Sundays: 02:30 on weekdays is fine.
        compile(section(Some(WEEKDAYS), "02:30", "05:00", "Europe/Berlin")).unwrap();
        // New York changes at 02:00 local on Sundays too; UTC never changes.
        compile(section(None, "02:30", "05:00", "UTC")).unwrap();
        assert!(compile(section(None, "02:30", "05:00", "America/New_York")).is_err());
    }

    #[test]
    fn bad_fields_are_refused_with_their_names() {
        for (s, field, says) in [
            (
                section(None, "17:00", "19:30", "Mars/Olympus"),
                "timezone",
                "unknown time zone",
            ),
            (
                section(Some(&["fri", "caturday"]), "17:00", "19:30", "UTC"),
                "days",
                "caturday",
            ),
            (
                section(Some(&[]), "17:00", "19:30", "UTC"),
                "days",
                "no day",
            ),
            (section(None, "5pm", "19:30", "UTC"), "start", "HH:MM"),
            (section(None, "17:00", "24:00", "UTC"), "end", "HH:MM"),
            (section(None, "17:00", "17:00", "UTC"), "end", "empty"),
        ] {
            let e = compile(s).unwrap_err();
            assert_eq!(
                e.location.field.as_deref(),
                Some(&*format!("schedules[0].{field}"))
            );
            assert!(e.message.contains(says), "{e}");
        }
        let mut s = section(None, "17:00", "19:30", "UTC");
        s.pressure_floor = 1.5;
        assert!(compile(s).unwrap_err().message.contains("(0, 1]"));
        let mut s = section(None, "17:00", "19:30", "UTC");
        s.name = "evening peak".into();
        assert!(compile(s).unwrap_err().message.contains("metric label"));
        let twice = vec![
            section(None, "17:00", "19:30", "UTC"),
            section(None, "06:00", "07:00", "UTC"),
        ];
        let e = compile_schedules(twice, Path::new("s.toml"), "").unwrap_err();
        assert!(e.message.contains("twice"), "{e}");
    }

    #[test]
    fn the_highest_open_floor_wins() {
        let mut low = compile(section(None, "00:00", "23:59", "UTC")).unwrap();
        low.floor = Pressure::new(0.6).unwrap();
        let mut high = low.clone();
        high.name = "high".into();
        high.floor = Pressure::new(0.8).unwrap();
        let noon = at("2026-05-28T12:00:00Z");
        assert_eq!(floor_at(&[low.clone(), high.clone()], noon).unwrap().0, 1);
        assert_eq!(floor_at(&[high, low], noon).unwrap().0, 0);
        assert!(floor_at(&[], noon).is_none());
    }
}
