//! Request and response bodies, with Storm UI's REST API key names (camelCase). Requests refuse
//! unknown fields except where Storm's own clients send more (rebalance); responses ignore them,
//! so nimbus can add a field without breaking older clients. Golden-tested in
//! `cluster-state/tests/api_formats.rs`: a key here is a wire name, never renamed.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use crate::api::UploadId;
use crate::ids::{ComponentId, SupervisorId, TopologyId, TopologyName};

/// Every error: `{"error": "<reason phrase>", "errorMessage": "<what is wrong>"}`. A nimbus
/// that is not the leader refuses a mutating call with a 503 and adds `"leader": "host:port"`
/// when it knows who leads, for the client to call there instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    /// The HTTP reason phrase, e.g. `Bad Request`.
    pub error: String,
    pub error_message: String,
    /// Set only on a follower's refusal: the leader's API address, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// Set only on a follower's refusal (`true` even when no leader is known yet).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_leader: bool,
}

impl ErrorBody {
    /// An error body without a leader hint.
    pub fn new(error: impl Into<String>, error_message: impl Into<String>) -> Self {
        ErrorBody {
            error: error.into(),
            error_message: error_message.into(),
            leader: None,
            not_leader: false,
        }
    }
}

/// `GET /api/v1/nimbus/summary`: every live nimbus and who leads (Storm UI's shape).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NimbusSummaries {
    pub nimbuses: Vec<NimbusSummaryView>,
}

/// One nimbus of [`NimbusSummaries`], with Storm UI's keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NimbusSummaryView {
    pub host: String,
    pub port: u16,
    /// `Leader`, `Not a Leader` (Storm UI's words) or `Offline` (a seed that is not registered).
    pub status: String,
    pub version: String,
    pub nimbus_up_time: String,
    pub nimbus_up_time_seconds: u64,
}

impl NimbusSummaryView {
    /// Storm UI's status of a leader.
    pub const LEADER: &'static str = "Leader";
    /// Storm UI's status of a follower.
    pub const NOT_A_LEADER: &'static str = "Not a Leader";

    /// `host:port`.
    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    pub fn is_leader(&self) -> bool {
        self.status == Self::LEADER
    }
}

/// `GET /api/v1/cluster/summary`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSummary {
    /// Storm's key, carrying Squall's version.
    pub storm_version: String,
    pub nimbus_uptime: String,
    pub nimbus_uptime_seconds: u64,
    pub supervisors: usize,
    pub slots_total: usize,
    pub slots_used: usize,
    pub slots_free: usize,
    pub executors_total: usize,
    pub tasks_total: u64,
    pub topologies: usize,
}

/// `GET /api/v1/supervisor/summary`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SupervisorSummaries {
    pub supervisors: Vec<SupervisorSummary>,
}

/// One supervisor of [`SupervisorSummaries`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SupervisorSummary {
    pub id: SupervisorId,
    pub host: String,
    pub uptime: String,
    pub uptime_seconds: u64,
    pub slots_total: usize,
    pub slots_used: usize,
    pub version: String,
}

/// `GET /api/v1/topology/summary`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologySummaries {
    pub topologies: Vec<TopologySummary>,
}

/// One topology of [`TopologySummaries`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologySummary {
    pub id: TopologyId,
    pub name: TopologyName,
    /// Storm UI's upper-case status: `ACTIVE`, `INACTIVE`, `REBALANCING`, `KILLED`.
    pub status: String,
    pub uptime: String,
    pub uptime_seconds: u64,
    pub tasks_total: u64,
    pub workers_total: usize,
    pub executors_total: usize,
    pub owner: String,
}

/// `GET /api/v1/topology/:id`: the summary plus the base record's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyDetail {
    #[serde(flatten)]
    pub summary: TopologySummary,
    pub launch_time_secs: u64,
    /// Storm UI's key for the configured worker count.
    pub requested_workers: u32,
    pub component_executors: BTreeMap<ComponentId, u32>,
    /// The status a rebalance returns to (upper case).
    pub prev_status: Option<String>,
    pub pending_transition: Option<PendingTransitionView>,
}

/// A delayed kill or rebalance as the topology view shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingTransitionView {
    pub action: PendingAction,
    pub deadline_secs: u64,
    pub seconds_left: u64,
}

/// What a delayed transition will do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PendingAction {
    Kill,
    Rebalance,
}

/// `GET /api/v1/topology/:id/errors`: newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyErrors {
    pub id: TopologyId,
    pub errors: Vec<TopologyError>,
}

/// One error a component reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyError {
    pub component: ComponentId,
    pub error: String,
    pub error_host: String,
    pub error_port: u16,
    /// Milliseconds since the epoch (Storm UI's unit).
    pub error_time: u64,
    pub error_lapsed_secs: u64,
}

/// One group of `GET /api/v1/prometheus/targets` (Prometheus `http_sd`): one process, with
/// bounded labels (`squall_role`, `supervisor`, `squall_topology`, `port`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetGroup {
    pub targets: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

/// `POST /api/v1/topology/submit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubmitTopology {
    /// The finished upload of the topology file.
    pub topology_upload: UploadId,
    /// The finished upload of the user's worker binary, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_upload: Option<UploadId>,
    /// Submit deactivated.
    #[serde(default, deserialize_with = "null_as_default")]
    pub inactive: bool,
    /// Who submitted it (at most 256 characters, no control characters; nimbus checks).
    #[serde(default, deserialize_with = "null_as_default")]
    pub owner: String,
}

impl SubmitTopology {
    /// Longest owner nimbus takes.
    pub const MAX_OWNER_CHARS: usize = 256;

    /// Nimbus's check of the owner field, worded for the submitter.
    pub fn check_owner(&self) -> Result<(), String> {
        if self.owner.len() > Self::MAX_OWNER_CHARS || self.owner.chars().any(char::is_control) {
            return Err(format!(
                "field \"owner\": a user name (at most {} characters, no control characters) is required",
                Self::MAX_OWNER_CHARS
            ));
        }
        Ok(())
    }
}

/// `201` answer to [`SubmitTopology`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Submitted {
    pub id: TopologyId,
    pub name: TopologyName,
    /// The stored status, lower case (`active`, `inactive`).
    pub status: String,
    pub workers: u32,
}

/// The operations of `POST /api/v1/topology/:id/<operation>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    Activate,
    Deactivate,
    Kill,
    Rebalance,
}

/// Storm UI's answer to an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyOperation {
    pub topology_operation: Operation,
    pub topology_id: TopologyId,
    /// Always `success` (a failure is an [`ErrorBody`]).
    pub status: String,
    /// The status after the operation, upper case, or `REMOVED`.
    pub topology_status: String,
}

/// `POST /api/v1/topology/:id/rebalance/:wait-time`. Storm UI nests the options under
/// `rebalanceOptions` (and may send a `callback`, so unknown fields are ignored); options at the
/// top level are taken too. An empty body changes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RebalanceRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebalance_options: Option<RebalanceOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_workers: Option<Count>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executors: Option<BTreeMap<ComponentId, Count>>,
}

impl RebalanceRequest {
    /// The body Storm UI sends.
    pub fn new(options: RebalanceOptions) -> Self {
        RebalanceRequest { rebalance_options: Some(options), ..Default::default() }
    }

    /// The options, nested or at the top level (nested wins).
    pub fn into_options(self) -> RebalanceOptions {
        self.rebalance_options.unwrap_or(RebalanceOptions {
            num_workers: self.num_workers,
            executors: self.executors.unwrap_or_default(),
        })
    }
}

/// What a rebalance changes: the worker count, components' executor counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RebalanceOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_workers: Option<Count>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty", deserialize_with = "null_as_default")]
    pub executors: BTreeMap<ComponentId, Count>,
}

/// A count Storm UI sends as a number or a decimal string (its executor counts are strings);
/// always written as a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Count(pub u32);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CountVisitor;
        impl Visitor<'_> for CountVisitor {
            type Value = Count;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative integer (a number or a decimal string)")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Count, E> {
                u32::try_from(n).map(Count).map_err(|_| E::invalid_value(de::Unexpected::Unsigned(n), &self))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Count, E> {
                u64::try_from(n)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(n), &self))
                    .and_then(|n| self.visit_u64(n))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Count, E> {
                let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
                match s.parse::<u32>() {
                    Ok(n) if digits => Ok(Count(n)),
                    _ => Err(E::invalid_value(de::Unexpected::Str(s), &self)),
                }
            }
        }
        deserializer.deserialize_any(CountVisitor)
    }
}

/// `POST /api/v1/uploads`: the size of what will be uploaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BeginUpload {
    pub size: u64,
}

/// `201` answer to [`BeginUpload`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UploadBegun {
    pub upload_id: UploadId,
    pub size: u64,
}

/// Answer to a chunk: the bytes received so far.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChunkReceived {
    pub upload_id: UploadId,
    pub received: u64,
}

/// `POST /api/v1/uploads/:id/finish`: the SHA-256 of the whole upload, hex.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinishUpload {
    pub sha256: String,
}

/// Answer to [`FinishUpload`]: the upload is verified and waits for a submit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UploadFinished {
    pub upload_id: UploadId,
    pub size: u64,
    pub sha256: String,
}

/// `null` reads as the default, as Storm's clients send it for "not set".
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// `POST /api/v1/supervisor/heartbeat`: one supervisor's aggregated heartbeat, every
/// `supervisor.heartbeat.frequency.secs`, to the leader nimbus (Storm 2's
/// `sendSupervisorWorkerHeartbeats`): every worker it runs, as read from the workers' local
/// heartbeat files. Nimbus keeps these in memory for liveness, the API and discovery; this is
/// what keeps worker liveness out of ZooKeeper. Unknown fields are refused.
///
/// ```json
/// {"supervisorId":"sup-1","timeSecs":1700000070,"uptimeSecs":60,"workers":[{"topologyId":"wc-1-1700000000",
///  "port":6700,"executors":[[1,2]],"timeSecs":1700000069,"startTimeSecs":1700000010,"uptimeSecs":59,
///  "executorStats":[...],"metricsEndpoint":"host1:38211"}]}
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SupervisorHeartbeat {
    pub supervisor_id: SupervisorId,
    /// The supervisor's clock when it sent this (nimbus never compares it with its own).
    pub time_secs: u64,
    pub uptime_secs: u64,
    pub workers: Vec<WorkerReport>,
}

/// One worker of a [`SupervisorHeartbeat`]: its local heartbeat, forwarded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerReport {
    pub topology_id: TopologyId,
    /// The slot's port on the sending supervisor (1 to 65535).
    #[serde(deserialize_with = "worker_port")]
    pub port: u16,
    pub executors: Vec<crate::ids::ExecutorId>,
    /// The worker's last local heartbeat time (its machine's clock): nimbus watches it change.
    pub time_secs: u64,
    #[serde(default)]
    pub start_time_secs: u64,
    #[serde(default)]
    pub uptime_secs: u64,
    #[serde(default)]
    pub executor_stats: Vec<ExecutorStatsReport>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_endpoint: Option<String>,
    /// How `metrics_endpoint` is served (`"metricsScheme":"https"`; absent: HTTP).
    #[serde(default, skip_serializing_if = "crate::znode::MetricsScheme::is_http")]
    pub metrics_scheme: crate::znode::MetricsScheme,
}

/// An executor's counters and average latencies, in a [`WorkerReport`] (the znode's
/// [`crate::znode::ExecutorStats`] with the API's camelCase keys).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecutorStatsReport {
    pub executor: crate::ids::ExecutorId,
    pub emitted: u64,
    pub transferred: u64,
    pub acked: u64,
    pub failed: u64,
    pub execute_latency_ms: f64,
    pub process_latency_ms: f64,
    pub complete_latency_ms: f64,
}

/// A finite latency for JSON (serde_json writes a NaN as `null`, which no reader takes).
fn finite(ms: f64) -> f64 {
    if ms.is_finite() { ms } else { 0.0 }
}

impl From<&crate::znode::ExecutorStats> for ExecutorStatsReport {
    fn from(s: &crate::znode::ExecutorStats) -> Self {
        ExecutorStatsReport {
            executor: s.executor,
            emitted: s.emitted,
            transferred: s.transferred,
            acked: s.acked,
            failed: s.failed,
            execute_latency_ms: finite(s.execute_latency_ms),
            process_latency_ms: finite(s.process_latency_ms),
            complete_latency_ms: finite(s.complete_latency_ms),
        }
    }
}

impl From<&ExecutorStatsReport> for crate::znode::ExecutorStats {
    fn from(s: &ExecutorStatsReport) -> Self {
        crate::znode::ExecutorStats {
            executor: s.executor,
            emitted: s.emitted,
            transferred: s.transferred,
            acked: s.acked,
            failed: s.failed,
            execute_latency_ms: s.execute_latency_ms,
            process_latency_ms: s.process_latency_ms,
            complete_latency_ms: s.complete_latency_ms,
        }
    }
}

fn worker_port<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u16, D::Error> {
    match u16::deserialize(deserializer)? {
        0 => Err(de::Error::custom("a worker port is 1 to 65535, not 0")),
        port => Ok(port),
    }
}

impl SupervisorHeartbeat {
    /// What serde cannot check: each port reported once. The error names the field.
    pub fn validate(&self) -> Result<(), crate::api::BodyError> {
        let mut seen = std::collections::BTreeSet::new();
        for (i, worker) in self.workers.iter().enumerate() {
            if !seen.insert(worker.port) {
                return Err(crate::api::BodyError::Invalid {
                    field: Some(format!("workers[{i}].port")),
                    source: de::Error::custom(format!("port {} is reported twice", worker.port)),
                });
            }
        }
        Ok(())
    }
}

/// The answer to a [`SupervisorHeartbeat`]: how many workers nimbus recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatAccepted {
    pub workers: usize,
}
