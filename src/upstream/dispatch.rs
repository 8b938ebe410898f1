//! The stack's innermost service: each request goes to the upstream admission chose for it,
//! its [`Target`], through that upstream's client.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};

use super::state::Upstream;
use super::{BodyProgress, ForwardBody};
use crate::edge::rejection::Body;

/// The upstream a request goes to, chosen by admission: beside the request in a [`Routed`].
/// It holds the upstream until the upstream's answer
/// has come (the response body keeps its own connection).
#[derive(Debug, Clone)]
pub struct Target(pub Arc<Upstream>);

/// A request on its way to the upstream admission chose for it, as the stack hands it to
/// [`Dispatch`]: the upstream and the streamed body's progress ride beside the request, not
/// in its extensions. `scripts/instructions.sh` (callgrind, 4,000 requests): the extensions'
/// inserts (the fourth entry grows the map) and the remove cost 791 instructions per request
/// in the client connection's task on the `never` yes (36,516 → 35,725) and 286 on the
/// sheddable yes (53,746 → 53,460).
#[derive(Debug)]
pub struct Routed {
    /// The upstream.
    pub target: Target,
    /// When the streamed body finished arriving; `None` for a body read whole before.
    pub progress: Option<BodyProgress>,
    /// The request.
    pub request: Request<ForwardBody>,
}

/// Sends each [`Routed`] request to its [`Target`]'s upstream.
#[derive(Debug, Clone, Copy, Default)]
pub struct Dispatch;

// === impl Dispatch ===

impl tower::Service<Routed> for Dispatch {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, routed: Routed) -> Self::Future {
        let Routed {
            target: Target(upstream),
            progress,
            request,
        } = routed;
        Box::pin(async move { Ok(upstream.proxy.forward(request, progress).await) })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::ServiceExt;

    use super::*;
    use crate::pressure::ControllerConfig;

    /// An upstream on 127.0.0.1 that answers every request 200 with `X-Upstream: name`.
    async fn named_upstream(name: &'static str) -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nX-Upstream: {name}\r\nContent-Length: 0\r\n\r\n"
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                });
            }
        });
        let settings = crate::upstream::Settings {
            url: format!("http://{addr}").parse().unwrap(),
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(5),
            pool: crate::upstream::pool::Limits::default(),
            controller: ControllerConfig {
                max_inflight: None,
                latency_target: Duration::from_millis(50),
                tuning: &crate::pressure::Tuning::DEFAULT,
            },
            load_report: None,
        };
        let client = crate::upstream::ClientOptions {
            body_limit: 1 << 20,
            host: super::super::HostHeader::Client,
            trusted: Arc::from([]),
            case: super::super::HeaderCase::Preserve,
            descriptors: None,
        };
        let account = crate::upstream::account::Accounts::default()
            .take()
            .unwrap();
        Upstream::build(
            name,
            settings,
            &client,
            account,
            &crate::metrics::Metrics::new(),
        )
    }

    fn request() -> Request<ForwardBody> {
        let body = http_body_util::Empty::new()
            .map_err(|never| match never {})
            .boxed_unsync();
        let mut req = Request::new(body);
        *req.uri_mut() = http::Uri::from_static("/events");
        req
    }

    #[tokio::test]
    async fn each_request_goes_to_its_targets_upstream() {
        let (a, b) = (
            Arc::new(named_upstream("a").await),
            Arc::new(named_upstream("b").await),
        );
        for (upstream, name) in [(&b, "b"), (&a, "a"), (&b, "b")] {
            let routed = Routed {
                target: Target(Arc::clone(upstream)),
                progress: None,
                request: request(),
            };
            let Ok(response) = Dispatch.oneshot(routed).await;
            assert_eq!(response.status(), http::StatusCode::OK);
            assert_eq!(response.headers()["x-upstream"], name);
        }
    }
}
