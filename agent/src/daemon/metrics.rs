//! The metrics endpoint: Prometheus text on `GET /metrics` and a liveness answer on
//! `/healthz`, over HTTP/1.1 with hyper, one request per connection.
//!
//! What is measured lives with what it measures (the fetcher's, the mirror's and the
//! snapshotter's metrics; the agent's collector); this only encodes a registry.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONNECTION, CONTENT_TYPE};
use hyper::{Request, Response, StatusCode};
use prometheus_client::registry::Registry;

/// What every answer is labelled with (the encoder writes OpenMetrics text).
const CONTENT_TYPE_OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves Prometheus text on `GET /metrics` (and `GET /healthz`) until dropped.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    gate: tessera_proto::listen::Gate,
    header_read_timeout: Duration,
    registry: Arc<Registry>,
) {
    loop {
        let stream = gate.accept(&listener).await;
        let registry = registry.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<_>| {
                let answer = answer(req.uri().path(), &registry);
                async move { Ok::<_, Infallible>(answer) }
            });
            // One request per connection, as scrapers and probes use it: a client that
            // reads to the end of the stream gets it.
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The answer to a request for `path` (any method).
fn answer(path: &str, registry: &Registry) -> Response<Full<Bytes>> {
    let (status, body) = match path {
        "/metrics" => {
            let mut text = String::new();
            match prometheus_client::encoding::text::encode(&mut text, registry) {
                Ok(()) => (StatusCode::OK, text),
                Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, String::new()),
            }
        }
        "/healthz" => (StatusCode::OK, "ok\n".to_string()),
        _ => (StatusCode::NOT_FOUND, String::new()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(CONTENT_TYPE_OPENMETRICS),
    );
    headers.insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_by_path() {
        let registry = Registry::default();
        assert_eq!(answer("/metrics", &registry).status(), StatusCode::OK);
        assert_eq!(answer("/healthz", &registry).status(), StatusCode::OK);
        let missing = answer("/nope", &registry);
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            missing
                .headers()
                .get(CONTENT_TYPE)
                .map(HeaderValue::as_bytes),
            Some(CONTENT_TYPE_OPENMETRICS.as_bytes())
        );
    }
}
