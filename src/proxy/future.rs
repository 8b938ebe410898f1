//! The response future of [`Admission`](super::Admission): ready for answers known in
//! `call`, boxed for the rest.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;

use crate::edge::rejection::Body;

// === impl ResponseFuture ===

/// The response future of [`Admission`](super::Admission): ready for answers known in `call`, boxed for the
/// rest (they await the body and the upstream).
pub struct ResponseFuture {
    kind: Kind,
}

enum Kind {
    Ready(Option<Response<Body>>),
    Boxed(Pin<Box<dyn Future<Output = Response<Body>> + Send>>),
}

impl ResponseFuture {
    pub(super) fn ready(response: Response<Body>) -> Self {
        ResponseFuture {
            kind: Kind::Ready(Some(response)),
        }
    }

    pub(super) fn boxed(f: impl Future<Output = Response<Body>> + Send + 'static) -> Self {
        ResponseFuture {
            kind: Kind::Boxed(Box::pin(f)),
        }
    }
}

impl std::fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().kind {
            Kind::Ready(r) => match r.take() {
                Some(r) => Poll::Ready(Ok(r)),
                None => Poll::Pending,
            },
            Kind::Boxed(f) => f.as_mut().poll(cx).map(Ok),
        }
    }
}
