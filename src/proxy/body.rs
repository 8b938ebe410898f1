//! Body wrappers of the request path: a request body with a deadline, and a response body
//! that holds the in-flight guard until it ends.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::Sleep;

use crate::BoxError;
use crate::pressure::InflightGuard;
use crate::upstream::{BodyProgress, BodyReadTimeout, ClientBodyError};

type Inner = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// A streamed request body that fails with [`BodyReadTimeout`] if it has not ended within
/// the body read timeout (a client dripping bytes must not hold an upstream connection).
pub struct TimedBody {
    inner: Inner,
    limit: Duration,
    deadline: Pin<Box<Sleep>>,
    progress: BodyProgress,
}

impl TimedBody {
    /// Wraps `inner`; the deadline starts now. `progress` is marked when the body ends.
    pub fn new(inner: Inner, limit: Duration, progress: BodyProgress) -> Self {
        if inner.is_end_stream() {
            progress.finish();
        }
        TimedBody {
            inner,
            limit,
            deadline: Box::pin(tokio::time::sleep(limit)),
            progress,
        }
    }
}

impl std::fmt::Debug for TimedBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimedBody")
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if frame.is_none() || this.inner.is_end_stream() {
                this.progress.finish();
            }
            // The client's own framing fault (a malformed chunk, a connection cut mid-body)
            // is named as such, so that the upstream call it aborts is not blamed on the
            // upstream (`Proxy::classify`); the body limit keeps its own error (413).
            return Poll::Ready(frame.map(|f| {
                f.map_err(|e| {
                    if e.is::<http_body_util::LengthLimitError>() {
                        e
                    } else {
                        Box::new(ClientBodyError(e)) as BoxError
                    }
                })
            }));
        }
        match this.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyReadTimeout(this.limit))))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that keeps its request counted in flight until the body ends, errors or
/// is dropped (tower-http's in-flight accounting does the same: streaming bodies would
/// otherwise escape the count).
pub struct GuardedBody<G = InflightGuard> {
    inner: crate::edge::rejection::Body,
    guard: Option<G>,
}

impl<G> GuardedBody<G> {
    /// Ties `guard` to `inner`.
    pub fn new(inner: crate::edge::rejection::Body, guard: G) -> Self {
        GuardedBody {
            inner,
            guard: Some(guard),
        }
    }
}

impl<G> std::fmt::Debug for GuardedBody<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuardedBody").finish_non_exhaustive()
    }
}

impl<G: Unpin> HttpBody for GuardedBody<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None | Some(Err(_))) => this.guard = None,
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.guard = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
