//! Storm UI's topology page, component page and component graph as pure functions of what
//! nimbus knows: the base record and assignment, the topology file's structure and graph, the
//! executors' counters as the supervisors last reported them (or the workerbeat znodes), the
//! counters at the start of the ten-minute window ([`StatsHistory`]) and the reported errors.
//!
//! Windows: `:all-time` is the counters since each worker started (a restarted worker starts
//! again from 0, as in Storm); `600` is the latest counters minus those of the newest sample at
//! least ten minutes old (or the oldest sample, while nimbus has seen the executor for less). A
//! counter that went down (the worker restarted within the window) counts from 0.
//!
//! Latencies are the workers' averages since they started (Squall's heartbeats carry no
//! per-window sums), averaged over executors weighted by acked (complete latency) or executed
//! tuples (execute and process latency). A bolt executor's `executed` is its acked plus failed
//! inputs (every built-in bolt acks or fails each input); its capacity is Storm's: executed in
//! the window x average execute latency / the window (the time nimbus has seen it, when
//! shorter); a component's capacity is its busiest executor's.

use std::collections::{BTreeMap, HashMap, VecDeque};

use cluster_state::api::{
    BoltSummary, BoltWindowStats, ComponentPage, ExecutorSummary, LastError, LogRead, LogRoute, SpoutSummary,
    StatsWindow, TopologyDetail, TopologyError, Visualization, VisualizationInput, VisualizationNode,
    VisualizationStat, WindowStats, WorkerSummary, storm_decimal,
};
use cluster_state::ids::{ComponentId, ExecutorId, SupervisorId, TopologyId, WorkerSlot};
use cluster_state::layout::TaskLayout;
use cluster_state::structure::{ComponentKind, TopologyGraph};
use cluster_state::worker_logs::LogFile;
use cluster_state::znode::{Assignment, ExecutorStats, StormBase, SupervisorInfo};

use crate::views::pretty_uptime;

/// The length of Storm UI's ten-minute window.
pub const TEN_MINUTES_SECS: u64 = 600;
/// How often a sample of an executor's counters is kept for the window.
pub const SAMPLE_EVERY_SECS: u64 = 10;

/// One worker's latest report: its slot, uptime and executors' counters.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerStats {
    pub slot: WorkerSlot,
    pub uptime_secs: u64,
    pub executors: Vec<ExecutorStats>,
}

#[derive(Debug, Clone, PartialEq)]
struct Sample {
    at_secs: u64,
    stats: ExecutorStats,
}

/// Samples of every executor's counters over the last ten minutes, one every
/// [`SAMPLE_EVERY_SECS`], on nimbus's clock: where the `600` window starts.
#[derive(Debug, Default)]
pub struct StatsHistory {
    samples: HashMap<(TopologyId, ExecutorId), VecDeque<Sample>>,
    /// When [`StatsHistory::forget_stale`] last looked at every executor.
    swept_at_secs: u64,
}

impl StatsHistory {
    /// Takes a report's counters seen at `now_secs` (nimbus's clock).
    pub fn record<'a>(
        &mut self,
        topology: &TopologyId,
        stats: impl IntoIterator<Item = &'a ExecutorStats>,
        now_secs: u64,
    ) {
        for s in stats {
            let samples = self.samples.entry((topology.clone(), s.executor)).or_default();
            if samples.back().is_some_and(|last| now_secs < last.at_secs.saturating_add(SAMPLE_EVERY_SECS)) {
                continue;
            }
            samples.push_back(Sample { at_secs: now_secs, stats: s.clone() });
            // Keep one sample at or before the window's start, none older.
            let start = now_secs.saturating_sub(TEN_MINUTES_SECS);
            while samples.len() > 1 && samples.get(1).is_some_and(|next| next.at_secs <= start) {
                samples.pop_front();
            }
        }
    }

    /// Forgets executors not reported for longer than the window (gone, moved or killed). Called
    /// at every supervisor's heartbeat, it looks at every executor at most once per
    /// [`SAMPLE_EVERY_SECS`]: at 2,000 supervisors that is 400 calls a second over 60,000
    /// executors, which swept every time was most of nimbus's CPU.
    pub fn forget_stale(&mut self, now_secs: u64) {
        if self.swept_at_secs != 0 && now_secs < self.swept_at_secs.saturating_add(SAMPLE_EVERY_SECS) {
            return;
        }
        self.swept_at_secs = now_secs;
        let limit = TEN_MINUTES_SECS + SAMPLE_EVERY_SECS;
        self.samples
            .retain(|_, samples| samples.back().is_some_and(|s| now_secs.saturating_sub(s.at_secs) <= limit));
    }

    /// Where each executor's `600` window starts: its counters then and how long ago that was.
    pub fn window_starts(
        &self,
        topology: &TopologyId,
        now_secs: u64,
    ) -> HashMap<ExecutorId, (ExecutorStats, u64)> {
        let start = now_secs.saturating_sub(TEN_MINUTES_SECS);
        self.samples
            .iter()
            .filter(|((t, _), _)| t == topology)
            .filter_map(|((_, executor), samples)| {
                let base = samples.iter().rev().find(|s| s.at_secs <= start).or_else(|| samples.front())?;
                Some((*executor, (base.stats.clone(), now_secs.saturating_sub(base.at_secs))))
            })
            .collect()
    }
}

/// Counts of one executor in one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    emitted: u64,
    transferred: u64,
    acked: u64,
    failed: u64,
}

impl Counts {
    fn of(s: &ExecutorStats) -> Counts {
        Counts { emitted: s.emitted, transferred: s.transferred, acked: s.acked, failed: s.failed }
    }

    /// `latest - base`, counting from 0 when a counter went down (a restarted worker).
    fn since(latest: &ExecutorStats, base: &ExecutorStats) -> Counts {
        let restarted = latest.emitted < base.emitted
            || latest.transferred < base.transferred
            || latest.acked < base.acked
            || latest.failed < base.failed;
        if restarted {
            return Counts::of(latest);
        }
        Counts {
            emitted: latest.emitted - base.emitted,
            transferred: latest.transferred - base.transferred,
            acked: latest.acked - base.acked,
            failed: latest.failed - base.failed,
        }
    }

    fn executed(&self) -> u64 {
        self.acked.saturating_add(self.failed)
    }

    fn add(&mut self, other: Counts) {
        self.emitted = self.emitted.saturating_add(other.emitted);
        self.transferred = self.transferred.saturating_add(other.transferred);
        self.acked = self.acked.saturating_add(other.acked);
        self.failed = self.failed.saturating_add(other.failed);
    }
}

/// One assigned executor with what is known of it.
#[derive(Debug, Clone)]
struct ExecutorRow {
    executor: ExecutorId,
    component: ComponentId,
    slot: WorkerSlot,
    host: String,
    uptime_secs: u64,
    all: Counts,
    ten: Counts,
    /// The `600` window's length for this executor (shorter while nimbus has seen it less).
    ten_span_secs: u64,
    latest: Option<ExecutorStats>,
}

impl ExecutorRow {
    fn counts(&self, window: StatsWindow) -> Counts {
        if window == StatsWindow::AllTime { self.all } else { self.ten }
    }

    /// Storm's capacity over the ten-minute window.
    fn capacity(&self) -> f64 {
        let Some(latest) = &self.latest else { return 0.0 };
        let span = if self.ten_span_secs > 0 { self.ten_span_secs } else { self.uptime_secs };
        if span == 0 {
            return 0.0;
        }
        self.ten.executed() as f64 * finite(latest.execute_latency_ms) / (span as f64 * 1000.0)
    }
}

fn finite(ms: f64) -> f64 {
    if ms.is_finite() && ms > 0.0 { ms } else { 0.0 }
}

/// Everything the pages of one topology are computed from.
#[derive(Debug, Clone)]
pub struct TopologyInputs<'a> {
    pub id: &'a TopologyId,
    pub base: &'a StormBase,
    pub assignment: Option<&'a Assignment>,
    pub supervisors: &'a BTreeMap<SupervisorId, SupervisorInfo>,
    /// Executor -> component (the assignment's executors).
    pub layout: &'a TaskLayout,
    pub graph: &'a TopologyGraph,
    /// The workers' latest reports.
    pub workers: &'a [WorkerStats],
    /// [`StatsHistory::window_starts`].
    pub window_starts: &'a HashMap<ExecutorId, (ExecutorStats, u64)>,
    /// Newest first.
    pub errors: &'a [TopologyError],
    pub now_secs: u64,
}

impl TopologyInputs<'_> {
    fn rows(&self) -> Vec<ExecutorRow> {
        let mut reported: HashMap<(ExecutorId, &WorkerSlot), (&ExecutorStats, u64)> = HashMap::new();
        for w in self.workers {
            for s in &w.executors {
                reported.insert((s.executor, &w.slot), (s, w.uptime_secs));
            }
        }
        let Some(assignment) = self.assignment else { return Vec::new() };
        assignment
            .executors
            .iter()
            .filter_map(|e| {
                let component = self.layout.executors.get(&e.executor)?.clone();
                let slot = WorkerSlot { node: e.node.clone(), port: e.port };
                let host = self.host(&e.node);
                let latest = reported.get(&(e.executor, &slot)).copied();
                let all = latest.map(|(s, _)| Counts::of(s)).unwrap_or_default();
                let (ten, ten_span_secs) = match (latest, self.window_starts.get(&e.executor)) {
                    (Some((s, _)), Some((base, span))) => (Counts::since(s, base), *span),
                    _ => (all, 0),
                };
                Some(ExecutorRow {
                    executor: e.executor,
                    component,
                    slot,
                    host,
                    uptime_secs: latest.map_or(0, |(_, up)| up),
                    all,
                    ten,
                    ten_span_secs,
                    latest: latest.map(|(s, _)| s.clone()),
                })
            })
            .collect()
    }

    fn host(&self, node: &SupervisorId) -> String {
        self.assignment
            .and_then(|a| a.node_host.get(node).cloned())
            .or_else(|| self.supervisors.get(node).map(|s| s.hostname.clone()))
            .unwrap_or_else(|| node.to_string())
    }

    fn kind(&self, component: &ComponentId) -> Option<ComponentKind> {
        self.graph.components.get(component).copied()
    }

    fn last_error(&self, component: &ComponentId) -> LastError {
        match self.errors.iter().find(|e| &e.component == component) {
            Some(e) => LastError {
                last_error: e.error.clone(),
                error_host: e.error_host.clone(),
                error_port: Some(e.error_port),
                error_time: Some(e.error_time / 1000),
                error_lapsed_secs: Some(e.error_lapsed_secs),
            },
            None => LastError::default(),
        }
    }

    fn tasks(&self, component: &ComponentId) -> u64 {
        self.layout.component_tasks.get(component).map_or(0, |t| t.len() as u64)
    }
}

/// Averages of one component's executors over one window.
#[derive(Debug, Clone, Default)]
struct Aggregate {
    executors: usize,
    counts: Counts,
    complete_ms: f64,
    execute_ms: f64,
    process_ms: f64,
    capacity: f64,
}

fn aggregate<'a>(rows: impl IntoIterator<Item = &'a ExecutorRow>, window: StatsWindow) -> Aggregate {
    let mut out = Aggregate::default();
    let (mut complete_w, mut execute_w) = (0.0, 0.0);
    for row in rows {
        out.executors += 1;
        let counts = row.counts(window);
        out.counts.add(counts);
        out.capacity = out.capacity.max(row.capacity());
        if let Some(latest) = &row.latest {
            // Weighted by the executor's all-time tuples: its averages are all-time ones.
            let acked = row.all.acked as f64;
            out.complete_ms += finite(latest.complete_latency_ms) * acked;
            complete_w += acked;
            let executed = row.all.executed() as f64;
            out.execute_ms += finite(latest.execute_latency_ms) * executed;
            out.process_ms += finite(latest.process_latency_ms) * executed;
            execute_w += executed;
        }
    }
    let divide = |sum: f64, weight: f64| if weight > 0.0 { sum / weight } else { 0.0 };
    out.complete_ms = divide(out.complete_ms, complete_w);
    out.execute_ms = divide(out.execute_ms, execute_w);
    out.process_ms = divide(out.process_ms, execute_w);
    out
}

fn window_stats(window: StatsWindow, a: &Aggregate) -> WindowStats {
    WindowStats {
        window_pretty: window.pretty(),
        window,
        emitted: a.counts.emitted,
        transferred: a.counts.transferred,
        complete_latency: storm_decimal(a.complete_ms),
        acked: a.counts.acked,
        failed: a.counts.failed,
    }
}

fn bolt_window_stats(window: StatsWindow, a: &Aggregate) -> BoltWindowStats {
    BoltWindowStats {
        window_pretty: window.pretty(),
        window,
        emitted: a.counts.emitted,
        transferred: a.counts.transferred,
        executed: a.counts.executed(),
        execute_latency: storm_decimal(a.execute_ms),
        process_latency: storm_decimal(a.process_ms),
        capacity: storm_decimal(a.capacity),
        acked: a.counts.acked,
        failed: a.counts.failed,
    }
}

/// Fills `detail` (the summary part already set) with Storm UI's topology page: `topologyStats`
/// (the spouts' tuples: emitted and transferred of every user component, acked, failed and
/// complete latency of the spouts, as Storm counts them), `spouts` and `bolts` for `window`,
/// `workers` and `configuration`.
pub fn fill_topology(detail: &mut TopologyDetail, inputs: &TopologyInputs<'_>, window: StatsWindow) {
    let rows = inputs.rows();
    let mut by_component: BTreeMap<&ComponentId, Vec<&ExecutorRow>> = BTreeMap::new();
    for row in &rows {
        by_component.entry(&row.component).or_default().push(row);
    }
    detail.window = window;
    detail.window_hint = window.pretty();
    detail.msg_timeout = inputs
        .graph
        .config
        .get("topology.message.timeout.secs")
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(30);
    detail.configuration = inputs.graph.config.clone();
    detail.topology_stats = StatsWindow::KEPT
        .iter()
        .map(|&w| {
            let user = rows.iter().filter(|r| inputs.kind(&r.component).is_some());
            let mut all = aggregate(user, w);
            let spouts =
                aggregate(rows.iter().filter(|r| inputs.kind(&r.component) == Some(ComponentKind::Spout)), w);
            all.counts.acked = spouts.counts.acked;
            all.counts.failed = spouts.counts.failed;
            all.complete_ms = spouts.complete_ms;
            window_stats(w, &all)
        })
        .collect();
    detail.spouts.clear();
    detail.bolts.clear();
    for (component, kind) in &inputs.graph.components {
        let own = by_component.get(component).map(Vec::as_slice).unwrap_or_default();
        let a = aggregate(own.iter().copied(), window);
        let tasks = inputs.tasks(component);
        let last_error = inputs.last_error(component);
        match kind {
            ComponentKind::Spout => detail.spouts.push(SpoutSummary {
                spout_id: component.clone(),
                executors: a.executors,
                tasks,
                emitted: a.counts.emitted,
                transferred: a.counts.transferred,
                acked: a.counts.acked,
                failed: a.counts.failed,
                complete_latency: storm_decimal(a.complete_ms),
                last_error,
            }),
            ComponentKind::Bolt => detail.bolts.push(BoltSummary {
                bolt_id: component.clone(),
                executors: a.executors,
                tasks,
                emitted: a.counts.emitted,
                transferred: a.counts.transferred,
                acked: a.counts.acked,
                failed: a.counts.failed,
                executed: a.counts.executed(),
                execute_latency: storm_decimal(a.execute_ms),
                process_latency: storm_decimal(a.process_ms),
                capacity: storm_decimal(a.capacity),
                last_error,
            }),
        }
    }
    let mut workers: BTreeMap<&WorkerSlot, Vec<&ExecutorRow>> = BTreeMap::new();
    for row in &rows {
        workers.entry(&row.slot).or_default().push(row);
    }
    let uptimes: HashMap<&WorkerSlot, u64> =
        inputs.workers.iter().map(|w| (&w.slot, w.uptime_secs)).collect();
    detail.workers = workers
        .into_iter()
        .map(|(slot, rows)| {
            let mut tasks: BTreeMap<ComponentId, u64> = BTreeMap::new();
            for row in &rows {
                *tasks.entry(row.component.clone()).or_default() += row.executor.tasks().count() as u64;
            }
            let uptime = uptimes.get(slot).copied();
            let supervisor = inputs.supervisors.get(&slot.node);
            let log_viewer = supervisor.and_then(|s| s.metrics_endpoint.clone());
            let log_viewer_scheme = supervisor.map(|s| s.metrics_scheme).unwrap_or_default();
            let worker_log_link = log_viewer
                .as_ref()
                .map(|endpoint| {
                    let route = LogRoute::Read {
                        topology: inputs.id.clone(),
                        port: slot.port,
                        file: LogFile::LOG,
                        read: LogRead::default(),
                    };
                    format!("{}://{endpoint}{}", log_viewer_scheme.as_str(), route.path_and_query())
                })
                .unwrap_or_default();
            WorkerSummary {
                supervisor_id: slot.node.clone(),
                host: rows.first().map(|r| r.host.clone()).unwrap_or_default(),
                port: slot.port,
                topology_id: inputs.id.clone(),
                topology_name: inputs.base.name.clone(),
                executors_total: rows.len(),
                component_num_tasks: tasks,
                uptime: uptime.map(pretty_uptime).unwrap_or_default(),
                uptime_seconds: uptime.unwrap_or(0),
                worker_log_link,
                log_viewer,
                log_viewer_scheme,
            }
        })
        .collect();
}

/// Storm UI's component page, `None` when the topology has no such spout or bolt.
pub fn component_page(
    inputs: &TopologyInputs<'_>,
    component: &ComponentId,
    window: StatsWindow,
) -> Option<ComponentPage> {
    let kind = inputs.kind(component)?;
    let rows: Vec<ExecutorRow> = inputs.rows().into_iter().filter(|r| &r.component == component).collect();
    let (spout_summary, bolt_stats) = match kind {
        ComponentKind::Spout => {
            (Some(StatsWindow::KEPT.iter().map(|&w| window_stats(w, &aggregate(&rows, w))).collect()), None)
        }
        ComponentKind::Bolt => (
            None,
            Some(StatsWindow::KEPT.iter().map(|&w| bolt_window_stats(w, &aggregate(&rows, w))).collect()),
        ),
    };
    let executor_stats = rows
        .iter()
        .map(|row| {
            let c = row.counts(window);
            let latest = row.latest.clone();
            let ms =
                |f: fn(&ExecutorStats) -> f64| storm_decimal(latest.as_ref().map_or(0.0, |s| finite(f(s))));
            let spout = kind == ComponentKind::Spout;
            ExecutorSummary {
                id: format!("[{}-{}]", row.executor.start_task().0, row.executor.end_task().0),
                host: row.host.clone(),
                port: row.slot.port,
                uptime: pretty_uptime(row.uptime_secs),
                uptime_seconds: row.uptime_secs,
                emitted: c.emitted,
                transferred: c.transferred,
                acked: c.acked,
                failed: c.failed,
                complete_latency: spout.then(|| ms(|s| s.complete_latency_ms)),
                executed: (!spout).then(|| c.executed()),
                execute_latency: (!spout).then(|| ms(|s| s.execute_latency_ms)),
                process_latency: (!spout).then(|| ms(|s| s.process_latency_ms)),
                capacity: (!spout).then(|| storm_decimal(row.capacity())),
            }
        })
        .collect();
    Some(ComponentPage {
        id: component.clone(),
        name: inputs.base.name.clone(),
        topology_id: inputs.id.clone(),
        topology_status: inputs.base.status.as_str().to_ascii_uppercase(),
        user: inputs.base.owner.clone(),
        component_type: kind.as_str().to_owned(),
        executors: rows.len(),
        tasks: inputs.tasks(component),
        window,
        window_hint: window.pretty(),
        component_errors: inputs.errors.iter().filter(|e| &e.component == component).cloned().collect(),
        spout_summary,
        bolt_stats,
        executor_stats,
    })
}

/// Storm UI's component graph. `link` makes a component's page address.
pub fn visualization(inputs: &TopologyInputs<'_>, link: impl Fn(&ComponentId) -> String) -> Visualization {
    let rows = inputs.rows();
    let mut nodes = BTreeMap::new();
    for (component, kind) in &inputs.graph.components {
        let own: Vec<&ExecutorRow> = rows.iter().filter(|r| &r.component == component).collect();
        let a = aggregate(own.iter().copied(), StatsWindow::TEN_MINUTES);
        let reported = own.iter().any(|r| r.latest.is_some());
        let first_stream = inputs.graph.streams.iter().find(|s| &s.from == component).map_or_else(
            || VisualizationInput::sanitize("default"),
            |s| VisualizationInput::sanitize(&s.stream),
        );
        let mut per_worker: BTreeMap<&WorkerSlot, (String, u64, Counts, Counts)> = BTreeMap::new();
        for row in &own {
            let entry = per_worker
                .entry(&row.slot)
                .or_insert_with(|| (row.host.clone(), row.uptime_secs, Counts::default(), Counts::default()));
            entry.2.add(row.ten);
            entry.3.add(row.all);
        }
        let stats = per_worker
            .into_iter()
            .map(|(slot, (host, uptime_secs, ten, all))| VisualizationStat {
                host,
                port: slot.port,
                uptime_secs,
                transferred: [
                    (
                        StatsWindow::TEN_MINUTES.to_string(),
                        BTreeMap::from([(first_stream.clone(), ten.transferred)]),
                    ),
                    (
                        StatsWindow::AllTime.to_string(),
                        BTreeMap::from([(first_stream.clone(), all.transferred)]),
                    ),
                ]
                .into_iter()
                .collect(),
            })
            .collect();
        let inputs_of = inputs
            .graph
            .inputs(component)
            .map(|s| VisualizationInput {
                component: s.from.clone(),
                stream: s.stream.clone(),
                sani_stream: VisualizationInput::sanitize(&s.stream),
                grouping: s.grouping.clone(),
            })
            .collect();
        let (capacity, latency) = match kind {
            ComponentKind::Spout => (0.0, a.complete_ms),
            ComponentKind::Bolt => (a.capacity, a.process_ms),
        };
        nodes.insert(
            component.clone(),
            VisualizationNode {
                kind: kind.as_str().to_owned(),
                capacity,
                latency: reported.then_some(latency),
                transferred: a.counts.transferred,
                stats,
                link: link(component),
                inputs: inputs_of,
            },
        );
    }
    Visualization(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cluster_state::ids::{TaskId, TopologyName};
    use cluster_state::structure::TopologyStructure;
    use cluster_state::znode::{ExecutorAssignment, TopologyStatus};

    const NOW: u64 = 1_700_100_000;
    const FLUX: &str = "name: wc\nconfig: {topology.message.timeout.secs: 45, topology.acker.executors: 0}\n\
        spouts: [{id: words, className: gen}]\nbolts: [{id: count, className: count, parallelism: 2}]\n\
        streams: [{from: words, to: count, grouping: {type: FIELDS, args: [word]}}]\n";

    fn stats(
        executor: ExecutorId,
        emitted: u64,
        acked: u64,
        execute_ms: f64,
        complete_ms: f64,
    ) -> ExecutorStats {
        ExecutorStats {
            executor,
            emitted,
            transferred: emitted,
            acked,
            failed: 1,
            execute_latency_ms: execute_ms,
            process_latency_ms: execute_ms,
            complete_latency_ms: complete_ms,
        }
    }

    struct Fixture {
        id: TopologyId,
        base: StormBase,
        assignment: Assignment,
        layout: TaskLayout,
        graph: TopologyGraph,
        supervisors: BTreeMap<SupervisorId, SupervisorInfo>,
    }

    fn fixture() -> Fixture {
        let structure = TopologyStructure::from_flux(FLUX).unwrap();
        let layout = structure.layout(&structure.component_executors());
        let node: SupervisorId = "sup-a".parse().unwrap();
        let assignment = Assignment {
            master_code_dir: String::new(),
            node_host: BTreeMap::from([(node.clone(), "host-a".to_owned())]),
            executors: layout
                .executors
                .keys()
                .enumerate()
                .map(|(i, e)| ExecutorAssignment {
                    executor: *e,
                    node: node.clone(),
                    port: 6700 + (i as u16 % 2),
                    start_time_secs: NOW - 900,
                })
                .collect(),
        };
        Fixture {
            id: "wc-1-1700000000".parse().unwrap(),
            base: StormBase {
                name: TopologyName::new("wc").unwrap(),
                launch_time_secs: NOW - 900,
                status: TopologyStatus::Active,
                num_workers: 2,
                component_executors: structure.component_executors(),
                owner: "alice".into(),
                prev_status: None,
                pending_transition: None,
            },
            assignment,
            layout,
            graph: TopologyGraph::from_flux(FLUX).unwrap(),
            supervisors: BTreeMap::new(),
        }
    }

    fn ex(start: u32) -> ExecutorId {
        ExecutorId::single(TaskId(start))
    }

    /// Tasks: count 1 and 2 (two executors), words 3.
    fn workers(scale: u64) -> Vec<WorkerStats> {
        let slot = |port| WorkerSlot { node: "sup-a".parse().unwrap(), port };
        vec![
            WorkerStats {
                slot: slot(6700),
                uptime_secs: 900,
                executors: vec![
                    stats(ex(1), 10 * scale, 100 * scale, 2.0, 0.0),
                    stats(ex(3), 50 * scale, 40 * scale, 0.0, 8.0),
                ],
            },
            WorkerStats {
                slot: slot(6701),
                uptime_secs: 900,
                executors: vec![stats(ex(2), 30 * scale, 299 * scale, 1.0, 0.0)],
            },
        ]
    }

    fn inputs<'a>(
        f: &'a Fixture,
        workers: &'a [WorkerStats],
        starts: &'a HashMap<ExecutorId, (ExecutorStats, u64)>,
        errors: &'a [TopologyError],
    ) -> TopologyInputs<'a> {
        TopologyInputs {
            id: &f.id,
            base: &f.base,
            assignment: Some(&f.assignment),
            supervisors: &f.supervisors,
            layout: &f.layout,
            graph: &f.graph,
            workers,
            window_starts: starts,
            errors,
            now_secs: NOW,
        }
    }

    fn detail() -> TopologyDetail {
        TopologyDetail {
            summary: cluster_state::api::TopologySummary {
                id: "wc-1-1700000000".parse().unwrap(),
                name: TopologyName::new("wc").unwrap(),
                status: "ACTIVE".into(),
                uptime: String::new(),
                uptime_seconds: 0,
                tasks_total: 3,
                workers_total: 2,
                executors_total: 3,
                owner: "alice".into(),
            },
            launch_time_secs: NOW - 900,
            requested_workers: 2,
            component_executors: BTreeMap::new(),
            prev_status: None,
            pending_transition: None,
            msg_timeout: 0,
            window: StatsWindow::AllTime,
            window_hint: String::new(),
            topology_stats: vec![],
            spouts: vec![],
            bolts: vec![],
            workers: vec![],
            configuration: BTreeMap::new(),
        }
    }

    #[test]
    fn the_ten_minute_window_counts_from_the_sample_at_its_start() {
        let f = fixture();
        let mut history = StatsHistory::default();
        // Samples every 5 s for 15 min at a rate of 1 per second: one kept per 10 s.
        for t in (0..=900).step_by(5) {
            let at = NOW - 900 + t;
            let s = [stats(ex(3), t, t, 0.0, 8.0)];
            history.record(&f.id, &s, at);
        }
        let starts = history.window_starts(&f.id, NOW);
        let (base, span) = &starts[&ex(3)];
        assert_eq!((base.emitted, *span), (300, 600), "the newest sample at least 600 s old");
        let samples = &history.samples[&(f.id.clone(), ex(3))];
        assert!(samples.len() <= 62 && samples.front().unwrap().at_secs == NOW - 600, "{}", samples.len());
        history.forget_stale(NOW + 5);
        assert!(!history.samples.is_empty());
        // Swept at most once per sample interval: 699 s without a report is not yet stale, and
        // the next sweep within 10 s does not look.
        history.forget_stale(NOW + 609);
        assert!(!history.samples.is_empty());
        history.forget_stale(NOW + 615);
        assert!(!history.samples.is_empty(), "swept 6 s ago");
        history.forget_stale(NOW + 700);
        assert!(history.samples.is_empty());
    }

    #[test]
    fn topology_page_aggregates_spouts_bolts_and_workers() {
        let f = fixture();
        let workers = workers(10);
        let starts: HashMap<ExecutorId, (ExecutorStats, u64)> = [
            (ex(1), (stats(ex(1), 40, 400, 2.0, 0.0), 600)),
            // Counters went down: that worker restarted within the window.
            (ex(2), (stats(ex(2), 10_000, 10_000, 1.0, 0.0), 600)),
            (ex(3), (stats(ex(3), 100, 80, 0.0, 8.0), 300)),
        ]
        .into_iter()
        .collect();
        let errors = [TopologyError {
            component: ComponentId::new("count").unwrap(),
            error: "boom".into(),
            error_host: "host-a".into(),
            error_port: 6700,
            error_time: (NOW - 5) * 1000,
            error_lapsed_secs: 5,
        }];
        let mut d = detail();
        fill_topology(&mut d, &inputs(&f, &workers, &starts, &errors), StatsWindow::AllTime);
        assert_eq!(d.msg_timeout, 45);
        assert_eq!(d.configuration["topology.message.timeout.secs"], serde_json::json!(45));
        let spout = &d.spouts[0];
        assert_eq!((spout.spout_id.as_str(), spout.executors, spout.tasks), ("words", 1, 1));
        assert_eq!((spout.emitted, spout.acked, spout.complete_latency.as_str()), (500, 400, "8.000"));
        let bolt = &d.bolts[0];
        assert_eq!(
            (bolt.bolt_id.as_str(), bolt.executors, bolt.emitted, bolt.acked),
            ("count", 2, 400, 3990)
        );
        assert_eq!(bolt.executed, 3990 + 2);
        // Execute latency weighted by executed: (2 ms x 1001 + 1 ms x 2991) / 3992.
        assert_eq!(bolt.execute_latency, storm_decimal((2.0 * 1001.0 + 2991.0) / 3992.0));
        // Capacity: executor 1 executed 1001 - 401 = 600 in 600 s at 2 ms: 0.002; executor 2
        // restarted, so 2991 in 600 s at 1 ms: 0.004985.
        assert_eq!(bolt.capacity, "0.005");
        assert_eq!(
            (bolt.last_error.last_error.as_str(), bolt.last_error.error_time),
            ("boom", Some(NOW - 5))
        );
        assert_eq!(spout.last_error, LastError::default());
        let windows: Vec<(String, u64, u64)> =
            d.topology_stats.iter().map(|w| (w.window.to_string(), w.emitted, w.acked)).collect();
        // 600: words 500 - 100, count 100 - 40 and 300 (restarted); acked is the spout's.
        assert_eq!(windows, [("600".into(), 400 + 60 + 300, 400 - 80), (":all-time".into(), 900, 400)]);
        assert_eq!(d.workers.len(), 2);
        assert_eq!(
            d.workers[0].component_num_tasks,
            BTreeMap::from([
                (ComponentId::new("count").unwrap(), 1),
                (ComponentId::new("words").unwrap(), 1)
            ])
        );
        assert_eq!((d.workers[0].host.as_str(), d.workers[0].uptime.as_str()), ("host-a", "15m 0s"));

        let mut ten = detail();
        fill_topology(&mut ten, &inputs(&f, &workers, &starts, &errors), StatsWindow::TEN_MINUTES);
        assert_eq!((ten.spouts[0].emitted, ten.bolts[0].emitted), (400, 360));
    }

    #[test]
    fn component_page_and_graph() {
        let f = fixture();
        let workers = workers(1);
        let starts = HashMap::new();
        let i = inputs(&f, &workers, &starts, &[]);
        let bolt = component_page(&i, &ComponentId::new("count").unwrap(), StatsWindow::AllTime).unwrap();
        assert_eq!((bolt.component_type.as_str(), bolt.executors, bolt.tasks), ("bolt", 2, 2));
        assert!(bolt.spout_summary.is_none());
        assert_eq!(bolt.bolt_stats.as_ref().map(Vec::len), Some(2));
        let ids: Vec<&str> = bolt.executor_stats.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["[1-1]", "[2-2]"]);
        assert!(
            bolt.executor_stats[0].complete_latency.is_none() && bolt.executor_stats[0].capacity.is_some()
        );
        let spout = component_page(&i, &ComponentId::new("words").unwrap(), StatsWindow::AllTime).unwrap();
        assert_eq!(spout.spout_summary.as_ref().unwrap()[1].emitted, 50);
        assert_eq!(spout.executor_stats[0].complete_latency.as_deref(), Some("8.000"));
        assert!(component_page(&i, &ComponentId::new("nope").unwrap(), StatsWindow::AllTime).is_none());

        let graph = visualization(&i, |c| format!("#/c/{c}"));
        let count = &graph.0[&ComponentId::new("count").unwrap()];
        assert_eq!(count.kind, "bolt");
        assert_eq!(count.link, "#/c/count");
        assert_eq!(
            count.inputs,
            [VisualizationInput {
                component: ComponentId::new("words").unwrap(),
                stream: "default".into(),
                sani_stream: "sdefault".into(),
                grouping: "fields".into()
            }]
        );
        let words = &graph.0[&ComponentId::new("words").unwrap()];
        assert_eq!((words.transferred, words.latency), (50, Some(8.0)));
        assert_eq!(words.stats[0].transferred["600"]["sdefault"], 50);
        // Nothing reported yet: no latency, zero counts.
        let none = inputs(&f, &[], &starts, &[]);
        assert_eq!(
            visualization(&none, |c| c.to_string()).0[&ComponentId::new("words").unwrap()].latency,
            None
        );
    }
}
