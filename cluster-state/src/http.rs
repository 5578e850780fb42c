//! The one HTTP accept loop of Squall's servers (nimbus's API, every process's `/metrics`):
//! accepts until `shutdown`, serves each connection on a tracked task, and on shutdown lets
//! in-flight requests finish, closes idle keep-alive connections, and returns only once every
//! connection task has ended. Each request carries its client's address as a [`Peer`]
//! extension.

use std::error::Error as StdError;
use std::net::SocketAddr;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long to wait before accepting again after a failed accept (out of file descriptors and
/// the like): back off instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What differs between servers.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// Names the server in log lines.
    pub name: &'static str,
    /// How long a client may take to send a request's headers. It also bounds how long an idle
    /// client can hold up shutdown.
    pub header_read_timeout: Duration,
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
        connections.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.timer(TokioTimer::new()).header_read_timeout(options.header_read_timeout);
            let connection = builder.serve_connection(TokioIo::new(stream), service);
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
        });
    }
    connections.close();
    connections.wait().await;
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
        let options = ServeOptions { name: "test", header_read_timeout: Duration::from_secs(30) };
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
