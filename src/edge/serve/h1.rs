//! hyper's HTTP/1.1 connection on a client connection's bytes: the request hook (the
//! client's [`ClientInfo`] and the framing guard's verdict, in extensions) and the answer
//! hook ([`close_when`]), and the count of parked connections.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tower::Service;

use super::Shared;
use crate::BoxError;
use crate::edge::answer::close_when;
use crate::edge::client::ClientInfo;
use crate::edge::framing::{AmbiguousFraming, HeadVerdict, HeaderLineTooLong};
use crate::edge::keepalive::{Activity, Answer};
use crate::edge::lifecycle::ClientIo;
use crate::edge::tls::ClientStream;
use crate::metrics::Metrics;

/// A client connection's hyper connection serving `Svc`, boxed (freed when it is parked).
pub(super) type Started<Svc> = Pin<
    Box<
        hyper::server::conn::http1::Connection<
            ClientIo<TokioIo<ClientStream>>,
            TowerToHyperService<Svc>,
        >,
    >,
>;

/// hyper's HTTP/1.1 connection over `io`, serving the listener's stack with the request hook
/// (the client's [`ClientInfo`], made here once per hyper connection, and the framing
/// guard's verdict, in extensions) and the answer hook ([`close_when`]).
pub(super) fn start<S, B>(
    shared: &Shared<S>,
    io: ClientIo<TokioIo<ClientStream>>,
    peer: SocketAddr,
    verdicts: &crate::edge::framing::Verdicts,
    activity: &Arc<Activity>,
) -> Started<
    impl Service<
        Request<Incoming>,
        Response = Response<Answer<B>>,
        Error = std::convert::Infallible,
        Future: Send,
    > + Clone
    + Send
    + 'static,
>
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = std::convert::Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let svc = tower::util::MapRequest::new(shared.stack.clone(), {
        let verdicts = verdicts.clone();
        let activity = Arc::clone(activity);
        let descriptors = Arc::clone(&shared.descriptors);
        let info = ClientInfo::new(peer).over_tls(shared.tls);
        move |mut req: Request<Incoming>| {
            activity.request(req.version());
            descriptors.in_use(&activity);
            req.extensions_mut().insert(info.clone());
            match verdicts.next() {
                Some(HeadVerdict::Framing(why)) => {
                    req.extensions_mut().insert(AmbiguousFraming(why));
                }
                Some(HeadVerdict::LineTooLong(limit)) => {
                    req.extensions_mut().insert(HeaderLineTooLong(limit));
                }
                None => {}
            }
            req
        }
    });
    let svc = tower::util::MapResponse::new(
        svc,
        close_when(
            verdicts.clone(),
            shared.lame_duck.clone(),
            shared.metrics.clone(),
            Arc::clone(activity),
        ),
    );
    Box::pin(
        shared
            .builder
            .serve_connection(io, TowerToHyperService::new(svc)),
    )
}

/// Counts a connection in [`crate::metrics::PARKED_CONNECTIONS`] while it lives.
pub(super) struct Parked<'a>(&'a Metrics);

impl<'a> Parked<'a> {
    pub(super) fn new(metrics: &'a Metrics) -> Self {
        metrics.parked_connections.increment(1.0);
        Parked(metrics)
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.parked_connections.decrement(1.0);
    }
}
