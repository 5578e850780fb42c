//! The in-memory backend: one tree in a mutex, with ZooKeeper's semantics.
//!
//! What it reproduces, because Squall's correctness leans on it:
//! - sessions with a timeout: a disconnected (or detached and dropped) session expires once the
//!   timeout passes without a reconnect; expiry and close delete the session's ephemerals and
//!   end its watches with [`WatchEvent::SessionEnded`];
//! - versions and compare-and-set, zxids, and ZooKeeper 3.8's numbering: a sequential suffix is
//!   the number of children the parent has ever had created (deletes do not advance it), while
//!   the parent's reported `cversion` counts creates and deletes (`2 * creates - children`);
//! - one-shot watches with ZooKeeper's trigger rules (data: changed or deleted; exists: also
//!   created; children: child added or removed, or the node deleted), fired after the whole
//!   transaction; events for a disconnected session are held back until it reconnects;
//! - multi: all or nothing, through an undo log;
//! - ACLs as ZooKeeper checks them: a session authenticated with `digest` credentials has the
//!   identity `digest:<user>:<hash of the payload>` (ZooKeeper's is a SHA-1 of it; only equality
//!   matters here), a node created by it gets the ACL `security.rs` decides for its path, and
//!   get / children need `READ`, set `WRITE`, create and delete `CREATE` / `DELETE` on the
//!   parent, a multi's check `READ`; `exists` is never refused; the root is open to all.
//!
//! Time is `tokio::time`, so tests may pause it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use super::{
    CreateMode, Credentials, Error, NodeAcl, Op, OpResult, Result, Security, SessionCredentials, SessionId,
    SessionOptions, SessionState, Stat, Watch, WatchEvent, parent,
};

/// Bounds ZooKeeper puts on negotiated session timeouts with its default tick of 2 s are 4 s and
/// 40 s; the in-memory ensemble accepts what it is asked, within these sanity limits.
const MIN_SESSION_TIMEOUT: Duration = Duration::from_millis(10);
const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(3600);

/// An in-process ensemble. Clones share the same tree and sessions; each handle has its own
/// credentials ([`MemoryEnsemble::with_security`]), as two clients of one server do.
#[derive(Clone, Default)]
pub struct MemoryEnsemble {
    tree: Arc<Mutex<Tree>>,
    security: Security,
}

/// ZooKeeper's permission bits.
mod perm {
    pub const READ: u32 = 1;
    pub const WRITE: u32 = 2;
    pub const CREATE: u32 = 4;
    pub const DELETE: u32 = 8;
    pub const ALL: u32 = 31;
}

/// An authenticated identity, `(scheme, id)`.
type Identity = (String, String);

/// One ACL entry: who (`world:anyone` or an identity) may do what.
#[derive(Clone, Debug, PartialEq, Eq)]
struct AclEntry {
    perms: u32,
    identity: Identity,
}

fn anyone() -> Identity {
    ("world".to_owned(), "anyone".to_owned())
}

/// Whether `ids` (or anyone) hold `wanted` on a node with `acl`.
fn allowed(acl: &[AclEntry], ids: &[Identity], wanted: u32) -> bool {
    acl.iter().any(|e| e.perms & wanted == wanted && (e.identity == anyone() || ids.contains(&e.identity)))
}

/// What a session may do and the ACL it gives the nodes it creates.
struct Access<'a> {
    ids: &'a [Identity],
    security: &'a Security,
}

impl Access<'_> {
    /// Fails with `NoAuth` on `path` unless `node`'s ACL grants `wanted`.
    fn check(&self, node: &Node, wanted: u32, path: &str) -> Result<()> {
        if allowed(&node.acl, self.ids, wanted) {
            Ok(())
        } else {
            Err(Error::NoAuth { path: path.to_owned() })
        }
    }

    /// The ACL of a node this session creates at `path`.
    fn new_acl(&self, path: &str) -> Result<Vec<AclEntry>> {
        let creators = || -> Result<Vec<AclEntry>> {
            if self.ids.is_empty() {
                return Err(Error::InvalidAcl {
                    path: path.to_owned(),
                    reason: "creator-only for a session that is not authenticated".into(),
                });
            }
            Ok(self.ids.iter().map(|id| AclEntry { perms: perm::ALL, identity: id.clone() }).collect())
        };
        Ok(match self.security.acl_for(path) {
            NodeAcl::Open => vec![AclEntry { perms: perm::ALL, identity: anyone() }],
            NodeAcl::Private => creators()?,
            NodeAcl::WorldReadable => {
                let mut acl = creators()?;
                acl.push(AclEntry { perms: perm::READ, identity: anyone() });
                acl
            }
        })
    }
}

/// The identities a session with `security`'s credentials holds.
fn identities(security: &Security) -> Vec<Identity> {
    security
        .auth
        .iter()
        .map(|auth| {
            // Deterministic (SipHash with fixed keys): equal credentials, equal identity.
            let hash =
                std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default().hash_one(auth.payload());
            (auth.scheme().to_owned(), format!("{}:{hash:016x}", auth.user()))
        })
        .collect()
}

impl std::fmt::Debug for MemoryEnsemble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tree = self.lock();
        f.debug_struct("MemoryEnsemble")
            .field("nodes", &tree.nodes.len())
            .field("sessions", &tree.sessions.len())
            .finish()
    }
}

#[derive(Default)]
struct Tree {
    nodes: BTreeMap<String, Node>,
    sessions: HashMap<i64, SessionEntry>,
    last_zxid: i64,
    last_session: i64,
    data_watches: HashMap<String, Vec<Watcher>>,
    exist_watches: HashMap<String, Vec<Watcher>>,
    child_watches: HashMap<String, Vec<Watcher>>,
}

#[derive(Clone)]
struct Node {
    data: Vec<u8>,
    stat: Stat,
    acl: Vec<AclEntry>,
    children: BTreeSet<String>,
    /// Children ever created: the next sequential suffix.
    child_creates: i32,
}

impl Node {
    fn new(data: Vec<u8>, stat: Stat, acl: Vec<AclEntry>) -> Self {
        Node { data, stat, acl, children: BTreeSet::new(), child_creates: 0 }
    }

    /// Updates the child counters after a child was added or removed.
    fn children_changed(&mut self, zxid: i64) {
        self.stat.num_children = self.children.len() as i32;
        self.stat.cversion = 2 * self.child_creates - self.stat.num_children;
        self.stat.pzxid = zxid;
    }
}

struct SessionEntry {
    password: u64,
    timeout: Duration,
    state: watch::Sender<SessionState>,
    /// Bumped at every disconnect, so a stale expiry timer can tell it has been overtaken.
    disconnect_epoch: u64,
    /// Watch events that fired while the session was disconnected.
    held_events: Vec<(oneshot::Sender<WatchEvent>, WatchEvent)>,
}

struct Watcher {
    session: i64,
    sender: oneshot::Sender<WatchEvent>,
}

fn now_ms() -> i64 {
    i64::try_from(crate::clock::now_millis()).unwrap_or(i64::MAX)
}

impl MemoryEnsemble {
    /// A fresh ensemble holding only the root node `/`.
    pub fn new() -> Self {
        let mut tree = Tree::default();
        // ZooKeeper's root is open to all.
        let open = vec![AclEntry { perms: perm::ALL, identity: anyone() }];
        tree.nodes.insert("/".to_owned(), Node::new(Vec::new(), Stat::default(), open));
        MemoryEnsemble { tree: Arc::new(Mutex::new(tree)), security: Security::default() }
    }

    /// A handle on the same tree whose sessions authenticate and create nodes as `security`
    /// says.
    pub fn with_security(&self, security: Security) -> MemoryEnsemble {
        MemoryEnsemble { tree: self.tree.clone(), security }
    }

    /// The credentials and ACL policy of this handle's sessions.
    pub fn security(&self) -> &Security {
        &self.security
    }

    fn lock(&self) -> MutexGuard<'_, Tree> {
        // A panic while holding the lock cannot leave the tree half-changed (multi restores
        // through its undo log before anything can panic), so a poisoned lock is still usable.
        self.tree.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn connect(&self, options: &SessionOptions) -> Result<MemSession> {
        let mut tree = self.lock();
        tree.last_session += 1;
        let id = tree.last_session;
        let password = RandomState::new().hash_one(id);
        let timeout = options.session_timeout.clamp(MIN_SESSION_TIMEOUT, MAX_SESSION_TIMEOUT);
        let (state, receiver) = watch::channel(SessionState::Connected);
        tree.sessions.insert(
            id,
            SessionEntry { password, timeout, state, disconnect_epoch: 0, held_events: Vec::new() },
        );
        Ok(MemSession {
            ensemble: self.clone(),
            id,
            password,
            timeout,
            detached: options.detached,
            state: receiver,
            ids: identities(&self.security),
        })
    }

    pub(super) fn resume(
        &self,
        id: SessionId,
        password: u64,
        options: &SessionOptions,
    ) -> Result<MemSession> {
        let (timeout, state) = {
            let tree = self.lock();
            match tree.sessions.get(&id.0) {
                Some(entry) if entry.password == password => (entry.timeout, entry.state.subscribe()),
                // ZooKeeper answers a wrong password like an unknown session: expired.
                _ => return Err(Error::SessionExpired { path: None }),
            }
        };
        self.reconnect(id);
        Ok(MemSession {
            ensemble: self.clone(),
            id: id.0,
            password,
            timeout,
            detached: options.detached,
            state,
            ids: identities(&self.security),
        })
    }

    /// Cuts a session's connection: calls fail with [`Error::ConnectionLoss`], its watches hold
    /// their events, and it expires unless [`MemoryEnsemble::reconnect`] comes within its timeout.
    pub fn disconnect(&self, id: SessionId) {
        let (epoch, timeout) = {
            let mut tree = self.lock();
            let Some(entry) = tree.sessions.get_mut(&id.0) else {
                return;
            };
            entry.disconnect_epoch += 1;
            entry.state.send_replace(SessionState::Disconnected);
            (entry.disconnect_epoch, entry.timeout)
        };
        let ensemble = self.clone();
        // The expiry timer needs a runtime; every caller of this backend runs inside one.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                tokio::time::sleep(timeout).await;
                let still_disconnected = {
                    let tree = ensemble.lock();
                    tree.sessions.get(&id.0).is_some_and(|e| {
                        e.disconnect_epoch == epoch && *e.state.borrow() == SessionState::Disconnected
                    })
                };
                if still_disconnected {
                    ensemble.expire(id);
                }
            });
        }
    }

    /// Restores a disconnected session's connection (if it has not expired) and delivers the
    /// watch events it missed meanwhile.
    pub fn reconnect(&self, id: SessionId) {
        let mut tree = self.lock();
        let Some(entry) = tree.sessions.get_mut(&id.0) else {
            return;
        };
        entry.state.send_replace(SessionState::Connected);
        for (sender, event) in entry.held_events.drain(..) {
            let _ = sender.send(event);
        }
    }

    /// Expires a session now, as the server does when its timeout passes.
    pub fn expire(&self, id: SessionId) {
        self.end_session(id.0, SessionState::Expired);
    }

    /// The ids of the sessions alive now.
    pub fn sessions(&self) -> Vec<SessionId> {
        let mut ids: Vec<_> = self.lock().sessions.keys().map(|&id| SessionId(id)).collect();
        ids.sort();
        ids
    }

    /// The timeout a live session was granted (what its owner asked for, within the sanity
    /// limits), so a test can see which timeout a component opened its session with.
    pub fn session_timeout(&self, id: SessionId) -> Option<Duration> {
        self.lock().sessions.get(&id.0).map(|entry| entry.timeout)
    }

    fn end_session(&self, id: i64, state: SessionState) {
        let mut tree = self.lock();
        let Some(entry) = tree.sessions.remove(&id) else {
            return;
        };
        let ephemerals: Vec<String> = tree
            .nodes
            .iter()
            .filter(|(_, node)| node.stat.ephemeral_owner == Some(SessionId(id)))
            .map(|(path, _)| path.clone())
            .collect();
        if !ephemerals.is_empty() {
            let mut txn = Txn::new(&mut tree);
            for path in &ephemerals {
                // Ephemerals have no children, so these deletes cannot fail.
                let _ = txn.delete(path, None, None);
            }
            let events = txn.commit();
            tree.fire(events);
        }
        // End the session's watches, then its state.
        let tree = &mut *tree;
        for watches in [&mut tree.data_watches, &mut tree.exist_watches, &mut tree.child_watches] {
            for list in watches.values_mut() {
                for watcher in std::mem::take(list) {
                    if watcher.session == id {
                        let _ = watcher.sender.send(WatchEvent::SessionEnded { state });
                    } else {
                        list.push(watcher);
                    }
                }
            }
            watches.retain(|_, list| !list.is_empty());
        }
        entry.state.send_replace(state);
    }
}

impl Tree {
    /// Fails unless the session can act: connected and alive.
    fn check_session(&self, id: i64, path: &str) -> Result<()> {
        match self.sessions.get(&id) {
            None => Err(Error::SessionExpired { path: Some(path.to_owned()) }),
            Some(entry) if *entry.state.borrow() != SessionState::Connected => {
                Err(Error::ConnectionLoss { path: Some(path.to_owned()) })
            }
            Some(_) => Ok(()),
        }
    }

    fn add_watch(map: &mut HashMap<String, Vec<Watcher>>, path: &str, session: i64) -> Watch {
        let (sender, receiver) = oneshot::channel();
        map.entry(path.to_owned()).or_default().push(Watcher { session, sender });
        Watch::new(async move {
            // The sender only goes away with the ensemble: the session is as good as closed.
            receiver.await.unwrap_or(WatchEvent::SessionEnded { state: SessionState::Closed })
        })
    }

    /// Triggers the watches a committed transaction's events concern.
    fn fire(&mut self, events: Vec<TreeEvent>) {
        for event in events {
            let (path, targets): (&str, Vec<&mut HashMap<String, Vec<Watcher>>>) = match &event {
                TreeEvent::Created(p) => (p, vec![&mut self.exist_watches]),
                TreeEvent::DataChanged(p) => (p, vec![&mut self.data_watches, &mut self.exist_watches]),
                TreeEvent::Deleted(p) => {
                    (p, vec![&mut self.data_watches, &mut self.exist_watches, &mut self.child_watches])
                }
                TreeEvent::ChildrenChanged(p) => (p, vec![&mut self.child_watches]),
            };
            let watch_event = match &event {
                TreeEvent::Created(p) => WatchEvent::NodeCreated { path: p.clone() },
                TreeEvent::DataChanged(p) => WatchEvent::NodeDataChanged { path: p.clone() },
                TreeEvent::Deleted(p) => WatchEvent::NodeDeleted { path: p.clone() },
                TreeEvent::ChildrenChanged(p) => WatchEvent::NodeChildrenChanged { path: p.clone() },
            };
            let mut triggered = Vec::new();
            for map in targets {
                if let Some(list) = map.remove(path) {
                    triggered.extend(list);
                }
            }
            for watcher in triggered {
                match self.sessions.get_mut(&watcher.session) {
                    Some(entry) if *entry.state.borrow() == SessionState::Disconnected => {
                        entry.held_events.push((watcher.sender, watch_event.clone()));
                    }
                    _ => {
                        let _ = watcher.sender.send(watch_event.clone());
                    }
                }
            }
        }
    }
}

/// A change to the tree that watches may be waiting for.
enum TreeEvent {
    Created(String),
    DataChanged(String),
    Deleted(String),
    ChildrenChanged(String),
}

/// A transaction over the tree: every mutation saves the prior state of the paths it touches,
/// so a failed multi can be rolled back exactly.
struct Txn<'a> {
    tree: &'a mut Tree,
    zxid: i64,
    time_ms: i64,
    undo: Vec<(String, Option<Node>)>,
    events: Vec<TreeEvent>,
}

impl<'a> Txn<'a> {
    fn new(tree: &'a mut Tree) -> Self {
        let zxid = tree.last_zxid + 1;
        Txn { tree, zxid, time_ms: now_ms(), undo: Vec::new(), events: Vec::new() }
    }

    fn save(&mut self, path: &str) {
        let prior = self.tree.nodes.get(path).cloned();
        self.undo.push((path.to_owned(), prior));
    }

    fn node(&self, path: &str) -> Result<&Node> {
        self.tree.nodes.get(path).ok_or_else(|| Error::NoNode { path: path.to_owned() })
    }

    fn create(
        &mut self,
        path: &str,
        data: &[u8],
        mode: CreateMode,
        session: i64,
        access: &Access<'_>,
    ) -> Result<String> {
        let parent_path = parent(path).ok_or_else(|| Error::NodeExists { path: path.to_owned() })?;
        // ZooKeeper names the path being created when its parent is missing.
        let parent_node = self.node(parent_path).map_err(|_| Error::NoNode { path: path.to_owned() })?;
        access.check(parent_node, perm::CREATE, path)?;
        let acl = access.new_acl(path)?;
        if parent_node.stat.ephemeral_owner.is_some() {
            return Err(Error::NoChildrenForEphemerals { path: path.to_owned() });
        }
        let actual = if mode.is_sequential() {
            format!("{path}{:010}", parent_node.child_creates)
        } else {
            path.to_owned()
        };
        if self.tree.nodes.contains_key(&actual) {
            return Err(Error::NodeExists { path: actual });
        }
        let name = actual[parent_path.len()..].trim_start_matches('/').to_owned();
        self.save(parent_path);
        self.save(&actual);
        let (zxid, time_ms) = (self.zxid, self.time_ms);
        if let Some(p) = self.tree.nodes.get_mut(parent_path) {
            p.children.insert(name);
            p.child_creates += 1;
            p.children_changed(zxid);
        }
        let stat = Stat {
            czxid: zxid,
            mzxid: zxid,
            pzxid: zxid,
            ctime_ms: time_ms,
            mtime_ms: time_ms,
            version: 0,
            cversion: 0,
            ephemeral_owner: mode.is_ephemeral().then_some(SessionId(session)),
            data_length: data.len() as i32,
            num_children: 0,
        };
        self.tree.nodes.insert(actual.clone(), Node::new(data.to_vec(), stat, acl));
        self.events.push(TreeEvent::Created(actual.clone()));
        self.events.push(TreeEvent::ChildrenChanged(parent_path.to_owned()));
        Ok(actual)
    }

    fn set(&mut self, path: &str, data: &[u8], version: Option<i32>, access: &Access<'_>) -> Result<Stat> {
        let node = self.node(path)?;
        access.check(node, perm::WRITE, path)?;
        check_version(path, node.stat.version, version)?;
        self.save(path);
        let (zxid, time_ms) = (self.zxid, self.time_ms);
        let node = self.tree.nodes.get_mut(path).ok_or_else(|| Error::NoNode { path: path.to_owned() })?;
        node.data = data.to_vec();
        node.stat.version += 1;
        node.stat.mzxid = zxid;
        node.stat.mtime_ms = time_ms;
        node.stat.data_length = data.len() as i32;
        let stat = node.stat;
        self.events.push(TreeEvent::DataChanged(path.to_owned()));
        Ok(stat)
    }

    fn delete(&mut self, path: &str, version: Option<i32>, access: Option<&Access<'_>>) -> Result<()> {
        let node = self.node(path)?;
        let parent_path = parent(path).ok_or_else(|| Error::Backend {
            path: Some(path.to_owned()),
            message: "the root node cannot be deleted".into(),
        })?;
        // `None`: the server itself (an ended session's ephemerals).
        if let Some(access) = access {
            access.check(self.node(parent_path)?, perm::DELETE, path)?;
        }
        check_version(path, node.stat.version, version)?;
        if !node.children.is_empty() {
            return Err(Error::NotEmpty { path: path.to_owned() });
        }
        self.save(parent_path);
        self.save(path);
        self.tree.nodes.remove(path);
        let zxid = self.zxid;
        if let Some(p) = self.tree.nodes.get_mut(parent_path) {
            p.children.remove(path[parent_path.len()..].trim_start_matches('/'));
            p.children_changed(zxid);
        }
        self.events.push(TreeEvent::Deleted(path.to_owned()));
        self.events.push(TreeEvent::ChildrenChanged(parent_path.to_owned()));
        Ok(())
    }

    fn check(&self, path: &str, version: i32, access: &Access<'_>) -> Result<()> {
        let node = self.node(path)?;
        access.check(node, perm::READ, path)?;
        check_version(path, node.stat.version, Some(version))
    }

    /// Keeps the changes and returns the events to fire.
    fn commit(self) -> Vec<TreeEvent> {
        if !self.events.is_empty() {
            self.tree.last_zxid = self.zxid;
        }
        self.events
    }

    /// Restores every touched path to its state before the transaction.
    fn rollback(self) {
        for (path, prior) in self.undo.into_iter().rev() {
            match prior {
                Some(node) => self.tree.nodes.insert(path, node),
                None => self.tree.nodes.remove(&path),
            };
        }
    }
}

fn check_version(path: &str, actual: i32, expected: Option<i32>) -> Result<()> {
    match expected {
        Some(expected) if expected != actual => Err(Error::BadVersion { path: path.to_owned(), expected }),
        _ => Ok(()),
    }
}

/// A session of a [`MemoryEnsemble`].
pub(super) struct MemSession {
    ensemble: MemoryEnsemble,
    id: i64,
    password: u64,
    timeout: Duration,
    detached: bool,
    /// The session's state; it keeps the last (terminal) state once the session is gone.
    state: watch::Receiver<SessionState>,
    /// Who the session authenticated as.
    ids: Vec<Identity>,
}

impl std::fmt::Debug for MemSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemSession").field("id", &SessionId(self.id)).finish_non_exhaustive()
    }
}

impl MemSession {
    pub(super) fn id(&self) -> SessionId {
        SessionId(self.id)
    }

    pub(super) fn credentials(&self) -> SessionCredentials {
        SessionCredentials(Credentials::Memory { id: SessionId(self.id), password: self.password })
    }

    pub(super) fn session_timeout(&self) -> Duration {
        self.timeout
    }

    pub(super) fn state(&self) -> SessionState {
        *self.state.borrow()
    }

    pub(super) fn state_receiver(&self) -> watch::Receiver<SessionState> {
        let mut receiver = self.state.clone();
        // Report changes from now on, as zookeeper-client's state watcher does.
        receiver.mark_unchanged();
        receiver
    }

    /// Runs one write in a transaction and fires its watches.
    fn write<T>(&self, path: &str, f: impl FnOnce(&mut Txn<'_>) -> Result<T>) -> Result<T> {
        let mut tree = self.ensemble.lock();
        tree.check_session(self.id, path)?;
        let mut txn = Txn::new(&mut tree);
        match f(&mut txn) {
            Ok(value) => {
                let events = txn.commit();
                tree.fire(events);
                Ok(value)
            }
            Err(e) => {
                txn.rollback();
                Err(e)
            }
        }
    }

    fn access(&self) -> Access<'_> {
        Access { ids: &self.ids, security: &self.ensemble.security }
    }

    pub(super) fn create_node(&self, path: &str, data: &[u8], mode: CreateMode) -> Result<String> {
        self.write(path, |txn| txn.create(path, data, mode, self.id, &self.access()))
    }

    pub(super) fn get(&self, path: &str) -> Result<(Vec<u8>, Stat)> {
        let tree = self.ensemble.lock();
        tree.check_session(self.id, path)?;
        let node = tree.nodes.get(path).ok_or_else(|| Error::NoNode { path: path.to_owned() })?;
        self.access().check(node, perm::READ, path)?;
        Ok((node.data.clone(), node.stat))
    }

    pub(super) fn get_watch(&self, path: &str) -> Result<(Vec<u8>, Stat, Watch)> {
        let mut tree = self.ensemble.lock();
        tree.check_session(self.id, path)?;
        let node = tree.nodes.get(path).ok_or_else(|| Error::NoNode { path: path.to_owned() })?;
        self.access().check(node, perm::READ, path)?;
        let (data, stat) = (node.data.clone(), node.stat);
        let watch = Tree::add_watch(&mut tree.data_watches, path, self.id);
        Ok((data, stat, watch))
    }

    pub(super) fn set(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<Stat> {
        self.write(path, |txn| txn.set(path, data, version, &self.access()))
    }

    pub(super) fn delete(&self, path: &str, version: Option<i32>) -> Result<()> {
        self.write(path, |txn| txn.delete(path, version, Some(&self.access())))
    }

    pub(super) fn children(&self, path: &str) -> Result<Vec<String>> {
        let tree = self.ensemble.lock();
        tree.check_session(self.id, path)?;
        let node = tree.nodes.get(path).ok_or_else(|| Error::NoNode { path: path.to_owned() })?;
        self.access().check(node, perm::READ, path)?;
        Ok(node.children.iter().cloned().collect())
    }

    pub(super) fn children_watch(&self, path: &str) -> Result<(Vec<String>, Watch)> {
        let mut tree = self.ensemble.lock();
        tree.check_session(self.id, path)?;
        let node = tree.nodes.get(path).ok_or_else(|| Error::NoNode { path: path.to_owned() })?;
        self.access().check(node, perm::READ, path)?;
        let children = node.children.iter().cloned().collect();
        let watch = Tree::add_watch(&mut tree.child_watches, path, self.id);
        Ok((children, watch))
    }

    pub(super) fn exists(&self, path: &str) -> Result<Option<Stat>> {
        let tree = self.ensemble.lock();
        tree.check_session(self.id, path)?;
        Ok(tree.nodes.get(path).map(|n| n.stat))
    }

    pub(super) fn exists_watch(&self, path: &str) -> Result<(Option<Stat>, Watch)> {
        let mut tree = self.ensemble.lock();
        tree.check_session(self.id, path)?;
        let stat = tree.nodes.get(path).map(|n| n.stat);
        let watch = Tree::add_watch(&mut tree.exist_watches, path, self.id);
        Ok((stat, watch))
    }

    pub(super) fn multi(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        let first = ops.first().map(Op::path).unwrap_or("/");
        let access = self.access();
        self.write(first, |txn| {
            let mut results = Vec::with_capacity(ops.len());
            for (index, op) in ops.iter().enumerate() {
                let result = match op {
                    Op::Create { path, data, mode } => {
                        txn.create(path, data, *mode, self.id, &access).map(|path| OpResult::Created { path })
                    }
                    Op::SetData { path, data, version } => {
                        txn.set(path, data, *version, &access).map(|stat| OpResult::DataSet { stat })
                    }
                    Op::Delete { path, version } => {
                        txn.delete(path, *version, Some(&access)).map(|()| OpResult::Deleted)
                    }
                    Op::Check { path, version } => {
                        txn.check(path, *version, &access).map(|()| OpResult::Checked)
                    }
                };
                results.push(result.map_err(|e| Error::MultiFailed { index, source: Box::new(e) })?);
            }
            Ok(results)
        })
    }

    /// Closes the session even when it was opened detached; Drop does the work.
    pub(super) fn close(mut self) {
        self.detached = false;
    }
}

impl Drop for MemSession {
    fn drop(&mut self) {
        if self.detached {
            // Like a process that died: the session lives on until its timeout.
            self.ensemble.disconnect(SessionId(self.id));
        } else {
            self.ensemble.end_session(self.id, SessionState::Closed);
        }
    }
}
