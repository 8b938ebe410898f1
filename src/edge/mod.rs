//! The edge: serving client connections (accept, timeouts, drain), the connection-level
//! framing guard, request-target and `Host` hygiene, and the one place where rejections
//! become responses.

pub mod framing;
pub mod keepalive;
pub mod lifecycle;
mod protocol;
pub mod rejection;
pub mod serve;
pub mod target;
