//! A typed client of nimbus's HTTP/JSON API ([`cluster_state::api`]): one method per route,
//! request and response bodies as their types. `squall`'s operator verbs and `squall local` call
//! it, supervisors download topology code with it.
//!
//! Each call opens its own connection (calls are rare: a verb, a code download), bounded by
//! [`NimbusClient::timeout`]. A code download streams ([`CodeDownload`]): the caller writes the
//! bytes where it wants and checks them against the checksum nimbus sent.
//!
//! With [`NimbusClient::with_tls`] every call is HTTPS: nimbus's certificate must chain to the
//! configured CA (`nimbus.http.tls.ca`) and name the host called; the client presents its own
//! certificate when configured (mutual TLS).
//!
//! [`LogViewerClient`] calls a supervisor's log viewer the same way (`squall logs`).
//!
//! Errors ([`ClientError`]) separate nimbus not answering (retryable) from nimbus refusing
//! (its `errorMessage` quoted with the status) and an answer this client cannot read.

// Async code: `tokio::time::Instant`, never std's (see clippy.toml).
#![deny(clippy::disallowed_types)]

use std::time::Duration;

use bytes::Bytes;
use cluster_state::api::{
    self, BeginUpload, BodyError, ChunkReceived, ClusterSummary, ErrorBody, FinishUpload, HeartbeatAccepted,
    LogConfigRequest, LogConfigView, LogRead, LogRoute, NimbusSummaries, RebalanceOptions, RebalanceRequest,
    Route, SubmitTopology, Submitted, SupervisorHeartbeat, SupervisorSummaries, TargetGroup, TopologyDetail,
    TopologyErrors, TopologyOperation, TopologySummaries, UploadBegun, UploadFinished, UploadId,
    WorkerLogChunk, WorkerLogFiles,
};
use cluster_state::code::CodeFile;
use cluster_state::ids::TopologyId;
use cluster_state::tls::ClientTls;
use cluster_state::worker_logs::LogFile;
use http_body_util::{BodyExt, Full};
pub use hyper::StatusCode;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

/// Upload chunk size: well under nimbus's default per-chunk limit (8 MiB).
pub const CHUNK_BYTES: usize = 4 * 1024 * 1024;

/// A failed call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No answer: nimbus is down, unreachable, or too slow. Retrying can help.
    #[error("cannot reach nimbus at {address}: {reason}")]
    Unreachable { address: String, reason: String },
    /// nimbus answered with an error status; `message` is its `errorMessage`.
    #[error("nimbus refused {what}: {message} (HTTP {status})")]
    Refused { what: String, status: StatusCode, message: String },
    /// nimbus answered something this client cannot read (a version mismatch, most likely).
    #[error("nimbus's answer to {what} is not what this client reads: {source}")]
    BadAnswer { what: String, source: BodyError },
    /// The TLS handshake failed: nimbus's certificate is not trusted (`nimbus.http.tls.ca`),
    /// nimbus refused this client's certificate or the lack of one (mutual TLS), or one side
    /// speaks plain HTTP. A configuration problem: retrying does not help.
    #[error("TLS with nimbus at {address} failed: {reason}")]
    Tls { address: String, reason: String },
    /// A follower refused a mutating call; `leader` is the leader it named, if any. The client
    /// follows it by itself; this is what is left when no leader answered in time.
    #[error("nimbus at {address} is not the leader ({message})")]
    NotLeader { address: String, leader: Option<String>, message: String },
}

impl ClientError {
    /// Whether the same call may succeed later (nimbus down or busy, ZooKeeper unavailable).
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } | ClientError::NotLeader { .. } => true,
            ClientError::Refused { status, .. } => status.is_server_error(),
            ClientError::BadAnswer { .. } | ClientError::Tls { .. } => false,
        }
    }

    /// The HTTP status of a refusal.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// nimbus's API at `address` (`host:port`), with the token for mutating calls.
///
/// With several nimbuses (HA, [`NimbusClient::with_seeds`]) a call goes to the nimbus that
/// answered last (the leader once one was named); a nimbus that does not answer is skipped for
/// the next seed, and a follower's refusal of a mutating call is followed to the leader it
/// names, for up to [`NimbusClient::failover`] (a leader election takes about the ZooKeeper
/// session timeout).
#[derive(Debug, Clone)]
pub struct NimbusClient {
    /// The first nimbus tried (the first seed).
    pub address: String,
    /// Every nimbus this client may try (`nimbus.seeds`), `address` included.
    pub seeds: Vec<String>,
    pub token: Option<String>,
    /// Bound on one call up to its answer's headers, and on reading a JSON answer.
    pub timeout: Duration,
    /// How long a call keeps looking for a nimbus (or the leader) that answers.
    pub failover: Duration,
    /// HTTPS with this CA (and client certificate), when set; plain HTTP otherwise.
    pub tls: Option<ClientTls>,
    /// The nimbus that answered last, shared by clones.
    current: std::sync::Arc<std::sync::Mutex<Option<String>>>,
}

/// A code file on its way: nimbus's checksum and the body, read chunk by chunk.
#[derive(Debug)]
pub struct CodeDownload {
    /// The SHA-256 nimbus recorded (lowercase hex), if it sent one.
    pub sha256: Option<String>,
    body: Incoming,
    address: String,
}

impl CodeDownload {
    /// The next bytes of the file, `None` at its end.
    pub async fn next_chunk(&mut self) -> Result<Option<Bytes>, ClientError> {
        while let Some(frame) = self.body.frame().await {
            let frame = frame.map_err(|e| ClientError::Unreachable {
                address: self.address.clone(),
                reason: format!("download interrupted: {e}"),
            })?;
            if let Ok(data) = frame.into_data() {
                return Ok(Some(data));
            }
        }
        Ok(None)
    }
}

impl NimbusClient {
    /// A client of nimbus at `address`; mutating calls carry `token` when set.
    pub fn new(address: impl Into<String>, token: Option<String>) -> Self {
        let address = address.into();
        NimbusClient {
            seeds: vec![address.clone()],
            address,
            token,
            timeout: Duration::from_secs(120),
            failover: Duration::ZERO,
            tls: None,
            current: Default::default(),
        }
    }

    /// A client of the nimbuses at `seeds` (Storm's `nimbus.seeds`; at least one), following
    /// the leader for up to 60 s per call.
    pub fn with_seeds(seeds: Vec<String>, token: Option<String>) -> Self {
        let mut client = NimbusClient::new(seeds.first().cloned().unwrap_or_default(), token);
        client.seeds = seeds;
        client.failover = Duration::from_secs(60);
        client
    }

    /// Calls over TLS with `tls` (`None`: plain HTTP).
    pub fn with_tls(mut self, tls: Option<ClientTls>) -> Self {
        self.tls = tls;
        self
    }

    /// The nimbus the next call goes to first.
    pub fn current(&self) -> String {
        self.current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or_else(|| self.address.clone())
    }

    fn set_current(&self, address: &str) {
        *self.current.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(address.to_owned());
    }

    /// The nimbus after `address` in the seeds (wrapping).
    fn next_seed(&self, address: &str) -> String {
        match self.seeds.iter().position(|s| s == address) {
            Some(i) => self.seeds[(i + 1) % self.seeds.len()].clone(),
            None => self.seeds.first().cloned().unwrap_or_else(|| self.address.clone()),
        }
    }

    /// Runs `attempt` against the current nimbus, moving to the next seed when one does not
    /// answer and to the named leader when a follower refuses: every seed is tried once, then
    /// again until `failover` has passed.
    async fn with_failover<T, F, Fut>(&self, mut attempt: F) -> Result<T, ClientError>
    where
        F: FnMut(String) -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let deadline = tokio::time::Instant::now() + self.failover;
        let mut address = self.current();
        let mut tried = 0usize;
        loop {
            let error = match attempt(address.clone()).await {
                Ok(answer) => {
                    self.set_current(&address);
                    return Ok(answer);
                }
                Err(e) => e,
            };
            tried += 1;
            let next = match &error {
                ClientError::NotLeader { leader: Some(leader), .. } if *leader != address => leader.clone(),
                ClientError::Unreachable { .. } | ClientError::NotLeader { .. } => self.next_seed(&address),
                _ => return Err(error),
            };
            if tried >= self.seeds.len().max(1) && tokio::time::Instant::now() >= deadline {
                return Err(error);
            }
            // A full round without an answer (an election under way): pause before the next.
            if tried.is_multiple_of(self.seeds.len().max(1)) {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            tracing::debug!(from = %address, to = %next, "nimbus failover: {error}");
            address = next;
        }
    }

    /// Every nimbus and who leads (`GET /api/v1/nimbus/summary`).
    pub async fn nimbus_summary(&self) -> Result<NimbusSummaries, ClientError> {
        self.get(Route::NimbusSummary).await
    }

    pub async fn cluster_summary(&self) -> Result<ClusterSummary, ClientError> {
        self.get(Route::ClusterSummary).await
    }

    pub async fn supervisor_summary(&self) -> Result<SupervisorSummaries, ClientError> {
        self.get(Route::SupervisorSummary).await
    }

    pub async fn topology_summary(&self) -> Result<TopologySummaries, ClientError> {
        self.get(Route::TopologySummary).await
    }

    pub async fn topology(&self, id: &TopologyId) -> Result<TopologyDetail, ClientError> {
        self.get(Route::Topology(id.clone())).await
    }

    /// The errors the topology's components reported, newest first.
    pub async fn errors(&self, id: &TopologyId) -> Result<TopologyErrors, ClientError> {
        self.get(Route::TopologyErrors(id.clone())).await
    }

    pub async fn prometheus_targets(&self) -> Result<Vec<TargetGroup>, ClientError> {
        self.get(Route::PrometheusTargets).await
    }

    /// Sends a supervisor's aggregated heartbeat of its workers to the leader.
    pub async fn supervisor_heartbeat(
        &self,
        beat: &SupervisorHeartbeat,
    ) -> Result<HeartbeatAccepted, ClientError> {
        self.post_json(Route::SupervisorHeartbeat, beat).await
    }

    /// Submits finished uploads as a topology.
    pub async fn submit(&self, request: &SubmitTopology) -> Result<Submitted, ClientError> {
        self.post_json(Route::Submit, request).await
    }

    pub async fn activate(&self, id: &TopologyId) -> Result<TopologyOperation, ClientError> {
        self.post_json(Route::Activate(id.clone()), &serde_json::Map::new()).await
    }

    pub async fn deactivate(&self, id: &TopologyId) -> Result<TopologyOperation, ClientError> {
        self.post_json(Route::Deactivate(id.clone()), &serde_json::Map::new()).await
    }

    /// Deactivates now, removes after `wait_secs`.
    pub async fn kill(&self, id: &TopologyId, wait_secs: u64) -> Result<TopologyOperation, ClientError> {
        self.post_json(Route::Kill { id: id.clone(), wait_secs }, &serde_json::Map::new()).await
    }

    /// Pauses the spouts for `wait_secs`, then reschedules with `options`.
    pub async fn rebalance(
        &self,
        id: &TopologyId,
        wait_secs: u64,
        options: RebalanceOptions,
    ) -> Result<TopologyOperation, ClientError> {
        let route = Route::Rebalance { id: id.clone(), wait_secs };
        self.post_json(route, &RebalanceRequest::new(options)).await
    }

    /// Sets runtime log levels on a topology's workers (Storm's `set_log_level`); the
    /// topology's levels after the change.
    pub async fn set_log_config(
        &self,
        id: &TopologyId,
        request: &LogConfigRequest,
    ) -> Result<LogConfigView, ClientError> {
        self.post_json(Route::LogConfig(id.clone()), request).await
    }

    /// Uploads `bytes` in chunks (begin, chunks, finish with the SHA-256); returns the upload
    /// id. `progress` gets the bytes sent so far after each chunk.
    pub async fn upload(&self, bytes: &[u8], mut progress: impl FnMut(u64)) -> Result<UploadId, ClientError> {
        let begun: UploadBegun =
            self.post_json(Route::BeginUpload, &BeginUpload { size: bytes.len() as u64 }).await?;
        let upload = begun.upload_id;
        let mut offset = 0u64;
        for chunk in bytes.chunks(CHUNK_BYTES) {
            let route = Route::Chunk { upload, offset };
            let body = Bytes::copy_from_slice(chunk);
            let _: ChunkReceived = self.call(route, body, Some("application/octet-stream")).await?;
            offset += chunk.len() as u64;
            progress(offset);
        }
        let sha256 = hex::encode(Sha256::digest(bytes));
        let _: UploadFinished = self.post_json(Route::FinishUpload(upload), &FinishUpload { sha256 }).await?;
        Ok(upload)
    }

    /// Starts downloading one code file of a topology (a 404 is [`ClientError::Refused`]).
    /// The caller bounds the whole download; [`NimbusClient::timeout`] bounds its start.
    pub async fn download_code(&self, id: &TopologyId, file: CodeFile) -> Result<CodeDownload, ClientError> {
        let route = Route::Code(id.clone(), file);
        let what = format!("GET {}", route.path());
        // Any nimbus holding the code serves it; a 404 from one (a follower still copying it)
        // does not stop the search while others are left to ask.
        let mut not_found = None;
        let mut asked = 0;
        loop {
            let attempt = self
                .with_failover(|address| {
                    let (route, what) = (&route, &what);
                    async move {
                        let response = self.exchange_at(&address, route, Bytes::new(), None).await?;
                        let response = self.check_status_at(&address, what, response).await?;
                        Ok((address, response))
                    }
                })
                .await;
            match attempt {
                Ok((address, response)) => {
                    let sha256 = response
                        .headers()
                        .get(api::CHECKSUM_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_ascii_lowercase);
                    return Ok(CodeDownload { sha256, body: response.into_body(), address });
                }
                Err(e) if e.status() == Some(StatusCode::NOT_FOUND) && asked + 1 < self.seeds.len() => {
                    asked += 1;
                    let failed = self.current();
                    self.set_current(&self.next_seed(&failed));
                    not_found = Some(e);
                }
                Err(e) => return Err(not_found.filter(|_| e.is_retryable()).unwrap_or(e)),
            }
        }
    }

    async fn get<T: DeserializeOwned>(&self, route: Route) -> Result<T, ClientError> {
        self.call(route, Bytes::new(), None).await
    }

    async fn post_json<T: DeserializeOwned>(
        &self,
        route: Route,
        body: &impl Serialize,
    ) -> Result<T, ClientError> {
        // Our own bodies always serialize (plain structs, string keys).
        let bytes = serde_json::to_vec(body).map_err(|e| ClientError::BadAnswer {
            what: format!("{} {}", route.method(), route.path()),
            source: BodyError::NotJson(e),
        })?;
        self.call(route, Bytes::from(bytes), Some("application/json")).await
    }

    /// One call whose answer is JSON.
    async fn call<T: DeserializeOwned>(
        &self,
        route: Route,
        body: Bytes,
        content_type: Option<&'static str>,
    ) -> Result<T, ClientError> {
        let what = format!("{} {}", route.method(), route.path());
        let (route, what, body) = (&route, &what, &body);
        self.with_failover(|address| async move {
            let response = self.exchange_at(&address, route, body.clone(), content_type).await?;
            let response = self.check_status_at(&address, what, response).await?;
            let bytes = self.read_all_at(&address, response).await?;
            api::decode_response(&bytes)
                .map_err(|source| ClientError::BadAnswer { what: what.clone(), source })
        })
        .await
    }

    fn unreachable_at(address: &str, reason: impl ToString) -> ClientError {
        ClientError::Unreachable { address: address.to_owned(), reason: reason.to_string() }
    }

    /// Sends the request over a new connection to `address`; returns the answer once its
    /// headers are in.
    async fn exchange_at(
        &self,
        address: &str,
        route: &Route,
        body: Bytes,
        content_type: Option<&'static str>,
    ) -> Result<Response<Incoming>, ClientError> {
        self.request_at(address, route.method(), route.path(), body, content_type).await
    }

    /// Sends `method path_and_query` over a new connection to `address`, with the token.
    async fn request_at(
        &self,
        address: &str,
        method: hyper::Method,
        path_and_query: String,
        body: Bytes,
        content_type: Option<&'static str>,
    ) -> Result<Response<Incoming>, ClientError> {
        let mut request = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(header::HOST, address)
            .body(Full::new(body))
            .map_err(|e| Self::unreachable_at(address, format!("bad request: {e}")))?;
        if let Some(kind) = content_type {
            request.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
        }
        if let Some(token) = &self.token
            && let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}"))
        {
            request.headers_mut().insert(header::AUTHORIZATION, value);
        }
        let exchange = async {
            let stream = tokio::net::TcpStream::connect(address)
                .await
                .map_err(|e| Self::unreachable_at(address, e))?;
            match &self.tls {
                None => send(address, stream, request).await,
                Some(tls) => {
                    let stream = tls.connect(address, stream).await.map_err(|e| io_failure(address, &e))?;
                    send(address, stream, request).await
                }
            }
        };
        tokio::time::timeout(self.timeout, exchange).await.map_err(|_| {
            Self::unreachable_at(address, format!("no answer within {}s", self.timeout.as_secs()))
        })?
    }

    /// An error status becomes [`ClientError::Refused`] quoting nimbus's `errorMessage`, or
    /// [`ClientError::NotLeader`] for a follower's refusal.
    async fn check_status_at(
        &self,
        address: &str,
        what: &str,
        response: Response<Incoming>,
    ) -> Result<Response<Incoming>, ClientError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let bytes = self.read_all_at(address, response).await.unwrap_or_default();
        let message = match api::decode_response::<ErrorBody>(&bytes) {
            Ok(body) if body.not_leader => {
                return Err(ClientError::NotLeader {
                    address: address.to_owned(),
                    leader: body.leader,
                    message: body.error_message,
                });
            }
            Ok(body) => body.error_message,
            Err(_) => String::from_utf8_lossy(&bytes).chars().take(300).collect(),
        };
        Err(ClientError::Refused { what: what.to_owned(), status, message })
    }

    async fn read_all_at(&self, address: &str, response: Response<Incoming>) -> Result<Bytes, ClientError> {
        let collect = response.into_body().collect();
        match tokio::time::timeout(self.timeout, collect).await {
            Ok(Ok(collected)) => Ok(collected.to_bytes()),
            Ok(Err(e)) => Err(Self::unreachable_at(address, e)),
            Err(_) => Err(Self::unreachable_at(
                address,
                format!("answer not complete within {}s", self.timeout.as_secs()),
            )),
        }
    }
}

/// A call to a supervisor's log viewer that failed.
#[derive(Debug, thiserror::Error)]
pub enum LogViewerError {
    /// No answer: the supervisor is down, unreachable, or too slow.
    #[error("cannot reach the supervisor's log viewer at {address}: {reason}")]
    Unreachable { address: String, reason: String },
    /// The supervisor answered with an error status (a wrong token, no such worker or file).
    #[error("the supervisor's log viewer refused {what}: {message} (HTTP {status})")]
    Refused { what: String, status: StatusCode, message: String },
    #[error("the supervisor's answer to {what} is not what this client reads: {source}")]
    BadAnswer { what: String, source: BodyError },
    /// Its certificate is not trusted, or it refused ours (mutual TLS), or one side is plain.
    #[error("TLS with the supervisor's log viewer at {address} failed: {reason}")]
    Tls { address: String, reason: String },
}

impl LogViewerError {
    /// The HTTP status of a refusal.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            LogViewerError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl From<ClientError> for LogViewerError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Unreachable { address, reason } => LogViewerError::Unreachable { address, reason },
            ClientError::NotLeader { address, message, .. } => {
                LogViewerError::Unreachable { address, reason: message }
            }
            ClientError::Refused { what, status, message } => {
                LogViewerError::Refused { what, status, message }
            }
            ClientError::BadAnswer { what, source } => LogViewerError::BadAnswer { what, source },
            ClientError::Tls { address, reason } => LogViewerError::Tls { address, reason },
        }
    }
}

/// A supervisor's log viewer (`cluster_state::logviewer`, on the supervisor's HTTP port): a
/// worker's log files and parts of them, by [`LogRoute`]. HTTPS when `tls` is set (the CA the
/// supervisors' certificates chain to); the token is the cluster's `nimbus.http.token`.
#[derive(Debug, Clone)]
pub struct LogViewerClient {
    inner: NimbusClient,
}

impl LogViewerClient {
    /// A client of the log viewer at `address` (`host:port`, as a topology page's `logViewer`).
    pub fn new(address: impl Into<String>, token: Option<String>, tls: Option<ClientTls>) -> Self {
        let mut inner = NimbusClient::new(address, token).with_tls(tls);
        inner.timeout = Duration::from_secs(30);
        LogViewerClient { inner }
    }

    /// The worker's log files.
    pub async fn files(&self, topology: &TopologyId, port: u16) -> Result<WorkerLogFiles, LogViewerError> {
        self.get(LogRoute::Files { topology: topology.clone(), port }).await
    }

    /// Part of one file.
    pub async fn read(
        &self,
        topology: &TopologyId,
        port: u16,
        file: LogFile,
        read: LogRead,
    ) -> Result<WorkerLogChunk, LogViewerError> {
        self.get(LogRoute::Read { topology: topology.clone(), port, file, read }).await
    }

    async fn get<T: DeserializeOwned>(&self, route: LogRoute) -> Result<T, LogViewerError> {
        let client = &self.inner;
        let address = &client.address;
        let what = format!("{} {}", route.method(), route.path_and_query());
        let response =
            client.request_at(address, route.method(), route.path_and_query(), Bytes::new(), None).await?;
        let response = client.check_status_at(address, &what, response).await?;
        let bytes = client.read_all_at(address, response).await?;
        api::decode_response(&bytes).map_err(|source| LogViewerError::BadAnswer { what, source })
    }
}

/// Sends `request` over `stream` (plain or TLS); returns the answer once its headers are in.
async fn send<S>(
    address: &str,
    stream: S,
    request: Request<Full<Bytes>>,
) -> Result<Response<Incoming>, ClientError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| io_failure(address, &e))?;
    // The connection is driven here until the answer's headers are in, so that a failure is
    // reported with its cause (a TLS alert: nimbus refused our certificate), which hyper hands
    // to the pending request as the connection ends.
    let mut connection = Box::pin(connection);
    let mut sent = Box::pin(sender.send_request(request));
    let response = tokio::select! {
        biased;
        response = &mut sent => response,
        ended = &mut connection => {
            if let Err(e) = ended {
                return Err(io_failure(address, &e));
            }
            sent.await
        }
    }
    .map_err(|e| io_failure(address, &e))?;
    // Then on its own task; it ends when the response body is dropped or read.
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("connection to nimbus ended: {e}");
        }
    });
    Ok(response)
}

/// A failed exchange: [`ClientError::Tls`] when TLS failed (under TLS 1.3 a server's refusal of
/// our certificate arrives with the first answer), else [`ClientError::Unreachable`].
fn io_failure(address: &str, error: &(dyn std::error::Error + 'static)) -> ClientError {
    if let Some(reason) = cluster_state::tls::tls_failure(error) {
        return ClientError::Tls { address: address.to_owned(), reason };
    }
    // hyper's errors name the step; the cause is in their sources.
    let mut reason = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        reason = format!("{reason}: {cause}");
        source = cause.source();
    }
    NimbusClient::unreachable_at(address, reason)
}
