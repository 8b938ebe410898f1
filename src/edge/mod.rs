//! The edge: the connection-level framing guard, request-target and `Host` hygiene, and the
//! one place where rejections become responses.

pub mod framing;
pub mod rejection;
pub mod target;
