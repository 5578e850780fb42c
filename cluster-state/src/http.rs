//! The one HTTP accept loop of Squall's servers (nimbus's API, every process's `/metrics`):
//! accepts until `shutdown`, serves each connection on a tracked task, and on shutdown lets
//! in-flight requests finish, closes idle keep-alive connections, and returns only once every
//! connection task has ended. Each request carries its client's address as a [`Peer`]
//! extension. With a [`TlsAcceptor`] every connection is TLS first: a client that does not
//! complete the handshake within the header timeout (plain HTTP, an untrusted or missing client
//! certificate under mutual TLS) is dropped before any request is read.

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::tls::TlsAcceptor;

/// How long to wait before accepting again after a failed accept (out of file descriptors and
/// the like): back off instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What differs between servers.
#[derive(Clone)]
pub struct ServeOptions {
    /// Names the server in log lines.
    pub name: &'static str,
    /// How long a client may take to send a request's headers. It also bounds how long an idle
    /// client can hold up shutdown.
    pub header_read_timeout: Duration,
    /// TLS on every connection (`None`: plain HTTP).
    pub tls: Option<TlsAcceptor>,
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("name", &self.name)
            .field("header_read_timeout", &self.header_read_timeout)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

/// The address of the client that sent a request (`request.extensions().get::<Peer>()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub SocketAddr);

/// `S` with every request tagged with its connection's [`Peer`].
#[derive(Clone)]
struct WithPeer<S> {
    inner: S,
    peer: SocketAddr,
}

impl<S: Service<Request<Incoming>>> Service<Request<Incoming>> for WithPeer<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        request.extensions_mut().insert(Peer(self.peer));
        self.inner.call(request)
    }
}

/// What a request's `Authorization` header says against a configured token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bearer {
    /// `Bearer <token>` with the right token.
    Valid,
    /// A bearer token, but not this one.
    Wrong,
    /// No `Authorization: Bearer ...` at all.
    Missing,
}

/// Checks `headers` for `Authorization: Bearer <token>` (RFC 7235: the scheme in any case, one
/// or more spaces after it), comparing without an early exit so timing does not reveal how much
/// of a guess was right. Nimbus's API and the supervisors' log viewer share it.
pub fn check_bearer(headers: &hyper::HeaderMap, token: &str) -> Bearer {
    let given = headers
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim_start_matches(' '));
    match given {
        None => Bearer::Missing,
        Some(given) if constant_time_eq(given.as_bytes(), token.as_bytes()) => Bearer::Valid,
        Some(_) => Bearer::Wrong,
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Serves `service` on `listener` until `shutdown`; returns once every connection has finished
/// (in-flight requests complete, idle keep-alive connections are closed).
pub async fn serve<S, B>(
    listener: TcpListener,
    service: S,
    options: ServeOptions,
    shutdown: CancellationToken,
) where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(server = options.name, "accepting a connection failed: {e}");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        let (service, shutdown) = (WithPeer { inner: service.clone(), peer }, shutdown.clone());
        let options = options.clone();
        connections.spawn(async move {
            let Some(acceptor) = &options.tls else {
                return serve_connection(stream, service, &options, peer, shutdown).await;
            };
            // The handshake is bounded like a request's headers, and by shutdown.
            let handshake = tokio::time::timeout(options.header_read_timeout, async {
                if speaks_plain_http(&stream).await {
                    return Handshake::PlainHttp(stream);
                }
                match acceptor.accept(stream).into_fallible().await {
                    Ok(tls) => Handshake::Done(Box::new(tls)),
                    Err((e, stream)) => Handshake::Failed(e, stream),
                }
            });
            let handshake = tokio::select! {
                _ = shutdown.cancelled() => return,
                handshake = handshake => handshake,
            };
            match handshake {
                Ok(Handshake::Done(tls)) => serve_connection(tls, service, &options, peer, shutdown).await,
                Ok(Handshake::PlainHttp(stream)) => {
                    tracing::debug!(server = options.name, %peer, "refused a plain-HTTP request");
                    close_refused(stream, true).await;
                }
                Ok(Handshake::Failed(e, stream)) => {
                    tracing::debug!(server = options.name, %peer, "TLS handshake failed: {e}");
                    close_refused(stream, false).await;
                }
                Err(_) => tracing::debug!(server = options.name, %peer, "TLS handshake timed out"),
            }
        });
    }
    connections.close();
    connections.wait().await;
}

/// What a plain-HTTP client of a TLS server gets: a 400 it can show, not a dropped
/// connection it would retry.
const PLAIN_HTTP_ANSWER: &str =
    "this server speaks HTTPS only: connect with TLS (for nimbus's API, set nimbus.http.tls.ca)";

/// Whether the client's first byte is an HTTP method's (a TLS client starts with a handshake
/// record, 0x16).
async fn speaks_plain_http(stream: &tokio::net::TcpStream) -> bool {
    let mut first = [0u8; 1];
    matches!(stream.peek(&mut first).await, Ok(1) if first[0].is_ascii_uppercase())
}

/// How a TLS connection's start went.
enum Handshake {
    Done(Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
    PlainHttp(tokio::net::TcpStream),
    Failed(std::io::Error, tokio::net::TcpStream),
}

/// How long a refused TLS client's bytes are read and dropped before its connection is closed.
const REFUSAL_DRAIN: Duration = Duration::from_secs(1);

/// Closes a connection whose TLS handshake failed so that the client reads why: the alert
/// rustls wrote is followed by a FIN, and what the client sent meanwhile (under TLS 1.3 its
/// request follows its certificate at once) is read and dropped, since closing a socket with
/// unread data sends a reset that would discard the alert before the client reads it.
async fn close_refused(mut stream: tokio::net::TcpStream, plain_http: bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if plain_http {
        let answer = format!(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\nconnection: close\r\n\
             content-length: {}\r\n\r\n{PLAIN_HTTP_ANSWER}",
            PLAIN_HTTP_ANSWER.len()
        );
        let _ = stream.write_all(answer.as_bytes()).await;
    }
    if stream.shutdown().await.is_err() {
        return;
    }
    let mut sink = [0u8; 4096];
    let drain = async { while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(REFUSAL_DRAIN, drain).await;
}

/// Serves one connection until it ends, or gracefully once `shutdown`.
async fn serve_connection<I, S, B>(
    io: I,
    service: WithPeer<S>,
    options: &ServeOptions,
    peer: SocketAddr,
    shutdown: CancellationToken,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Service<Request<Incoming>, Response = Response<B>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(options.header_read_timeout);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        _ = shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(server = options.name, %peer, "connection ended with an error: {e}");
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::Full;
    use hyper::body::Bytes;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn shutdown_closes_idle_keep_alive_connections_and_waits_for_them() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = hyper::service::service_fn(|_: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        });
        let options = ServeOptions { name: "test", header_read_timeout: Duration::from_secs(30), tls: None };
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(listener, service, options, shutdown.clone()));

        // One connection that was answered and stays open (HTTP/1.1 keep-alive), one that
        // never sent anything.
        let mut kept = tokio::net::TcpStream::connect(addr).await.unwrap();
        kept.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut answer = [0u8; 256];
        let n = kept.read(&mut answer).await.unwrap();
        assert!(answer[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer[..n]));
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("serve drains and returns")
            .unwrap();
        assert_eq!(kept.read(&mut answer).await.unwrap(), 0, "the idle connection was closed");
        assert_eq!(silent.read(&mut answer).await.unwrap_or(0), 0, "the silent connection was closed");
    }
}
