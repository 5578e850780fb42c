//! Payloads of Storm's layout (Squall's own JSON, version 1). See the [module docs](super) for
//! the versioning rule: unknown versions are rejected, unknown fields within version 1 ignored.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{DecodeError, JsonObject, ZnodeData, decode_json, json_array};
use crate::ids::{ComponentId, ExecutorId, SupervisorId, TopologyId, TopologyName, WorkerSlot};

/// A topology's status (Storm's topology status), lowercase in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopologyStatus {
    /// Spouts emit.
    Active,
    /// Deployed, spouts paused.
    Inactive,
    /// Waiting for a delayed rebalance.
    Rebalancing,
    /// Waiting for a delayed kill; spouts paused.
    Killed,
}

impl TopologyStatus {
    /// The JSON and display name, e.g. `"active"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Inactive => "inactive",
            Self::Rebalancing => "rebalancing",
            Self::Killed => "killed",
        }
    }
}

impl fmt::Display for TopologyStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A transition nimbus runs when its deadline passes; stored so a restarted nimbus resumes it.
///
/// `{"action":"kill","deadline_secs":1700000330}` or
/// `{"action":"rebalance","deadline_secs":1700000330,"num_workers":3,"component_executors":{"split":4}}`
/// (`num_workers` `null` and `component_executors` `{}` mean "unchanged").
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "action", rename_all = "lowercase")]
pub enum DelayedTransition {
    /// Remove the topology at `deadline_secs`.
    Kill {
        /// When to act, in seconds since the epoch.
        deadline_secs: u64,
    },
    /// Recompute the assignment at `deadline_secs`, then return to [`StormBase::prev_status`].
    Rebalance {
        /// When to act, in seconds since the epoch.
        deadline_secs: u64,
        /// New worker count, if changed (`-n`).
        #[serde(default)]
        num_workers: Option<u32>,
        /// New parallelism of some components (`-e component=parallelism`).
        #[serde(default)]
        component_executors: BTreeMap<ComponentId, u32>,
    },
}

impl DelayedTransition {
    /// When the transition is due, in seconds since the epoch.
    pub fn deadline_secs(&self) -> u64 {
        match self {
            Self::Kill { deadline_secs } | Self::Rebalance { deadline_secs, .. } => *deadline_secs,
        }
    }

    fn to_json(&self) -> String {
        match self {
            Self::Kill { deadline_secs } => {
                JsonObject::new().field("action", "kill").field("deadline_secs", *deadline_secs).finish()
            }
            Self::Rebalance { deadline_secs, num_workers, component_executors } => JsonObject::new()
                .field("action", "rebalance")
                .field("deadline_secs", *deadline_secs)
                .field("num_workers", *num_workers)
                .raw(
                    "component_executors",
                    &JsonObject::map(component_executors.iter().map(|(c, n)| (c, *n))),
                )
                .finish(),
        }
    }
}

/// A topology's base record, at `/storm/storms/<topology-id>`.
///
/// ```json
/// {"version":1,"name":"wc","launch_time_secs":1700000000,"status":"killed","num_workers":2,
///  "component_executors":{"count":4,"split":2},"owner":"alice","prev_status":"active",
///  "pending_transition":{"action":"kill","deadline_secs":1700000330}}
/// ```
/// (one line in the znode). `prev_status` is the status to return to after a rebalance,
/// `null` otherwise; `pending_transition` is `null` when nothing is scheduled.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct StormBase {
    /// The user-given topology name.
    pub name: TopologyName,
    /// Submission time, seconds since the epoch.
    pub launch_time_secs: u64,
    /// Current status.
    pub status: TopologyStatus,
    /// Requested number of workers.
    pub num_workers: u32,
    /// Parallelism (executor count) of each component.
    pub component_executors: BTreeMap<ComponentId, u32>,
    /// The submitting user.
    pub owner: String,
    /// Status to return to once a rebalance finishes.
    #[serde(default)]
    pub prev_status: Option<TopologyStatus>,
    /// A delayed kill or rebalance not yet run.
    #[serde(default)]
    pub pending_transition: Option<DelayedTransition>,
}

impl ZnodeData for StormBase {
    const FORMAT: &'static str = "storm-base v1 JSON";

    fn encode(&self) -> Vec<u8> {
        JsonObject::versioned(1)
            .field("name", self.name.as_str())
            .field("launch_time_secs", self.launch_time_secs)
            .field("status", self.status.as_str())
            .field("num_workers", self.num_workers)
            .raw(
                "component_executors",
                &JsonObject::map(self.component_executors.iter().map(|(c, n)| (c, *n))),
            )
            .field("owner", self.owner.as_str())
            .field("prev_status", self.prev_status.map(TopologyStatus::as_str))
            .raw(
                "pending_transition",
                &self.pending_transition.as_ref().map_or("null".into(), |t| t.to_json()),
            )
            .finish()
            .into_bytes()
    }

    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        decode_json::<Self>(path, bytes, 1..=1).map(|(_, base)| base)
    }
}

/// Where one executor runs and since when.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ExecutorAssignment {
    /// The executor, `[start, end]` in JSON.
    pub executor: ExecutorId,
    /// The supervisor running it.
    pub node: SupervisorId,
    /// The worker port on that supervisor.
    pub port: u16,
    /// When it was assigned to this slot, seconds since the epoch.
    pub start_time_secs: u64,
}

impl ExecutorAssignment {
    /// The worker slot running the executor.
    pub fn slot(&self) -> WorkerSlot {
        WorkerSlot { node: self.node.clone(), port: self.port }
    }
}

/// A topology's placement, at `/storm/assignments/<topology-id>`.
///
/// ```json
/// {"version":1,"master_code_dir":"/var/squall/nimbus/stormdist/wc-1-1700000000",
///  "node_host":{"sup-a1":"host1"},
///  "executors":[{"executor":[1,2],"node":"sup-a1","port":6700,"start_time_secs":1700000005}]}
/// ```
/// (one line in the znode). Executors are a list because JSON keys must be strings. Decoding
/// rejects an executor listed twice.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Assignment {
    /// Nimbus's directory holding the topology's code.
    pub master_code_dir: String,
    /// Hostname of each supervisor used.
    pub node_host: BTreeMap<SupervisorId, String>,
    /// Slot and start time of every executor.
    pub executors: Vec<ExecutorAssignment>,
}

impl Assignment {
    /// The slot running `executor`, if it is assigned.
    pub fn slot_of(&self, executor: &ExecutorId) -> Option<WorkerSlot> {
        self.executors.iter().find(|e| e.executor == *executor).map(ExecutorAssignment::slot)
    }

    /// The executors running in `slot`.
    pub fn executors_of<'a>(&'a self, slot: &'a WorkerSlot) -> impl Iterator<Item = ExecutorId> + 'a {
        self.executors.iter().filter(move |e| e.node == slot.node && e.port == slot.port).map(|e| e.executor)
    }

    /// Every slot with at least one executor.
    pub fn slots(&self) -> BTreeSet<WorkerSlot> {
        self.executors.iter().map(ExecutorAssignment::slot).collect()
    }
}

impl ZnodeData for Assignment {
    const FORMAT: &'static str = "assignment v1 JSON";

    fn encode(&self) -> Vec<u8> {
        let executors = self.executors.iter().map(|e| {
            JsonObject::new()
                .field("executor", Vec::from(<[u32; 2]>::from(e.executor)))
                .field("node", e.node.as_str())
                .field("port", e.port)
                .field("start_time_secs", e.start_time_secs)
                .finish()
        });
        JsonObject::versioned(1)
            .field("master_code_dir", self.master_code_dir.as_str())
            .raw("node_host", &JsonObject::map(self.node_host.iter().map(|(n, h)| (n, h.as_str()))))
            .raw("executors", &json_array(executors))
            .finish()
            .into_bytes()
    }

    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        let (_, assignment) = decode_json::<Self>(path, bytes, 1..=1)?;
        let mut seen = HashSet::new();
        if let Some(dup) = assignment.executors.iter().find(|e| !seen.insert(e.executor)) {
            return Err(DecodeError::new::<Self>(
                path,
                format_args!("executor {} assigned twice", dup.executor),
            ));
        }
        Ok(assignment)
    }
}

/// The topologies whose assignment names one node, at `/storm/node-assignments/<supervisor-id>`
/// (persistent; written by the leader nimbus only when the set changes). Squall's, not Storm's:
/// a supervisor reads and watches its own index and only the assignments it lists, instead of
/// every assignment of the cluster (Storm 2 sends each supervisor its own assignments over RPC
/// for the same reason). `/storm/assignments/<id>` stays the truth; the index only says where
/// to look.
///
/// ```json
/// {"version":1,"topologies":["wc-1-1700000000","wc2-2-1700000100"]}
/// ```
/// (one line in the znode, ids sorted).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct NodeAssignments {
    /// Topologies with at least one executor on the node.
    pub topologies: BTreeSet<TopologyId>,
}

impl ZnodeData for NodeAssignments {
    const FORMAT: &'static str = "node-assignments v1 JSON";

    fn encode(&self) -> Vec<u8> {
        let ids: Vec<&str> = self.topologies.iter().map(TopologyId::as_str).collect();
        JsonObject::versioned(1).field("topologies", ids).finish().into_bytes()
    }

    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        decode_json::<Self>(path, bytes, 1..=1).map(|(_, index)| index)
    }
}

/// How a process's Prometheus `/metrics` is served: plain HTTP, or HTTPS (`supervisor.metrics.tls.*`,
/// `worker.metrics.tls.*`). Written as `"metrics_scheme":"https"` beside a `metrics_endpoint`
/// (added within version 1: written only for HTTPS, absent reads as HTTP), and published by
/// nimbus's discovery as the target's `__scheme__`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsScheme {
    #[default]
    Http,
    Https,
}

impl MetricsScheme {
    /// `https` when `tls`.
    pub fn from_tls(tls: bool) -> Self {
        if tls { MetricsScheme::Https } else { MetricsScheme::Http }
    }

    /// As Prometheus spells it (`__scheme__`).
    pub fn as_str(self) -> &'static str {
        match self {
            MetricsScheme::Http => "http",
            MetricsScheme::Https => "https",
        }
    }

    /// Whether it is the default (HTTP), which is not written.
    pub fn is_http(&self) -> bool {
        *self == MetricsScheme::Http
    }
}

/// A live supervisor, at `/storm/supervisors/<supervisor-id>` (ephemeral).
///
/// ```json
/// {"version":1,"time_secs":1700000100,"hostname":"host1","supervisor_id":"sup-a1",
///  "used_ports":[6700],"all_ports":[6700,6701],"uptime_secs":100,"squall_version":"0.1.0",
///  "metrics_endpoint":"host1:9100"}
/// ```
/// (one line in the znode). `all_ports` is Storm's `meta`; `squall_version` is named so to stay
/// apart from the format `version`; `metrics_endpoint` is `null` when metrics are off;
/// `"metrics_scheme":"https"` follows it when they are served over TLS ([`MetricsScheme`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SupervisorInfo {
    /// Last heartbeat, seconds since the epoch.
    pub time_secs: u64,
    /// The supervisor's hostname.
    pub hostname: String,
    /// Its id (also the znode name).
    pub supervisor_id: SupervisorId,
    /// Ports with a running worker.
    pub used_ports: Vec<u16>,
    /// All worker ports it offers (`supervisor.slots.ports`).
    pub all_ports: Vec<u16>,
    /// Seconds since it started.
    pub uptime_secs: u64,
    /// Squall version of the supervisor.
    #[serde(rename = "squall_version")]
    pub version: String,
    /// `host:port` of its Prometheus `/metrics`, for discovery.
    #[serde(default)]
    pub metrics_endpoint: Option<String>,
    /// How `metrics_endpoint` is served.
    #[serde(default)]
    pub metrics_scheme: MetricsScheme,
}

impl SupervisorInfo {
    /// A supervisor just started at `time_secs`: nothing running, no metrics endpoint.
    pub fn starting(
        supervisor_id: SupervisorId,
        hostname: String,
        all_ports: Vec<u16>,
        time_secs: u64,
    ) -> Self {
        SupervisorInfo {
            time_secs,
            hostname,
            supervisor_id,
            used_ports: Vec::new(),
            all_ports,
            uptime_secs: 0,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            metrics_endpoint: None,
            metrics_scheme: MetricsScheme::Http,
        }
    }
}

impl ZnodeData for SupervisorInfo {
    const FORMAT: &'static str = "supervisor-info v1 JSON";

    fn encode(&self) -> Vec<u8> {
        let object = JsonObject::versioned(1)
            .field("time_secs", self.time_secs)
            .field("hostname", self.hostname.as_str())
            .field("supervisor_id", self.supervisor_id.as_str())
            .field("used_ports", self.used_ports.as_slice())
            .field("all_ports", self.all_ports.as_slice())
            .field("uptime_secs", self.uptime_secs)
            .field("squall_version", self.version.as_str())
            .field("metrics_endpoint", self.metrics_endpoint.as_deref());
        with_scheme(object, self.metrics_scheme).finish().into_bytes()
    }

    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        decode_json::<Self>(path, bytes, 1..=1).map(|(_, info)| info)
    }
}

/// A live nimbus, at `/storm/nimbuses/<host:port>` (ephemeral; Storm's `NimbusSummary`).
///
/// ```json
/// {"version":1,"host":"nimbus1","port":8080,"start_time_secs":1700000000,"uptime_secs":0,
///  "squall_version":"0.1.0","is_leader":false}
/// ```
/// (one line in the znode). Written when the nimbus joins and again when it becomes leader, so
/// `uptime_secs` is as of the last write; readers compute the uptime from `start_time_secs`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NimbusSummary {
    /// The host clients reach its API at.
    pub host: String,
    /// Its API port.
    pub port: u16,
    /// When it started, seconds since the epoch.
    pub start_time_secs: u64,
    /// Seconds it had been up when this was written.
    pub uptime_secs: u64,
    /// Squall version of the nimbus.
    #[serde(rename = "squall_version")]
    pub version: String,
    /// Whether it holds the leadership.
    pub is_leader: bool,
}

impl NimbusSummary {
    /// `host:port`, the node's name and what clients connect to.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

impl ZnodeData for NimbusSummary {
    const FORMAT: &'static str = "nimbus-summary v1 JSON";

    fn encode(&self) -> Vec<u8> {
        JsonObject::versioned(1)
            .field("host", self.host.as_str())
            .field("port", self.port)
            .field("start_time_secs", self.start_time_secs)
            .field("uptime_secs", self.uptime_secs)
            .field("squall_version", self.version.as_str())
            .field("is_leader", self.is_leader)
            .finish()
            .into_bytes()
    }

    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        decode_json::<Self>(path, bytes, 1..=1).map(|(_, info)| info)
    }
}

/// Counters and average latencies of one executor since its worker started.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ExecutorStats {
    /// The executor.
    pub executor: ExecutorId,
    /// Tuples emitted.
    pub emitted: u64,
    /// Tuples sent to other tasks.
    pub transferred: u64,
    /// Tuples acked.
    pub acked: u64,
    /// Tuples failed.
    pub failed: u64,
    /// Average time in `execute` (bolts), milliseconds.
    pub execute_latency_ms: f64,
    /// Average time from receipt to ack (bolts), milliseconds.
    pub process_latency_ms: f64,
    /// Average time from emit to full ack of a tuple tree (spouts), milliseconds.
    pub complete_latency_ms: f64,
}

/// A finite latency for JSON; a non-finite average (no samples, or a bug) is written as 0
/// (serde_json writes a NaN as `null`, which no reader takes).
pub(crate) fn finite_latency(ms: f64) -> f64 {
    if ms.is_finite() { ms } else { 0.0 }
}

impl ExecutorStats {
    fn to_json(&self) -> String {
        JsonObject::new()
            .field("executor", Vec::from(<[u32; 2]>::from(self.executor)))
            .field("emitted", self.emitted)
            .field("transferred", self.transferred)
            .field("acked", self.acked)
            .field("failed", self.failed)
            .field("execute_latency_ms", finite_latency(self.execute_latency_ms))
            .field("process_latency_ms", finite_latency(self.process_latency_ms))
            .field("complete_latency_ms", finite_latency(self.complete_latency_ms))
            .finish()
    }
}

/// A worker's heartbeat, at `/storm/workerbeats/<topology-id>/<node>-<port>`.
///
/// ```json
/// {"version":1,"topology_id":"wc-1-1700000000","executor_stats":[{"executor":[1,2],
///  "emitted":10,"transferred":10,"acked":8,"failed":1,"execute_latency_ms":0.5,
///  "process_latency_ms":0.25,"complete_latency_ms":12.0}],"start_time_secs":1700000010,
///  "time_secs":1700000070,"uptime_secs":60,"metrics_endpoint":"host1:38211"}
/// ```
/// (one line in the znode). Latencies are averages; a non-finite one is written as `0.0`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct WorkerHeartbeat {
    /// The topology the worker runs.
    pub topology_id: TopologyId,
    /// Stats of each of its executors.
    pub executor_stats: Vec<ExecutorStats>,
    /// When the worker started, seconds since the epoch.
    pub start_time_secs: u64,
    /// When this heartbeat was written, seconds since the epoch.
    pub time_secs: u64,
    /// Seconds since the worker started.
    pub uptime_secs: u64,
    /// `host:port` of the worker's Prometheus `/metrics`, for discovery (added within version
    /// 1: written only when set, absent reads as `None`).
    #[serde(default)]
    pub metrics_endpoint: Option<String>,
    /// How `metrics_endpoint` is served (`"metrics_scheme":"https"`, written only for HTTPS).
    #[serde(default)]
    pub metrics_scheme: MetricsScheme,
}

impl WorkerHeartbeat {
    /// Whether `self` says something `previous` did not, for the throttled
    /// `/storm/workerbeats` writes (`squall.workerbeats.zk.secs`): the topology, start time,
    /// metrics endpoint, the executors, or any executor's counter or latency at two
    /// significant digits (what a person reading Storm UI's figures would notice). `time_secs`
    /// and `uptime_secs` change on every beat and are not content; a node is rewritten only
    /// when its content changed, and then with every field as it is now.
    pub fn content_differs(&self, previous: &WorkerHeartbeat) -> bool {
        let key = |b: &WorkerHeartbeat| {
            (
                b.topology_id.clone(),
                b.start_time_secs,
                b.metrics_endpoint.clone(),
                b.metrics_scheme,
                b.executor_stats
                    .iter()
                    .map(|s| {
                        (
                            s.executor,
                            [s.emitted, s.transferred, s.acked, s.failed].map(two_digits),
                            [s.execute_latency_ms, s.process_latency_ms, s.complete_latency_ms]
                                .map(two_digits_f64),
                        )
                    })
                    .collect::<Vec<_>>(),
            )
        };
        key(self) != key(previous)
    }
}

/// When a worker writes its `/storm/workerbeats` node (`squall.workerbeats.zk.secs`): at once,
/// then only when its content changed ([`WorkerHeartbeat::content_differs`]) and at least
/// `every` after the previous write. Liveness goes to nimbus through the supervisor's
/// aggregated heartbeat; the node is for tools reading Storm's layout. The worker process and
/// the scale bench's simulated workers decide with it.
#[derive(Debug, Clone)]
pub struct WorkerbeatThrottle {
    every: std::time::Duration,
    last: Option<(WorkerHeartbeat, tokio::time::Instant)>,
}

impl WorkerbeatThrottle {
    pub fn new(every: std::time::Duration) -> Self {
        WorkerbeatThrottle { every, last: None }
    }

    /// Whether `beat` should be written at `now`: pass the instants of evenly spaced ticks
    /// (not the time a write finished, or every other tick of a `every`-long interval is
    /// skipped).
    pub fn due(&self, beat: &WorkerHeartbeat, now: tokio::time::Instant) -> bool {
        self.last
            .as_ref()
            .is_none_or(|(last, at)| now.duration_since(*at) >= self.every && beat.content_differs(last))
    }

    /// `beat` was written at `now`.
    pub fn written(&mut self, beat: WorkerHeartbeat, now: tokio::time::Instant) {
        self.last = Some((beat, now));
    }
}

/// `n` with all but its two most significant decimal digits zeroed (`12_345` -> `12_000`).
pub fn two_digits(n: u64) -> u64 {
    let mut scale = 1;
    while n / scale >= 100 {
        scale *= 10;
    }
    n / scale * scale
}

/// A latency at two significant digits, as (mantissa, decimal exponent); non-finite as 0.
fn two_digits_f64(x: f64) -> (i64, i32) {
    if !x.is_finite() || x == 0.0 {
        return (0, 0);
    }
    // Two digits before the point: 10..=99 (rounding may give 100, which compares fine).
    #[allow(clippy::cast_possible_truncation)]
    let exponent = x.abs().log10().floor() as i32 - 1;
    #[allow(clippy::cast_possible_truncation)]
    let mantissa = (x / 10f64.powi(exponent)).round() as i64;
    (mantissa, exponent)
}

impl ZnodeData for WorkerHeartbeat {
    const FORMAT: &'static str = "worker-heartbeat v1 JSON";

    fn encode(&self) -> Vec<u8> {
        let object = JsonObject::versioned(1)
            .field("topology_id", self.topology_id.as_str())
            .raw("executor_stats", &json_array(self.executor_stats.iter().map(ExecutorStats::to_json)))
            .field("start_time_secs", self.start_time_secs)
            .field("time_secs", self.time_secs)
            .field("uptime_secs", self.uptime_secs);
        let object = match &self.metrics_endpoint {
            Some(endpoint) => object.field("metrics_endpoint", endpoint.as_str()),
            None => object,
        };
        with_scheme(object, self.metrics_scheme).finish().into_bytes()
    }

    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        decode_json::<Self>(path, bytes, 1..=1).map(|(_, beat)| beat)
    }
}

/// An error a component reported, at `/storm/errors/<topology-id>/<component-id>/e<seq>`.
///
/// ```json
/// {"version":1,"error":"connection refused","time_secs":1700000200,"host":"host1","port":6700}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ErrorInfo {
    /// The error text (message and, where available, its chain of causes).
    pub error: String,
    /// When it was reported, seconds since the epoch.
    pub time_secs: u64,
    /// Host of the reporting worker.
    pub host: String,
    /// Port of the reporting worker.
    pub port: u16,
}

impl ZnodeData for ErrorInfo {
    const FORMAT: &'static str = "error-info v1 JSON";

    fn encode(&self) -> Vec<u8> {
        JsonObject::versioned(1)
            .field("error", self.error.as_str())
            .field("time_secs", self.time_secs)
            .field("host", self.host.as_str())
            .field("port", self.port)
            .finish()
            .into_bytes()
    }

    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        decode_json::<Self>(path, bytes, 1..=1).map(|(_, info)| info)
    }
}

/// A worker's local heartbeat: not a znode but a file, `<storm.local.dir>/workers/<worker-id>/heartbeat`,
/// written by the worker every `worker.heartbeat.frequency.secs` and read by its supervisor
/// (Storm's worker `LocalState` heartbeat). Same wire-format rules as the znodes:
///
/// ```json
/// {"version":1,"time_secs":1700000070,"topology_id":"wc-1-1700000000","executors":[[1,2],[3,3]],"port":6700}
/// ```
/// Added within version 1 (written only when set, absent reads as empty), for the supervisor's
/// aggregated heartbeat to nimbus: `"start_time_secs":N`, `"executor_stats":[...]` (as in
/// [`WorkerHeartbeat`]), `"metrics_endpoint":"host:port"` and `"metrics_scheme":"https"`; for
/// the supervisor's writes of the worker's `/storm/workerbeats` node,
/// `"workerbeats_zk_secs":N` (its topology's `squall.workerbeats.zk.secs`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct LocalWorkerHeartbeat {
    /// When the worker wrote it, seconds since the epoch (same machine as the reader).
    pub time_secs: u64,
    /// The topology the worker runs.
    pub topology_id: TopologyId,
    /// The executors it runs.
    pub executors: Vec<ExecutorId>,
    /// Its slot's port.
    pub port: u16,
    /// When the worker started, seconds since the epoch (`None`: an older worker).
    #[serde(default)]
    pub start_time_secs: Option<u64>,
    /// Stats of each of its executors (empty: an older worker).
    #[serde(default)]
    pub executor_stats: Vec<ExecutorStats>,
    /// `host:port` of the worker's Prometheus `/metrics`.
    #[serde(default)]
    pub metrics_endpoint: Option<String>,
    /// How `metrics_endpoint` is served.
    #[serde(default)]
    pub metrics_scheme: MetricsScheme,
    /// The topology's `squall.workerbeats.zk.secs`: the shortest time between two writes of
    /// the worker's `/storm/workerbeats` node, which its supervisor writes (`None`: an older
    /// worker; the supervisor's own setting applies).
    #[serde(default)]
    pub workerbeats_zk_secs: Option<u64>,
}

/// The `/storm/workerbeats` node a worker's local heartbeat becomes, whoever writes it (the
/// worker running alone, or its supervisor).
impl From<&LocalWorkerHeartbeat> for WorkerHeartbeat {
    fn from(local: &LocalWorkerHeartbeat) -> Self {
        let start = local.start_time_secs.unwrap_or(0);
        WorkerHeartbeat {
            topology_id: local.topology_id.clone(),
            executor_stats: local.executor_stats.clone(),
            start_time_secs: start,
            time_secs: local.time_secs,
            uptime_secs: if start == 0 { 0 } else { local.time_secs.saturating_sub(start) },
            metrics_endpoint: local.metrics_endpoint.clone(),
            metrics_scheme: local.metrics_scheme,
        }
    }
}

impl LocalWorkerHeartbeat {
    /// Where the heartbeat of `worker_id` lives under a supervisor's local dir. Worker ids are
    /// generated by the supervisor (never taken from a client), so they are safe path segments.
    pub fn path(local_dir: &std::path::Path, worker_id: &str) -> std::path::PathBuf {
        local_dir.join("workers").join(worker_id).join("heartbeat")
    }
}

impl ZnodeData for LocalWorkerHeartbeat {
    const FORMAT: &'static str = "local-worker-heartbeat v1 JSON";

    fn encode(&self) -> Vec<u8> {
        let object = JsonObject::versioned(1)
            .field("time_secs", self.time_secs)
            .field("topology_id", self.topology_id.as_str())
            .raw(
                "executors",
                &json_array(
                    self.executors.iter().map(|e| format!("[{},{}]", e.start_task().0, e.end_task().0)),
                ),
            )
            .field("port", self.port);
        let object = match self.start_time_secs {
            Some(start) => object.field("start_time_secs", start),
            None => object,
        };
        let object = if self.executor_stats.is_empty() {
            object
        } else {
            object.raw("executor_stats", &json_array(self.executor_stats.iter().map(ExecutorStats::to_json)))
        };
        let object = match &self.metrics_endpoint {
            Some(endpoint) => object.field("metrics_endpoint", endpoint.as_str()),
            None => object,
        };
        let object = with_scheme(object, self.metrics_scheme);
        let object = match self.workerbeats_zk_secs {
            Some(secs) => object.field("workerbeats_zk_secs", secs),
            None => object,
        };
        object.finish().into_bytes()
    }

    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        decode_json::<Self>(path, bytes, 1..=1).map(|(_, beat)| beat)
    }
}

/// `object` with `"metrics_scheme"` when it is not the default (HTTP, which older readers
/// assume).
fn with_scheme(object: JsonObject, scheme: MetricsScheme) -> JsonObject {
    if scheme.is_http() { object } else { object.field("metrics_scheme", scheme.as_str()) }
}
