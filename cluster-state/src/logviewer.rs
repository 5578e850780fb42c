//! A supervisor's HTTP port: its Prometheus `/metrics` and the log viewer (Storm's logviewer
//! idea), which serves the logs of the workers on this machine by topology id, port and
//! [`LogFile`] ([`LogRoute`]); no client names a path, so nothing outside
//! `<storm.local.dir>/workers-artifacts/<topology-id>/<port>/` can be read.
//!
//! Every log call needs `Authorization: Bearer <nimbus.http.token>` when the cluster has a token
//! (logs carry data and hosts; `/metrics` stays open, as on nimbus); the port is HTTPS with
//! `supervisor.metrics.tls.*` (mutual with its client CA). A read returns at most
//! [`MAX_READ_BYTES`]; a download streams the file in chunks, so no request holds a whole file
//! in memory.

use std::convert::Infallible;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use prometheus::Registry;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::api::{
    ErrorBody, InvalidSegment, LogRead, LogRoute, MAX_READ_BYTES, WorkerLogChunk, WorkerLogFile,
    WorkerLogFiles,
};
use crate::http::{Bearer, ServeOptions};
use crate::ids::TopologyId;
use crate::worker_logs::{self, LogFile};

/// The body of every answer of the port.
pub type Body = UnsyncBoxBody<Bytes, io::Error>;

/// Bytes per chunk of a download.
const DOWNLOAD_CHUNK: usize = 64 * 1024;

/// What the log viewer serves from: the supervisor's `storm.local.dir` and the cluster's token.
#[derive(Clone)]
pub struct LogViewer {
    pub local_dir: PathBuf,
    /// `nimbus.http.token`: required on every log call when set.
    pub token: Option<String>,
}

impl std::fmt::Debug for LogViewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogViewer")
            .field("local_dir", &self.local_dir)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Serves `/metrics` from `registry` and the log viewer on `listener` (over TLS when `tls` is
/// set) until `cancel`, then drains its connections ([`crate::http::serve`]).
pub async fn serve(
    listener: TcpListener,
    registry: Registry,
    viewer: LogViewer,
    tls: Option<crate::tls::TlsAcceptor>,
    cancel: CancellationToken,
) {
    let shared = Arc::new((registry, viewer));
    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
        let shared = shared.clone();
        async move { Ok::<_, Infallible>(respond(&shared.0, &shared.1, request).await) }
    });
    let options = ServeOptions { name: "supervisor", header_read_timeout: Duration::from_secs(30), tls };
    crate::http::serve(listener, service, options, cancel).await;
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never: Infallible| match never {}).boxed_unsync()
}

fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    // Our own bodies always serialize (plain structs, string keys).
    let bytes = serde_json::to_vec(value).unwrap_or_default();
    let mut response = Response::new(full(bytes));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn error(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    let reason = status.canonical_reason().unwrap_or("Error");
    json(status, &ErrorBody::new(reason, message))
}

/// One request: a log route, else what `/metrics` answers (itself, or a 404).
async fn respond<B>(registry: &Registry, viewer: &LogViewer, request: Request<B>) -> Response<Body> {
    let mut response = match LogRoute::parse(request.uri().path(), request.uri().query()) {
        Ok(None) => crate::metrics::respond(registry, request.method(), request.uri().path())
            .map(|body| body.map_err(|never: Infallible| match never {}).boxed_unsync()),
        _ if request.method() != Method::GET => {
            let mut r = error(StatusCode::METHOD_NOT_ALLOWED, "the log viewer answers GET only");
            r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("GET"));
            r
        }
        parsed => match authorize(viewer, request.headers()) {
            Err(refused) => error(StatusCode::UNAUTHORIZED, refused),
            Ok(()) => match parsed {
                Ok(Some(route)) => serve_route(viewer, route).await,
                Err(segment @ InvalidSegment::LogFile(_)) => {
                    error(StatusCode::NOT_FOUND, segment.to_string())
                }
                Err(segment) => error(StatusCode::BAD_REQUEST, segment.to_string()),
                Ok(None) => error(StatusCode::NOT_FOUND, "no such resource"),
            },
        },
    };
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Whether the request may read logs; the refusal's message otherwise (a 401).
fn authorize(viewer: &LogViewer, headers: &hyper::HeaderMap) -> Result<(), &'static str> {
    let Some(token) = &viewer.token else { return Ok(()) };
    match crate::http::check_bearer(headers, token) {
        Bearer::Valid => Ok(()),
        Bearer::Wrong => Err("the bearer token is wrong"),
        Bearer::Missing => Err("worker logs are served only with \"Authorization: Bearer <token>\""),
    }
}

/// A log call that failed: the worker or file is not here, or reading it failed.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("no {file} for topology {topology} on port {port} on this supervisor")]
    NotFound { topology: TopologyId, port: u16, file: String },
    #[error("cannot read {file} of topology {topology} on port {port}")]
    Io { topology: TopologyId, port: u16, file: String, source: io::Error },
}

impl LogError {
    fn from_io(topology: &TopologyId, port: u16, file: String, source: io::Error) -> Self {
        if source.kind() == io::ErrorKind::NotFound {
            LogError::NotFound { topology: topology.clone(), port, file }
        } else {
            LogError::Io { topology: topology.clone(), port, file, source }
        }
    }

    /// The answer: 404 or 500; a 500 never names a server path (the detail goes to the log).
    fn response(&self) -> Response<Body> {
        match self {
            LogError::NotFound { .. } => error(StatusCode::NOT_FOUND, self.to_string()),
            LogError::Io { source, .. } => {
                tracing::warn!(error = %source, "log viewer: {self}");
                error(StatusCode::INTERNAL_SERVER_ERROR, self.to_string())
            }
        }
    }
}

async fn serve_route(viewer: &LogViewer, route: LogRoute) -> Response<Body> {
    let local_dir = viewer.local_dir.clone();
    match route {
        LogRoute::Files { topology, port } => {
            let listed = tokio::task::spawn_blocking(move || list(&local_dir, &topology, port)).await;
            match listed {
                Ok(Ok(files)) => json(StatusCode::OK, &files),
                Ok(Err(e)) => e.response(),
                Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("listing failed: {e}")),
            }
        }
        LogRoute::Read { topology, port, file, read: how } => {
            let chunk =
                tokio::task::spawn_blocking(move || read(&local_dir, &topology, port, file, how)).await;
            match chunk {
                Ok(Ok(chunk)) => json(StatusCode::OK, &chunk),
                Ok(Err(e)) => e.response(),
                Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("reading failed: {e}")),
            }
        }
        LogRoute::Download { topology, port, file } => download(&local_dir, &topology, port, file).await,
    }
}

/// The worker's log files present: live ones first, then each kind's rotated files newest first.
pub fn list(local_dir: &Path, topology: &TopologyId, port: u16) -> Result<WorkerLogFiles, LogError> {
    let dir = worker_logs::artifacts_dir(local_dir, topology, port);
    let entries = std::fs::read_dir(&dir)
        .map_err(|e| LogError::from_io(topology, port, "log directory".to_owned(), e))?;
    let mut files = Vec::new();
    for entry in entries.flatten() {
        let Some(file) = entry.file_name().to_str().and_then(|n| n.parse::<LogFile>().ok()) else {
            continue;
        };
        if let Ok(meta) = entry.metadata()
            && meta.is_file()
        {
            files.push(WorkerLogFile { file, size: meta.len() });
        }
    }
    files.sort_by_key(|f| match f.file {
        LogFile::Log(n) => (n.min(1), 0, n),
        LogFile::Out(n) => (n.min(1), 1, n),
    });
    Ok(WorkerLogFiles { topology_id: topology.clone(), port, files })
}

/// Reads part of a log file ([`LogRead`], whose bounds the route checked).
pub fn read(
    local_dir: &Path,
    topology: &TopologyId,
    port: u16,
    file: LogFile,
    how: LogRead,
) -> Result<WorkerLogChunk, LogError> {
    let io_error = |e| LogError::from_io(topology, port, file.file_name(), e);
    let mut handle = std::fs::File::open(file.path(local_dir, topology, port)).map_err(io_error)?;
    let file_size = handle.metadata().map_err(io_error)?.len();
    let (start, bytes) = match how {
        LogRead::Range { start, length } => {
            let start = start.min(file_size);
            (start, read_at(&mut handle, start, length.min(MAX_READ_BYTES)).map_err(io_error)?)
        }
        LogRead::Tail { lines } => {
            let window_start = file_size.saturating_sub(MAX_READ_BYTES);
            let window = read_at(&mut handle, window_start, file_size - window_start).map_err(io_error)?;
            let skip = tail_start(&window, lines as usize, window_start > 0);
            (window_start + skip as u64, window[skip..].to_vec())
        }
    };
    Ok(WorkerLogChunk {
        topology_id: topology.clone(),
        port,
        file,
        file_size,
        start,
        length: bytes.len() as u64,
        data: String::from_utf8_lossy(&bytes).into_owned(),
    })
}

fn read_at(handle: &mut std::fs::File, start: u64, length: u64) -> io::Result<Vec<u8>> {
    handle.seek(SeekFrom::Start(start))?;
    let mut bytes = Vec::new();
    handle.take(length).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Where the last `lines` lines of `window` begin. A last line without its newline counts;
/// when `cut` (the window starts mid-file), the first, maybe partial, line is never returned
/// unless it is the only one.
pub fn tail_start(window: &[u8], lines: usize, cut: bool) -> usize {
    let body = window.strip_suffix(b"\n").unwrap_or(window);
    let mut start = body.len();
    let mut found = 0;
    while found < lines {
        match body[..start].iter().rposition(|b| *b == b'\n') {
            Some(newline) => {
                start = newline;
                found += 1;
            }
            None => {
                // The first line of the window: whole only if the window is the file's start.
                return if cut && found > 0 { start + 1 } else { 0 };
            }
        }
    }
    (start + 1).min(window.len())
}

async fn download(local_dir: &Path, topology: &TopologyId, port: u16, file: LogFile) -> Response<Body> {
    let handle = match tokio::fs::File::open(file.path(local_dir, topology, port)).await {
        Ok(handle) => handle,
        Err(e) => return LogError::from_io(topology, port, file.file_name(), e).response(),
    };
    let size = handle.metadata().await.map(|m| m.len()).ok();
    // Up to the size at opening: a live file keeps growing, and a download has an end.
    let limited = handle.take(size.unwrap_or(u64::MAX));
    let chunks = futures::stream::unfold(limited, |mut reader| async move {
        let mut buffer = vec![0u8; DOWNLOAD_CHUNK];
        match reader.read(&mut buffer).await {
            Ok(0) => None,
            Ok(n) => {
                buffer.truncate(n);
                Some((Ok(Frame::data(Bytes::from(buffer))), reader))
            }
            Err(e) => Some((Err(e), reader)),
        }
    });
    let mut response = Response::new(StreamBody::new(chunks.boxed()).boxed_unsync());
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    if let Some(size) = size {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    }
    // Ids and file names are plain ASCII without quotes (validated), so the header is valid.
    let name = format!("attachment; filename=\"{topology}-{port}-{file}\"");
    if let Ok(value) = HeaderValue::from_str(&name) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn tails_take_whole_lines_from_the_end() {
        let text = b"one\ntwo\nthree\n";
        let tail =
            |lines, cut| std::str::from_utf8(&text[tail_start(text, lines, cut)..]).unwrap().to_owned();
        assert_eq!(tail(1, false), "three\n");
        assert_eq!(tail(2, false), "two\nthree\n");
        assert_eq!(tail(3, false), "one\ntwo\nthree\n");
        assert_eq!(tail(9, false), "one\ntwo\nthree\n");
        // A window cut mid-file drops its first, partial, line.
        assert_eq!(tail(9, true), "two\nthree\n");
        let unfinished = b"one\ntwo";
        assert_eq!(&unfinished[tail_start(unfinished, 1, false)..], b"two");
        assert_eq!(tail_start(b"", 5, false), 0);
        assert_eq!(tail_start(b"only a part", 5, true), 0);
    }
}
