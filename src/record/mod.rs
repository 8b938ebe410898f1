//! Every decision on record: the access log (one JSON line per answered request, written off
//! the request path), the replay of a log's decisions under a policy, and the preview of a
//! candidate policy decided in shadow beside the live one (docs/operations.md "Access log",
//! "Replay and preview").
//!
//! - [`line`](mod@line): what the proxy hands over ([`line::Entry`]) and the line it becomes
//!   ([`line::Line`], which replay reads back).
//! - [`format`](mod@format): the entry written as that line, by hand ([`format::Formatter`]).
//! - [`privacy`]: the peer cut to its network, device ids keyed-hashed.
//! - [`writer`]: the bounded queue and the writer thread ([`writer::AccessLog`]), which
//!   writes lines in the order the requests were answered.
//! - [`sink`]: where the lines go, and no torn line left there after a short write.
//! - [`tally`]: decisions counted by stream, area and rank band, then and now.
//! - [`replay`]: a log's lines decided again ([`replay::Replay`]).
//! - [`preview`]: a candidate policy decided in shadow on live traffic
//!   ([`preview::Preview`]), one at a time ([`preview::PreviewSlot`]).

pub mod format;
pub mod line;
pub mod preview;
pub mod privacy;
pub mod replay;
pub mod sink;
pub mod tally;
pub mod writer;

pub use line::{Decided, Entry, Note};
pub use preview::Preview;
pub use writer::{AccessLog, LogConfig, Sampling, Target};

/// The access log and the policy preview: the proxy writes to the one and decides in the
/// other's shadow; the admin listener starts and reads the preview.
#[derive(Debug, Clone, Default)]
pub struct Records {
    /// The access log, when `--access-log` is set.
    pub log: Option<std::sync::Arc<AccessLog>>,
    /// The preview, when one was started (running or ended), and the few before it.
    pub preview: std::sync::Arc<preview::PreviewSlot>,
}
