//! Request and response bodies, with Storm UI's REST API key names (camelCase). Requests refuse
//! unknown fields except where Storm's own clients send more (rebalance); responses ignore them,
//! so nimbus can add a field without breaking older clients. Golden-tested in
//! `cluster-state/tests/api_formats.rs`: a key here is a wire name, never renamed.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use crate::api::UploadId;
use crate::ids::{ComponentId, GroupId, SupervisorId, Topic, TopologyId, TopologyName};

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

/// `GET /api/v1/topology/:id[?window=600]`: Storm UI's topology page. The summary, the base
/// record's settings, and Storm 2's `topologyStats` (windows `600` and `:all-time`), `spouts`,
/// `bolts` (stats of the requested window, `:all-time` by default), `workers` and
/// `configuration` (the topology file's `config`, secrets redacted). The fields after
/// `pendingTransition` read as empty when absent (a nimbus from before they existed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// `topology.message.timeout.secs`.
    #[serde(default)]
    pub msg_timeout: u64,
    /// The window of `spouts` and `bolts`.
    #[serde(default)]
    pub window: StatsWindow,
    #[serde(default)]
    pub window_hint: String,
    #[serde(default)]
    pub topology_stats: Vec<WindowStats>,
    #[serde(default)]
    pub spouts: Vec<SpoutSummary>,
    #[serde(default)]
    pub bolts: Vec<BoltSummary>,
    #[serde(default)]
    pub workers: Vec<WorkerSummary>,
    #[serde(default)]
    pub configuration: BTreeMap<String, serde_json::Value>,
}

/// A stats window: Storm UI's `:all-time` or a number of seconds (`600`, the only other window
/// nimbus keeps). Written as Storm writes it: the string `":all-time"` or `"600"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, PartialOrd, Ord)]
pub enum StatsWindow {
    #[default]
    AllTime,
    Secs(u64),
}

impl StatsWindow {
    /// Storm UI's ten-minute window.
    pub const TEN_MINUTES: StatsWindow = StatsWindow::Secs(600);
    /// Every window nimbus keeps, as `topologyStats` lists them.
    pub const KEPT: [StatsWindow; 2] = [StatsWindow::TEN_MINUTES, StatsWindow::AllTime];

    /// Storm UI's `windowPretty` / `windowHint`: `10m 0s`, `All time`.
    pub fn pretty(self) -> String {
        match self {
            StatsWindow::AllTime => "All time".to_owned(),
            StatsWindow::Secs(secs) => pretty_secs(secs),
        }
    }

    /// The window's length, `None` for all time.
    pub fn secs(self) -> Option<u64> {
        match self {
            StatsWindow::AllTime => None,
            StatsWindow::Secs(secs) => Some(secs),
        }
    }
}

impl fmt::Display for StatsWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatsWindow::AllTime => f.write_str(":all-time"),
            StatsWindow::Secs(secs) => write!(f, "{secs}"),
        }
    }
}

impl std::str::FromStr for StatsWindow {
    type Err = String;
    /// `:all-time` or `600` (the windows nimbus keeps).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            ":all-time" => Ok(StatsWindow::AllTime),
            "600" => Ok(StatsWindow::TEN_MINUTES),
            other => Err(format!(
                "window {:?}: \":all-time\" or \"600\" is required (the windows nimbus keeps)",
                other.chars().take(40).collect::<String>()
            )),
        }
    }
}

impl Serialize for StatsWindow {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for StatsWindow {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        match text.as_str() {
            ":all-time" => Ok(StatsWindow::AllTime),
            digits => digits.parse().map(StatsWindow::Secs).map_err(|_| {
                de::Error::invalid_value(de::Unexpected::Str(digits), &"\":all-time\" or a number of seconds")
            }),
        }
    }
}

/// Storm UI's duration format (uptimes, windows): `1d 2h 3m 4s`, leading zero units left out.
pub fn pretty_secs(secs: u64) -> String {
    let units = [(secs / 86_400, "d"), (secs / 3600 % 24, "h"), (secs / 60 % 60, "m"), (secs % 60, "s")];
    let first = units.iter().position(|&(n, _)| n > 0).unwrap_or(units.len() - 1);
    units[first..].iter().map(|(n, unit)| format!("{n}{unit}")).collect::<Vec<_>>().join(" ")
}

/// A latency or capacity as Storm UI writes it: a decimal string with three places.
pub fn storm_decimal(value: f64) -> String {
    format!("{:.3}", crate::znode::storm::finite_latency(value))
}

/// One window of a topology's or a spout's stats (`topologyStats`, `spoutSummary`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WindowStats {
    pub window_pretty: String,
    pub window: StatsWindow,
    pub emitted: u64,
    pub transferred: u64,
    /// Milliseconds, a decimal string ([`storm_decimal`]).
    pub complete_latency: String,
    pub acked: u64,
    pub failed: u64,
}

/// One window of a bolt's stats (`boltStats`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BoltWindowStats {
    pub window_pretty: String,
    pub window: StatsWindow,
    pub emitted: u64,
    pub transferred: u64,
    pub executed: u64,
    pub execute_latency: String,
    pub process_latency: String,
    pub capacity: String,
    pub acked: u64,
    pub failed: u64,
}

/// A component's last error as Storm UI's spout and bolt rows show it (empty and nulls when
/// there is none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LastError {
    pub last_error: String,
    pub error_host: String,
    pub error_port: Option<u16>,
    /// Seconds since the epoch (Storm's unit here, unlike `componentErrors`).
    pub error_time: Option<u64>,
    pub error_lapsed_secs: Option<u64>,
}

/// A row of the topology page's `spouts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpoutSummary {
    pub spout_id: ComponentId,
    pub executors: usize,
    pub tasks: u64,
    pub emitted: u64,
    pub transferred: u64,
    pub acked: u64,
    pub failed: u64,
    pub complete_latency: String,
    #[serde(flatten)]
    pub last_error: LastError,
}

/// A row of the topology page's `bolts`. `capacity` is Storm's: executed x average execute
/// latency / the last ten minutes (or the executors' uptime when shorter), of the busiest
/// executor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BoltSummary {
    pub bolt_id: ComponentId,
    pub executors: usize,
    pub tasks: u64,
    pub emitted: u64,
    pub transferred: u64,
    pub acked: u64,
    pub failed: u64,
    pub executed: u64,
    pub execute_latency: String,
    pub process_latency: String,
    pub capacity: String,
    #[serde(flatten)]
    pub last_error: LastError,
}

/// A worker of a topology (`workers`), from the assignment and the supervisors' reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerSummary {
    pub supervisor_id: SupervisorId,
    pub host: String,
    pub port: u16,
    pub topology_id: TopologyId,
    pub topology_name: TopologyName,
    pub executors_total: usize,
    /// Tasks per component on this worker.
    pub component_num_tasks: BTreeMap<ComponentId, u64>,
    /// Empty and 0 until the worker has reported.
    pub uptime: String,
    pub uptime_seconds: u64,
    /// Storm UI's link to the worker's log: its supervisor's log viewer, the last lines of
    /// `worker.log`; empty when the supervisor publishes no HTTP endpoint.
    #[serde(default)]
    pub worker_log_link: String,
    /// `host:port` of the supervisor's log viewer (its HTTP port, beside `/metrics`), which
    /// `squall logs` calls with [`crate::api::LogRoute`]s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_viewer: Option<String>,
    /// How `logViewer` is served (`"logViewerScheme":"https"`; absent: HTTP).
    #[serde(default, skip_serializing_if = "crate::znode::MetricsScheme::is_http")]
    pub log_viewer_scheme: crate::znode::MetricsScheme,
}

/// `GET /api/v1/topology/:id/component/:component[?window=600]`: Storm UI's component page.
/// Spouts carry `spoutSummary`, bolts `boltStats` (one entry per kept window); both carry
/// `executorStats` for the requested window and the component's errors, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ComponentPage {
    pub id: ComponentId,
    /// The topology's name.
    pub name: TopologyName,
    pub topology_id: TopologyId,
    pub topology_status: String,
    /// The topology's owner.
    pub user: String,
    /// `spout` or `bolt`.
    pub component_type: String,
    pub executors: usize,
    pub tasks: u64,
    pub window: StatsWindow,
    pub window_hint: String,
    pub component_errors: Vec<TopologyError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spout_summary: Option<Vec<WindowStats>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bolt_stats: Option<Vec<BoltWindowStats>>,
    pub executor_stats: Vec<ExecutorSummary>,
}

/// One executor of a component page. Spouts carry `completeLatency`; bolts `executed`,
/// `executeLatency`, `processLatency` and `capacity`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutorSummary {
    /// Storm's `[start-end]`.
    pub id: String,
    pub host: String,
    pub port: u16,
    pub uptime: String,
    pub uptime_seconds: u64,
    pub emitted: u64,
    pub transferred: u64,
    pub acked: u64,
    pub failed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_latency: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execute_latency: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_latency: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<String>,
}

/// `GET /api/v1/topology/:id/visualization`: Storm UI's component graph, keyed by component
/// (system components left out), with Storm's `:`-prefixed keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Visualization(pub BTreeMap<ComponentId, VisualizationNode>);

/// One component of the [`Visualization`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VisualizationNode {
    /// `spout` or `bolt`.
    #[serde(rename = ":type")]
    pub kind: String,
    /// Bolts: the capacity (0 to 1+); spouts: 0.
    #[serde(rename = ":capacity")]
    pub capacity: f64,
    /// Spouts: complete latency; bolts: process latency (ms). `null` before any stats.
    #[serde(rename = ":latency")]
    pub latency: Option<f64>,
    /// Tuples transferred over the last ten minutes (all time while younger).
    #[serde(rename = ":transferred")]
    pub transferred: u64,
    /// Per worker running the component.
    #[serde(rename = ":stats")]
    pub stats: Vec<VisualizationStat>,
    /// The component's page in the UI.
    #[serde(rename = ":link")]
    pub link: String,
    /// The streams into it.
    #[serde(rename = ":inputs")]
    pub inputs: Vec<VisualizationInput>,
}

/// A worker's share of a component, in a [`VisualizationNode`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VisualizationStat {
    #[serde(rename = ":host")]
    pub host: String,
    #[serde(rename = ":port")]
    pub port: u16,
    #[serde(rename = ":uptime_secs")]
    pub uptime_secs: u64,
    /// Window (`600`, `:all-time`) -> sanitized stream -> tuples transferred. Squall counts per
    /// component, not per stream: every count is under the component's first output stream.
    #[serde(rename = ":transferred")]
    pub transferred: BTreeMap<String, BTreeMap<String, u64>>,
}

/// A stream into a component, in a [`VisualizationNode`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VisualizationInput {
    #[serde(rename = ":component")]
    pub component: ComponentId,
    #[serde(rename = ":stream")]
    pub stream: String,
    /// The stream id made safe for an HTML id: `s` and the id with every character other than
    /// an ASCII letter or digit replaced by `_`.
    #[serde(rename = ":sani-stream")]
    pub sani_stream: String,
    #[serde(rename = ":grouping")]
    pub grouping: String,
}

impl VisualizationInput {
    /// [`VisualizationInput::sani_stream`] of `stream`.
    pub fn sanitize(stream: &str) -> String {
        let safe: String = stream.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
        format!("s{safe}")
    }
}

/// `GET /api/v1/cluster/configuration`: nimbus's configuration with Storm's key names, as
/// Storm UI shows it (a flat object). `nimbus.http.token` and any other secret key is
/// replaced by `<redacted>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ClusterConfiguration(pub BTreeMap<String, serde_json::Value>);

/// `GET /api/v1/consumergroup/summary`: every consumer group under `/consumers` as nimbus's
/// lag evaluator last judged it (Burrow's statuses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerGroups {
    pub groups: Vec<ConsumerGroupSummary>,
    /// When the evaluator's last pass finished (seconds since the epoch), 0 before the first.
    pub evaluated_at_secs: u64,
}

/// One group of [`ConsumerGroups`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerGroupSummary {
    pub group: GroupId,
    /// Members registered under `/consumers/<group>/ids`.
    pub members: usize,
    /// Burrow's group status: `OK`, `WARN`, `ERR`, `NOTFOUND`.
    pub status: String,
    /// The worst partition's status (`STOP`, `STALL`, `REWIND` stay themselves).
    pub worst_status: String,
    pub partitions: usize,
    /// The sum of the known partition lags.
    pub total_lag: u64,
}

/// `GET /api/v1/consumergroup/:group`: per partition the committed offset, log end, lag,
/// owner and lag status (Kafka's ConsumerOffsetChecker columns and Burrow's verdict).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerGroupDetail {
    #[serde(flatten)]
    pub summary: ConsumerGroupSummary,
    pub partitions_detail: Vec<ConsumerPartition>,
}

/// One partition of a [`ConsumerGroupDetail`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerPartition {
    pub topic: Topic,
    pub partition: i32,
    /// `None` where nothing is committed.
    pub committed_offset: Option<i64>,
    /// `None` while the brokers' log end is unknown.
    pub log_end_offset: Option<i64>,
    pub lag: Option<u64>,
    /// The owning consumer thread id, `None` when nobody owns the partition.
    pub owner: Option<String>,
    /// Burrow's partition status (`NOTFOUND` before the evaluator saw it).
    pub status: String,
}

/// `POST /api/v1/consumergroup/:group/reset-plan`: what `squall offsets reset` would write,
/// computed and never written (a dry run).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResetPlanRequest {
    /// Only this topic's partitions (all of the group's when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<Topic>,
    pub to: ResetTarget,
    /// The offset for `offset`, the shift for `shiftBy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<i64>,
}

/// Where a reset plan goes, as `squall offsets reset --to-earliest | --to-latest |
/// --to-offset N | --shift-by N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ResetTarget {
    Earliest,
    Latest,
    Offset,
    ShiftBy,
}

impl ResetPlanRequest {
    /// What serde cannot check: `offset` and `shiftBy` need a value, the others take none.
    pub fn validate(&self) -> Result<(), crate::api::BodyError> {
        let needs = matches!(self.to, ResetTarget::Offset | ResetTarget::ShiftBy);
        let problem = match (needs, self.value) {
            (true, None) => Some("a value is required with \"offset\" and \"shiftBy\""),
            (false, Some(_)) => Some("a value is taken only with \"offset\" and \"shiftBy\""),
            (true, Some(v)) if self.to == ResetTarget::Offset && v < 0 => Some("an offset is never negative"),
            _ => None,
        };
        match problem {
            Some(message) => Err(crate::api::BodyError::Invalid {
                field: Some("value".to_owned()),
                source: de::Error::custom(message),
            }),
            None => Ok(()),
        }
    }
}

/// The answer to a [`ResetPlanRequest`]: the plan, per partition; nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResetPlan {
    pub group: GroupId,
    /// Always `true`: the API only plans; `squall offsets reset --execute` writes.
    pub dry_run: bool,
    /// Live members: a reset would be refused while there are any.
    pub members: usize,
    pub partitions: Vec<ResetPlanRow>,
}

/// One partition of a [`ResetPlan`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResetPlanRow {
    pub topic: Topic,
    pub partition: i32,
    pub current_offset: Option<i64>,
    pub target_offset: i64,
    /// Set when the target was clamped into the broker's `[earliest, log end]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
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
    /// The finished upload of the shell components' resources archive
    /// (`crate::resources`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources_upload: Option<UploadId>,
    /// Submit deactivated.
    #[serde(default, deserialize_with = "null_as_default")]
    pub inactive: bool,
    /// Who submitted it (at most 256 characters, no control characters; nimbus checks).
    #[serde(default, deserialize_with = "null_as_default")]
    pub owner: String,
}

impl SubmitTopology {
    /// A topology file alone (built-in components), submitted active by `owner`.
    pub fn file(topology_upload: UploadId, owner: impl Into<String>) -> Self {
        SubmitTopology {
            topology_upload,
            worker_upload: None,
            resources_upload: None,
            inactive: false,
            owner: owner.into(),
        }
    }
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

impl From<&crate::znode::ExecutorStats> for ExecutorStatsReport {
    fn from(s: &crate::znode::ExecutorStats) -> Self {
        ExecutorStatsReport {
            executor: s.executor,
            emitted: s.emitted,
            transferred: s.transferred,
            acked: s.acked,
            failed: s.failed,
            execute_latency_ms: crate::znode::storm::finite_latency(s.execute_latency_ms),
            process_latency_ms: crate::znode::storm::finite_latency(s.process_latency_ms),
            complete_latency_ms: crate::znode::storm::finite_latency(s.complete_latency_ms),
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

/// `GET /api/v1/logs/:topology-id/:port` on a supervisor: the worker's log files present, live
/// ones first, then rotated ones newest first.
///
/// ```json
/// {"topologyId":"wc-1-1700000000","port":6700,
///  "files":[{"file":"worker.log","size":1200},{"file":"worker.log.1","size":104857500}]}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerLogFiles {
    pub topology_id: TopologyId,
    pub port: u16,
    pub files: Vec<WorkerLogFile>,
}

/// One file of [`WorkerLogFiles`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerLogFile {
    pub file: crate::worker_logs::LogFile,
    /// Bytes.
    pub size: u64,
}

/// `GET /api/v1/logs/:topology-id/:port/:file[?...]` on a supervisor: part of a worker's log.
/// `start` and `length` are the bytes of the file returned (a tail's `start` is where its first
/// line begins); `fileSize` is the file's size when read, so a client following it asks from
/// `start + length` next. `data` is the bytes as text (invalid UTF-8 replaced).
///
/// ```json
/// {"topologyId":"wc-1-1700000000","port":6700,"file":"worker.log","fileSize":5120,
///  "start":5000,"length":120,"data":"2026-11-23T21:00:00Z INFO ...\n"}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerLogChunk {
    pub topology_id: TopologyId,
    pub port: u16,
    pub file: crate::worker_logs::LogFile,
    pub file_size: u64,
    pub start: u64,
    pub length: u64,
    pub data: String,
}

/// `POST /api/v1/topology/:id/logconfig` (Storm UI's, `storm set_log_level`): levels to set on
/// the topology's running workers, by logger (`ROOT` or a module path).
///
/// ```json
/// {"namedLoggerLevels":{"kafka_spout":{"target_level":"DEBUG","timeout":30}}}
/// ```
/// `timeout` is in seconds, 0 (the default) for ever; a logger not named keeps what it had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogConfigRequest {
    pub named_logger_levels: BTreeMap<crate::znode::LoggerName, LoggerLevelRequest>,
}

/// One logger of a [`LogConfigRequest`] (Storm's keys).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoggerLevelRequest {
    pub target_level: crate::znode::LogLevel,
    #[serde(default)]
    pub timeout: u64,
}

/// The answer to a [`LogConfigRequest`]: the topology's levels now, each with the epoch (ms)
/// it ends at, if it does.
///
/// ```json
/// {"namedLoggerLevels":{"kafka_spout":{"target_level":"DEBUG","timeout_epoch":1700000030000}}}
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogConfigView {
    pub named_logger_levels: BTreeMap<crate::znode::LoggerName, LoggerLevelView>,
}

/// One logger of a [`LogConfigView`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggerLevelView {
    pub target_level: crate::znode::LogLevel,
    #[serde(default)]
    pub timeout_epoch: Option<u64>,
}

impl From<&crate::znode::LogConfig> for LogConfigView {
    fn from(config: &crate::znode::LogConfig) -> Self {
        let levels = config.named_logger_level.iter().map(|(name, level)| {
            let view = LoggerLevelView {
                target_level: level.target_log_level,
                timeout_epoch: level.reset_log_level_timeout_epoch_ms,
            };
            (name.clone(), view)
        });
        LogConfigView { named_logger_levels: levels.collect() }
    }
}
