//! The coordination client: ZooKeeper's data model behind one API, with two backends.
//!
//! Every Squall process talks to the cluster through a [`Session`] obtained from an
//! [`Ensemble`]:
//!
//! - [`Ensemble::zookeeper`]: a real ZooKeeper ensemble through `zookeeper-client`.
//! - [`Ensemble::in_memory`]: an in-process tree with ZooKeeper's semantics (sessions that
//!   expire and take their ephemerals with them, sequential numbering from the parent's
//!   `cversion`, versions, one-shot watches, atomic multi). `squall local` and fast unit tests
//!   use it; its [`MemoryEnsemble`] handle can also disconnect and expire sessions on demand.
//!
//! Both are held to the same behaviour by one conformance suite
//! (`cluster-state/tests/conformance.rs`), which runs every case against each backend.
//!
//! Semantics callers can rely on (both backends):
//! - A session is [`SessionState::Connected`], may become [`SessionState::Disconnected`] and come
//!   back, and ends [`SessionState::Expired`] or [`SessionState::Closed`]. Calls made while
//!   disconnected fail with [`Error::ConnectionLoss`]; after the end with
//!   [`Error::SessionExpired`] / [`Error::SessionClosed`].
//! - Watches are one-shot futures ([`Watch`]). They survive a disconnect (an event that happened
//!   meanwhile is delivered on reconnect) and resolve to [`WatchEvent::SessionEnded`] when the
//!   session ends. Watches can still be missed between firing and re-arming: reconcile by
//!   re-reading, never by counting events.
//! - Dropping a [`Session`] closes it (its ephemerals go at once), unless it was opened
//!   [`SessionOptions::detached`]: then it lives on until it times out, like the session of a
//!   process that was killed, and [`Ensemble::resume`] can pick it up again.
//!
//! - With credentials ([`Ensemble::with_security`]) a session authenticates and the nodes it
//!   creates get ACLs by where they are (`security.rs`): Storm's layout private, the Kafka
//!   registry world-readable; a call the ACL refuses fails with [`Error::NoAuth`].
//!
//! Layout: `error.rs` (the error enum), `security.rs` (credentials and the ACL policy), `memory.rs` (in-memory backend), `zookeeper.rs` (real
//! ZooKeeper backend), `lease.rs` (the lease clock and a session's confirmations), `recipes.rs`
//! (what is built on top of the backends: parent creation, decoding reads, set-or-create,
//! recursive delete, children-or-empty, checked ephemerals), `watched.rs` (`WatchedDir`, a
//! directory's children kept current by watches), this file (the shared types and the
//! calls each backend answers).

mod error;
mod lease;
mod memory;
mod recipes;
mod security;
mod watched;
mod zookeeper;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

pub use self::error::{Error, Result};
use self::lease::Confirmations;
pub use self::lease::LeaseInstant;
pub use self::memory::MemoryEnsemble;
pub use self::security::{AUTH_ENV, NodeAcl, Security, ZkAuth};
pub use self::watched::{Versioned, WatchedDir};

/// A ZooKeeper session id, as the server assigns it (shown in hex, like ZooKeeper's logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub i64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// The state of a session, as reported by [`Session::state`] and [`StateChanges`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionState {
    /// Connected to a server; calls go through.
    Connected,
    /// Connection lost; the session lives on at the server until its timeout. Stop acting on
    /// ownership (nothing may be emitted from owned partitions) until connected again.
    Disconnected,
    /// The session timed out at the server: every ephemeral and watch of it is gone.
    Expired,
    /// The session was closed by this client.
    Closed,
    /// The server refused the client's credentials.
    AuthFailed,
}

impl SessionState {
    /// Whether no further state can follow.
    pub fn is_terminal(self) -> bool {
        matches!(self, SessionState::Expired | SessionState::Closed | SessionState::AuthFailed)
    }
}

/// A session state change together with the session it concerns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionEvent {
    pub session_id: SessionId,
    pub state: SessionState,
}

/// How to open a session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// Requested session timeout; the server may clamp it (ZooKeeper: 2 to 20 ticks by default).
    pub session_timeout: Duration,
    /// How long to wait for the session to be established.
    pub connect_timeout: Duration,
    /// Keep the session alive after the [`Session`] is dropped, until it times out.
    pub detached: bool,
}

impl Default for SessionOptions {
    /// Storm's `storm.zookeeper.session.timeout` (20 s) and
    /// `storm.zookeeper.connection.timeout` (15 s).
    fn default() -> Self {
        SessionOptions {
            session_timeout: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(15),
            detached: false,
        }
    }
}

/// What it takes to re-attach to a live session (its id and password).
#[derive(Clone)]
pub struct SessionCredentials(Credentials);

#[derive(Clone)]
enum Credentials {
    ZooKeeper(::zookeeper_client::SessionInfo),
    Memory { id: SessionId, password: u64 },
}

impl SessionCredentials {
    /// The session these credentials belong to.
    pub fn id(&self) -> SessionId {
        match &self.0 {
            Credentials::ZooKeeper(info) => SessionId(info.id().0),
            Credentials::Memory { id, .. } => *id,
        }
    }
}

impl fmt::Debug for SessionCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The password stays out of logs.
        f.debug_struct("SessionCredentials").field("id", &self.id()).finish_non_exhaustive()
    }
}

/// A znode's metadata, as ZooKeeper's `Stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Stat {
    /// Transaction id that created the node.
    pub czxid: i64,
    /// Transaction id that last changed the node's data.
    pub mzxid: i64,
    /// Transaction id that last changed the node's children.
    pub pzxid: i64,
    /// Creation time, ms since the epoch.
    pub ctime_ms: i64,
    /// Last data change time, ms since the epoch.
    pub mtime_ms: i64,
    /// Number of data changes: the version a compare-and-set names.
    pub version: i32,
    /// Number of child changes (also the next sequential suffix of a child).
    pub cversion: i32,
    /// The session owning this node if it is ephemeral.
    pub ephemeral_owner: Option<SessionId>,
    /// Size of the data in bytes.
    pub data_length: i32,
    /// Number of children.
    pub num_children: i32,
}

/// The kind of node a create makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CreateMode {
    /// Stays until deleted.
    Persistent,
    /// Goes when the creating session ends.
    Ephemeral,
    /// Persistent, with a 10-digit increasing suffix appended to the name.
    PersistentSequential,
    /// Ephemeral, with a 10-digit increasing suffix appended to the name.
    EphemeralSequential,
}

impl CreateMode {
    /// Also create missing parents (as empty persistent nodes).
    pub fn with_parents(self) -> CreateOptions {
        CreateOptions { mode: self, parents: true }
    }

    /// Whether nodes of this mode die with their session.
    pub fn is_ephemeral(self) -> bool {
        matches!(self, CreateMode::Ephemeral | CreateMode::EphemeralSequential)
    }

    /// Whether a sequence suffix is appended.
    pub fn is_sequential(self) -> bool {
        matches!(self, CreateMode::PersistentSequential | CreateMode::EphemeralSequential)
    }
}

/// A [`CreateMode`] and whether missing parents are created.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CreateOptions {
    pub mode: CreateMode,
    pub parents: bool,
}

impl From<CreateMode> for CreateOptions {
    fn from(mode: CreateMode) -> Self {
        CreateOptions { mode, parents: false }
    }
}

/// One operation of a [`Session::multi`] transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Create a node (parents must exist).
    Create { path: String, data: Vec<u8>, mode: CreateMode },
    /// Set a node's data, if its version is `version` (or unconditionally on `None`).
    SetData { path: String, data: Vec<u8>, version: Option<i32> },
    /// Delete a childless node, if its version is `version` (or unconditionally on `None`).
    Delete { path: String, version: Option<i32> },
    /// Fail the transaction unless the node exists with this version.
    Check { path: String, version: i32 },
}

impl Op {
    /// The path the operation touches.
    pub fn path(&self) -> &str {
        match self {
            Op::Create { path, .. } | Op::SetData { path, .. } | Op::Delete { path, .. } => path,
            Op::Check { path, .. } => path,
        }
    }
}

/// The outcome of one operation of a successful [`Session::multi`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpResult {
    /// The node was created at this path (with its sequence suffix, if any).
    Created { path: String },
    /// The data was set; the node's new stat.
    DataSet { stat: Stat },
    /// The node was deleted.
    Deleted,
    /// The check held.
    Checked,
}

/// What a one-shot [`Watch`] reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// The watched node was created (only watches set by [`Session::exists_watch`]).
    NodeCreated { path: String },
    /// The watched node was deleted.
    NodeDeleted { path: String },
    /// The watched node's data changed.
    NodeDataChanged { path: String },
    /// A child was added to or removed from the watched node.
    NodeChildrenChanged { path: String },
    /// The session ended (expired or closed): the watch will never fire otherwise.
    SessionEnded { state: SessionState },
}

/// A one-shot watch: a future resolving to the first [`WatchEvent`] on the watched path.
#[must_use = "a watch does nothing unless awaited"]
pub struct Watch(Pin<Box<dyn Future<Output = WatchEvent> + Send + 'static>>);

impl Watch {
    fn new(future: impl Future<Output = WatchEvent> + Send + 'static) -> Self {
        Watch(Box::pin(future))
    }
}

impl Future for Watch {
    type Output = WatchEvent;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<WatchEvent> {
        self.0.as_mut().poll(cx)
    }
}

impl fmt::Debug for Watch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Watch")
    }
}

/// The outcome of [`Session::create_ephemeral_checked`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EphemeralClaim {
    /// This call created the node.
    Created,
    /// The node was already there, owned by this very session with this very data: a create
    /// from before a reconnect went through although its reply was lost (KAFKA-1387).
    AlreadyOurs,
}

/// Where sessions come from: a ZooKeeper ensemble or an in-memory one.
#[derive(Clone, Debug)]
pub enum Ensemble {
    /// A ZooKeeper connect string: `host:port[,host:port...][/chroot]`, and the credentials and
    /// ACL policy of its sessions.
    ZooKeeper { connect_string: String, security: Security },
    /// An in-process ensemble; clones share one tree (each clone with its own credentials).
    Memory(MemoryEnsemble),
}

impl Ensemble {
    /// A real ZooKeeper ensemble (no credentials: see [`Ensemble::with_security`]).
    pub fn zookeeper(connect_string: impl Into<String>) -> Self {
        Ensemble::ZooKeeper { connect_string: connect_string.into(), security: Security::default() }
    }

    /// The same ensemble, whose sessions authenticate and create nodes as `security` says.
    pub fn with_security(self, security: Security) -> Self {
        match self {
            Ensemble::ZooKeeper { connect_string, .. } => Ensemble::ZooKeeper { connect_string, security },
            Ensemble::Memory(memory) => Ensemble::Memory(memory.with_security(security)),
        }
    }

    /// The credentials and ACL policy of this ensemble's sessions.
    pub fn security(&self) -> &Security {
        match self {
            Ensemble::ZooKeeper { security, .. } => security,
            Ensemble::Memory(memory) => memory.security(),
        }
    }

    /// A fresh, empty in-memory ensemble.
    pub fn in_memory() -> Self {
        Ensemble::Memory(MemoryEnsemble::new())
    }

    /// Opens a new session.
    pub async fn connect(&self, options: &SessionOptions) -> Result<Session> {
        let sent = LeaseInstant::now();
        let backend = match self {
            Ensemble::ZooKeeper { connect_string, security } => Backend::ZooKeeper(
                zookeeper::ZkSession::connect(connect_string, options, None, security).await?,
            ),
            Ensemble::Memory(ensemble) => Backend::Memory(ensemble.connect(options)?),
        };
        Ok(Session { backend, metrics: None, confirmations: Confirmations::established(sent) })
    }

    /// Re-attaches to a live session (a fast reconnect after a crash, within the timeout).
    /// Fails with [`Error::SessionExpired`] when the session is gone.
    pub async fn resume(
        &self,
        credentials: &SessionCredentials,
        options: &SessionOptions,
    ) -> Result<Session> {
        let sent = LeaseInstant::now();
        let backend = match (self, &credentials.0) {
            (Ensemble::ZooKeeper { connect_string, security }, Credentials::ZooKeeper(info)) => {
                Backend::ZooKeeper(
                    zookeeper::ZkSession::connect(connect_string, options, Some(info.clone()), security)
                        .await?,
                )
            }
            (Ensemble::Memory(ensemble), Credentials::Memory { id, password }) => {
                Backend::Memory(ensemble.resume(*id, *password, options)?)
            }
            _ => {
                return Err(Error::Backend {
                    path: None,
                    message: "session credentials belong to another kind of ensemble".into(),
                });
            }
        };
        Ok(Session { backend, metrics: None, confirmations: Confirmations::established(sent) })
    }
}

/// One coordination session. Not `Clone`: share it with `Arc<Session>`; the session closes
/// when the last owner drops it (unless detached) or calls [`Session::close`].
#[derive(Debug)]
pub struct Session {
    backend: Backend,
    /// Request latency and state, when [`Session::instrument`]ed.
    pub(crate) metrics: Option<crate::metrics::CoordMetrics>,
    /// When the server last answered; see [`Session::confirmed_at`].
    confirmations: Confirmations,
}

#[derive(Debug)]
enum Backend {
    ZooKeeper(zookeeper::ZkSession),
    Memory(memory::MemSession),
}

/// Dispatches a call to the backend; both backends have methods of the same names. An answer
/// from the server (a result or a server-side error) confirms the session as of the send time.
macro_rules! dispatch {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {{
        // The request's real latency, for the histogram, even when a test pauses tokio's clock.
        #[allow(clippy::disallowed_types)]
        let started = std::time::Instant::now();
        let sent = LeaseInstant::now();
        let result = match &$self.backend {
            Backend::ZooKeeper(s) => s.$method($($arg),*).await,
            Backend::Memory(s) => s.$method($($arg),*),
        };
        if result.as_ref().err().is_none_or(Error::is_server_answer) {
            $self.confirmations.confirm(sent);
        }
        if let Some(metrics) = &$self.metrics {
            metrics.observe(crate::metrics::zookeeper_op(stringify!($method)), started.elapsed(), result.is_err());
        }
        result
    }};
}

impl Session {
    /// This session's id.
    pub fn id(&self) -> SessionId {
        match &self.backend {
            Backend::ZooKeeper(s) => s.id(),
            Backend::Memory(s) => s.id(),
        }
    }

    /// What [`Ensemble::resume`] needs to re-attach to this session.
    pub fn credentials(&self) -> SessionCredentials {
        match &self.backend {
            Backend::ZooKeeper(s) => s.credentials(),
            Backend::Memory(s) => s.credentials(),
        }
    }

    /// When the server last confirmed this session: the send time of the latest request it
    /// answered (connecting counts). The server cannot expire the session before this plus the
    /// session timeout, which is what ownership leases are built on (see `coord/lease.rs`).
    pub fn confirmed_at(&self) -> Option<LeaseInstant> {
        self.confirmations.last()
    }

    /// The session timeout the server granted.
    pub fn session_timeout(&self) -> Duration {
        match &self.backend {
            Backend::ZooKeeper(s) => s.session_timeout(),
            Backend::Memory(s) => s.session_timeout(),
        }
    }

    /// The current state.
    pub fn state(&self) -> SessionState {
        match &self.backend {
            Backend::ZooKeeper(s) => s.state(),
            Backend::Memory(s) => s.state(),
        }
    }

    /// The states this session goes through from now on, ending after a terminal one.
    pub fn state_changes(&self) -> StateChanges {
        let inner = match &self.backend {
            Backend::ZooKeeper(s) => StateChangesInner::ZooKeeper(s.state_watcher()),
            Backend::Memory(s) => StateChangesInner::Memory(s.state_receiver()),
        };
        StateChanges { session_id: self.id(), inner, ended: false }
    }

    /// Creates a node and returns its path (with the sequence suffix for sequential modes).
    pub async fn create(&self, path: &str, data: &[u8], options: impl Into<CreateOptions>) -> Result<String> {
        let options = options.into();
        validate_path(path)?;
        let created = dispatch!(self.create_node(path, data, options.mode));
        match created {
            Err(Error::NoNode { .. }) if options.parents => {
                self.create_parents(path).await?;
                dispatch!(self.create_node(path, data, options.mode))
            }
            other => other,
        }
    }

    /// Creates every missing ancestor of `path` as an empty persistent node.
    async fn create_parents(&self, path: &str) -> Result<()> {
        for (i, _) in path.match_indices('/').skip(1) {
            let ancestor = &path[..i];
            match dispatch!(self.create_node(ancestor, &[], CreateMode::Persistent)) {
                Ok(_) | Err(Error::NodeExists { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads a node's data and stat.
    pub async fn get(&self, path: &str) -> Result<(Vec<u8>, Stat)> {
        validate_path(path)?;
        dispatch!(self.get(path))
    }

    /// Reads a node and leaves a watch for its next change or deletion.
    pub async fn get_watch(&self, path: &str) -> Result<(Vec<u8>, Stat, Watch)> {
        validate_path(path)?;
        dispatch!(self.get_watch(path))
    }

    /// Sets a node's data if its version is `expected_version` (any version on `None`).
    pub async fn set(&self, path: &str, data: &[u8], expected_version: Option<i32>) -> Result<Stat> {
        validate_path(path)?;
        dispatch!(self.set(path, data, expected_version))
    }

    /// Deletes a childless node if its version is `expected_version` (any version on `None`).
    pub async fn delete(&self, path: &str, expected_version: Option<i32>) -> Result<()> {
        validate_path(path)?;
        dispatch!(self.delete(path, expected_version))
    }

    /// Lists a node's children (names, unsorted as ZooKeeper returns them).
    pub async fn children(&self, path: &str) -> Result<Vec<String>> {
        validate_path(path)?;
        dispatch!(self.children(path))
    }

    /// Lists a node's children and leaves a watch for the next child change or its deletion.
    pub async fn children_watch(&self, path: &str) -> Result<(Vec<String>, Watch)> {
        validate_path(path)?;
        dispatch!(self.children_watch(path))
    }

    /// Like [`Session::children_watch`], for a directory that may not exist yet: its children
    /// (none while it is absent) and a watch that fires when they change or, while it is
    /// absent, when it is created. A directory created between the listing and the existence
    /// check is listed again: an existence watch on a node that exists would fire only on a
    /// change of its data, never on a child created under it.
    pub async fn children_watch_or_absent(&self, path: &str) -> Result<(Vec<String>, Watch)> {
        let mut attempts = 0;
        loop {
            match self.children_watch(path).await {
                Err(Error::NoNode { .. }) => {}
                listed => return listed,
            }
            let (stat, watch) = self.exists_watch(path).await?;
            attempts += 1;
            // Created and deleted over and over: the watch fires at its next deletion.
            if stat.is_none() || attempts >= 3 {
                return Ok((Vec::new(), watch));
            }
        }
    }

    /// The node's stat, or `None` when it does not exist.
    pub async fn exists(&self, path: &str) -> Result<Option<Stat>> {
        validate_path(path)?;
        dispatch!(self.exists(path))
    }

    /// Like [`Session::exists`], leaving a watch for its creation, change or deletion.
    pub async fn exists_watch(&self, path: &str) -> Result<(Option<Stat>, Watch)> {
        validate_path(path)?;
        dispatch!(self.exists_watch(path))
    }

    /// Applies all operations atomically, or none of them ([`Error::MultiFailed`] names the
    /// first that failed). An empty transaction succeeds without contacting the server.
    pub async fn multi(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        for (index, op) in ops.iter().enumerate() {
            validate_path(op.path()).map_err(|e| Error::MultiFailed { index, source: Box::new(e) })?;
        }
        dispatch!(self.multi(ops))
    }

    /// [`Session::close`] for a daemon that is stopping: waits at most `within` for the
    /// server's confirmation, so a process stopped while ZooKeeper is unreachable still exits
    /// promptly (its ephemerals then go when the server expires the session). Returns whether
    /// the close was confirmed in time; a close that was not is logged with the session id.
    pub async fn close_within(self, within: Duration) -> bool {
        let id = self.id();
        match tokio::time::timeout(within, self.close()).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::warn!(session = %id, error = %e, "closing the ZooKeeper session failed");
                false
            }
            Err(_) => {
                tracing::warn!(
                    session = %id,
                    "ZooKeeper did not confirm the session close within {within:?}; leaving it to expire"
                );
                false
            }
        }
    }

    /// Closes the session: its ephemerals are removed before this returns.
    pub async fn close(self) -> Result<()> {
        match self.backend {
            Backend::ZooKeeper(s) => s.close().await,
            Backend::Memory(s) => {
                s.close();
                Ok(())
            }
        }
    }
}

/// How long a stopping daemon (nimbus, supervisor, worker) waits for ZooKeeper to confirm its
/// session close: [`Session::close_within`]'s bound. Below the supervisor's 3 s grace before it
/// kills a worker, and short enough that an outage does not hold a shutdown.
pub const SHUTDOWN_CLOSE_BOUND: Duration = Duration::from_secs(2);

/// The stream of a session's state changes; see [`Session::state_changes`].
#[derive(Debug)]
pub struct StateChanges {
    session_id: SessionId,
    inner: StateChangesInner,
    ended: bool,
}

#[derive(Debug)]
enum StateChangesInner {
    ZooKeeper(::zookeeper_client::StateWatcher),
    Memory(tokio::sync::watch::Receiver<SessionState>),
}

impl StateChanges {
    /// The next state change; `None` once a terminal state has been delivered.
    pub async fn next(&mut self) -> Option<SessionEvent> {
        if self.ended {
            return None;
        }
        let state = match &mut self.inner {
            StateChangesInner::ZooKeeper(watcher) => zookeeper::map_state(watcher.changed().await),
            StateChangesInner::Memory(receiver) => match receiver.changed().await {
                Ok(()) => *receiver.borrow_and_update(),
                // The ensemble dropped the session's sender: it is gone.
                Err(_) => SessionState::Closed,
            },
        };
        self.ended = state.is_terminal();
        Some(SessionEvent { session_id: self.session_id, state })
    }

    /// Waits until the session reaches `wanted` (or ends); returns the state reached.
    pub async fn wait_for(&mut self, wanted: SessionState) -> Option<SessionState> {
        while let Some(event) = self.next().await {
            if event.state == wanted || event.state.is_terminal() {
                return Some(event.state);
            }
        }
        None
    }

    /// As a `futures::Stream`.
    pub fn into_stream(self) -> impl futures::Stream<Item = SessionEvent> + Send {
        futures::stream::unfold(self, |mut changes| async move { changes.next().await.map(|e| (e, changes)) })
    }
}

/// Joins a parent path and a child name.
pub fn join(parent: &str, child: &str) -> String {
    if parent == "/" { format!("/{child}") } else { format!("{parent}/{child}") }
}

/// The parent of a path (`None` for the root).
pub(crate) fn parent(path: &str) -> Option<&str> {
    match path.rfind('/') {
        Some(0) if path.len() > 1 => Some("/"),
        Some(0) | None => None,
        Some(i) => Some(&path[..i]),
    }
}

/// ZooKeeper's path rules, checked the same way for both backends.
pub(crate) fn validate_path(path: &str) -> Result<()> {
    let invalid = |reason| Err(Error::InvalidPath { path: path.to_owned(), reason });
    if !path.starts_with('/') {
        return invalid("must start with '/'");
    }
    if path == "/" {
        return Ok(());
    }
    if path.ends_with('/') {
        return invalid("must not end with '/'");
    }
    for segment in path[1..].split('/') {
        if segment.is_empty() {
            return invalid("empty segment ('//')");
        }
        if segment == "." || segment == ".." {
            return invalid("relative segment '.' or '..'");
        }
    }
    if path.chars().any(|c| c == '\0' || ('\u{1}'..='\u{1f}').contains(&c) || c == '\u{7f}') {
        return invalid("control character");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_rules() {
        for ok in ["/", "/a", "/a/b", "/consumers/g/offsets/t/0", "/a.b/..c"] {
            assert!(validate_path(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a", "/a/", "//a", "/a//b", "/a/./b", "/..", "/a\0", "/a\u{1}"] {
            assert!(matches!(validate_path(bad), Err(Error::InvalidPath { .. })), "{bad:?}");
        }
    }

    #[test]
    fn parents_and_joins() {
        assert_eq!(parent("/"), None);
        assert_eq!(parent("/a"), Some("/"));
        assert_eq!(parent("/a/b/c"), Some("/a/b"));
        assert_eq!(join("/", "a"), "/a");
        assert_eq!(join("/a", "b"), "/a/b");
    }

    #[test]
    fn retryable_errors() {
        assert!(Error::ConnectionLoss { path: None }.is_retryable());
        assert!(!Error::NodeExists { path: "/a".into() }.is_retryable());
        assert!(Error::SessionExpired { path: None }.is_session_lost());
        let multi = Error::MultiFailed { index: 1, source: Box::new(Error::NoNode { path: "/x".into() }) };
        assert_eq!(multi.path(), Some("/x"));
    }
}
