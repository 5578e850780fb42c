//! Prometheus on every process: the `/metrics` HTTP endpoint each process serves, and the
//! coordination client's own metrics (ZooKeeper request latency and session state), which every
//! process exports the same way.
//!
//! The registry is created in `main` and passed down; nothing here registers globally.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry, TextEncoder,
};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::coord::{Session, SessionState};
use crate::http::ServeOptions;

/// The text exposition of `registry` (what `/metrics` answers).
pub fn encode(registry: &Registry) -> Vec<u8> {
    let mut out = Vec::new();
    if let Err(e) = TextEncoder::new().encode(&registry.gather(), &mut out) {
        tracing::warn!("cannot encode metrics: {e}");
    }
    out
}

/// Registers what every Squall daemon exports about itself: the process collector
/// (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds`, ...) and
/// `squall_build_info{version, daemon}` = 1. `daemon` is `nimbus`, `supervisor` or `worker` (not
/// `squall_role`, which discovery sets as a target label and Prometheus would rename).
pub fn register_daemon_info(registry: &Registry, daemon: &str) -> prometheus::Result<()> {
    let info = IntGaugeVec::new(
        Opts::new("squall_build_info", "Squall's version, 1 for every running daemon"),
        &["version", "daemon"],
    )?;
    info.with_label_values(&[env!("CARGO_PKG_VERSION"), daemon]).set(1);
    registry.register(Box::new(info))?;
    registry.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))
}

/// The content type of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Answers `GET /metrics` (and `/`, for a person checking) with `registry`; 404 elsewhere.
pub fn respond(registry: &Registry, method: &Method, path: &str) -> Response<Full<Bytes>> {
    let mut response = match (method, path) {
        (&Method::GET, "/metrics") => {
            let mut r = Response::new(Full::new(Bytes::from(encode(registry))));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
            r
        }
        (&Method::GET, "/") => Response::new(Full::new(Bytes::from_static(b"squall: metrics at /metrics\n"))),
        _ => {
            let mut r = Response::new(Full::new(Bytes::from_static(b"not found: metrics are at /metrics\n")));
            *r.status_mut() = StatusCode::NOT_FOUND;
            r
        }
    };
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Serves `/metrics` on `listener` until `cancel`, then drains its connections (see
/// [`crate::http::serve`]).
pub async fn serve(listener: TcpListener, registry: Registry, cancel: CancellationToken) {
    serve_tls(listener, registry, None, cancel).await;
}

/// [`serve`], over TLS when `tls` is set (a supervisor's `supervisor.metrics.tls.*`).
pub async fn serve_tls(
    listener: TcpListener,
    registry: Registry,
    tls: Option<crate::tls::TlsAcceptor>,
    cancel: CancellationToken,
) {
    let registry = Arc::new(registry);
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        let response = respond(&registry, request.method(), request.uri().path());
        async move { Ok::<_, Infallible>(response) }
    });
    // hyper's default header timeout: a scrape sends its headers at once.
    let options = ServeOptions { name: "metrics", header_read_timeout: Duration::from_secs(30), tls };
    crate::http::serve(listener, service, options, cancel).await;
}

/// The coordination client's metrics: request latency by operation, failures by operation,
/// and the session's state. [`Session::instrument`] attaches them to a session.
#[derive(Debug, Clone)]
pub struct CoordMetrics {
    pub request_duration: HistogramVec,
    pub request_failures: IntCounterVec,
    pub session_state: IntGaugeVec,
}

/// Every state a session reports, for the state gauge (one of them is 1).
const STATES: [SessionState; 5] = [
    SessionState::Connected,
    SessionState::Disconnected,
    SessionState::Expired,
    SessionState::Closed,
    SessionState::AuthFailed,
];

fn state_label(state: SessionState) -> &'static str {
    match state {
        SessionState::Connected => "connected",
        SessionState::Disconnected => "disconnected",
        SessionState::Expired => "expired",
        SessionState::Closed => "closed",
        SessionState::AuthFailed => "auth_failed",
    }
}

/// The ZooKeeper protocol's name of the operation a session method performs (the `op` label, as
/// ZooKeeper's own request metrics name them); a watch does not change the operation.
pub(crate) fn zookeeper_op(method: &str) -> &'static str {
    match method {
        "create_node" => "create",
        "get" | "get_watch" => "getData",
        "set" => "setData",
        "delete" => "delete",
        "children" | "children_watch" => "getChildren",
        "exists" | "exists_watch" => "exists",
        "multi" => "multi",
        _ => "other",
    }
}

impl CoordMetrics {
    /// Registers the families on `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let metrics = CoordMetrics {
            request_duration: HistogramVec::new(
                HistogramOpts::new(
                    "squall_zookeeper_request_duration_seconds",
                    "Time of ZooKeeper requests made by this process, by operation",
                )
                .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0]),
                &["op"],
            )?,
            request_failures: IntCounterVec::new(
                Opts::new(
                    "squall_zookeeper_request_failures_total",
                    "ZooKeeper requests that failed, by operation",
                ),
                &["op"],
            )?,
            session_state: IntGaugeVec::new(
                Opts::new(
                    "squall_zookeeper_session_state",
                    "1 for the state the process's ZooKeeper session is in, 0 for the others",
                ),
                &["state"],
            )?,
        };
        registry.register(Box::new(metrics.request_duration.clone()))?;
        registry.register(Box::new(metrics.request_failures.clone()))?;
        registry.register(Box::new(metrics.session_state.clone()))?;
        Ok(metrics)
    }

    pub(crate) fn observe(&self, op: &str, took: Duration, failed: bool) {
        self.request_duration.with_label_values(&[op]).observe(took.as_secs_f64());
        if failed {
            self.request_failures.with_label_values(&[op]).inc();
        }
    }

    fn set_state(&self, state: SessionState) {
        for s in STATES {
            self.session_state.with_label_values(&[state_label(s)]).set(i64::from(s == state));
        }
    }
}

impl Session {
    /// Records this session's requests and state in `metrics` from now on. The state is
    /// followed by a task of the current tokio runtime until the session ends.
    pub fn instrument(mut self, metrics: CoordMetrics) -> Session {
        metrics.set_state(self.state());
        let mut changes = self.state_changes();
        let follower = metrics.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                while let Some(event) = changes.next().await {
                    follower.set_state(event.state);
                    if event.state.is_terminal() {
                        break;
                    }
                }
            });
        }
        self.metrics = Some(metrics);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::{CreateMode, Ensemble, SessionOptions};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).await.unwrap();
        text
    }

    #[tokio::test]
    async fn requests_and_state_are_served_at_metrics() {
        let registry = Registry::new();
        let metrics = CoordMetrics::register(&registry).unwrap();
        let session =
            Ensemble::in_memory().connect(&SessionOptions::default()).await.unwrap().instrument(metrics);
        session.create("/a", b"", CreateMode::Persistent).await.unwrap();
        assert!(session.create("/a", b"", CreateMode::Persistent).await.is_err());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cancel = CancellationToken::new();
        let server = tokio::spawn(serve(listener, registry, cancel.clone()));
        let page = get(addr, "/metrics").await;
        assert!(page.starts_with("HTTP/1.0 200") || page.starts_with("HTTP/1.1 200"), "{page}");
        assert!(page.contains("squall_zookeeper_request_duration_seconds_count{op=\"create\"} 2"), "{page}");
        assert!(page.contains("squall_zookeeper_request_failures_total{op=\"create\"} 1"), "{page}");
        assert!(page.contains("squall_zookeeper_session_state{state=\"connected\"} 1"), "{page}");
        assert!(page.contains("squall_zookeeper_session_state{state=\"expired\"} 0"), "{page}");
        assert!(get(addr, "/other").await.contains(" 404 "));
        cancel.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(5), server).await.unwrap().unwrap();
    }
}
