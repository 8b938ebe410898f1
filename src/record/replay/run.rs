//! A whole log replayed ([`Run`]): every line through [`Replay`], the bad lines kept, the
//! report as text or JSON.

use super::{LineError, Replay};
use crate::policy::Policy;

/// Most mismatches and bad lines a report lists one by one (all are counted).
pub const LISTED: usize = 20;

/// A whole log replayed: [`Replay`]'s counts, the lines that were not access-log lines, and
/// the time it took.
#[derive(Debug)]
pub struct Run<'p> {
    /// The replay.
    pub replay: Replay<'p>,
    /// Lines that are not access-log lines (every one; the first [`LISTED`] printed).
    pub errors: Vec<LineError>,
}

impl<'p> Run<'p> {
    /// Replays every line `log` holds under `policy`.
    ///
    /// # Errors
    /// The reader's I/O error (the log cannot be read).
    pub fn read(mut log: impl std::io::BufRead, policy: &'p Policy) -> std::io::Result<Self> {
        let mut replay = Replay::new(policy);
        let mut errors = Vec::new();
        let mut text = String::new();
        let mut number = 0u64;
        loop {
            text.clear();
            if log.read_line(&mut text)? == 0 {
                break;
            }
            number += 1;
            if let Err(e) = replay.line(number, &text) {
                errors.push(e);
            }
        }
        Ok(Run { replay, errors })
    }

    /// Whether every decision of the policy given came out the same and every line read.
    pub fn passed(&self) -> bool {
        self.replay.stats.mismatched == 0 && self.errors.is_empty()
    }

    /// The report as text.
    pub fn text(&self, source: &str) -> String {
        use std::fmt::Write as _;
        let r = &self.replay;
        let s = &r.stats;
        let version = r.policy.version();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "replayed {} lines of {source} under policy {version}",
            s.lines
        );
        let _ = writeln!(
            out,
            "  decided under this policy:    {} reproduced, {} mismatched",
            s.reproduced, s.mismatched
        );
        let others: Vec<String> = r
            .versions
            .iter()
            .filter(|(v, _)| v.as_str() != version)
            .map(|(v, n)| format!("{v}: {n} lines logged, unread bodies included"))
            .collect();
        let _ = writeln!(
            out,
            "  decided under other policies: {}{}",
            s.compared,
            if others.is_empty() {
                String::new()
            } else {
                format!(" ({})", others.join(", "))
            }
        );
        let _ = writeln!(
            out,
            "  bodies streamed through unread: {} still never shed, {} undecidable under this \
             policy (it would need their facts)",
            s.unread, s.undecidable
        );
        let _ = writeln!(
            out,
            "  not decided by a policy:      {} (rejections, budget waits, buffered-bytes \
             sheds)",
            s.outside
        );
        for m in r.mismatches.iter().take(LISTED) {
            let _ = writeln!(
                out,
                "line {}: mismatch: recorded {}; replayed {}",
                m.line, m.recorded, m.replayed
            );
        }
        if r.mismatches.len() > LISTED {
            let _ = writeln!(
                out,
                "... and {} more mismatches",
                r.mismatches.len() - LISTED
            );
        }
        for e in self.errors.iter().take(LISTED) {
            let _ = writeln!(out, "{e}");
        }
        if self.errors.len() > LISTED {
            let _ = writeln!(out, "... and {} more bad lines", self.errors.len() - LISTED);
        }
        if !r.tally.is_empty() {
            let _ = writeln!(
                out,
                "\nThe other policies' decisions under {version}, over {:.1} s of traffic \
                 (open-loop: the recorded pressure is replayed; a policy that admits more \
                 would in reality raise it):",
                r.seconds()
            );
            out.push_str(&r.tally.table(r.policy, r.seconds()));
        }
        out
    }

    /// The report as JSON.
    pub fn json(&self) -> serde_json::Value {
        let r = &self.replay;
        serde_json::json!({
            "policy": r.policy.version(),
            "stats": r.stats,
            "versions": r.versions,
            "mismatches": r.mismatches,
            "errors": self.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "seconds": r.seconds(),
            "rows": r.tally.rows(r.policy, r.seconds()),
        })
    }
}
