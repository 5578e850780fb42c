//! The Flux-style YAML loader and the component registry it resolves class names with.
//!
//! ```yaml
//! name: wordcount
//! config:
//!   topology.workers: 2
//!   topology.max.spout.pending: 1000
//! spouts:
//!   - id: sentences
//!     className: sentence-generator      # a registry name
//!     parallelism: 1
//!     params: {rate_per_sec: 1000, count: 100000}
//! bolts:
//!   - id: split
//!     className: split-sentence
//!     parallelism: 2
//!   - id: count
//!     className: word-count
//!     parallelism: 2
//! streams:
//!   - name: "sentences --> split"        # optional
//!     from: sentences
//!     to: split
//!     grouping: {type: SHUFFLE}          # also FIELDS (args: [field..]), ALL, GLOBAL,
//!   - from: split                        # DIRECT, LOCAL_OR_SHUFFLE, NONE; streamId: <stream>
//!     to: count
//!     grouping: {type: FIELDS, args: [word]}
//! ```
//!
//! Unknown keys are errors, and every error names the line and the element (`line 14:
//! streams[1] "split --> count"`). Nothing is started by loading.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::builtin::{
    Filter, FilterParams, LogSink, LogSinkAt, LogSinkParams, SentenceParams, SentenceSpout, SplitParams,
    SplitSentence, StdoutSink, WordCount, WordCountParams,
};
use crate::component::{Bolt, BoltFactory, Spout, SpoutFactory};
use crate::config::TopologyConfig;
use crate::error::{Error, Result};
use crate::topology::{ComponentDecl, ComponentKind, Grouping, Subscription, Topology};
use crate::tuple::DEFAULT_STREAM;

/// A component's `params:` from the topology file (`null` when absent).
pub type Params = serde_yaml_ng::Value;

/// Turns `params` into a spout factory, or says what is wrong with them.
pub type SpoutMaker = Arc<dyn Fn(&Params) -> Result<SpoutFactory, String> + Send + Sync>;
/// Turns `params` into a bolt factory, or says what is wrong with them.
pub type BoltMaker = Arc<dyn Fn(&Params) -> Result<BoltFactory, String> + Send + Sync>;

/// Deserializes `params` into `T` (`null` gives `T::default()`).
pub fn parse_params<T: DeserializeOwned + Default>(params: &Params) -> Result<T, String> {
    if params.is_null() {
        return Ok(T::default());
    }
    serde_yaml_ng::from_value(params.clone()).map_err(|e| format!("bad params: {e}"))
}

/// Component classes by name. Users building their own worker binary register theirs next
/// to the built-ins.
#[derive(Clone, Default)]
pub struct Registry {
    spouts: BTreeMap<String, SpoutMaker>,
    bolts: BTreeMap<String, BoltMaker>,
    /// The working directory of shell components; `None`: `resources/` beside the topology
    /// file (or the current directory for text loaded without a file).
    resources_dir: Option<PathBuf>,
}

/// Class names of shell bolts: Storm Flux's, and Squall's short name.
pub const SHELL_BOLT_CLASSES: [&str; 2] =
    ["org.apache.storm.flux.wrappers.bolts.FluxShellBolt", "shell-bolt"];
/// Class names of shell spouts: Storm Flux's, and Squall's short name.
pub const SHELL_SPOUT_CLASSES: [&str; 2] =
    ["org.apache.storm.flux.wrappers.spouts.FluxShellSpout", "shell-spout"];
/// The directory beside a topology file that holds its shell components' files (Storm: the
/// jar's `resources/`).
pub const RESOURCES_DIR: &str = cluster_state::resources::DIR_NAME;

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("spouts", &self.spouts.keys().collect::<Vec<_>>())
            .field("bolts", &self.bolts.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry::default()
    }

    /// The built-ins: spout `sentence-generator`; bolts `split-sentence`, `word-count`,
    /// `filter`, `log`, `stdout`.
    pub fn with_builtins() -> Self {
        let mut r = Registry::new();
        r.register_spout("sentence-generator", |p| {
            let params: SentenceParams = parse_params(p)?;
            if params.rate_per_sec.is_some_and(|r| r.is_nan() || r <= 0.0) {
                return Err("rate_per_sec must be positive".into());
            }
            Ok(Arc::new(move || Box::new(SentenceSpout::new(params.clone())) as Box<dyn Spout>))
        });
        r.register_bolt("split-sentence", |p| {
            let params: SplitParams = parse_params(p)?;
            Ok(Arc::new(move || Box::new(SplitSentence::new(params.clone())) as Box<dyn Bolt>))
        });
        r.register_bolt("word-count", |p| {
            let params: WordCountParams = parse_params(p)?;
            Ok(Arc::new(move || Box::new(WordCount::new(params.clone())) as Box<dyn Bolt>))
        });
        r.register_bolt("filter", |p| {
            let params: FilterParams = parse_params(p)?;
            Filter::new(params.clone())?;
            Ok(Arc::new(move || match Filter::new(params.clone()) {
                Ok(f) => Box::new(f) as Box<dyn Bolt>,
                // Checked just above; parameters do not change.
                Err(_) => Box::new(LogSink) as Box<dyn Bolt>,
            }))
        });
        r.register_bolt("log", |p| {
            let params: LogSinkParams = if p.is_null() { LogSinkParams::default() } else { parse_params(p)? };
            Ok(Arc::new(move || Box::new(LogSinkAt { level: params.level }) as Box<dyn Bolt>))
        });
        r.register_bolt("stdout", |p| {
            no_params(p)?;
            Ok(Arc::new(|| Box::new(StdoutSink) as Box<dyn Bolt>))
        });
        r
    }

    /// Registers a spout class.
    pub fn register_spout(
        &mut self,
        name: &str,
        make: impl Fn(&Params) -> Result<SpoutFactory, String> + Send + Sync + 'static,
    ) -> &mut Self {
        self.spouts.insert(name.to_owned(), Arc::new(make));
        self
    }

    /// Registers a bolt class.
    pub fn register_bolt(
        &mut self,
        name: &str,
        make: impl Fn(&Params) -> Result<BoltFactory, String> + Send + Sync + 'static,
    ) -> &mut Self {
        self.bolts.insert(name.to_owned(), Arc::new(make));
        self
    }

    /// Runs shell components in `dir` (instead of `resources/` beside the topology file).
    pub fn with_resources_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.resources_dir = Some(dir.into());
        self
    }

    /// Loads a topology file. Shell components run in `resources/` beside it (see
    /// [`Registry::with_resources_dir`]), or beside it when it has none.
    pub fn load_file(&self, path: &Path) -> Result<Topology> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| Error::ReadFile { file: path.to_owned(), source })?;
        let loader = match &self.resources_dir {
            Some(_) => std::borrow::Cow::Borrowed(self),
            None => {
                let beside = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
                let resources = beside.join(RESOURCES_DIR);
                let dir = if resources.is_dir() { resources } else { beside.to_owned() };
                std::borrow::Cow::Owned(self.clone().with_resources_dir(dir))
            }
        };
        loader.load_str(&text).map_err(|e| match e {
            Error::Yaml { line, column, message, .. } => {
                Error::Yaml { file: Some(path.to_owned()), line, column, message }
            }
            other => other,
        })
    }

    /// Loads a topology from YAML text.
    pub fn load_str(&self, text: &str) -> Result<Topology> {
        // Before anything can quote the file: this process's errors and logs hide its secrets.
        cluster_state::secrets::remember(&cluster_state::secrets::Redactor::from_flux(text));
        let file: FluxFile = serde_yaml_ng::from_str(text).map_err(|e| {
            let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
            Error::Yaml { file: None, line, column, message: e.to_string() }
        })?;
        let lines = Lines::new(text);
        let mut decls = Vec::new();
        let mut id_seen: BTreeMap<String, usize> = BTreeMap::new();
        let components = file.spouts.iter().map(|c| (c, true)).chain(file.bolts.iter().map(|c| (c, false)));
        let (mut si, mut bi) = (0, 0);
        for (c, is_spout) in components {
            let (section, index) = if is_spout { ("spouts", &mut si) } else { ("bolts", &mut bi) };
            let nth = id_seen.entry(c.id.clone()).or_insert(0);
            *nth += 1;
            let element =
                lines.label(&format!("{section}[{index}] {:?}", c.id), lines.find("id", &c.id, *nth));
            *index += 1;
            crate::topology::check_name(&element, &c.id)?;
            if *nth > 1 {
                return Err(Error::DuplicateId { element, id: c.id.clone() });
            }
            let shell = if is_spout { &SHELL_SPOUT_CLASSES } else { &SHELL_BOLT_CLASSES };
            let kind = if shell.contains(&c.class_name.as_str()) {
                let spec = self.shell_spec(c).map_err(|reason| Error::BadParams {
                    element: element.clone(),
                    component: c.id.clone(),
                    reason,
                })?;
                if is_spout {
                    ComponentKind::Spout(Arc::new(move || {
                        Box::new(crate::multilang::ShellSpout::new(spec.clone())) as Box<dyn Spout>
                    }))
                } else {
                    ComponentKind::Bolt(Arc::new(move || {
                        Box::new(crate::multilang::ShellBolt::new(spec.clone())) as Box<dyn Bolt>
                    }))
                }
            } else if c.constructor_args.is_some() || c.config_methods.is_some() {
                return Err(Error::BadParams {
                    element,
                    component: c.id.clone(),
                    reason: format!(
                        "constructorArgs and configMethods are only for shell components ({}); other \
                         classes take params",
                        shell.join(", ")
                    ),
                });
            } else if is_spout {
                let maker = self.spouts.get(&c.class_name).ok_or_else(|| Error::UnknownComponent {
                    element: lines.label(
                        &format!("{section}[{}] {:?} className", *index - 1, c.id),
                        lines.find("className", &c.class_name, 1),
                    ),
                    name: c.class_name.clone(),
                    known: self.spouts.keys().cloned().collect(),
                })?;
                ComponentKind::Spout(maker(&c.params).map_err(|reason| Error::BadParams {
                    element: element.clone(),
                    component: c.id.clone(),
                    reason,
                })?)
            } else {
                let maker = self.bolts.get(&c.class_name).ok_or_else(|| Error::UnknownComponent {
                    element: lines.label(
                        &format!("{section}[{}] {:?} className", *index - 1, c.id),
                        lines.find("className", &c.class_name, 1),
                    ),
                    name: c.class_name.clone(),
                    known: self.bolts.keys().cloned().collect(),
                })?;
                ComponentKind::Bolt(maker(&c.params).map_err(|reason| Error::BadParams {
                    element: element.clone(),
                    component: c.id.clone(),
                    reason,
                })?)
            };
            decls.push(ComponentDecl {
                id: c.id.clone(),
                kind,
                parallelism: c.parallelism,
                num_tasks: c.num_tasks,
                inputs: Vec::new(),
                element,
            });
        }
        for (i, s) in file.streams.iter().enumerate() {
            let name = s.name.clone().unwrap_or_else(|| format!("{} --> {}", s.from, s.to));
            let element = lines.label(&format!("streams[{i}] {name:?}"), lines.nth_key("from", i + 1));
            let grouping = match s.grouping.kind {
                GroupingType::Shuffle => Grouping::Shuffle,
                GroupingType::Fields => Grouping::Fields(s.grouping.args.clone()),
                GroupingType::All => Grouping::All,
                GroupingType::Global => Grouping::Global,
                GroupingType::Direct => Grouping::Direct,
                GroupingType::LocalOrShuffle => Grouping::LocalOrShuffle,
                GroupingType::None => Grouping::None,
            };
            if !matches!(s.grouping.kind, GroupingType::Fields) && !s.grouping.args.is_empty() {
                return Err(Error::BadGrouping { element, reason: "only FIELDS grouping takes args".into() });
            }
            let Some(target) = decls.iter_mut().find(|d| d.id == s.to) else {
                return Err(Error::UnknownComponent {
                    element,
                    name: s.to.clone(),
                    known: file.spouts.iter().chain(&file.bolts).map(|c| c.id.clone()).collect(),
                });
            };
            target.inputs.push(Subscription {
                from: s.from.clone(),
                stream: s.grouping.stream_id.clone().unwrap_or_else(|| DEFAULT_STREAM.to_owned()),
                grouping,
                element,
            });
        }
        Topology::new(&file.name, file.config, decls).map_err(|e| match e {
            Error::BadName { element, name } if element == "topology name" => {
                Error::BadName { element: lines.label("name", lines.find("name", &file.name, 1)), name }
            }
            other => other,
        })
    }
}

impl Registry {
    /// A shell component's spec from Flux's `FluxShellBolt` / `FluxShellSpout` constructor
    /// arguments (`[command]`, `[command, outputFields]` or `[command, componentConfig,
    /// outputFields]`), then their `configMethods` in order: `setDefaultStream [fields]`,
    /// `setNamedStream name [fields]` and `addComponentConfig key value`.
    fn shell_spec(&self, c: &FluxComponent) -> Result<crate::multilang::ShellSpec, String> {
        const SHAPE: &str = "constructorArgs must be [[command, args..]], [[command, args..], [output \
                             fields..]] or [[command, args..], {component config}, [output fields..]]";
        if !c.params.is_null() {
            return Err("a shell component takes constructorArgs, not params".into());
        }
        let args =
            c.constructor_args.as_deref().ok_or_else(|| format!("missing constructorArgs: {SHAPE}"))?;
        let (command, config, fields) = match args {
            [command] => (command, None, None),
            [command, fields] => (command, None, Some(fields)),
            [command, config, fields] => (command, Some(config), Some(fields)),
            _ => return Err(format!("{} constructorArgs: {SHAPE}", args.len())),
        };
        let command =
            strings(command).map_err(|_| format!("the command must be a list of strings: {SHAPE}"))?;
        if command.first().is_none_or(|p| p.is_empty()) {
            return Err("the command is empty".into());
        }
        let mut component_config = match config {
            None => serde_json::Map::new(),
            Some(v) => serde_yaml_ng::from_value::<serde_json::Map<String, serde_json::Value>>(v.clone())
                .map_err(|e| format!("the component config must be a map: {e}"))?,
        };
        let mut outputs: Vec<(String, crate::tuple::Fields)> = Vec::new();
        let mut set_stream = |name: String, fields: Vec<String>| {
            let fields = crate::tuple::Fields::new(fields);
            match outputs.iter_mut().find(|(stream, _)| *stream == name) {
                Some(declared) => declared.1 = fields,
                None => outputs.push((name, fields)),
            }
        };
        if let Some(fields) = fields {
            let fields = strings(fields)
                .map_err(|_| format!("the output fields must be a list of strings: {SHAPE}"))?;
            set_stream(DEFAULT_STREAM.to_owned(), fields);
        }
        for (i, method) in c.config_methods.iter().flatten().enumerate() {
            let at = |reason: String| format!("configMethods[{i}] {:?}: {reason}", method.name);
            let fields_of = |v: &serde_yaml_ng::Value| {
                strings(v).map_err(|_| at("the output fields must be a list of strings".into()))
            };
            match (method.name.as_str(), method.args.as_slice()) {
                ("setDefaultStream", [fields]) => set_stream(DEFAULT_STREAM.to_owned(), fields_of(fields)?),
                ("setNamedStream", [name, fields]) => {
                    let name = name
                        .as_str()
                        .filter(|n| !n.is_empty())
                        .ok_or_else(|| at("the stream name must be a non-empty string".into()))?;
                    set_stream(name.to_owned(), fields_of(fields)?);
                }
                ("addComponentConfig", [key, value]) => {
                    let key = key.as_str().ok_or_else(|| at("the key must be a string".into()))?;
                    let value = serde_json::to_value(value)
                        .map_err(|e| at(format!("the value cannot be passed on as JSON: {e}")))?;
                    component_config.insert(key.to_owned(), value);
                }
                ("setDefaultStream" | "setNamedStream" | "addComponentConfig", args) => {
                    let wanted = match method.name.as_str() {
                        "setDefaultStream" => "[[fields..]]",
                        "setNamedStream" => "[name, [fields..]]",
                        _ => "[key, value]",
                    };
                    return Err(at(format!("takes args {wanted}, got {} args", args.len())));
                }
                (other, _) => {
                    return Err(format!(
                        "configMethods[{i}]: unknown method {other:?}; a shell component knows \
                         setDefaultStream, setNamedStream and addComponentConfig"
                    ));
                }
            }
        }
        let working_dir = self.resources_dir.clone().unwrap_or_else(|| PathBuf::from("."));
        Ok(crate::multilang::ShellSpec { command, component_config, outputs, working_dir })
    }
}

/// A YAML list of strings.
fn strings(v: &serde_yaml_ng::Value) -> std::result::Result<Vec<String>, serde_yaml_ng::Error> {
    serde_yaml_ng::from_value::<Vec<String>>(v.clone())
}

fn no_params(p: &Params) -> Result<(), String> {
    if p.is_null() { Ok(()) } else { Err("takes no params".into()) }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FluxFile {
    name: String,
    #[serde(default)]
    config: TopologyConfig,
    #[serde(default)]
    spouts: Vec<FluxComponent>,
    #[serde(default)]
    bolts: Vec<FluxComponent>,
    #[serde(default)]
    streams: Vec<FluxStream>,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct FluxComponent {
    id: String,
    class_name: String,
    #[serde(default = "one")]
    parallelism: u32,
    #[serde(default)]
    num_tasks: Option<u32>,
    #[serde(default)]
    params: Params,
    /// Shell components only (Flux's constructor arguments of `FluxShellBolt`/`FluxShellSpout`).
    #[serde(default)]
    constructor_args: Option<Vec<serde_yaml_ng::Value>>,
    /// Shell components only: Flux's setter calls (`setNamedStream`, ...), applied in order.
    #[serde(default)]
    config_methods: Option<Vec<FluxConfigMethod>>,
}

/// One of Flux's `configMethods`: a method name and its arguments.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FluxConfigMethod {
    name: String,
    #[serde(default)]
    args: Vec<serde_yaml_ng::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FluxStream {
    #[serde(default)]
    name: Option<String>,
    from: String,
    to: String,
    grouping: FluxGrouping,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FluxGrouping {
    #[serde(rename = "type")]
    kind: GroupingType,
    #[serde(default)]
    args: Vec<String>,
    #[serde(rename = "streamId", default)]
    stream_id: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum GroupingType {
    Shuffle,
    Fields,
    All,
    Global,
    Direct,
    LocalOrShuffle,
    None,
}

/// Finds the lines of elements in the YAML text, for error messages. serde's model has no
/// spans, so this matches `key: value` lines, which is exact for Flux's block style and
/// degrades to naming only the element for flow style.
struct Lines<'a> {
    lines: Vec<&'a str>,
}

impl<'a> Lines<'a> {
    fn new(text: &'a str) -> Self {
        Lines { lines: text.lines().collect() }
    }

    /// `(key, value)` of a `key: value` line, with a list dash and quotes removed.
    fn kv(line: &str) -> Option<(&str, &str)> {
        let t = line.trim_start();
        let t = t.strip_prefix("- ").unwrap_or(t).trim_start();
        let (k, v) = t.split_once(':')?;
        let v = v.split(" #").next().unwrap_or("").trim();
        let v = v.trim_matches(|c| c == '"' || c == '\'');
        Some((k.trim(), v))
    }

    /// The 1-based line of the `nth` `key: value` line.
    fn find(&self, key: &str, value: &str, nth: usize) -> Option<usize> {
        self.lines
            .iter()
            .enumerate()
            .filter(|(_, l)| Self::kv(l).is_some_and(|(k, v)| k == key && v == value))
            .nth(nth.saturating_sub(1))
            .map(|(i, _)| i + 1)
    }

    /// The 1-based line of the `nth` line with `key`.
    fn nth_key(&self, key: &str, nth: usize) -> Option<usize> {
        self.lines
            .iter()
            .enumerate()
            .filter(|(_, l)| Self::kv(l).is_some_and(|(k, _)| k == key))
            .nth(nth.saturating_sub(1))
            .map(|(i, _)| i + 1)
    }

    fn label(&self, element: &str, line: Option<usize>) -> String {
        match line {
            Some(l) => format!("line {l}: {element}"),
            None => element.to_owned(),
        }
    }
}
