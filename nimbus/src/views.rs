//! The read side of nimbus's HTTP API, as pure functions from what ZooKeeper holds to the
//! bodies of Storm's UI REST API (cluster, supervisor and topology summaries, the topology view;
//! the types and their Storm key names are `cluster_state::api`'s).
//!
//! Slot usage is counted from the assignments (what nimbus decided), as Storm UI does, not from
//! what supervisors report, which lags.

use std::collections::{BTreeMap, BTreeSet};

use cluster_state::api::{
    ClusterSummary, PendingAction, PendingTransitionView, StatsWindow, SupervisorSummary, TargetGroup,
    TopologyDetail, TopologySummary,
};
use cluster_state::ids::{SupervisorId, TopologyId, WorkerSlot};
use cluster_state::znode::{Assignment, DelayedTransition, MetricsScheme, StormBase, SupervisorInfo};

/// Everything the summaries are computed from, read in one pass.
#[derive(Debug, Clone, Default)]
pub struct ClusterSnapshot {
    pub storms: BTreeMap<TopologyId, StormBase>,
    pub assignments: BTreeMap<TopologyId, Assignment>,
    pub supervisors: BTreeMap<SupervisorId, SupervisorInfo>,
    /// When this nimbus started, seconds since the epoch.
    pub nimbus_start_secs: u64,
    pub now_secs: u64,
}

/// Storm UI's uptime format: `1d 2h 3m 4s`, leading zero units left out.
pub fn pretty_uptime(secs: u64) -> String {
    cluster_state::api::pretty_secs(secs)
}

fn used_slots(snapshot: &ClusterSnapshot) -> BTreeSet<WorkerSlot> {
    snapshot.assignments.values().flat_map(Assignment::slots).collect()
}

impl ClusterSnapshot {
    /// `Route::ClusterSummary`.
    pub fn cluster_summary(&self, version: &str) -> ClusterSummary {
        let used = used_slots(self);
        let slots_total: usize = self.supervisors.values().map(|s| s.all_ports.len()).sum();
        let slots_used = used.iter().filter(|slot| self.supervisors.contains_key(&slot.node)).count();
        let executors = self.assignments.values().flat_map(|a| &a.executors);
        let uptime = self.now_secs.saturating_sub(self.nimbus_start_secs);
        ClusterSummary {
            storm_version: version.to_owned(),
            nimbus_uptime: pretty_uptime(uptime),
            nimbus_uptime_seconds: uptime,
            supervisors: self.supervisors.len(),
            slots_total,
            slots_used,
            slots_free: slots_total.saturating_sub(slots_used),
            executors_total: executors.clone().count(),
            tasks_total: executors.map(|e| e.executor.tasks().count() as u64).sum(),
            topologies: self.storms.len(),
        }
    }

    /// `Route::SupervisorSummary` (the body's `supervisors` list), by id.
    pub fn supervisor_summaries(&self) -> Vec<SupervisorSummary> {
        let used = used_slots(self);
        self.supervisors
            .values()
            .map(|info| SupervisorSummary {
                id: info.supervisor_id.clone(),
                host: info.hostname.clone(),
                uptime: pretty_uptime(info.uptime_secs),
                uptime_seconds: info.uptime_secs,
                slots_total: info.all_ports.len(),
                slots_used: used.iter().filter(|slot| slot.node == info.supervisor_id).count(),
                version: info.version.clone(),
            })
            .collect()
    }

    /// `Route::TopologySummary` (the body's `topologies` list), by id.
    pub fn topology_summaries(&self) -> Vec<TopologySummary> {
        self.storms.iter().map(|(id, base)| self.topology_summary(id, base)).collect()
    }

    fn topology_summary(&self, id: &TopologyId, base: &StormBase) -> TopologySummary {
        let assignment = self.assignments.get(id);
        let executors: Vec<_> = assignment.map(|a| a.executors.iter().collect()).unwrap_or_default();
        let uptime = self.now_secs.saturating_sub(base.launch_time_secs);
        TopologySummary {
            id: id.clone(),
            name: base.name.clone(),
            status: base.status.as_str().to_ascii_uppercase(),
            uptime: pretty_uptime(uptime),
            uptime_seconds: uptime,
            tasks_total: executors.iter().map(|e| e.executor.tasks().count() as u64).sum(),
            workers_total: assignment.map_or(0, |a| a.slots().len()),
            executors_total: executors.len(),
            owner: base.owner.clone(),
        }
    }

    /// `Route::Topology`: the summary plus the base record's settings; the component stats
    /// (Storm UI's `spouts`, `bolts`, ...) are `crate::stats::fill_topology`'s.
    pub fn topology_detail(&self, id: &TopologyId) -> Option<TopologyDetail> {
        let base = self.storms.get(id)?;
        Some(TopologyDetail {
            summary: self.topology_summary(id, base),
            launch_time_secs: base.launch_time_secs,
            requested_workers: base.num_workers,
            component_executors: base.component_executors.clone(),
            prev_status: base.prev_status.map(|s| s.as_str().to_ascii_uppercase()),
            pending_transition: base.pending_transition.as_ref().map(|p| PendingTransitionView {
                action: match p {
                    DelayedTransition::Kill { .. } => PendingAction::Kill,
                    DelayedTransition::Rebalance { .. } => PendingAction::Rebalance,
                },
                deadline_secs: p.deadline_secs(),
                seconds_left: p.deadline_secs().saturating_sub(self.now_secs),
            }),
            // Filled by `crate::stats::fill_topology` from the topology file and the stats.
            msg_timeout: 0,
            window: StatsWindow::AllTime,
            window_hint: StatsWindow::AllTime.pretty(),
            topology_stats: Vec::new(),
            spouts: Vec::new(),
            bolts: Vec::new(),
            workers: Vec::new(),
            configuration: BTreeMap::new(),
        })
    }
}

/// Prometheus HTTP service discovery (`http_sd_configs`): one target group per process, with
/// bounded labels (`squall_role`, `supervisor`, `squall_topology`, `port`). The topology label is
/// `squall_topology`, not `topology`: a worker's executor series carry their own `topology`, which a
/// target label of the same name would make Prometheus rename to `exported_topology`.
pub fn discovery_targets(
    nimbus: &str,
    nimbus_https: bool,
    snapshot: &ClusterSnapshot,
    workers: &[crate::state::WorkerEndpoint],
) -> Vec<TargetGroup> {
    let group = |target: String, labels: &[(&str, &str)]| TargetGroup {
        targets: vec![target],
        labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
    };
    let mut groups = Vec::new();
    // Prometheus takes a target's scheme from `__scheme__` (its job's default, `http`, when
    // absent): each process says how it serves `/metrics`, so one job scrapes a mix.
    let scheme = |scheme: MetricsScheme| (!scheme.is_http()).then_some(("__scheme__", scheme.as_str()));
    if !nimbus.is_empty() {
        // Nimbus's `/metrics` is on its API, HTTPS when that is.
        let labels: Vec<_> = [Some(("squall_role", "nimbus")), scheme(MetricsScheme::from_tls(nimbus_https))]
            .into_iter()
            .flatten()
            .collect();
        groups.push(group(nimbus.to_owned(), &labels));
    }
    for (id, info) in &snapshot.supervisors {
        if let Some(endpoint) = &info.metrics_endpoint {
            let labels: Vec<_> = [
                Some(("squall_role", "supervisor")),
                Some(("supervisor", id.as_str())),
                scheme(info.metrics_scheme),
            ]
            .into_iter()
            .flatten()
            .collect();
            groups.push(group(endpoint.clone(), &labels));
        }
    }
    for w in workers {
        // Only workers of live supervisors: a dead machine's last beat is not a target.
        if !snapshot.supervisors.contains_key(&w.slot.node) {
            continue;
        }
        let port = w.slot.port.to_string();
        let labels: Vec<_> = [
            Some(("squall_role", "worker")),
            Some(("squall_topology", w.topology.as_str())),
            Some(("supervisor", w.slot.node.as_str())),
            Some(("port", port.as_str())),
            scheme(w.scheme),
        ]
        .into_iter()
        .flatten()
        .collect();
        groups.push(group(w.endpoint.clone(), &labels));
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use cluster_state::ids::{ExecutorId, TaskId, TopologyName};
    use cluster_state::znode::{ExecutorAssignment, TopologyStatus};

    const NOW: u64 = 1_700_100_000;

    fn sup(id: &str) -> SupervisorId {
        SupervisorId::new(id).unwrap()
    }

    fn supervisor(id: &str, ports: &[u16], uptime_secs: u64) -> SupervisorInfo {
        SupervisorInfo {
            time_secs: NOW,
            hostname: format!("host-{id}"),
            supervisor_id: sup(id),
            used_ports: vec![],
            all_ports: ports.to_vec(),
            uptime_secs,
            version: "0.1.0".into(),
            metrics_endpoint: None,
            metrics_scheme: cluster_state::znode::MetricsScheme::Http,
        }
    }

    fn snapshot() -> ClusterSnapshot {
        let id: TopologyId = "wc-1-1700000000".parse().unwrap();
        let base = StormBase {
            name: TopologyName::new("wc").unwrap(),
            launch_time_secs: NOW - 3_723,
            status: TopologyStatus::Active,
            num_workers: 2,
            component_executors: BTreeMap::new(),
            owner: "alice".into(),
            prev_status: None,
            pending_transition: None,
        };
        let entry = |start, end, node: &str, port| ExecutorAssignment {
            executor: ExecutorId::new(TaskId(start), TaskId(end)).unwrap(),
            node: sup(node),
            port,
            start_time_secs: NOW - 3_700,
        };
        let assignment = Assignment {
            master_code_dir: "/code".into(),
            node_host: BTreeMap::new(),
            executors: vec![entry(1, 2, "a", 6700), entry(3, 3, "b", 6700), entry(4, 6, "a", 6700)],
        };
        ClusterSnapshot {
            storms: [(id.clone(), base)].into_iter().collect(),
            assignments: [(id, assignment)].into_iter().collect(),
            supervisors: [("a", supervisor("a", &[6700, 6701], 90_061)), ("b", supervisor("b", &[6700], 5))]
                .into_iter()
                .map(|(k, v)| (sup(k), v))
                .collect(),
            nimbus_start_secs: NOW - 59,
            now_secs: NOW,
        }
    }

    #[test]
    fn uptimes_read_like_storm_ui() {
        assert_eq!(pretty_uptime(0), "0s");
        assert_eq!(pretty_uptime(59), "59s");
        assert_eq!(pretty_uptime(3_723), "1h 2m 3s");
        assert_eq!(pretty_uptime(90_061), "1d 1h 1m 1s");
        assert_eq!(pretty_uptime(86_400), "1d 0h 0m 0s");
    }

    // The views as typed values; their wire keys are golden in cluster-state/tests/api_formats.rs.

    #[test]
    fn cluster_summary_counts_slots_from_assignments() {
        assert_eq!(
            snapshot().cluster_summary("0.1.0"),
            ClusterSummary {
                storm_version: "0.1.0".into(),
                nimbus_uptime: "59s".into(),
                nimbus_uptime_seconds: 59,
                supervisors: 2,
                slots_total: 3,
                slots_used: 2,
                slots_free: 1,
                executors_total: 3,
                tasks_total: 6,
                topologies: 1,
            }
        );
        let empty = ClusterSnapshot::default().cluster_summary("0.1.0");
        assert_eq!((empty.slots_total, empty.slots_free, empty.topologies), (0, 0, 0));
    }

    #[test]
    fn supervisor_and_topology_summaries() {
        let snapshot = snapshot();
        let supervisors = snapshot.supervisor_summaries();
        assert_eq!(
            supervisors[0],
            SupervisorSummary {
                id: sup("a"),
                host: "host-a".into(),
                uptime: "1d 1h 1m 1s".into(),
                uptime_seconds: 90_061,
                slots_total: 2,
                slots_used: 1,
                version: "0.1.0".into(),
            }
        );
        assert_eq!(supervisors[1].slots_used, 1);
        assert_eq!(
            snapshot.topology_summaries(),
            [TopologySummary {
                id: "wc-1-1700000000".parse().unwrap(),
                name: TopologyName::new("wc").unwrap(),
                status: "ACTIVE".into(),
                uptime: "1h 2m 3s".into(),
                uptime_seconds: 3_723,
                tasks_total: 6,
                workers_total: 2,
                executors_total: 3,
                owner: "alice".into(),
            }]
        );
    }

    /// A worker's target is labelled `squall_topology`: a `topology` target label would clash
    /// with the executor series' own and reach Prometheus as `exported_topology`.
    #[test]
    fn worker_targets_do_not_clash_with_series_labels() {
        let snapshot = snapshot();
        let worker = crate::state::WorkerEndpoint {
            topology: "wc-1-1700000000".parse().unwrap(),
            slot: WorkerSlot { node: sup("a"), port: 6700 },
            endpoint: "h:9000".into(),
            scheme: MetricsScheme::Http,
        };
        let groups = discovery_targets("n:8080", false, &snapshot, &[worker]);
        let labels: Vec<(&str, &str)> =
            groups[groups.len() - 1].labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            labels,
            [
                ("port", "6700"),
                ("squall_role", "worker"),
                ("squall_topology", "wc-1-1700000000"),
                ("supervisor", "a")
            ]
        );
        assert!(!groups[0].labels.contains_key("__scheme__"), "plain HTTP: Prometheus's default");
        let groups = discovery_targets("n:8080", true, &snapshot, &[]);
        assert_eq!(groups[0].labels.get("__scheme__").map(String::as_str), Some("https"));
        assert!(groups[1..].iter().all(|g| !g.labels.contains_key("__scheme__")), "{groups:?}");
    }

    /// Each target carries its own scheme, so one Prometheus job scrapes plain and TLS
    /// processes side by side.
    #[test]
    fn every_target_says_how_its_metrics_are_served() {
        let mut snapshot = snapshot();
        for (id, info) in &mut snapshot.supervisors {
            info.metrics_endpoint = Some(format!("{id}:9100"));
        }
        let b = sup("b");
        snapshot.supervisors.get_mut(&b).unwrap().metrics_scheme = MetricsScheme::Https;
        let worker = |node: &str, scheme| crate::state::WorkerEndpoint {
            topology: "wc-1-1700000000".parse().unwrap(),
            slot: WorkerSlot { node: sup(node), port: 6700 },
            endpoint: format!("{node}:9000"),
            scheme,
        };
        let groups = discovery_targets(
            "n:8080",
            false,
            &snapshot,
            &[worker("a", MetricsScheme::Https), worker("b", MetricsScheme::Http)],
        );
        let schemes: Vec<(&str, Option<&str>)> = groups
            .iter()
            .map(|g| (g.targets[0].as_str(), g.labels.get("__scheme__").map(String::as_str)))
            .collect();
        assert_eq!(
            schemes,
            [
                ("n:8080", None),
                ("a:9100", None),
                ("b:9100", Some("https")),
                ("a:9000", Some("https")),
                ("b:9000", None),
            ]
        );
    }
}
