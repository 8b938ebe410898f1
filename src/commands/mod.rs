//! Subcommands of the `shedgate` binary that read what a running proxy recorded: `replay`,
//! `preview` and `device-hash`.

pub(crate) mod device_hash;
pub(crate) mod preview;
pub(crate) mod replay;
