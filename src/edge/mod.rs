//! The edge: the connection-level framing guard, and the one place where rejections become
//! responses.

pub mod framing;
pub mod rejection;
