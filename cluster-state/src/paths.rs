//! ZooKeeper paths, built from validated ids so each one names exactly one node.
//!
//! Two layouts, each under its own configurable root:
//!
//! ```text
//! <storm root, default /storm>
//!   /storms/<topology-id>                       -> StormBase
//!   /assignments/<topology-id>                  -> Assignment
//!   /node-assignments/<supervisor-id>           -> NodeAssignments (Squall's index, not Storm's)
//!   /supervisors/<supervisor-id>                -> SupervisorInfo (ephemeral)
//!   /workerbeats/<topology-id>/<node>-<port>    -> WorkerHeartbeat
//!   /errors/<topology-id>/<component-id>/e<seq> -> ErrorInfo (persistent sequential)
//!   /leader-lock/latch-<seq>                    -> nimbus host:port (ephemeral sequential)
//!   /nimbuses/<host:port>                       -> NimbusSummary (ephemeral)
//!   /blobstore/<topology-id>/<host:port>        -> (empty; ephemeral: that nimbus holds the code)
//! <kafka chroot, default none>
//!   /consumers/[group]/ids/[consumer_id]            -> ConsumerRegistration (ephemeral)
//!   /consumers/[group]/owners/[topic]/[partition]   -> OwnerData (ephemeral)
//!   /consumers/[group]/offsets/[topic]/[partition]  -> OffsetData
//!   /brokers/ids/[id]                               -> BrokerRegistration (Kafka's)
//!   /brokers/topics/[topic]                         -> TopicRegistration (Kafka's)
//! ```
//!
//! Roots are absolute, have no trailing `/` and no empty, `.` or `..` segments. The Storm root
//! cannot be `/` itself: Storm's cleanup deletes whole subtrees under it, which must not share
//! the ZooKeeper root with Kafka's registry or `/zookeeper`. The Kafka chroot may be `/`, which
//! means no chroot (as in Kafka's `zookeeper.connect=host:2181/`).

use crate::ids::{
    BrokerId, ComponentId, ConsumerId, GroupId, IdError, Partition, SnapshotName, SupervisorId, Topic,
    TopologyId, WorkerSlot, check_segment,
};

/// Validates an absolute, non-root ZooKeeper path without trailing `/`.
fn check_root(kind: &'static str, root: &str) -> Result<(), IdError> {
    let rule = "must be an absolute ZooKeeper path other than '/', without trailing '/'";
    let segments = root.strip_prefix('/').ok_or_else(|| IdError { kind, value: root.to_owned(), rule })?;
    for segment in segments.split('/') {
        check_segment(kind, segment).map_err(|_| IdError { kind, value: root.to_owned(), rule })?;
    }
    Ok(())
}

/// Paths of Storm's layout under a root (default `/storm`, Storm's `storm.zookeeper.root`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StormPaths {
    root: String,
}

impl Default for StormPaths {
    fn default() -> Self {
        Self { root: Self::DEFAULT_ROOT.to_owned() }
    }
}

impl std::str::FromStr for StormPaths {
    type Err = IdError;
    /// The layout under the root `s` (see [`StormPaths::new`]).
    fn from_str(s: &str) -> Result<Self, IdError> {
        Self::new(s)
    }
}

impl StormPaths {
    /// Storm's default root (`storm.zookeeper.root` in defaults.yaml).
    pub const DEFAULT_ROOT: &'static str = "/storm";

    /// The layout under `root`, which must be absolute, not `/`, without trailing `/`.
    pub fn new(root: &str) -> Result<Self, IdError> {
        check_root("storm root", root)?;
        Ok(Self { root: root.to_owned() })
    }

    /// The root, e.g. `/storm`.
    pub fn root(&self) -> &str {
        &self.root
    }

    /// `<root>/storms`.
    pub fn storms_dir(&self) -> String {
        format!("{}/storms", self.root)
    }

    /// `<root>/storms/<topology-id>`.
    pub fn storm(&self, id: &TopologyId) -> String {
        format!("{}/storms/{id}", self.root)
    }

    /// `<root>/assignments`.
    pub fn assignments_dir(&self) -> String {
        format!("{}/assignments", self.root)
    }

    /// `<root>/assignments/<topology-id>`.
    pub fn assignment(&self, id: &TopologyId) -> String {
        format!("{}/assignments/{id}", self.root)
    }

    /// `<root>/node-assignments`: the leader's index of which assignments name each node
    /// (Squall's, not Storm's; see [`crate::znode::NodeAssignments`]).
    pub fn node_assignments_dir(&self) -> String {
        format!("{}/node-assignments", self.root)
    }

    /// `<root>/node-assignments/<supervisor-id>`.
    pub fn node_assignments(&self, node: &SupervisorId) -> String {
        format!("{}/node-assignments/{node}", self.root)
    }

    /// `<root>/supervisors`.
    pub fn supervisors_dir(&self) -> String {
        format!("{}/supervisors", self.root)
    }

    /// `<root>/supervisors/<supervisor-id>`.
    pub fn supervisor(&self, id: &SupervisorId) -> String {
        format!("{}/supervisors/{id}", self.root)
    }

    /// `<root>/workerbeats`.
    pub fn workerbeats_dir(&self) -> String {
        format!("{}/workerbeats", self.root)
    }

    /// `<root>/workerbeats/<topology-id>`.
    pub fn workerbeats_topology(&self, id: &TopologyId) -> String {
        format!("{}/workerbeats/{id}", self.root)
    }

    /// `<root>/workerbeats/<topology-id>/<node>-<port>`.
    pub fn workerbeat(&self, id: &TopologyId, slot: &WorkerSlot) -> String {
        format!("{}/workerbeats/{id}/{}", self.root, slot.beat_node_name())
    }

    /// `<root>/errors`.
    pub fn errors_dir(&self) -> String {
        format!("{}/errors", self.root)
    }

    /// `<root>/errors/<topology-id>`.
    pub fn errors_topology(&self, id: &TopologyId) -> String {
        format!("{}/errors/{id}", self.root)
    }

    /// `<root>/errors/<topology-id>/<component-id>`.
    pub fn errors_component(&self, id: &TopologyId, component: &ComponentId) -> String {
        format!("{}/errors/{id}/{component}", self.root)
    }

    /// `<root>/errors/<topology-id>/<component-id>/e`: the path to create *sequential*;
    /// ZooKeeper appends a 10-digit counter, giving e.g. `e0000000042`.
    pub fn error_sequential_prefix(&self, id: &TopologyId, component: &ComponentId) -> String {
        format!("{}/errors/{id}/{component}/e", self.root)
    }

    /// `<root>/logconfigs`: runtime log levels per topology (Storm's path).
    pub fn log_configs_dir(&self) -> String {
        format!("{}/logconfigs", self.root)
    }

    /// `<root>/logconfigs/<topology-id>`.
    pub fn log_config(&self, id: &TopologyId) -> String {
        format!("{}/logconfigs/{id}", self.root)
    }

    /// `<root>/leader-lock`: nimbus leader election (Storm's layout; Curator's leader latch
    /// there, Squall's sequential ephemerals `latch-<seq>` here, lowest wins).
    pub fn leader_lock_dir(&self) -> String {
        format!("{}/leader-lock", self.root)
    }

    /// `<root>/leader-lock/latch-`: the path to create *ephemeral sequential*.
    pub fn leader_latch_prefix(&self) -> String {
        format!("{}/leader-lock/{}", self.root, Self::LATCH_PREFIX)
    }

    /// What every election node's name starts with (the rest is ZooKeeper's 10-digit counter).
    pub const LATCH_PREFIX: &'static str = "latch-";

    /// The sequence number of an election node name such as `latch-0000000007`, or `None` for
    /// a name that is not one.
    pub fn parse_latch_seq(name: &str) -> Option<u32> {
        let digits = name.strip_prefix(Self::LATCH_PREFIX)?;
        if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }

    /// `<root>/nimbuses`.
    pub fn nimbuses_dir(&self) -> String {
        format!("{}/nimbuses", self.root)
    }

    /// `<root>/nimbuses/<host:port>`; the address must be a valid path segment.
    pub fn nimbus(&self, address: &str) -> Result<String, IdError> {
        check_segment("nimbus address", address)?;
        Ok(format!("{}/nimbuses/{address}", self.root))
    }

    /// `<root>/blobstore`: which nimbuses hold which topology's code (Storm's layout).
    pub fn blobstore_dir(&self) -> String {
        format!("{}/blobstore", self.root)
    }

    /// `<root>/blobstore/<topology-id>`.
    pub fn blobstore_topology(&self, id: &TopologyId) -> String {
        format!("{}/blobstore/{id}", self.root)
    }

    /// `<root>/blobstore/<topology-id>/<host:port>`; the address must be a valid path segment.
    pub fn code_holder(&self, id: &TopologyId, address: &str) -> Result<String, IdError> {
        check_segment("nimbus address", address)?;
        Ok(format!("{}/blobstore/{id}/{address}", self.root))
    }

    /// The sequence number of an error znode name such as `e0000000042`, or `None` for a name
    /// that is not `e` followed by ZooKeeper's 10 digits. Sort errors by it, newest last.
    pub fn parse_error_seq(name: &str) -> Option<u32> {
        let digits = name.strip_prefix('e')?;
        if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok()
    }
}

/// Paths of Kafka's ZooKeeper registry, under an optional chroot (default: none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KafkaPaths {
    /// Empty for no chroot, else e.g. `/kafka`.
    chroot: String,
}

impl KafkaPaths {
    /// The registry under `chroot`; `None` or `Some("/")` mean the ZooKeeper root.
    pub fn new(chroot: Option<&str>) -> Result<Self, IdError> {
        match chroot {
            None | Some("/") => Ok(Self::default()),
            Some(root) => {
                check_root("kafka chroot", root)?;
                Ok(Self { chroot: root.to_owned() })
            }
        }
    }

    /// The chroot, `None` when Kafka's paths sit at the ZooKeeper root.
    pub fn chroot(&self) -> Option<&str> {
        (!self.chroot.is_empty()).then_some(self.chroot.as_str())
    }

    /// `/consumers`.
    pub fn consumers_dir(&self) -> String {
        format!("{}/consumers", self.chroot)
    }

    /// `/consumers/[group]`.
    pub fn group(&self, group: &GroupId) -> String {
        format!("{}/consumers/{group}", self.chroot)
    }

    /// `/consumers/[group]/ids`.
    pub fn ids_dir(&self, group: &GroupId) -> String {
        format!("{}/consumers/{group}/ids", self.chroot)
    }

    /// `/consumers/[group]/ids/[consumer_id]`.
    pub fn id(&self, group: &GroupId, consumer: &ConsumerId) -> String {
        format!("{}/consumers/{group}/ids/{consumer}", self.chroot)
    }

    /// `/consumers/[group]/owners`.
    pub fn owners_dir(&self, group: &GroupId) -> String {
        format!("{}/consumers/{group}/owners", self.chroot)
    }

    /// `/consumers/[group]/owners/[topic]`.
    pub fn owners_topic(&self, group: &GroupId, topic: &Topic) -> String {
        format!("{}/consumers/{group}/owners/{topic}", self.chroot)
    }

    /// `/consumers/[group]/owners/[topic]/[partition]`.
    pub fn owner(&self, group: &GroupId, topic: &Topic, partition: Partition) -> String {
        format!("{}/consumers/{group}/owners/{topic}/{partition}", self.chroot)
    }

    /// `/consumers/[group]/offsets`.
    pub fn offsets_dir(&self, group: &GroupId) -> String {
        format!("{}/consumers/{group}/offsets", self.chroot)
    }

    /// `/consumers/[group]/offsets/[topic]`.
    pub fn offsets_topic(&self, group: &GroupId, topic: &Topic) -> String {
        format!("{}/consumers/{group}/offsets/{topic}", self.chroot)
    }

    /// `/consumers/[group]/offsets/[topic]/[partition]`.
    pub fn offset(&self, group: &GroupId, topic: &Topic, partition: Partition) -> String {
        format!("{}/consumers/{group}/offsets/{topic}/{partition}", self.chroot)
    }

    /// `/consumers/[group]/squall-snapshots`: Squall's named offset snapshots.
    pub fn snapshots_dir(&self, group: &GroupId) -> String {
        format!("{}/consumers/{group}/squall-snapshots", self.chroot)
    }

    /// `/consumers/[group]/squall-snapshots/[name]`.
    pub fn snapshot(&self, group: &GroupId, name: &SnapshotName) -> String {
        format!("{}/consumers/{group}/squall-snapshots/{name}", self.chroot)
    }

    /// `/brokers/ids`.
    pub fn brokers_ids_dir(&self) -> String {
        format!("{}/brokers/ids", self.chroot)
    }

    /// `/brokers/ids/[id]`.
    pub fn broker(&self, id: BrokerId) -> String {
        format!("{}/brokers/ids/{id}", self.chroot)
    }

    /// `/brokers/topics`.
    pub fn brokers_topics_dir(&self) -> String {
        format!("{}/brokers/topics", self.chroot)
    }

    /// `/brokers/topics/[topic]`.
    pub fn topic(&self, topic: &Topic) -> String {
        format!("{}/brokers/topics/{topic}", self.chroot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::TopologyName;

    fn storm_table(p: &StormPaths) -> Vec<String> {
        let id = TopologyId::new(&TopologyName::new("wc").unwrap(), 1, 1_700_000_000);
        let sup = SupervisorId::new("sup-a1").unwrap();
        let slot = WorkerSlot { node: sup.clone(), port: 6700 };
        let comp = ComponentId::new("split").unwrap();
        vec![
            p.storms_dir(),
            p.storm(&id),
            p.assignments_dir(),
            p.assignment(&id),
            p.supervisors_dir(),
            p.supervisor(&sup),
            p.workerbeats_dir(),
            p.workerbeats_topology(&id),
            p.workerbeat(&id, &slot),
            p.errors_dir(),
            p.errors_topology(&id),
            p.errors_component(&id, &comp),
            p.error_sequential_prefix(&id, &comp),
        ]
    }

    const STORM_SUFFIXES: [&str; 13] = [
        "/storms",
        "/storms/wc-1-1700000000",
        "/assignments",
        "/assignments/wc-1-1700000000",
        "/supervisors",
        "/supervisors/sup-a1",
        "/workerbeats",
        "/workerbeats/wc-1-1700000000",
        "/workerbeats/wc-1-1700000000/sup-a1-6700",
        "/errors",
        "/errors/wc-1-1700000000",
        "/errors/wc-1-1700000000/split",
        "/errors/wc-1-1700000000/split/e",
    ];

    #[test]
    fn storm_paths_default_and_custom_root() {
        for (paths, root) in [
            (StormPaths::default(), "/storm"),
            (StormPaths::new("/storm").unwrap(), "/storm"),
            (StormPaths::new("/apps/squall-test").unwrap(), "/apps/squall-test"),
        ] {
            assert_eq!(paths.root(), root);
            let expected: Vec<String> = STORM_SUFFIXES.iter().map(|s| format!("{root}{s}")).collect();
            assert_eq!(storm_table(&paths), expected);
        }
    }

    #[test]
    fn storm_root_is_validated() {
        for bad in ["", "/", "storm", "/storm/", "//storm", "/a//b", "/a/./b", "/a/..", "/a\nb"] {
            let err = StormPaths::new(bad).unwrap_err();
            assert_eq!(err.kind, "storm root");
        }
    }

    #[test]
    fn error_sequence_numbers() {
        assert_eq!(StormPaths::parse_error_seq("e0000000042"), Some(42));
        assert_eq!(StormPaths::parse_error_seq("e2147483647"), Some(2_147_483_647));
        for bad in ["e", "e42", "x0000000042", "e000000004x", "e-000000042", "e00000000042", "e9999999999"] {
            assert_eq!(StormPaths::parse_error_seq(bad), None, "{bad}");
        }
    }

    fn kafka_table(p: &KafkaPaths) -> Vec<String> {
        let g = GroupId::new("mygroup").unwrap();
        let c = ConsumerId::new("mygroup_host1-1400000000000-a1b2c3d4").unwrap();
        let t = Topic::new("clicks").unwrap();
        let part = Partition::new(3).unwrap();
        vec![
            p.consumers_dir(),
            p.group(&g),
            p.ids_dir(&g),
            p.id(&g, &c),
            p.owners_dir(&g),
            p.owners_topic(&g, &t),
            p.owner(&g, &t, part),
            p.offsets_dir(&g),
            p.offsets_topic(&g, &t),
            p.offset(&g, &t, part),
            p.brokers_ids_dir(),
            p.broker(BrokerId(2)),
            p.brokers_topics_dir(),
            p.topic(&t),
        ]
    }

    const KAFKA_PATHS: [&str; 14] = [
        "/consumers",
        "/consumers/mygroup",
        "/consumers/mygroup/ids",
        "/consumers/mygroup/ids/mygroup_host1-1400000000000-a1b2c3d4",
        "/consumers/mygroup/owners",
        "/consumers/mygroup/owners/clicks",
        "/consumers/mygroup/owners/clicks/3",
        "/consumers/mygroup/offsets",
        "/consumers/mygroup/offsets/clicks",
        "/consumers/mygroup/offsets/clicks/3",
        "/brokers/ids",
        "/brokers/ids/2",
        "/brokers/topics",
        "/brokers/topics/clicks",
    ];

    #[test]
    fn kafka_paths_default_and_chroot() {
        for (paths, chroot) in [
            (KafkaPaths::default(), ""),
            (KafkaPaths::new(None).unwrap(), ""),
            (KafkaPaths::new(Some("/")).unwrap(), ""),
            (KafkaPaths::new(Some("/kafka")).unwrap(), "/kafka"),
            (KafkaPaths::new(Some("/a/kafka-1")).unwrap(), "/a/kafka-1"),
        ] {
            assert_eq!(paths.chroot(), (!chroot.is_empty()).then_some(chroot));
            let expected: Vec<String> = KAFKA_PATHS.iter().map(|s| format!("{chroot}{s}")).collect();
            assert_eq!(kafka_table(&paths), expected);
        }
    }

    #[test]
    fn kafka_chroot_is_validated() {
        for bad in ["", "kafka", "/kafka/", "//", "/a/../b"] {
            assert_eq!(KafkaPaths::new(Some(bad)).unwrap_err().kind, "kafka chroot");
        }
    }
}
