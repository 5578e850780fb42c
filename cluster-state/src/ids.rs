//! Identifier newtypes shared by every Squall process.
//!
//! Each id that becomes a ZooKeeper path segment is validated when it is built (`new`,
//! `FromStr`, or serde deserialization), so a path built from ids always names one node:
//! non-empty, no `/`, not `.` or `..`, none of the characters ZooKeeper rejects (controls
//! U+0000-U+001F and U+007F-U+009F, U+E000-U+F8FF, U+FFF0-U+FFFF). Some ids add the rule of the
//! system they come from (Storm's topology names, Kafka's topic names).
//!
//! All ids serialize transparently: a string id as a JSON string, a numeric id as a number,
//! an [`ExecutorId`] as Storm's `[start, end]` pair.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An identifier that broke the rule of its kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {value:?}: {rule}")]
pub struct IdError {
    /// What the value was meant to be, e.g. `"topic"`.
    pub kind: &'static str,
    /// The offending value.
    pub value: String,
    /// The rule it broke.
    pub rule: &'static str,
}

impl IdError {
    fn new(kind: &'static str, value: &str, rule: &'static str) -> Self {
        Self { kind, value: value.to_owned(), rule }
    }
}

/// The rule every path segment must follow, stated in [`IdError::rule`].
const SEGMENT_RULE: &str =
    "must be a non-empty ZooKeeper path segment: no '/', not '.' or '..', no control characters";

/// Whether ZooKeeper refuses `c` anywhere in a path (its `PathUtils.validatePath`).
fn is_zk_forbidden(c: char) -> bool {
    c.is_control() || ('\u{E000}'..='\u{F8FF}').contains(&c) || ('\u{FFF0}'..='\u{FFFF}').contains(&c)
}

/// Checks that `value` can be one ZooKeeper path segment.
pub(crate) fn check_segment(kind: &'static str, value: &str) -> Result<(), IdError> {
    if value.is_empty()
        || value == "."
        || value == ".."
        || value.chars().any(|c| c == '/' || is_zk_forbidden(c))
    {
        return Err(IdError::new(kind, value, SEGMENT_RULE));
    }
    Ok(())
}

/// Parses a canonical non-negative decimal: ASCII digits only, no sign, no leading zero.
/// Canonical form matters because the number is turned back into a path segment.
fn parse_canonical<T: FromStr>(kind: &'static str, s: &str) -> Result<T, IdError> {
    const RULE: &str = "must be a non-negative decimal integer without sign or leading zeros";
    let canonical =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if !canonical {
        return Err(IdError::new(kind, s, RULE));
    }
    s.parse().map_err(|_| IdError::new(kind, s, "is out of range"))
}

/// Declares a validated string newtype with `as_str`, `Display`, `FromStr`, serde, and a
/// validating constructor named `$ctor` (`pub new` unless the type builds itself from parts).
macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $vis:vis fn $ctor:ident, $check:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates `value` and wraps it.
            $vis fn $ctor(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                let check: fn(&'static str, &str) -> Result<(), IdError> = $check;
                check($kind, &value)?;
                Ok(Self(value))
            }

            /// The id as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::$ctor(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::$ctor(s)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

/// The longest topology name, in characters. A topology id (`<name>-<counter>-<launch secs>`,
/// up to 42 more characters) becomes a ZooKeeper node, a URL path segment, and a directory name
/// on nimbus and on every supervisor (whose download directory adds 47 more); 128 keeps all of
/// them under the 255 bytes a Linux file name may have.
pub const MAX_TOPOLOGY_NAME_LEN: usize = 128;

/// The rule of [`TopologyName`], as its errors state it.
pub const TOPOLOGY_NAME_RULE: &str = "must be 1 to 128 characters, each an ASCII letter, a digit, '-' or '_'";

string_id!(
    /// A topology's user-given name: Storm's rule (`^[^/.:\\]+$`) narrowed to what needs no
    /// escaping anywhere the name goes (URL path segments, file and directory names, ZooKeeper
    /// nodes, log lines, Prometheus labels): ASCII letters, digits, `-` and `_`, at most
    /// [`MAX_TOPOLOGY_NAME_LEN`] characters. Nothing a client sends is percent-decoded, so a
    /// name that needed escaping could be submitted but never be named again in a request.
    TopologyName,
    "topology name",
    pub fn new,
    |kind, v| {
        let allowed = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if v.is_empty() || v.len() > MAX_TOPOLOGY_NAME_LEN || !v.chars().all(allowed) {
            return Err(IdError::new(kind, v, TOPOLOGY_NAME_RULE));
        }
        Ok(())
    }
);

/// A topology instance, Storm's `<name>-<counter>-<launch secs>` (e.g. `wc-1-1700000000`).
/// Built from its parts with [`TopologyId::new`], or parsed (`FromStr`, serde) from that form.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TopologyId {
    id: String,
    name_len: usize,
    counter: u64,
    launch_secs: u64,
}

impl TopologyId {
    /// Storm's id for the `counter`-th submission of `name`, launched at `launch_secs`.
    pub fn new(name: &TopologyName, counter: u64, launch_secs: u64) -> Self {
        // A valid name followed by two numbers is always a valid id and path segment.
        Self {
            id: format!("{name}-{counter}-{launch_secs}"),
            name_len: name.as_str().len(),
            counter,
            launch_secs,
        }
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.id
    }

    /// The topology name part.
    pub fn name(&self) -> &str {
        &self.id[..self.name_len]
    }

    /// The submission counter part.
    pub fn counter(&self) -> u64 {
        self.counter
    }

    /// The launch time part, in seconds since the epoch.
    pub fn launch_secs(&self) -> u64 {
        self.launch_secs
    }
}

impl fmt::Display for TopologyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

impl FromStr for TopologyId {
    type Err = IdError;
    /// Splits at the last two dashes (names may contain dashes) and validates each part.
    fn from_str(s: &str) -> Result<Self, IdError> {
        let bad = || IdError::new("topology id", s, "must be <topology name>-<counter>-<launch secs>");
        let mut parts = s.rsplitn(3, '-');
        let launch_secs =
            parse_canonical("topology id", parts.next().unwrap_or_default()).map_err(|_| bad())?;
        let counter = parse_canonical("topology id", parts.next().unwrap_or_default()).map_err(|_| bad())?;
        let name = TopologyName::new(parts.next().unwrap_or_default()).map_err(|_| bad())?;
        Ok(Self::new(&name, counter, launch_secs))
    }
}

impl TryFrom<String> for TopologyId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        s.parse()
    }
}

impl From<TopologyId> for String {
    fn from(id: TopologyId) -> String {
        id.id
    }
}

string_id!(
    /// A spout or bolt id within a topology (Storm's component id), a valid path segment.
    ComponentId,
    "component id",
    pub fn new,
    check_segment
);

string_id!(
    /// A supervisor's id (Storm uses a UUID), stable across supervisor restarts.
    SupervisorId,
    "supervisor id",
    pub fn new,
    check_segment
);

string_id!(
    /// A worker's id, made by its supervisor (a UUID) when it launches the worker: the name of
    /// its local heartbeat directory and how a restarted supervisor recognises it, so a valid
    /// path segment.
    WorkerId,
    "worker id",
    pub fn new,
    check_segment
);

string_id!(
    /// A Kafka consumer group id, a valid path segment.
    GroupId,
    "group id",
    pub fn new,
    check_segment
);

string_id!(
    /// The name of a consumer group's offset snapshot (`squall offsets snapshot --name`), a
    /// valid path segment.
    SnapshotName,
    "snapshot name",
    pub fn new,
    check_segment
);

string_id!(
    /// A Kafka topic name: `[a-zA-Z0-9._-]+`, at most 249 characters, not `.` or `..` (Kafka's rule).
    Topic,
    "topic",
    pub fn new,
    |kind, v| {
        if v.len() > 249 {
            return Err(IdError::new(kind, v, "must be at most 249 characters (Kafka's rule)"));
        }
        if v.is_empty() || v == "." || v == ".." || !v.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
            return Err(IdError::new(kind, v, "must match [a-zA-Z0-9._-]+ and not be '.' or '..' (Kafka's rule)"));
        }
        Ok(())
    }
);

string_id!(
    /// A Kafka consumer id, by default `group_host-millis-uuid8` (see [`ConsumerId::generate`]).
    ConsumerId,
    "consumer id",
    pub fn new,
    check_segment
);

impl ConsumerId {
    /// Kafka 0.8's default consumer id: `<group>_<host>-<now_ms>-<uuid8>`, where `uuid8` is the
    /// first 8 hex digits of a random UUID. Fails if `host` or `uuid8` makes it no path segment.
    pub fn generate(group: &GroupId, host: &str, now_ms: u64, uuid8: &str) -> Result<Self, IdError> {
        Self::new(format!("{group}_{host}-{now_ms}-{uuid8}"))
    }
}

string_id!(
    /// One consumer stream of a consumer, Kafka's `<consumer id>-<n>`. Owner znodes hold it and
    /// range assignment sorts by it (as a string, like Kafka).
    ConsumerThreadId,
    "consumer thread id",
    fn validated,
    |kind, v| {
        check_segment(kind, v)?;
        match v.rsplit_once('-') {
            Some((consumer, n)) if !consumer.is_empty() && parse_canonical::<u32>(kind, n).is_ok() => Ok(()),
            _ => Err(IdError::new(kind, v, "must be <consumer id>-<thread number>")),
        }
    }
);

impl ConsumerThreadId {
    /// Thread `n` of `consumer`.
    pub fn new(consumer: &ConsumerId, n: u32) -> Self {
        // A path segment followed by "-<digits>" is still a path segment.
        Self(format!("{consumer}-{n}"))
    }
}

/// A task: one instance of a component's logic (Storm's task id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TaskId(pub u32);

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for TaskId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        parse_canonical("task id", s).map(Self)
    }
}

/// An executor: the thread running tasks `start_task..=end_task` (Storm's `[start end]`).
/// Serialized as the JSON pair `[start, end]`; displayed as `[3 4]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "[u32; 2]", into = "[u32; 2]")]
pub struct ExecutorId {
    start_task: TaskId,
    end_task: TaskId,
}

impl ExecutorId {
    /// The executor of tasks `start..=end`; fails if `start > end`.
    pub fn new(start: TaskId, end: TaskId) -> Result<Self, IdError> {
        if start > end {
            return Err(IdError::new(
                "executor",
                &format!("[{start} {end}]"),
                "start task must not exceed end task",
            ));
        }
        Ok(Self { start_task: start, end_task: end })
    }

    /// The executor of the single task `task`.
    pub fn single(task: TaskId) -> Self {
        Self { start_task: task, end_task: task }
    }

    /// The first task.
    pub fn start_task(&self) -> TaskId {
        self.start_task
    }

    /// The last task (inclusive).
    pub fn end_task(&self) -> TaskId {
        self.end_task
    }

    /// All tasks of this executor, in order.
    pub fn tasks(&self) -> impl Iterator<Item = TaskId> + use<> {
        (self.start_task.0..=self.end_task.0).map(TaskId)
    }
}

impl fmt::Display for ExecutorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{} {}]", self.start_task, self.end_task)
    }
}

impl FromStr for ExecutorId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        let bad = || IdError::new("executor", s, "must be [<start task> <end task>]");
        let inner = s.strip_prefix('[').and_then(|r| r.strip_suffix(']')).ok_or_else(bad)?;
        let (start, end) = inner.split_once(' ').ok_or_else(bad)?;
        Self::new(start.parse().map_err(|_| bad())?, end.parse().map_err(|_| bad())?)
    }
}

impl TryFrom<[u32; 2]> for ExecutorId {
    type Error = IdError;
    fn try_from([start, end]: [u32; 2]) -> Result<Self, IdError> {
        Self::new(TaskId(start), TaskId(end))
    }
}

impl From<ExecutorId> for [u32; 2] {
    fn from(e: ExecutorId) -> Self {
        [e.start_task.0, e.end_task.0]
    }
}

/// A worker slot: one port on one supervisor. Displayed as `node:port`; its workerbeat znode
/// is named `node-port` (see [`WorkerSlot::beat_node_name`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkerSlot {
    /// The supervisor.
    pub node: SupervisorId,
    /// The worker's port on it.
    pub port: u16,
}

impl WorkerSlot {
    /// The name of this slot's znode under `/workerbeats/<topology-id>`: `<node>-<port>`.
    pub fn beat_node_name(&self) -> String {
        format!("{}-{}", self.node, self.port)
    }

    /// Parses a workerbeat znode name back, splitting at the last `-` (supervisor ids contain
    /// dashes, ports do not).
    pub fn from_beat_node_name(name: &str) -> Result<Self, IdError> {
        let bad = || IdError::new("workerbeat node name", name, "must be <supervisor id>-<port>");
        let (node, port) = name.rsplit_once('-').ok_or_else(bad)?;
        Ok(Self { node: SupervisorId::new(node)?, port: parse_canonical("port", port).map_err(|_| bad())? })
    }
}

impl fmt::Display for WorkerSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.node, self.port)
    }
}

impl FromStr for WorkerSlot {
    type Err = IdError;
    /// Parses `node:port`, splitting at the last `:`.
    fn from_str(s: &str) -> Result<Self, IdError> {
        let bad = || IdError::new("worker slot", s, "must be <supervisor id>:<port>");
        let (node, port) = s.rsplit_once(':').ok_or_else(bad)?;
        Ok(Self { node: SupervisorId::new(node)?, port: parse_canonical("port", port).map_err(|_| bad())? })
    }
}

/// A Kafka partition number, never negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "i32", into = "i32")]
pub struct Partition(i32);

impl Partition {
    /// Wraps `n`; fails if it is negative.
    pub fn new(n: i32) -> Result<Self, IdError> {
        if n < 0 {
            return Err(IdError::new("partition", &n.to_string(), "must not be negative"));
        }
        Ok(Self(n))
    }

    /// The partition number.
    pub fn get(self) -> i32 {
        self.0
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for Partition {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, IdError> {
        parse_canonical("partition", s).map(Self)
    }
}

impl TryFrom<i32> for Partition {
    type Error = IdError;
    fn try_from(n: i32) -> Result<Self, IdError> {
        Self::new(n)
    }
}

impl From<Partition> for i32 {
    fn from(p: Partition) -> i32 {
        p.0
    }
}

/// A Kafka broker id (`broker.id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BrokerId(pub i32);

impl fmt::Display for BrokerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for BrokerId {
    type Err = IdError;
    /// Parses a `/brokers/ids` child name: a canonical non-negative decimal.
    fn from_str(s: &str) -> Result<Self, IdError> {
        parse_canonical("broker id", s).map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_names_follow_storm_rule() {
        assert!(TOPOLOGY_NAME_RULE.contains(&format!("1 to {MAX_TOPOLOGY_NAME_LEN} characters")));
        let longest = "x".repeat(MAX_TOPOLOGY_NAME_LEN);
        for ok in ["wc", "a-b_c", "-_-", "Word-Count_2", longest.as_str()] {
            assert!(TopologyName::new(ok).is_ok(), "{ok}");
        }
        // Storm's own refusals, and what would need escaping in a URL or a file name.
        let too_long = "x".repeat(MAX_TOPOLOGY_NAME_LEN + 1);
        for bad in [
            "",
            "a/b",
            "a.b",
            "a:b",
            "a\\b",
            ".",
            "..",
            "a\nb",
            "a\u{7f}",
            "word count",
            "a|b",
            "a`b",
            "a%20b",
            "a?b",
            "a#b",
            "ünïcode",
            too_long.as_str(),
        ] {
            let err = TopologyName::new(bad).unwrap_err();
            assert_eq!(err.kind, "topology name");
            assert_eq!(err.value, bad);
        }
    }

    #[test]
    fn topology_id_parts_round_trip() {
        let name = TopologyName::new("word-count").unwrap();
        let id = TopologyId::new(&name, 3, 1_700_000_000);
        assert_eq!(id.as_str(), "word-count-3-1700000000");
        assert_eq!((id.name(), id.counter(), id.launch_secs()), ("word-count", 3, 1_700_000_000));
        assert_eq!("word-count-3-1700000000".parse::<TopologyId>().unwrap(), id);
        for bad in ["wc", "wc-1", "wc-x-1", "-1-2", "a.b-1-2", "wc-01-2", "wc-1-+2", "wc-1-2-", "a/b-1-2"] {
            assert!(bad.parse::<TopologyId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn segments_reject_what_zookeeper_rejects() {
        for bad in ["", ".", "..", "a/b", "a\0b", "a\u{1}", "a\u{85}", "a\u{e000}", "a\u{fff0}"] {
            assert!(ComponentId::new(bad).is_err(), "{bad:?}");
            assert!(GroupId::new(bad).is_err(), "{bad:?}");
            assert!(SupervisorId::new(bad).is_err(), "{bad:?}");
        }
        for ok in ["__acker", "split", "a.b", "...", "grüße"] {
            assert!(ComponentId::new(ok).is_ok(), "{ok:?}");
        }
    }

    #[test]
    fn topics_follow_kafka_rule() {
        assert!(Topic::new("a".repeat(249)).is_ok());
        assert!(Topic::new("My_topic.v1-x").is_ok());
        assert!(Topic::new("...").is_ok());
        for bad in ["", ".", "..", "a b", "a/b", "é", "a:b"] {
            assert!(Topic::new(bad).is_err(), "{bad:?}");
        }
        let err = Topic::new("a".repeat(250)).unwrap_err();
        assert!(err.to_string().contains("249"), "{err}");
    }

    #[test]
    fn id_error_names_kind_value_and_rule() {
        let err = Topic::new("a b").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid topic \"a b\": must match [a-zA-Z0-9._-]+ and not be '.' or '..' (Kafka's rule)"
        );
    }

    #[test]
    fn executor_display_parse_and_serde() {
        let e = ExecutorId::new(TaskId(3), TaskId(4)).unwrap();
        assert_eq!(e.to_string(), "[3 4]");
        assert_eq!("[3 4]".parse::<ExecutorId>().unwrap(), e);
        assert_eq!(serde_json::to_string(&e).unwrap(), "[3,4]");
        assert_eq!(serde_json::from_str::<ExecutorId>("[3,4]").unwrap(), e);
        assert!(serde_json::from_str::<ExecutorId>("[4,3]").is_err());
        assert!(ExecutorId::new(TaskId(2), TaskId(1)).is_err());
        assert_eq!(e.tasks().collect::<Vec<_>>(), [TaskId(3), TaskId(4)]);
        for bad in ["3 4", "[3,4]", "[3  4]", "[4 3]", "[-1 2]"] {
            assert!(bad.parse::<ExecutorId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn worker_slot_names() {
        let slot = WorkerSlot { node: SupervisorId::new("6f1c-9a2b").unwrap(), port: 6700 };
        assert_eq!(slot.to_string(), "6f1c-9a2b:6700");
        assert_eq!(slot.beat_node_name(), "6f1c-9a2b-6700");
        assert_eq!(WorkerSlot::from_beat_node_name("6f1c-9a2b-6700").unwrap(), slot);
        assert_eq!("6f1c-9a2b:6700".parse::<WorkerSlot>().unwrap(), slot);
        for bad in ["6700", "-6700", "node-", "node-70000", "node-x"] {
            assert!(WorkerSlot::from_beat_node_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn kafka_consumer_ids() {
        let group = GroupId::new("mygroup").unwrap();
        let consumer = ConsumerId::generate(&group, "host1", 1_400_000_000_000, "a1b2c3d4").unwrap();
        assert_eq!(consumer.as_str(), "mygroup_host1-1400000000000-a1b2c3d4");
        let thread = ConsumerThreadId::new(&consumer, 0);
        assert_eq!(thread.as_str(), "mygroup_host1-1400000000000-a1b2c3d4-0");
        assert_eq!(thread.as_str().parse::<ConsumerThreadId>().unwrap(), thread);
        assert!(ConsumerId::generate(&group, "a/b", 1, "x").is_err());
        for bad in ["c", "c-", "-0", "c-x", "c-01"] {
            assert!(bad.parse::<ConsumerThreadId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn numeric_ids_are_canonical() {
        assert_eq!("7".parse::<Partition>().unwrap().get(), 7);
        assert!(Partition::new(-1).is_err());
        for bad in ["", "-1", "+1", "07", "1e3", " 1", "2147483648"] {
            assert!(bad.parse::<Partition>().is_err(), "{bad:?}");
            assert!(bad.parse::<BrokerId>().is_err(), "{bad:?}");
        }
        assert!(serde_json::from_str::<Partition>("-1").is_err());
        assert_eq!(serde_json::from_str::<Partition>("3").unwrap(), Partition::new(3).unwrap());
        assert_eq!("0".parse::<TaskId>().unwrap(), TaskId(0));
    }

    #[test]
    fn string_ids_validate_on_deserialize() {
        assert!(serde_json::from_str::<Topic>("\"a b\"").is_err());
        let topic: Topic = serde_json::from_str("\"clicks\"").unwrap();
        assert_eq!(serde_json::to_string(&topic).unwrap(), "\"clicks\"");
    }
}
