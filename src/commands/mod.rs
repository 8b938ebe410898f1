//! Subcommands of the `shedgate` binary that read what a running proxy recorded: `replay`
//! and `preview`.

pub(crate) mod preview;
pub(crate) mod replay;
