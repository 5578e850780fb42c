//! Nimbus's HTTP/JSON API, shaped like Storm's UI REST API so scripts written for Storm work.
//! The routes, bodies and their JSON keys are the wire format in `cluster_state::api` (see
//! `cluster_state::api::routes` for the table); this is the server: [`run`] accepts
//! connections, `dispatch` matches a request to its [`Route`], checks the method and the token,
//! decodes the body into the route's type, and calls one handler per route.
//!
//! ```text
//! GET  /metrics                                   nimbus's own metrics (Prometheus text)
//! ```
//!
//! Errors are `ErrorBody` (`{"error": "<reason phrase>", "errorMessage": "<what is wrong>"}`)
//! with a 4xx for anything the client got wrong (400 naming the field, 401, 404, 405, 409, 413,
//! 429); a 5xx only when nimbus or ZooKeeper failed. When a token is configured, every POST
//! and every code download (`GET .../code/<file>`: the user's binary, the topology file with
//! its params, the transport secret) needs `Authorization: Bearer <token>`. Bodies are
//! size-limited before they are read. Secret param values (`cluster_state::secrets`) never
//! appear in an answer.

use std::convert::Infallible;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cluster_state::api::{
    self, BeginUpload, BodyError, ChunkReceived, ClusterConfiguration, ClusterSummary, ComponentPage,
    ConsumerGroupDetail, ConsumerGroups, ErrorBody, FinishUpload, HeartbeatAccepted, LogConfigRequest,
    LogConfigView, NimbusSummaries, NimbusSummaryView, Operation, RebalanceRequest, ResetPlan,
    ResetPlanRequest, Route, RouteError, StatsWindow, SubmitTopology, Submitted, SupervisorHeartbeat,
    SupervisorSummaries, TargetGroup, TopologyDetail, TopologyError, TopologyErrors, TopologyOperation,
    TopologySummaries, UploadBegun, UploadFinished, UploadId, Visualization,
};
use cluster_state::code::CodeFile;
use cluster_state::coord;
use cluster_state::http::{Bearer, Peer, ServeOptions};
use cluster_state::ids::TopologyId;
use cluster_state::ids::{ComponentId, GroupId};
use cluster_state::layout::TaskLayout;
use cluster_state::paths::KafkaPaths;
use cluster_state::secrets;
use cluster_state::structure::{TopologyGraph, TopologyStructure};
use cluster_state::znode::{LogConfig, LoggerLevel, NimbusSummary, ZnodeData};
use futures::TryStreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, LengthLimitError, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;
use tokio_util::io::ReaderStream;
use tokio_util::sync::CancellationToken;

use crate::assigner::{Assigner, SubmitError, SubmitRequest};
use crate::code_store::CodeStoreError;
use crate::lag::LagMetrics;
use crate::leader::{self, Leadership, Replicator};
use crate::lifecycle::{Event, LifecycleError};
use crate::state;
use crate::stats::{TopologyInputs, WorkerStats};
use crate::transitions::{Applied, TimerHandle, TransitionError, Transitions};
use crate::ui;
use cluster_state::clock::now_secs;

/// The header carrying a code file's SHA-256 (lowercase hex) on download.
pub use cluster_state::api::CHECKSUM_HEADER;

/// How long a mutating call waits, on a nimbus with no leader elected, for this nimbus to win.
const ELECTION_WAIT: Duration = Duration::from_secs(5);

/// Limits and settings of the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    /// Required on mutating calls and code downloads as `Authorization: Bearer <token>`, when set.
    pub token: Option<String>,
    /// Largest JSON request body.
    pub max_json_body_bytes: usize,
    /// Largest upload chunk.
    pub max_chunk_bytes: usize,
    /// Largest supervisor heartbeat (every worker of one supervisor, with executor stats).
    pub max_heartbeat_body_bytes: usize,
    /// Reported as `stormVersion`.
    pub version: String,
    /// A client has this long to send its request headers (slow clients hold a connection).
    pub header_read_timeout: Duration,
    /// `topology.min.replication.count`: nimbuses holding a topology's code before its submit
    /// is acknowledged.
    pub min_replication_count: usize,
    /// `topology.max.replication.wait.time.sec`: the longest a submit waits for that.
    pub max_replication_wait: Duration,
    /// The API is served over TLS (`nimbus.http.tls.cert`): discovery marks nimbus's own
    /// target `https`.
    pub https: bool,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            token: None,
            max_json_body_bytes: 64 * 1024,
            // Storm's jar upload sends small chunks; 8 MiB keeps a chunk's memory bounded while
            // a 100 MiB binary still goes in a dozen requests.
            max_chunk_bytes: 8 * 1024 * 1024,
            // A supervisor's workers with their executors' stats: ~200 bytes per executor, so
            // 4 MiB holds some 20,000 executors on one machine.
            max_heartbeat_body_bytes: 4 * 1024 * 1024,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            header_read_timeout: Duration::from_secs(30),
            // Storm's defaults.yaml.
            min_replication_count: 1,
            max_replication_wait: Duration::from_secs(60),
            https: false,
        }
    }
}

/// What request handlers share.
#[derive(Debug)]
pub struct ApiState {
    pub transitions: Arc<Transitions>,
    pub assigner: Arc<Assigner>,
    /// What `GET /metrics` serves (the process's registry).
    pub registry: prometheus::Registry,
    pub timers: TimerHandle,
    pub config: ApiConfig,
    /// When this nimbus started, epoch seconds.
    pub nimbus_start_secs: u64,
    /// Whether this nimbus leads: a follower refuses every POST, naming the leader.
    pub leadership: Leadership,
    /// Code replication, for a submit to wait for `min_replication_count` copies (none: no wait).
    pub replicator: Option<Replicator>,
    /// The lag evaluator's latest report, for the consumer-group pages (none: no evaluator).
    pub lag: Option<LagMetrics>,
    /// The consumer registry the lag evaluator reads (`squall.lag.zookeeper.chroot`).
    pub kafka_paths: KafkaPaths,
    /// `GET /api/v1/cluster/configuration`, secrets redacted.
    pub cluster_configuration: ClusterConfiguration,
}

type Body = BoxBody<Bytes, io::Error>;

/// Serves the API on `listener` until `shutdown`; returns once every connection has finished
/// (in-flight requests complete, idle keep-alive connections are closed).
pub async fn run(listener: TcpListener, state: Arc<ApiState>, shutdown: CancellationToken) {
    run_tls(listener, state, None, shutdown).await;
}

/// [`run`], over TLS when `tls` is set (`nimbus.http.tls.*`).
pub async fn run_tls(
    listener: TcpListener,
    state: Arc<ApiState>,
    tls: Option<cluster_state::tls::TlsAcceptor>,
    shutdown: CancellationToken,
) {
    let options =
        ServeOptions { name: "nimbus API", header_read_timeout: state.config.header_read_timeout, tls };
    let service = hyper::service::service_fn(move |request| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(handle(&state, request).await) }
    });
    cluster_state::http::serve(listener, service, options, shutdown).await;
}

/// A failed request: status and what is wrong.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
    allow: Option<&'static str>,
    /// A follower's refusal: `Some(leader address, if known)`.
    not_leader: Option<Option<String>>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError { status, message: message.into(), allow: None, not_leader: None }
    }

    /// A follower's answer to a mutating call: 503 with the leader's address when known.
    fn not_leader(leader: Option<String>) -> Self {
        let message = match &leader {
            Some(leader) => format!("this nimbus is not the leader; the leader is {leader}"),
            None => {
                "this nimbus is not the leader and no leader is elected yet; try again shortly".to_owned()
            }
        };
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, message);
        e.not_leader = Some(leader);
        e
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// A failure of nimbus itself: the client learns what failed, the log gets the detail
    /// (which names server paths the client has no business seeing).
    fn internal(status: StatusCode, what: &str, detail: &dyn std::fmt::Display) -> Self {
        tracing::error!("{what}: {detail}");
        Self::new(status, format!("{what}; the details are in nimbus's log"))
    }
}

impl From<coord::Error> for ApiError {
    fn from(e: coord::Error) -> Self {
        if e.is_retryable() || e.is_session_lost() {
            let what = "nimbus's ZooKeeper connection is down; try again";
            ApiError::internal(StatusCode::SERVICE_UNAVAILABLE, what, &e)
        } else {
            ApiError::internal(StatusCode::INTERNAL_SERVER_ERROR, "a ZooKeeper request failed", &e)
        }
    }
}

impl From<CodeStoreError> for ApiError {
    fn from(e: CodeStoreError) -> Self {
        use CodeStoreError::*;
        let status = match &e {
            InvalidChecksum { .. } | ChecksumMismatch { .. } | ReplicaChecksum { .. } => {
                StatusCode::BAD_REQUEST
            }
            UnknownUpload { .. } | NoCode { .. } => StatusCode::NOT_FOUND,
            TooLarge { .. } | PastDeclaredSize { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            TooManyUploads { .. } | TooManyUploadsFromClient { .. } => StatusCode::TOO_MANY_REQUESTS,
            WrongOffset { .. } | Incomplete { .. } | AlreadyFinished { .. } | NotFinished { .. } => {
                StatusCode::CONFLICT
            }
            Io { source, .. } => {
                let what = format!("nimbus's code store failed to read or write a file ({})", source.kind());
                return ApiError::internal(StatusCode::INTERNAL_SERVER_ERROR, &what, &e);
            }
        };
        ApiError::new(status, e.to_string())
    }
}

impl From<TransitionError> for ApiError {
    fn from(e: TransitionError) -> Self {
        let status = match e {
            TransitionError::Coord(c) => return ApiError::from(c),
            TransitionError::Code(c) => return ApiError::from(c),
            TransitionError::UnknownTopology { .. } => StatusCode::NOT_FOUND,
            TransitionError::Lifecycle(LifecycleError::NoTransition { .. })
            | TransitionError::Contended { .. } => StatusCode::CONFLICT,
            TransitionError::Lifecycle(_) => StatusCode::BAD_REQUEST,
            TransitionError::Reschedule { ref id, .. } => {
                let what = format!("rescheduling topology {id} failed");
                return ApiError::internal(StatusCode::INTERNAL_SERVER_ERROR, &what, &e);
            }
        };
        ApiError::new(status, e.to_string())
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::Code(c) => ApiError::from(c),
            SubmitError::Coord(c) => ApiError::from(c),
            SubmitError::NotText | SubmitError::Structure(_) | SubmitError::Limit(_) => {
                ApiError::bad_request(e.to_string())
            }
            SubmitError::NameTaken { .. } => ApiError::new(StatusCode::CONFLICT, e.to_string()),
        }
    }
}

impl From<BodyError> for ApiError {
    fn from(e: BodyError) -> Self {
        ApiError::bad_request(format!("request body: {e}"))
    }
}

fn json_response(status: StatusCode, body: &impl Serialize) -> Response<Body> {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|e| {
        // Our own bodies always serialize; say so if one does not rather than panic.
        format!("{{\"error\":\"Internal Server Error\",\"errorMessage\":\"response encoding: {e}\"}}")
            .into_bytes()
    });
    let mut response = Response::new(full(bytes));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

fn error_response(e: ApiError) -> Response<Body> {
    let error = e.status.canonical_reason().unwrap_or("Error").to_owned();
    // A message may quote a topology file (a submit refused for its params).
    let mut body = ErrorBody::new(error, secrets::redact_known(&e.message).into_owned());
    if let Some(leader) = e.not_leader {
        body.not_leader = true;
        body.leader = leader;
    }
    let mut response = json_response(e.status, &body);
    if let Some(allow) = e.allow {
        response.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
    }
    response
}

async fn handle(state: &ApiState, request: Request<Incoming>) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let mut response = match dispatch(state, request).await {
        Ok(response) => response,
        Err(e) => {
            tracing::debug!(%method, %path, status = %e.status, "request refused: {}", e.message);
            error_response(e)
        }
    };
    ui::add_security_headers(response.headers_mut());
    state.transitions.metrics().response(response.status().as_u16());
    response
}

/// A handler's answer, `200 OK`.
fn ok(body: &impl Serialize) -> Result<Response<Body>, ApiError> {
    Ok(json_response(StatusCode::OK, body))
}

fn wrong_method(path: &str, wanted: &Method, given: &Method) -> ApiError {
    let allow = if *wanted == Method::GET { "GET" } else { "POST" };
    let mut e = ApiError::new(StatusCode::METHOD_NOT_ALLOWED, format!("{path} accepts {allow}, not {given}"));
    e.allow = Some(allow);
    e
}

/// Matches the request to its route (method, then token, then the path's segments), and calls
/// the route's handler with its decoded body.
async fn dispatch(state: &ApiState, request: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let path = request.uri().path().to_owned();
    if path == "/metrics" {
        let response = cluster_state::metrics::respond(&state.registry, request.method(), &path);
        let (parts, body) = response.into_parts();
        return Ok(Response::from_parts(parts, body.map_err(|never| match never {}).boxed()));
    }
    if let Some(asset) = ui::Asset::at(&path) {
        return match *request.method() {
            Method::GET | Method::HEAD => Ok(asset.response(request.method() == Method::GET).map(full)),
            ref other => Err(wrong_method(&path, &Method::GET, other)),
        };
    }
    let window =
        || api::window_from_query(request.uri().query()).map_err(|e| ApiError::bad_request(e.to_string()));
    let (wanted, route) = match Route::parse(&path) {
        Ok(route) => (route.method(), Ok(route)),
        Err(RouteError::NoSuchResource { path }) => {
            return Err(ApiError::not_found(format!("no such resource: {path}")));
        }
        Err(RouteError::Invalid { method, segment }) => (method, Err(segment)),
    };
    if request.method() != wanted {
        return Err(wrong_method(&path, &wanted, request.method()));
    }
    // Code files are the user's program and its topology file, which may hold credentials:
    // only token holders (supervisors, operators) read them, like every change.
    let code_file = matches!(route, Ok(Route::Code(..)) | Err(api::InvalidSegment::CodeFile(_)));
    if wanted == Method::POST || code_file {
        authorize(state, &request)?;
        if !state.leadership.is_leader() {
            let t = &state.transitions;
            let mut leader = leader::leader_address(t.session(), t.paths()).await.unwrap_or_default();
            if leader.is_none() {
                // An election is under way (a nimbus just started, or the leader just went):
                // this nimbus may win it in a moment, so the call waits a little for that.
                let _ = tokio::time::timeout(ELECTION_WAIT, state.leadership.leading()).await;
                leader = leader::leader_address(t.session(), t.paths()).await.unwrap_or_default();
            }
            if !state.leadership.is_leader() {
                return Err(ApiError::not_leader(leader));
            }
        }
    }
    let route = route.map_err(|segment| match segment {
        // A name nimbus has no file for, like an unknown id.
        api::InvalidSegment::CodeFile(_) => ApiError::not_found(segment.to_string()),
        _ => ApiError::bad_request(segment.to_string()),
    })?;
    let json_limit = state.config.max_json_body_bytes;
    match route {
        Route::ClusterSummary => ok(&cluster_summary(state).await?),
        Route::SupervisorSummary => ok(&supervisor_summary(state).await?),
        Route::NimbusSummary => ok(&nimbus_summary(state).await?),
        Route::TopologySummary => ok(&topology_summary(state).await?),
        Route::PrometheusTargets => {
            // nimbus is where Prometheus reached it; the others published their endpoints.
            let own = request.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
            ok(&prometheus_targets(state, own).await?)
        }
        Route::ClusterConfiguration => ok(&state.cluster_configuration),
        Route::Topology(id) => ok(&topology(state, &id, window()?).await?),
        Route::Component(id, component) => ok(&component_page(state, &id, &component, window()?).await?),
        Route::Visualization(id) => ok(&visualization(state, &id).await?),
        Route::ConsumerGroups => ok(&consumer_groups(state)),
        Route::ConsumerGroup(group) => ok(&consumer_group(state, &group).await?),
        Route::ResetPlan(group) => {
            let body: ResetPlanRequest = json_body(request, json_limit).await?;
            body.validate()?;
            ok(&reset_plan(state, &group, &body).await?)
        }
        Route::TopologyErrors(id) => ok(&topology_errors(state, &id).await?),
        Route::Code(id, file) => code(state, &id, file).await,
        Route::Submit => {
            let submitted = submit(state, json_body(request, json_limit).await?).await?;
            Ok(json_response(StatusCode::CREATED, &submitted))
        }
        Route::SupervisorHeartbeat => {
            let beat: SupervisorHeartbeat = json_body(request, state.config.max_heartbeat_body_bytes).await?;
            beat.validate()?;
            let store = state.assigner.heartbeats();
            let workers = store.record(beat);
            let metrics = state.transitions.metrics();
            metrics.supervisor_heartbeats.inc();
            // Current at every report, not only at the monitor's pass (the scale bench times
            // submit -> every worker reported with it).
            metrics.workers_reported.set(store.workers_reported() as i64);
            ok(&HeartbeatAccepted { workers })
        }
        Route::Activate(id) => ok(&operate(state, &id, Operation::Activate, Event::Activate).await?),
        Route::Deactivate(id) => ok(&operate(state, &id, Operation::Deactivate, Event::Deactivate).await?),
        Route::Kill { id, wait_secs } => {
            ok(&operate(state, &id, Operation::Kill, Event::Kill { wait_secs }).await?)
        }
        Route::Rebalance { id, wait_secs } => {
            let body = read_body(request, json_limit).await?;
            // An empty body changes nothing (Storm UI's "rebalance" button sends none).
            let options = if body.iter().all(u8::is_ascii_whitespace) {
                Default::default()
            } else {
                api::decode_request::<RebalanceRequest>(&body)?.into_options()
            };
            // Storm caps executors at tasks; asking for more is refused, naming the component.
            if !options.executors.is_empty() {
                let asked = options.executors.iter().map(|(c, n)| (c.clone(), n.0)).collect();
                state.assigner.check_rebalance(&id, &asked).await?;
            }
            let event = Event::Rebalance {
                wait_secs,
                num_workers: options.num_workers.map(|n| n.0),
                component_executors: options.executors.into_iter().map(|(c, n)| (c, n.0)).collect(),
            };
            ok(&operate(state, &id, Operation::Rebalance, event).await?)
        }
        Route::LogConfig(id) => {
            let body: LogConfigRequest = json_body(request, json_limit).await?;
            ok(&set_log_config(state, &id, body).await?)
        }
        Route::BeginUpload => {
            let client = request.extensions().get::<Peer>().map(|p| p.0.ip());
            let begun = begin_upload(state, client, json_body(request, json_limit).await?).await?;
            Ok(json_response(StatusCode::CREATED, &begun))
        }
        Route::Chunk { upload, offset } => {
            let body = read_body(request, state.config.max_chunk_bytes).await?;
            ok(&chunk(state, upload, offset, &body).await?)
        }
        Route::FinishUpload(upload) => {
            ok(&finish_upload(state, upload, json_body(request, json_limit).await?).await?)
        }
    }
}

/// Storm's `set_log_level`: merges the request into `/logconfigs/<id>` (a fenced
/// compare-and-set; levels whose timeout passed are dropped), which the topology's workers
/// watch. A timeout ends at nimbus's clock now plus its seconds.
async fn set_log_config(
    state: &ApiState,
    id: &TopologyId,
    request: LogConfigRequest,
) -> Result<LogConfigView, ApiError> {
    const MAX_TIMEOUT_SECS: u64 = 7 * 24 * 3600;
    let t = &state.transitions;
    if t.session().exists(&t.paths().storm(id)).await?.is_none() {
        return Err(unknown_topology(id));
    }
    if let Some((name, _)) = request.named_logger_levels.iter().find(|(_, l)| l.timeout > MAX_TIMEOUT_SECS) {
        return Err(ApiError::bad_request(format!("logger {name}: timeout over {MAX_TIMEOUT_SECS} seconds")));
    }
    let path = t.paths().log_config(id);
    let now_ms = cluster_state::clock::now_millis();
    let current = match t.session().get(&path).await {
        Ok((bytes, stat)) => Some((LogConfig::decode(&path, &bytes).unwrap_or_default(), stat.version)),
        Err(coord::Error::NoNode { .. }) => None,
        Err(e) => return Err(e.into()),
    };
    let mut config = current.as_ref().map(|(c, _)| c.clone()).unwrap_or_default().without_expired(now_ms);
    for (name, level) in request.named_logger_levels {
        let reset = (level.timeout > 0).then(|| now_ms.saturating_add(level.timeout.saturating_mul(1000)));
        config.named_logger_level.insert(
            name,
            LoggerLevel { target_log_level: level.target_level, reset_log_level_timeout_epoch_ms: reset },
        );
    }
    let bytes = config.encode();
    match current {
        Some((_, version)) => {
            leader::set(t.session(), &state.leadership, &path, &bytes, Some(version)).await?
        }
        None => {
            t.session().ensure_path(&t.paths().log_configs_dir()).await?;
            leader::create(t.session(), &state.leadership, &path, &bytes).await?
        }
    }
    Ok(LogConfigView::from(&config))
}

fn unknown_topology(id: &TopologyId) -> ApiError {
    ApiError::not_found(format!("no topology {id}"))
}

async fn snapshot(state: &ApiState) -> Result<crate::views::ClusterSnapshot, ApiError> {
    let t = &state.transitions;
    let mut read = state::read_snapshot(t.session(), t.paths(), state.nimbus_start_secs, now_secs()).await?;
    t.metrics().garbage_znodes.inc_by(read.skipped.len() as u64);
    // Supervisors' nodes are rewritten only when their content changes: their time and uptime
    // come from their latest heartbeat (on the leader; a follower shows the node's).
    state.assigner.heartbeats().refresh_infos(&mut read.value.supervisors);
    Ok(read.value)
}

async fn cluster_summary(state: &ApiState) -> Result<ClusterSummary, ApiError> {
    Ok(snapshot(state).await?.cluster_summary(&state.config.version))
}

async fn supervisor_summary(state: &ApiState) -> Result<SupervisorSummaries, ApiError> {
    Ok(SupervisorSummaries { supervisors: snapshot(state).await?.supervisor_summaries() })
}

/// Every registered nimbus, Storm UI's way; a nimbus that runs no election lists itself.
async fn nimbus_summary(state: &ApiState) -> Result<NimbusSummaries, ApiError> {
    let t = &state.transitions;
    let now = now_secs();
    let view = |n: NimbusSummary| {
        let up = now.saturating_sub(n.start_time_secs);
        NimbusSummaryView {
            status: if n.is_leader { NimbusSummaryView::LEADER } else { NimbusSummaryView::NOT_A_LEADER }
                .to_owned(),
            host: n.host,
            port: n.port,
            version: n.version,
            nimbus_up_time: crate::views::pretty_uptime(up),
            nimbus_up_time_seconds: up,
        }
    };
    let nimbuses = leader::nimbuses(t.session(), t.paths()).await?.into_iter().map(view).collect();
    Ok(NimbusSummaries { nimbuses })
}

async fn topology_summary(state: &ApiState) -> Result<TopologySummaries, ApiError> {
    Ok(TopologySummaries { topologies: snapshot(state).await?.topology_summaries() })
}

/// `own` is nimbus's address as the caller reached it.
async fn prometheus_targets(state: &ApiState, own: &str) -> Result<Vec<TargetGroup>, ApiError> {
    let t = &state.transitions;
    let snapshot = snapshot(state).await?;
    // The workers' endpoints from the supervisors' reports (the leader has them); topologies
    // none reported (on a follower, or just after a failover) from their throttled workerbeats.
    let mut endpoints = state.assigner.heartbeats().worker_endpoints();
    let reported: std::collections::BTreeSet<TopologyId> =
        endpoints.iter().map(|w| w.topology.clone()).collect();
    let unreported: Vec<TopologyId> =
        snapshot.storms.keys().filter(|id| !reported.contains(*id)).cloned().collect();
    let workers = state::read_worker_endpoints(t.session(), t.paths(), &unreported).await?;
    t.metrics().garbage_znodes.inc_by(workers.skipped.len() as u64);
    endpoints.extend(workers.value);
    endpoints.retain(|w| snapshot.storms.contains_key(&w.topology));
    Ok(crate::views::discovery_targets(own, state.config.https, &snapshot, &endpoints))
}

/// What the topology, component and graph pages are computed from (see [`crate::stats`]).
struct PageData {
    snapshot: crate::views::ClusterSnapshot,
    graph: TopologyGraph,
    layout: TaskLayout,
    workers: Vec<WorkerStats>,
    window_starts:
        std::collections::HashMap<cluster_state::ids::ExecutorId, (cluster_state::znode::ExecutorStats, u64)>,
    errors: Vec<TopologyError>,
    now_secs: u64,
}

impl PageData {
    fn inputs<'a>(&'a self, id: &'a TopologyId) -> Option<TopologyInputs<'a>> {
        Some(TopologyInputs {
            id,
            base: self.snapshot.storms.get(id)?,
            assignment: self.snapshot.assignments.get(id),
            supervisors: &self.snapshot.supervisors,
            layout: &self.layout,
            graph: &self.graph,
            workers: &self.workers,
            window_starts: &self.window_starts,
            errors: &self.errors,
            now_secs: self.now_secs,
        })
    }
}

/// Reads a topology's file, stats and errors. The file is nimbus's copy (a follower's replica):
/// without it (not yet replicated) the pages show no components rather than fail.
async fn page_data(state: &ApiState, id: &TopologyId) -> Result<PageData, ApiError> {
    let t = &state.transitions;
    let snapshot = snapshot(state).await?;
    let base = snapshot.storms.get(id).ok_or_else(|| unknown_topology(id))?;
    let file = t.code().topology_dir(id).join(CodeFile::Topology.file_name());
    let text = match tokio::fs::read_to_string(&file).await {
        Ok(text) => text,
        Err(e) => {
            tracing::warn!(topology = %id, "no topology file for the UI's pages: {e}");
            String::new()
        }
    };
    let graph = TopologyGraph::from_flux(&text).unwrap_or_default();
    let mut layout =
        TopologyStructure::from_flux(&text).map(|s| s.layout(&base.component_executors)).unwrap_or_default();
    if let Some(assignment) = snapshot.assignments.get(id)
        && let Ok(assigned) = layout.with_executors(assignment.executors.iter().map(|e| e.executor))
    {
        layout = assigned;
    }
    let now_secs = now_secs();
    let heartbeats = state.assigner.heartbeats();
    let mut workers = heartbeats.topology_workers(id);
    if workers.is_empty() {
        // A follower, or a leader that has just taken over: the throttled workerbeats.
        let read = state::read_workerbeats(t.session(), t.paths(), id).await?;
        t.metrics().garbage_znodes.inc_by(read.skipped.len() as u64);
        workers = read
            .value
            .into_iter()
            .map(|(slot, beat)| WorkerStats {
                slot,
                uptime_secs: beat.uptime_secs,
                executors: beat.executor_stats,
            })
            .collect();
    }
    let window_starts = heartbeats.window_starts(id, now_secs);
    let errors = topology_errors(state, id).await?.errors;
    Ok(PageData { snapshot, graph, layout, workers, window_starts, errors, now_secs })
}

async fn topology(
    state: &ApiState,
    id: &TopologyId,
    window: StatsWindow,
) -> Result<TopologyDetail, ApiError> {
    let data = page_data(state, id).await?;
    let mut detail = data.snapshot.topology_detail(id).ok_or_else(|| unknown_topology(id))?;
    if let Some(inputs) = data.inputs(id) {
        crate::stats::fill_topology(&mut detail, &inputs, window);
    }
    Ok(detail)
}

async fn component_page(
    state: &ApiState,
    id: &TopologyId,
    component: &ComponentId,
    window: StatsWindow,
) -> Result<ComponentPage, ApiError> {
    let data = page_data(state, id).await?;
    data.inputs(id)
        .and_then(|inputs| crate::stats::component_page(&inputs, component, window))
        .ok_or_else(|| ApiError::not_found(format!("topology {id} has no spout or bolt {component}")))
}

async fn visualization(state: &ApiState, id: &TopologyId) -> Result<Visualization, ApiError> {
    let data = page_data(state, id).await?;
    let inputs = data.inputs(id).ok_or_else(|| unknown_topology(id))?;
    Ok(crate::stats::visualization(&inputs, |c| ui::component_link(id, c)))
}

fn lag_report(state: &ApiState) -> crate::lag::window::LagReport {
    state.lag.as_ref().map(LagMetrics::latest).unwrap_or_default()
}

fn consumer_groups(state: &ApiState) -> ConsumerGroups {
    let evaluated_at_secs = state.lag.as_ref().map_or(0, |l| l.last_pass.get().max(0) as u64);
    ConsumerGroups { groups: crate::lag::view::group_summaries(&lag_report(state)), evaluated_at_secs }
}

/// The group's partitions and members as ZooKeeper holds them now.
async fn registry_read(
    state: &ApiState,
    group: &GroupId,
) -> Result<
    (
        std::collections::BTreeMap<
            consumer_registry::TopicPartition,
            consumer_registry::admin::PartitionState,
        >,
        usize,
    ),
    ApiError,
> {
    let admin = consumer_registry::admin::Admin::new(state.transitions.session(), state.kafka_paths.clone());
    let partitions = admin.read(group, None).await.map_err(|e| match e {
        consumer_registry::admin::AdminError::UnknownGroup { .. } => {
            ApiError::not_found(format!("no consumer group {group}"))
        }
        consumer_registry::admin::AdminError::Coord(c) => ApiError::from(c),
        other => {
            ApiError::internal(StatusCode::INTERNAL_SERVER_ERROR, "reading the consumer group failed", &other)
        }
    })?;
    let members = admin.members(group).await.map_err(|e| {
        ApiError::internal(StatusCode::SERVICE_UNAVAILABLE, "reading the group's members failed", &e)
    })?;
    Ok((partitions, members.len()))
}

async fn consumer_group(state: &ApiState, group: &GroupId) -> Result<ConsumerGroupDetail, ApiError> {
    let (partitions, members) = registry_read(state, group).await?;
    Ok(crate::lag::view::group_detail(group, &lag_report(state), &partitions, members))
}

async fn reset_plan(
    state: &ApiState,
    group: &GroupId,
    request: &ResetPlanRequest,
) -> Result<ResetPlan, ApiError> {
    let (partitions, members) = registry_read(state, group).await?;
    crate::lag::view::reset_plan(group, request, &lag_report(state), &partitions, members).map_err(
        |e| match e {
            crate::lag::view::PlanError::UnknownOffsets { .. } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
            }
            _ => ApiError::bad_request(e.to_string()),
        },
    )
}

async fn topology_errors(state: &ApiState, id: &TopologyId) -> Result<TopologyErrors, ApiError> {
    let t = &state.transitions;
    if t.session().exists(&t.paths().storm(id)).await?.is_none() {
        return Err(unknown_topology(id));
    }
    let now = now_secs();
    let read = state::read_errors(t.session(), t.paths(), id).await?;
    t.metrics().garbage_znodes.inc_by(read.skipped.len() as u64);
    let errors = read
        .value
        .into_iter()
        .map(|e| TopologyError {
            component: e.component,
            // A component's error may quote its params; workers redact too, this covers
            // errors written before the topology's secrets were known to them.
            error: secrets::redact_known(&e.info.error).into_owned(),
            error_host: e.info.host,
            error_port: e.info.port,
            error_time: e.info.time_secs.saturating_mul(1000),
            error_lapsed_secs: now.saturating_sub(e.info.time_secs),
        })
        .collect();
    Ok(TopologyErrors { id: id.clone(), errors })
}

/// Streams a code file, its SHA-256 in [`CHECKSUM_HEADER`].
async fn code(state: &ApiState, id: &TopologyId, file: CodeFile) -> Result<Response<Body>, ApiError> {
    let reader = state.transitions.code().open_code(id, file).await?;
    let stream = ReaderStream::new(reader.file).map_ok(Frame::data);
    let mut response = Response::new(StreamBody::new(stream).boxed());
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(reader.size));
    // Checked to be 64 hex digits when the file was opened, so always a valid value.
    if let Ok(sum) = HeaderValue::from_str(&reader.sha256) {
        headers.insert(CHECKSUM_HEADER, sum);
    }
    Ok(response)
}

async fn submit(state: &ApiState, body: SubmitTopology) -> Result<Submitted, ApiError> {
    body.check_owner().map_err(ApiError::bad_request)?;
    let request = SubmitRequest {
        topology: body.topology_upload,
        worker_binary: body.worker_upload,
        resources: body.resources_upload,
        inactive: body.inactive,
        owner: body.owner,
    };
    let (id, base) = state.assigner.submit(request).await?;
    if let Some(replicator) = &state.replicator {
        if let Err(e) = replicator.record_own_copy(&id).await {
            tracing::warn!(topology = %id, "cannot record the leader's copy of the code: {e}");
        }
        let (min, within) = (state.config.min_replication_count, state.config.max_replication_wait);
        let held = replicator.wait_for_replicas(&id, min, within).await;
        if held < min {
            tracing::warn!(
                topology = %id, held, min,
                "topology.min.replication.count not reached within topology.max.replication.wait.time.sec; acknowledging anyway"
            );
        }
    }
    Ok(Submitted { id, name: base.name, status: base.status.as_str().to_owned(), workers: base.num_workers })
}

/// Applies a lifecycle event and answers as Storm UI does.
async fn operate(
    state: &ApiState,
    id: &TopologyId,
    operation: Operation,
    event: Event,
) -> Result<TopologyOperation, ApiError> {
    let applied = state.transitions.apply(id, event, now_secs()).await?;
    if let Some(deadline) = applied.pending_deadline_secs() {
        state.timers.arm(id.clone(), deadline).await;
    }
    let status = match &applied {
        Applied::Unchanged(base) | Applied::Updated(base) => base.status.as_str().to_ascii_uppercase(),
        Applied::Removed => "REMOVED".to_owned(),
    };
    Ok(TopologyOperation {
        topology_operation: operation,
        topology_id: id.clone(),
        status: "success".to_owned(),
        topology_status: status,
    })
}

/// `client` is the peer's address; its uploads are bounded per address.
async fn begin_upload(
    state: &ApiState,
    client: Option<std::net::IpAddr>,
    body: BeginUpload,
) -> Result<UploadBegun, ApiError> {
    let upload_id = state.transitions.code().begin_for(body.size, client).await?;
    Ok(UploadBegun { upload_id, size: body.size })
}

async fn chunk(
    state: &ApiState,
    upload: UploadId,
    offset: u64,
    bytes: &[u8],
) -> Result<ChunkReceived, ApiError> {
    let received = state.transitions.code().chunk(upload, offset, bytes).await?;
    Ok(ChunkReceived { upload_id: upload, received })
}

async fn finish_upload(
    state: &ApiState,
    upload: UploadId,
    body: FinishUpload,
) -> Result<UploadFinished, ApiError> {
    let finished = state.transitions.code().finish(upload, &body.sha256).await?;
    Ok(UploadFinished { upload_id: finished.id, size: finished.size, sha256: finished.sha256 })
}

fn authorize(state: &ApiState, request: &Request<Incoming>) -> Result<(), ApiError> {
    let Some(token) = &state.config.token else { return Ok(()) };
    match cluster_state::http::check_bearer(request.headers(), token) {
        Bearer::Valid => Ok(()),
        Bearer::Wrong => Err(ApiError::new(StatusCode::UNAUTHORIZED, "the bearer token is wrong")),
        Bearer::Missing if request.method() == Method::POST => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "this call changes the cluster and needs \"Authorization: Bearer <token>\"",
        )),
        Bearer::Missing => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "topology code is served only with \"Authorization: Bearer <token>\"",
        )),
    }
}

/// Reads a body of at most `limit` bytes; a declared or actual larger one is a 413.
async fn read_body(request: Request<Incoming>, limit: usize) -> Result<Bytes, ApiError> {
    let too_large =
        || ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("request body larger than {limit} bytes"));
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match Limited::new(request.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(too_large()),
        Err(e) => Err(ApiError::bad_request(format!("reading the request body failed: {e}"))),
    }
}

/// Reads and decodes a JSON request body; a bad one is a 400 naming the field at fault.
async fn json_body<T: DeserializeOwned>(request: Request<Incoming>, limit: usize) -> Result<T, ApiError> {
    Ok(api::decode_request(&read_body(request, limit).await?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_in_full() {
        let check = |value: &str| {
            let mut headers = hyper::HeaderMap::new();
            headers.insert(header::AUTHORIZATION, value.parse().unwrap());
            cluster_state::http::check_bearer(&headers, "secret")
        };
        assert_eq!(check("Bearer secret"), Bearer::Valid);
        assert_eq!(check("bearer   secret"), Bearer::Valid);
        assert_eq!(check("Bearer secreT"), Bearer::Wrong);
        assert_eq!(check("Bearer secret2"), Bearer::Wrong);
        assert_eq!(check("Basic secret"), Bearer::Missing);
        assert_eq!(cluster_state::http::check_bearer(&hyper::HeaderMap::new(), "secret"), Bearer::Missing);
    }

    #[test]
    fn bad_bodies_are_400s_naming_the_field() {
        let e =
            ApiError::from(api::decode_request::<RebalanceRequest>(br#"{"numWorkers":"x"}"#).unwrap_err());
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.starts_with("request body: field \"numWorkers\""), "{}", e.message);
    }
}
