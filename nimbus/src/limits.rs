//! How large a topology nimbus accepts: checked at submit and at rebalance, so that what is
//! stored can always be scheduled and its assignment always written.
//!
//! An assignment is one znode, and ZooKeeper refuses a request larger than its
//! `jute.maxbuffer` (1 MiB by default) by dropping the connection: a topology whose assignment
//! does not fit would cost nimbus its session on every monitor pass. So a topology's executors
//! are bounded, its estimated assignment must stay under [`MAX_ASSIGNMENT_BYTES`], and the
//! monitor pass checks the encoded size again before every write.

use std::collections::BTreeMap;

use cluster_state::ids::{ComponentId, ExecutorId, SupervisorId};
use cluster_state::structure::TopologyStructure;
use cluster_state::znode::{Assignment, ExecutorAssignment, ZnodeData};

/// The largest assignment nimbus writes: ZooKeeper's default `jute.maxbuffer` is 1 MiB
/// (1,048,575 bytes) for the whole request, path and framing included; 900 KiB leaves room.
pub const MAX_ASSIGNMENT_BYTES: usize = 900 * 1024;

/// A supervisor id as long as Storm's (a UUID), the shortest the estimate assumes.
const TYPICAL_NODE_ID_LEN: usize = 36;

/// Nimbus's limits on one topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopologyLimits {
    /// Storm's `topology.max.task.parallelism` set in the cluster config: the most executors
    /// one component may have. Storm silently caps at it; nimbus refuses, so the topology runs
    /// with the numbers its file says. `None`: no such limit (Storm's default).
    pub max_task_parallelism: Option<u32>,
    /// `nimbus.topology.max.tasks`: tasks of one topology in all, ackers included.
    pub max_tasks: u32,
    /// `nimbus.topology.max.executors`: executors of one topology in all, ackers included.
    pub max_executors: u32,
}

impl Default for TopologyLimits {
    fn default() -> Self {
        TopologyLimits {
            // Storm's defaults.yaml: `topology.max.task.parallelism: null`.
            max_task_parallelism: None,
            // Squall's: task instances each take memory in a worker; 10,000 is far above what
            // Storm topologies use and keeps a layout cheap to compute.
            max_tasks: 10_000,
            // Squall's: an executor takes about 100 bytes of assignment; 4,000 keeps an
            // assignment well under ZooKeeper's 1 MiB with supervisor ids up to 100 bytes.
            max_executors: 4_000,
        }
    }
}

/// A limit a topology is over; the message names the limit and the numbers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LimitError(pub String);

impl TopologyLimits {
    /// Checks `structure` run with `executors` per component (its own counts, or a
    /// rebalance's), as its assignment on supervisors `nodes` would be (`node_host` entries;
    /// ids and host names as long as theirs), with `master_code_dir`.
    pub fn check(
        &self,
        structure: &TopologyStructure,
        executors: &BTreeMap<ComponentId, u32>,
        nodes: &BTreeMap<SupervisorId, String>,
        master_code_dir: &str,
    ) -> Result<(), LimitError> {
        for (component, &asked) in executors {
            if let Some(shape) = structure.components.get(component)
                && asked > shape.tasks
            {
                return Err(LimitError(format!(
                    "component {component} has {} tasks, so it cannot run {asked} executors (executors are at most the tasks, as in Storm)",
                    shape.tasks
                )));
            }
        }
        if let Some(max) = self.max_task_parallelism {
            for (component, shape) in &structure.components {
                let n = executors.get(component).copied().unwrap_or(shape.executors);
                if n > max {
                    return Err(LimitError(format!(
                        "component {component} asks for {n} executors, above topology.max.task.parallelism {max}"
                    )));
                }
            }
        }
        let tasks = structure.total_tasks();
        if tasks > u64::from(self.max_tasks) {
            return Err(LimitError(format!(
                "the topology has {tasks} tasks in all (ackers included), above nimbus.topology.max.tasks {}",
                self.max_tasks
            )));
        }
        let total = structure.total_executors(executors);
        if total > u64::from(self.max_executors) {
            return Err(LimitError(format!(
                "the topology has {total} executors in all (ackers included), above nimbus.topology.max.executors {}",
                self.max_executors
            )));
        }
        let bytes = estimate_assignment_bytes(structure, executors, nodes, master_code_dir);
        if bytes > MAX_ASSIGNMENT_BYTES {
            return Err(LimitError(format!(
                "the topology's assignment would take about {bytes} bytes, above the {MAX_ASSIGNMENT_BYTES} bytes one ZooKeeper node may safely hold; run fewer executors"
            )));
        }
        Ok(())
    }
}

/// The encoded size of the assignment of `structure` with `executors` per component, every
/// executor on a supervisor id as long as the longest of `nodes` (at least a UUID's), with
/// the largest port and a ten-digit start time.
pub fn estimate_assignment_bytes(
    structure: &TopologyStructure,
    executors: &BTreeMap<ComponentId, u32>,
    nodes: &BTreeMap<SupervisorId, String>,
    master_code_dir: &str,
) -> usize {
    let longest = nodes.keys().map(|id| id.as_str().len()).max().unwrap_or(0).max(TYPICAL_NODE_ID_LEN);
    let Ok(node) = SupervisorId::new("n".repeat(longest)) else { return usize::MAX };
    let executors: Vec<ExecutorAssignment> = structure
        .layout(executors)
        .executors
        .into_keys()
        .map(|executor: ExecutorId| ExecutorAssignment {
            executor,
            node: node.clone(),
            port: u16::MAX,
            start_time_secs: 9_999_999_999,
        })
        .collect();
    Assignment { master_code_dir: master_code_dir.to_owned(), node_host: nodes.clone(), executors }
        .encode()
        .len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn structure(bolt: &str) -> TopologyStructure {
        TopologyStructure::from_flux(&format!("name: t\nspouts: [{{id: s}}]\nbolts: [{bolt}]")).unwrap()
    }

    fn check(limits: TopologyLimits, bolt: &str, rebalance: &[(&str, u32)]) -> Result<(), LimitError> {
        let s = structure(bolt);
        let executors = rebalance.iter().map(|(c, n)| (ComponentId::new(*c).unwrap(), *n)).collect();
        limits.check(&s, &executors, &BTreeMap::new(), "/var/squall/nimbus/stormdist/t-1-1")
    }

    /// Limits, the split bolt, a rebalance's `-e`, and what the refusal says ("" for none).
    type Case<'a> = (TopologyLimits, &'a str, &'a [(&'a str, u32)], &'a str);

    #[test]
    fn limits_name_what_is_over() {
        let strict = TopologyLimits { max_task_parallelism: Some(8), ..Default::default() };
        let cases: &[Case] = &[
            (Default::default(), "{id: b, parallelism: 4, numTasks: 8}", &[], ""),
            (Default::default(), "{id: b, parallelism: 4, numTasks: 8}", &[("b", 8)], ""),
            (
                Default::default(),
                "{id: b, parallelism: 4, numTasks: 8}",
                &[("b", 9)],
                "component b has 8 tasks",
            ),
            (strict, "{id: b, parallelism: 9}", &[], "topology.max.task.parallelism 8"),
            (strict, "{id: b, parallelism: 2, numTasks: 20}", &[("b", 9)], "topology.max.task.parallelism 8"),
            (Default::default(), "{id: b, numTasks: 4294967000}", &[], "nimbus.topology.max.tasks 10000"),
            (Default::default(), "{id: b, parallelism: 5000}", &[], "nimbus.topology.max.executors 4000"),
            (
                TopologyLimits { max_executors: 100_000, max_tasks: 100_000, ..Default::default() },
                "{id: b, parallelism: 30000}",
                &[],
                "bytes one ZooKeeper node may safely hold",
            ),
        ];
        for (limits, bolt, rebalance, expected) in cases {
            let result = check(*limits, bolt, rebalance);
            match (result, expected.is_empty()) {
                (Ok(()), true) => {}
                (Err(e), false) => assert!(e.0.contains(expected), "{bolt}: {e}"),
                (result, _) => panic!("{bolt} {rebalance:?}: {result:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn the_estimate_covers_the_default_executor_limit() {
        let s = structure("{id: b, parallelism: 3998}");
        assert_eq!(s.total_executors(&BTreeMap::new()), 4_000);
        let nodes = BTreeMap::from([(SupervisorId::new("x".repeat(100)).unwrap(), "h".repeat(100))]);
        let bytes = estimate_assignment_bytes(&s, &BTreeMap::new(), &nodes, &"/d".repeat(100));
        assert!(bytes < MAX_ASSIGNMENT_BYTES, "{bytes}");
    }
}
