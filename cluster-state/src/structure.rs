//! A topology's shape as nimbus needs it: its name, worker count, and each component's executors
//! and tasks, read from the Flux YAML without resolving a single class.
//!
//! Nimbus schedules topologies whose components it cannot load (they may live in the user's own
//! worker binary), so it reads only the structural fields of the file: `name`,
//! `config.topology.workers`, `config.topology.acker.executors`, and `id` / `parallelism` /
//! `numTasks` of every spout and bolt. Everything else (classes, params, streams, other config
//! keys) is the worker's business and is checked by the worker's loader, which `squall submit`
//! runs before uploading. The two readers agree on the numbers; worker's tests hold them to it.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::ids::{ComponentId, TopologyName};
use crate::layout::TaskLayout;

/// The component id of acker tasks (Storm's `__acker`).
pub const ACKER_COMPONENT: &str = "__acker";

/// One component's executor and task counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComponentShape {
    /// Executors (`parallelism`).
    pub executors: u32,
    /// Tasks (`numTasks`, default: the parallelism); fixed for the topology's lifetime.
    pub tasks: u32,
}

/// What nimbus knows of a topology's definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyStructure {
    pub name: TopologyName,
    /// `topology.workers` (Storm's default: 1).
    pub num_workers: u32,
    /// Every component, ackers (`__acker`) included when acking is on.
    pub components: BTreeMap<ComponentId, ComponentShape>,
}

/// Why a topology file's structure is unusable. The message names the element.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("topology file: {element}: {reason}")]
pub struct StructureError {
    pub element: String,
    pub reason: String,
}

impl StructureError {
    fn new(element: impl Into<String>, reason: impl Into<String>) -> Self {
        StructureError { element: element.into(), reason: reason.into() }
    }
}

#[derive(Deserialize)]
struct File {
    name: Option<String>,
    #[serde(default)]
    config: Config,
    #[serde(default)]
    spouts: Vec<Component>,
    #[serde(default)]
    bolts: Vec<Component>,
}

#[derive(Deserialize, Default)]
struct Config {
    #[serde(rename = "topology.workers")]
    workers: Option<u32>,
    #[serde(rename = "topology.acker.executors")]
    acker_executors: Option<u32>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Component {
    id: Option<String>,
    parallelism: Option<u32>,
    num_tasks: Option<u32>,
}

impl TopologyStructure {
    /// Reads the structure of a Flux YAML topology file.
    pub fn from_flux(text: &str) -> Result<TopologyStructure, StructureError> {
        let file: File = serde_yaml_ng::from_str(text).map_err(|e| {
            let at = e.location().map_or_else(String::new, |l| format!("line {}", l.line()));
            StructureError::new(if at.is_empty() { "YAML".to_owned() } else { at }, e.to_string())
        })?;
        let name = file.name.ok_or_else(|| StructureError::new("name", "missing"))?;
        let name = TopologyName::new(&name).map_err(|e| StructureError::new("name", e.to_string()))?;
        let num_workers = file.config.workers.unwrap_or(1);
        if num_workers == 0 {
            return Err(StructureError::new("config topology.workers", "must be at least 1"));
        }
        let mut components = BTreeMap::new();
        let sections = [("spouts", &file.spouts), ("bolts", &file.bolts)];
        for (section, list) in sections {
            for (i, c) in list.iter().enumerate() {
                let element = format!("{section}[{i}]");
                let id = c.id.as_deref().ok_or_else(|| StructureError::new(&element, "id is missing"))?;
                let element = format!("{section}[{i}] {id:?}");
                let id = ComponentId::new(id).map_err(|e| StructureError::new(&element, e.to_string()))?;
                if id.as_str().starts_with("__") {
                    return Err(StructureError::new(
                        &element,
                        "ids starting with __ are reserved for Squall",
                    ));
                }
                let executors = c.parallelism.unwrap_or(1);
                if executors == 0 {
                    return Err(StructureError::new(&element, "parallelism must be at least 1"));
                }
                let tasks = c.num_tasks.unwrap_or(executors);
                if tasks < executors {
                    return Err(StructureError::new(
                        &element,
                        format!("numTasks {tasks} is less than parallelism {executors}"),
                    ));
                }
                if components.insert(id, ComponentShape { executors, tasks }).is_some() {
                    return Err(StructureError::new(&element, "duplicate id"));
                }
            }
        }
        if components.is_empty() {
            return Err(StructureError::new("spouts", "a topology needs at least one spout or bolt"));
        }
        let ackers = file.config.acker_executors.unwrap_or(num_workers);
        if ackers > 0
            && let Ok(acker) = ComponentId::new(ACKER_COMPONENT)
        {
            components.insert(acker, ComponentShape { executors: ackers, tasks: ackers });
        }
        let structure = TopologyStructure { name, num_workers, components };
        // Task ids are u32 counted from 1 (`TaskLayout::compute`): more tasks than that cannot
        // be numbered, and Storm's numbering silently wrapped.
        if structure.total_tasks() > u64::from(u32::MAX - 1) {
            return Err(StructureError::new(
                "numTasks",
                format!(
                    "the topology has {} tasks in all (ackers included); task ids are 32-bit, so at most {}",
                    structure.total_tasks(),
                    u32::MAX - 1
                ),
            ));
        }
        Ok(structure)
    }

    /// Tasks of every component, ackers included (fixed for the topology's lifetime).
    pub fn total_tasks(&self) -> u64 {
        self.components.values().map(|s| u64::from(s.tasks)).sum()
    }

    /// Executors of every component with `executors` per component as
    /// [`TopologyStructure::layout`] counts them (capped at the component's tasks).
    pub fn total_executors(&self, executors: &BTreeMap<ComponentId, u32>) -> u64 {
        self.components.iter().map(|(c, s)| u64::from(executors_of(s, executors.get(c).copied()))).sum()
    }

    /// Executors per component, as `StormBase::component_executors` holds them.
    pub fn component_executors(&self) -> BTreeMap<ComponentId, u32> {
        self.components.iter().map(|(c, s)| (c.clone(), s.executors)).collect()
    }

    /// The task layout with `executors` per component (a rebalance's `-e comp=N`; components not
    /// in it keep their own count). A count above the component's tasks is capped at the tasks,
    /// as Storm does.
    pub fn layout(&self, executors: &BTreeMap<ComponentId, u32>) -> TaskLayout {
        let triples: Vec<(ComponentId, u32, u32)> = self
            .components
            .iter()
            .map(|(c, s)| (c.clone(), executors_of(s, executors.get(c).copied()), s.tasks))
            .collect();
        TaskLayout::compute(&triples)
    }
}

/// A component's executors: `asked` (a rebalance's `-e`) or its own, capped at its tasks as Storm
/// does.
fn executors_of(shape: &ComponentShape, asked: Option<u32>) -> u32 {
    asked.unwrap_or(shape.executors).clamp(1, shape.tasks.max(1))
}

/// Whether a component is a spout or a bolt (Storm UI's `componentType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComponentKind {
    Spout,
    Bolt,
}

impl ComponentKind {
    /// Storm UI's lower-case word.
    pub fn as_str(self) -> &'static str {
        match self {
            ComponentKind::Spout => "spout",
            ComponentKind::Bolt => "bolt",
        }
    }
}

/// One stream of a topology file: `from` feeds `to` on `stream` with `grouping`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamEdge {
    pub from: ComponentId,
    pub to: ComponentId,
    /// The stream id (`default` unless the grouping names one).
    pub stream: String,
    /// The grouping in Storm's lower-case Thrift field names (`shuffle`, `fields`,
    /// `local_or_shuffle`, ...; Flux's `GLOBAL` is `global`).
    pub grouping: String,
}

/// What the UI shows of a topology's definition: its components by kind, its streams and its
/// `config` section, read from the Flux file without resolving classes (as
/// [`TopologyStructure::from_flux`]). Secret config values are replaced by
/// [`crate::secrets::REDACTED`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TopologyGraph {
    pub components: BTreeMap<ComponentId, ComponentKind>,
    pub streams: Vec<StreamEdge>,
    /// The file's `config` section (Storm's keys), secrets redacted.
    pub config: BTreeMap<String, serde_json::Value>,
}

#[derive(Deserialize)]
struct GraphFile {
    #[serde(default)]
    config: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    spouts: Vec<GraphComponent>,
    #[serde(default)]
    bolts: Vec<GraphComponent>,
    #[serde(default)]
    streams: Vec<GraphStream>,
}

#[derive(Deserialize)]
struct GraphComponent {
    id: String,
}

#[derive(Deserialize)]
struct GraphStream {
    from: String,
    to: String,
    grouping: GraphGrouping,
}

#[derive(Deserialize)]
struct GraphGrouping {
    #[serde(rename = "type")]
    kind: String,
    #[serde(rename = "streamId", default)]
    stream_id: Option<String>,
}

/// Storm's default stream id.
pub const DEFAULT_STREAM: &str = "default";

impl TopologyGraph {
    /// Reads components, streams and config of a Flux file. A stream naming a component the
    /// file does not declare is an error naming the stream.
    pub fn from_flux(text: &str) -> Result<TopologyGraph, StructureError> {
        let file: GraphFile = serde_yaml_ng::from_str(text).map_err(|e| {
            let at = e.location().map_or_else(|| "YAML".to_owned(), |l| format!("line {}", l.line()));
            StructureError::new(at, e.to_string())
        })?;
        let mut components = BTreeMap::new();
        for (section, list, kind) in
            [("spouts", &file.spouts, ComponentKind::Spout), ("bolts", &file.bolts, ComponentKind::Bolt)]
        {
            for (i, c) in list.iter().enumerate() {
                let id = ComponentId::new(&c.id)
                    .map_err(|e| StructureError::new(format!("{section}[{i}]"), e.to_string()))?;
                components.insert(id, kind);
            }
        }
        let mut streams = Vec::new();
        for (i, s) in file.streams.iter().enumerate() {
            let element = format!("streams[{i}]");
            let known = |name: &str| {
                ComponentId::new(name)
                    .ok()
                    .filter(|c| components.contains_key(c))
                    .ok_or_else(|| StructureError::new(&element, format!("no component {name:?}")))
            };
            streams.push(StreamEdge {
                from: known(&s.from)?,
                to: known(&s.to)?,
                stream: s.grouping.stream_id.clone().unwrap_or_else(|| DEFAULT_STREAM.to_owned()),
                grouping: s.grouping.kind.to_ascii_lowercase(),
            });
        }
        let listed: Vec<String> = match file.config.get(crate::secrets::SECRET_KEYS_KEY) {
            Some(serde_json::Value::Array(keys)) => {
                keys.iter().filter_map(|k| k.as_str().map(str::to_owned)).collect()
            }
            _ => Vec::new(),
        };
        let config = file
            .config
            .into_iter()
            .map(|(key, value)| {
                let value = if crate::secrets::is_secret_key(&key, &listed) {
                    serde_json::Value::String(crate::secrets::REDACTED.to_owned())
                } else {
                    value
                };
                (key, value)
            })
            .collect();
        Ok(TopologyGraph { components, streams, config })
    }

    /// The streams into `component`.
    pub fn inputs<'a>(&'a self, component: &'a ComponentId) -> impl Iterator<Item = &'a StreamEdge> + 'a {
        self.streams.iter().filter(move |s| &s.to == component)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> ComponentId {
        ComponentId::new(s).unwrap()
    }

    const WORDCOUNT: &str = "
name: wordcount
config:
  topology.workers: 2
  topology.max.spout.pending: 1000
spouts:
  - id: sentences
    className: sentence-generator
    params: {rate_per_sec: 20}
bolts:
  - id: split
    className: split-sentence
    parallelism: 2
    numTasks: 4
  - id: count
    className: word-count
    parallelism: 3
streams:
  - {from: sentences, to: split, grouping: {type: SHUFFLE}}
";

    #[test]
    fn reads_counts_and_adds_ackers() {
        let s = TopologyStructure::from_flux(WORDCOUNT).unwrap();
        assert_eq!(s.name.as_str(), "wordcount");
        assert_eq!(s.num_workers, 2);
        let shapes: Vec<(&str, u32, u32)> =
            s.components.iter().map(|(c, s)| (c.as_str(), s.executors, s.tasks)).collect();
        assert_eq!(shapes, vec![("__acker", 2, 2), ("count", 3, 3), ("sentences", 1, 1), ("split", 2, 4)]);
        let layout = s.layout(&s.component_executors());
        assert_eq!(layout.max_task(), 10);
        assert_eq!(layout.executors.len(), 8);
        // A rebalance to 4 executors of split uses its 4 tasks; 9 is capped to them.
        let more = s.layout(&BTreeMap::from([(c("split"), 9)]));
        assert_eq!(more.executors.values().filter(|v| v.as_str() == "split").count(), 4);
    }

    #[test]
    fn acking_off_has_no_ackers() {
        let s =
            TopologyStructure::from_flux("name: t\nconfig: {topology.acker.executors: 0}\nbolts: [{id: b}]")
                .unwrap();
        assert_eq!(s.components.keys().map(ComponentId::as_str).collect::<Vec<_>>(), vec!["b"]);
        assert_eq!(s.num_workers, 1);
    }

    #[test]
    fn bad_structures_name_the_element() {
        let cases = [
            ("spouts: [{id: s}]", "name: missing"),
            ("name: a/b\nspouts: [{id: s}]", "name: "),
            ("name: t", "spouts: a topology needs"),
            ("name: t\nspouts: [{id: s}, {id: s}]", "spouts[1] \"s\": duplicate id"),
            ("name: t\nspouts: [{id: s}]\nbolts: [{id: s}]", "bolts[0] \"s\": duplicate id"),
            ("name: t\nbolts: [{id: b, parallelism: 0}]", "bolts[0] \"b\": parallelism must be"),
            ("name: t\nbolts: [{id: b, parallelism: 3, numTasks: 2}]", "numTasks 2 is less"),
            ("name: t\nbolts: [{parallelism: 3}]", "bolts[0]: id is missing"),
            ("name: t\nbolts: [{id: __acker}]", "reserved"),
            ("name: t\nconfig: {topology.workers: 0}\nbolts: [{id: b}]", "topology.workers: must be"),
            ("name: t\nbolts: [{id: b, parallelism: many}]", "line 2"),
            ("[1, 2]", "line 1"),
            ("name: t\nbolts: {id: b}", "line 2"),
            (
                "name: t\nbolts: [{id: b, numTasks: 4294967295}]",
                "numTasks: the topology has 4294967296 tasks in all",
            ),
            ("name: t\nbolts: [{id: a, numTasks: 4294967294}, {id: b, numTasks: 4294967294}]", "32-bit"),
        ];
        for (text, expected) in cases {
            let err = TopologyStructure::from_flux(text).unwrap_err().to_string();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }

    #[test]
    fn the_graph_has_kinds_streams_and_redacted_config() {
        let text = format!(
            "{WORDCOUNT}  - {{from: split, to: count, grouping: {{type: FIELDS, args: [word], streamId: words}}}}\n"
        );
        let text = text.replace(
            "topology.max.spout.pending: 1000",
            "topology.max.spout.pending: 1000\n  kafka.password: hunter22\n  my.key: v\n  topology.secret.keys: [my.key]",
        );
        let g = TopologyGraph::from_flux(&text).unwrap();
        let kinds: Vec<(&str, &str)> = g.components.iter().map(|(c, k)| (c.as_str(), k.as_str())).collect();
        assert_eq!(kinds, [("count", "bolt"), ("sentences", "spout"), ("split", "bolt")]);
        assert_eq!(g.streams.len(), 2);
        assert_eq!(
            g.streams[1],
            StreamEdge {
                from: c("split"),
                to: c("count"),
                stream: "words".into(),
                grouping: "fields".into()
            }
        );
        assert_eq!(g.streams[0].stream, DEFAULT_STREAM);
        assert_eq!(g.inputs(&c("count")).count(), 1);
        assert_eq!(g.config["topology.max.spout.pending"], serde_json::json!(1000));
        assert_eq!(g.config["kafka.password"], serde_json::json!(crate::secrets::REDACTED));
        assert_eq!(g.config["my.key"], serde_json::json!(crate::secrets::REDACTED));
        let bad = TopologyGraph::from_flux(
            "name: t\nbolts: [{id: b}]\nstreams: [{from: x, to: b, grouping: {type: SHUFFLE}}]",
        );
        assert!(bad.unwrap_err().to_string().contains("streams[0]: no component \"x\""));
    }
}
