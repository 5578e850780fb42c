//! Topologies: the validated graph of spouts and bolts, and the builder to make one in code.
//!
//! [`Topology::new`] is the single gate: the builder and the Flux loader both end there, so a
//! topology that exists has valid names, unique ids, known sources and streams, grouping
//! fields that exist, and runnable parallelism.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use cluster_state::ids::ComponentId;

use crate::component::{Bolt, BoltFactory, OutputDeclarer, Spout, SpoutFactory};
use crate::config::TopologyConfig;
use crate::error::{Error, Result};
use crate::tuple::{DEFAULT_STREAM, Fields};

pub use cluster_state::structure::ACKER_COMPONENT;

/// How a stream's tuples are spread over a subscribing bolt's tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grouping {
    /// Round-robin over a shuffled task order: an even spread.
    Shuffle,
    /// Equal values of these fields go to the same task.
    Fields(Vec<String>),
    /// Every task gets every tuple.
    All,
    /// The task with the lowest id gets everything.
    Global,
    /// The emitter names the task (`emit_direct`).
    Direct,
    /// Shuffle among the tasks in the emitting worker, or among all if it has none.
    LocalOrShuffle,
    /// No preference (Storm treats it as shuffle).
    None,
}

/// A bolt's subscription to one stream of one component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// The emitting component.
    pub from: String,
    /// The stream.
    pub stream: String,
    /// How tuples are spread over the subscriber's tasks.
    pub grouping: Grouping,
    /// Where it was declared, for error messages (`streams[2] "split --> count"`).
    pub element: String,
}

/// A spout or bolt instance factory.
#[derive(Clone)]
pub enum ComponentKind {
    Spout(SpoutFactory),
    Bolt(BoltFactory),
}

impl std::fmt::Debug for ComponentKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ComponentKind::Spout(_) => "Spout",
            ComponentKind::Bolt(_) => "Bolt",
        })
    }
}

/// One component as declared, before validation.
#[derive(Debug, Clone)]
pub struct ComponentDecl {
    pub id: String,
    pub kind: ComponentKind,
    /// Executors (Storm's parallelism hint).
    pub parallelism: u32,
    /// Tasks; `None` means one per executor.
    pub num_tasks: Option<u32>,
    /// Bolts only: what it subscribes to.
    pub inputs: Vec<Subscription>,
    /// Where it was declared, for error messages (`bolts[1] "split"`).
    pub element: String,
}

/// One validated component.
#[derive(Debug, Clone)]
pub struct ComponentSpec {
    pub id: ComponentId,
    pub kind: ComponentKind,
    pub parallelism: u32,
    pub num_tasks: u32,
    /// Declared output streams, as the component declared them.
    pub outputs: Vec<(String, Fields)>,
    pub inputs: Vec<Subscription>,
}

impl ComponentSpec {
    /// Whether this is a spout.
    pub fn is_spout(&self) -> bool {
        matches!(self.kind, ComponentKind::Spout(_))
    }

    /// The fields of output stream `stream`.
    pub fn output(&self, stream: &str) -> Option<&Fields> {
        self.outputs.iter().find(|(s, _)| s == stream).map(|(_, f)| f)
    }
}

/// A validated topology: components sorted by id, config checked.
#[derive(Debug, Clone)]
pub struct Topology {
    name: String,
    config: Arc<TopologyConfig>,
    components: BTreeMap<ComponentId, ComponentSpec>,
}

/// Storm's name rule `^[^/.:\\]+$`.
pub fn check_name(element: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty() && !name.contains(['/', '.', ':', '\\']) && !name.chars().any(char::is_control);
    if ok { Ok(()) } else { Err(Error::BadName { element: element.to_owned(), name: name.to_owned() }) }
}

impl Topology {
    /// Validates and builds a topology: names (Storm's rule), unique ids, parallelism, config,
    /// and every subscription's source, stream and grouping fields. Instantiates each component
    /// once to read its declared outputs.
    // Over 100 lines on purpose: one validation pass in the order a user reads their topology
    // (name, components, then each subscription), each check a few lines with its own message.
    pub fn new(name: &str, config: TopologyConfig, decls: Vec<ComponentDecl>) -> Result<Self> {
        check_name("topology name", name)?;
        config.validate()?;
        let mut seen = HashSet::new();
        let mut components = BTreeMap::new();
        for decl in decls {
            check_name(&decl.element, &decl.id)?;
            if decl.id.starts_with("__") {
                return Err(Error::BadName {
                    element: decl.element.clone(),
                    name: format!(
                        "{} (ids starting with \"__\" are reserved for system components)",
                        decl.id
                    ),
                });
            }
            if !seen.insert(decl.id.clone()) {
                return Err(Error::DuplicateId { element: decl.element, id: decl.id });
            }
            if decl.parallelism == 0 {
                return Err(Error::BadParallelism {
                    element: decl.element,
                    reason: "parallelism must be at least 1".into(),
                });
            }
            let num_tasks = decl.num_tasks.unwrap_or(decl.parallelism);
            if num_tasks < decl.parallelism {
                return Err(Error::BadParallelism {
                    element: decl.element,
                    reason: format!("numTasks {num_tasks} is less than parallelism {}", decl.parallelism),
                });
            }
            let id = ComponentId::new(decl.id.as_str())
                .map_err(|_| Error::BadName { element: decl.element.clone(), name: decl.id.clone() })?;
            let mut declarer = OutputDeclarer::default();
            match &decl.kind {
                ComponentKind::Spout(f) => f().declare_outputs(&mut declarer),
                ComponentKind::Bolt(f) => f().declare_outputs(&mut declarer),
            }
            for (stream, _) in &declarer.streams {
                check_name(&format!("{} output stream", decl.element), stream)?;
            }
            if matches!(decl.kind, ComponentKind::Spout(_)) && !decl.inputs.is_empty() {
                let element = decl.inputs[0].element.clone();
                return Err(Error::BadGrouping {
                    element,
                    reason: format!("{:?} is a spout and cannot subscribe to streams", decl.id),
                });
            }
            components.insert(
                id.clone(),
                ComponentSpec {
                    id,
                    kind: decl.kind,
                    parallelism: decl.parallelism,
                    num_tasks,
                    outputs: declarer.streams,
                    inputs: decl.inputs,
                },
            );
        }
        let known: Vec<String> = components.keys().map(|c| c.to_string()).collect();
        for spec in components.values() {
            for sub in &spec.inputs {
                let Some(source) = components.values().find(|c| c.id.as_str() == sub.from) else {
                    return Err(Error::UnknownComponent {
                        element: sub.element.clone(),
                        name: sub.from.clone(),
                        known: known.clone(),
                    });
                };
                let Some(fields) = source.output(&sub.stream) else {
                    return Err(Error::UnknownStream {
                        element: sub.element.clone(),
                        component: sub.from.clone(),
                        stream: sub.stream.clone(),
                        known: source.outputs.iter().map(|(s, _)| s.clone()).collect(),
                    });
                };
                if let Grouping::Fields(names) = &sub.grouping {
                    if names.is_empty() {
                        return Err(Error::BadGrouping {
                            element: sub.element.clone(),
                            reason: "fields grouping needs at least one field".into(),
                        });
                    }
                    if let Some(bad) = names.iter().find(|n| fields.index_of(n).is_none()) {
                        return Err(Error::BadGroupingField {
                            element: sub.element.clone(),
                            component: sub.from.clone(),
                            stream: sub.stream.clone(),
                            field: bad.clone(),
                            known: fields.names().to_vec(),
                        });
                    }
                }
            }
        }
        if !components.values().any(ComponentSpec::is_spout) {
            return Err(Error::BadParallelism {
                element: "spouts".into(),
                reason: "a topology needs at least one spout".into(),
            });
        }
        Ok(Topology { name: name.to_owned(), config: Arc::new(config), components })
    }

    /// The topology's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its configuration.
    pub fn config(&self) -> &Arc<TopologyConfig> {
        &self.config
    }

    /// Components by id (sorted, like Storm's task numbering).
    pub fn components(&self) -> &BTreeMap<ComponentId, ComponentSpec> {
        &self.components
    }

    /// One component.
    pub fn component(&self, id: &str) -> Option<&ComponentSpec> {
        self.components.values().find(|c| c.id.as_str() == id)
    }

    /// `(component, parallelism, tasks)` for every component including the ackers, the input
    /// of [`crate::layout::TaskLayout::compute`]. Ackers get `topology.acker.executors`.
    pub fn component_parallelism(&self) -> Vec<(ComponentId, u32, u32)> {
        let mut out: Vec<(ComponentId, u32, u32)> =
            self.components.values().map(|c| (c.id.clone(), c.parallelism, c.num_tasks)).collect();
        let ackers = self.config.effective_acker_executors();
        if ackers > 0
            && let Ok(id) = ComponentId::new(ACKER_COMPONENT)
        {
            out.push((id, ackers, ackers));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Executors per component (with ackers), as `StormBase::component_executors` holds them.
    pub fn component_executors(&self) -> BTreeMap<ComponentId, u32> {
        self.component_parallelism().into_iter().map(|(c, p, _)| (c, p)).collect()
    }
}

/// Builds a [`Topology`] in code (Storm's `TopologyBuilder`).
#[derive(Debug)]
pub struct TopologyBuilder {
    name: String,
    config: TopologyConfig,
    decls: Vec<ComponentDecl>,
}

impl TopologyBuilder {
    /// A builder for topology `name` with Storm's default config.
    pub fn new(name: &str) -> Self {
        TopologyBuilder { name: name.to_owned(), config: TopologyConfig::default(), decls: Vec::new() }
    }

    /// Replaces the configuration.
    pub fn config(&mut self, config: TopologyConfig) -> &mut Self {
        self.config = config;
        self
    }

    /// Adds a spout with `parallelism` executors; `make` builds one instance per task.
    pub fn set_spout<S, F>(&mut self, id: &str, parallelism: u32, make: F) -> ComponentDeclarer<'_>
    where
        S: Spout,
        F: Fn() -> S + Send + Sync + 'static,
    {
        let factory: SpoutFactory = Arc::new(move || Box::new(make()) as Box<dyn Spout>);
        self.push(id, ComponentKind::Spout(factory), parallelism, "spout")
    }

    /// Adds a bolt with `parallelism` executors; `make` builds one instance per task.
    pub fn set_bolt<B, F>(&mut self, id: &str, parallelism: u32, make: F) -> ComponentDeclarer<'_>
    where
        B: Bolt,
        F: Fn() -> B + Send + Sync + 'static,
    {
        let factory: BoltFactory = Arc::new(move || Box::new(make()) as Box<dyn Bolt>);
        self.push(id, ComponentKind::Bolt(factory), parallelism, "bolt")
    }

    /// Adds a component from an existing factory (what the Flux loader uses).
    pub fn set_component(
        &mut self,
        id: &str,
        kind: ComponentKind,
        parallelism: u32,
    ) -> ComponentDeclarer<'_> {
        let what = if matches!(kind, ComponentKind::Spout(_)) { "spout" } else { "bolt" };
        self.push(id, kind, parallelism, what)
    }

    fn push(&mut self, id: &str, kind: ComponentKind, parallelism: u32, what: &str) -> ComponentDeclarer<'_> {
        self.decls.push(ComponentDecl {
            id: id.to_owned(),
            kind,
            parallelism,
            num_tasks: None,
            inputs: Vec::new(),
            element: format!("{what} {id:?}"),
        });
        let idx = self.decls.len() - 1;
        ComponentDeclarer { decl: &mut self.decls[idx] }
    }

    /// Validates and returns the topology.
    pub fn build(self) -> Result<Topology> {
        Topology::new(&self.name, self.config, self.decls)
    }
}

/// Sets a just-added component's tasks and subscriptions (Storm's `BoltDeclarer`).
#[derive(Debug)]
pub struct ComponentDeclarer<'a> {
    decl: &'a mut ComponentDecl,
}

impl ComponentDeclarer<'_> {
    /// Runs `n` tasks over the component's executors (Storm's `setNumTasks`).
    pub fn num_tasks(self, n: u32) -> Self {
        self.decl.num_tasks = Some(n);
        self
    }

    /// Subscribes to `stream` of `from` with `grouping`.
    pub fn grouping(self, from: &str, stream: &str, grouping: Grouping) -> Self {
        let element = format!("{} input from {from:?} stream {stream:?}", self.decl.element);
        self.decl.inputs.push(Subscription {
            from: from.to_owned(),
            stream: stream.to_owned(),
            grouping,
            element,
        });
        self
    }

    /// Shuffle grouping on `from`'s default stream.
    pub fn shuffle_grouping(self, from: &str) -> Self {
        self.grouping(from, DEFAULT_STREAM, Grouping::Shuffle)
    }

    /// Fields grouping on `from`'s default stream.
    pub fn fields_grouping<I: IntoIterator<Item = S>, S: Into<String>>(self, from: &str, fields: I) -> Self {
        self.grouping(from, DEFAULT_STREAM, Grouping::Fields(fields.into_iter().map(Into::into).collect()))
    }

    /// All grouping on `from`'s default stream.
    pub fn all_grouping(self, from: &str) -> Self {
        self.grouping(from, DEFAULT_STREAM, Grouping::All)
    }

    /// Global grouping on `from`'s default stream.
    pub fn global_grouping(self, from: &str) -> Self {
        self.grouping(from, DEFAULT_STREAM, Grouping::Global)
    }

    /// Direct grouping on `from`'s default stream.
    pub fn direct_grouping(self, from: &str) -> Self {
        self.grouping(from, DEFAULT_STREAM, Grouping::Direct)
    }

    /// Local-or-shuffle grouping on `from`'s default stream.
    pub fn local_or_shuffle_grouping(self, from: &str) -> Self {
        self.grouping(from, DEFAULT_STREAM, Grouping::LocalOrShuffle)
    }
}
