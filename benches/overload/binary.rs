//! The overload bench's binary shedder (a module of `benches/overload.rs`).

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use shedgate::edge::rejection::Body;
use shedgate::upstream::{HostHeader, Proxy};
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};

use super::WORKERS;

/// The binary shedder: `ConcurrencyLimit` + `LoadShed` at the upstream's capacity, in front of
/// shedgate's proxy service (same client, same header hygiene), 503 when shed.
pub(crate) async fn start_binary(upstream: &str) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let proxy = Proxy::new(
        &upstream.parse().unwrap(),
        Duration::from_secs(10),
        Duration::from_secs(2),
        1 << 20,
        HostHeader::Client,
        &[],
        shedgate::upstream::HeaderCase::Preserve,
    );
    let svc = ServiceBuilder::new()
        .load_shed()
        .concurrency_limit(WORKERS as usize)
        .service(proxy);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let svc = svc.clone();
            tokio::spawn(async move {
                let hsvc =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let mut svc = svc.clone();
                        async move {
                            let req =
                                req.map(|b| b.map_err(shedgate::BoxError::from).boxed_unsync());
                            let resp: Response<Body> = match svc.ready().await {
                                Ok(ready) => match ready.call(req).await {
                                    Ok(r) => r,
                                    Err(_) => shed(),
                                },
                                Err(_) => shed(),
                            };
                            Ok::<_, Infallible>(resp)
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hsvc)
                    .await;
            });
        }
    });
    addr
}

fn shed() -> Response<Body> {
    let mut r = Response::new(shedgate::edge::rejection::full(Bytes::new()));
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    r
}
