//! The edge: serving client connections (accept, timeouts, drain, descriptors), the
//! connection-level framing guard, request-target and `Host` hygiene, the one place where
//! rejections become responses, and the access-log line of a head hyper's parser answered
//! itself.

mod answer;
pub mod client;
pub mod descriptors;
pub mod framing;
pub mod keepalive;
pub mod lifecycle;
mod protocol;
pub mod refusal;
pub mod rejection;
pub mod reuse;
pub mod serve;
pub mod target;
pub mod tls;
