//! The one error type of the worker crate.

use std::path::PathBuf;

/// What building, loading or running a topology can fail with. Variants name the element
/// (component, stream, field, YAML line) concerned; [`Error::is_retryable`] says which ones a
/// caller may retry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The topology file is not valid YAML, or does not have Flux's shape.
    #[error("topology file{}: line {line}, column {column}: {message}", file_suffix(file))]
    Yaml { file: Option<PathBuf>, line: usize, column: usize, message: String },
    /// The topology file could not be read.
    #[error("cannot read topology file {}: {source}", file.display())]
    ReadFile { file: PathBuf, source: std::io::Error },
    /// A name breaks Storm's rule `^[^/.:\\]+$` (or is empty).
    #[error(
        "{element}: invalid name {name:?}: must be non-empty and contain none of '/', '.', ':', '\\' (Storm's rule)"
    )]
    BadName { element: String, name: String },
    /// Two components share an id.
    #[error("{element}: duplicate component id {id:?}")]
    DuplicateId { element: String, id: String },
    /// A component class is not in the registry, or a stream names a component that does not exist.
    #[error("{element}: unknown component {name:?}{}", known_suffix(known))]
    UnknownComponent { element: String, name: String, known: Vec<String> },
    /// A stream subscribes to a stream its source does not declare.
    #[error("{element}: component {component:?} declares no stream {stream:?}{}", known_suffix(known))]
    UnknownStream { element: String, component: String, stream: String, known: Vec<String> },
    /// A fields grouping names a field the stream does not declare.
    #[error("{element}: stream {stream:?} of {component:?} has no field {field:?}{}", known_suffix(known))]
    BadGroupingField { element: String, component: String, stream: String, field: String, known: Vec<String> },
    /// A grouping is malformed (e.g. fields grouping without fields), or targets a spout.
    #[error("{element}: {reason}")]
    BadGrouping { element: String, reason: String },
    /// A component's parameters were rejected by its factory.
    #[error("{element}: component {component:?}: {reason}")]
    BadParams { element: String, component: String, reason: String },
    /// Parallelism or task counts that cannot run (zero, or more executors than tasks).
    #[error("{element}: {reason}")]
    BadParallelism { element: String, reason: String },
    /// A configuration value is out of range.
    #[error("config key {key}: {reason}")]
    BadConfig { key: &'static str, reason: String },
    /// A component emitted on a stream it did not declare, or with the wrong number of values.
    #[error("component {component:?} emitted on stream {stream:?}: {reason}")]
    BadEmit { component: String, stream: String, reason: String },
    /// A component's `open` / `prepare` failed.
    #[error("component {component:?} task {task} failed to start: {reason}")]
    ComponentStart { component: String, task: u32, reason: String },
    /// The assignment gives this worker's slot nothing to run, or names executors the
    /// topology does not have.
    #[error("assignment of topology {topology}: {reason}")]
    BadAssignment { topology: String, reason: String },
    /// A frame from a peer worker could not be decoded.
    #[error("frame from {peer}: {reason}")]
    BadFrame { peer: String, reason: String },
    /// An envelope cannot be put on the wire: a count or length does not fit its field, or
    /// the envelope alone is larger than a frame may be. It is dropped; acking replays it.
    #[error("envelope for task {task} cannot be sent: {reason}")]
    Unencodable { task: u32, reason: String },
    /// A peer connection failed the handshake: wrong protocol, topology or secret, or too slow.
    #[error("peer {peer} refused: {reason}")]
    Handshake { peer: String, reason: String },
    /// The topology's secret (the code file peers authenticate each other with) is missing
    /// or unusable.
    #[error("topology secret {}: {reason}", path.display())]
    Secret { path: PathBuf, reason: String },
    /// TLS cannot be set up: the transport's (`topology.transport.tls`, from the topology's
    /// secret) or `/metrics`' (`worker.metrics.tls.*`: the reason names the key and file).
    #[error("TLS: {reason}")]
    Tls { reason: String },
    /// A socket or file operation failed.
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    /// A coordination (ZooKeeper) call failed.
    #[error(transparent)]
    Coord(#[from] cluster_state::coord::Error),
    /// A metric could not be registered.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// An executor thread could not be started or died.
    #[error("executor {executor}: {reason}")]
    Executor { executor: String, reason: String },
}

fn file_suffix(file: &Option<PathBuf>) -> String {
    file.as_ref().map(|f| format!(" {}", f.display())).unwrap_or_default()
}

fn known_suffix(known: &[String]) -> String {
    if known.is_empty() { String::new() } else { format!(" (known: {})", known.join(", ")) }
}

impl Error {
    /// Whether the same call may succeed if repeated: only lost connections to ZooKeeper
    /// or to a peer.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Coord(e) => e.is_retryable(),
            Error::Io { .. } => true,
            _ => false,
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { what: what.into(), source }
    }
}

/// Result of the worker crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
