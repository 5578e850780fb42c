//! Nimbus high availability (Storm's layout): who leads, fenced leader writes, and the code a
//! follower copies so that it can lead.
//!
//! ```text
//! /storm/leader-lock/latch-<seq>            -> "host:port" (ephemeral sequential)
//! /storm/nimbuses/<host:port>               -> NimbusSummary (ephemeral)
//! /storm/blobstore/<topology-id>/<host:port> -> empty (ephemeral: that nimbus holds the code)
//! ```
//!
//! [`Election`]: every nimbus registers in `/nimbuses` and creates a sequential ephemeral
//! under `/leader-lock`; the lowest leads. Each candidate watches only its predecessor (no
//! herd when the leader goes). A candidate that is lowest but lacks the code of a stored
//! topology does not lead (Storm's rule): it fetches the code from another nimbus first, and if
//! it cannot, it gives its place up (deletes its node and queues again at the end), saying why.
//! Leadership lasts as long as the session and the election node: a nimbus whose session ended
//! starts over as a new candidate (`daemon::run_rejoining`), and a leader whose election node
//! is deleted while its session lives (by hand, or a bug elsewhere) steps down as soon as it
//! learns of it, from a watch on its own node ([`Election::watch_own_node`]) or from the first
//! leader write the fence refused ([`Leadership::refused`]), and queues again as a follower.
//!
//! [`Leadership`] is the shared flag the API, the monitor and the timers consult, and the
//! fence of every leader write: [`create`], [`set`], [`delete`] and [`delete_recursive`] send
//! their write in one `multi` with a check of the leader's own election node, so a deposed
//! leader (session expired while it was stopped or cut off: its node is gone) cannot write,
//! whatever its memory says.
//!
//! [`Replicator`]: a follower copies every stored topology's code from the leader (or any
//! nimbus holding it) through the code API, checking each file's SHA-256, records itself under
//! `/blobstore/<id>` and deletes the code of topologies gone from `/storms`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use cluster_state::clock::now_secs;
use cluster_state::code::CodeFile;
use cluster_state::coord::{self, CreateMode, Op, Session, WatchEvent};
use cluster_state::ids::TopologyId;
use cluster_state::paths::StormPaths;
use cluster_state::tls::ClientTls;
use cluster_state::znode::{NimbusSummary, StormBase, TopologyStatus, ZnodeData};
use nimbus_client::{ClientError, NimbusClient, StatusCode};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::code_store::CodeStore;

/// Whether this nimbus leads, and the fence of its writes. Clones share one state.
#[derive(Debug, Clone)]
pub struct Leadership {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// A nimbus built without an election (tests wiring the parts by hand): always the leader,
    /// writes unfenced.
    standalone: bool,
    /// Our election node while we have one.
    latch: std::sync::Mutex<Option<String>>,
    leading: watch::Sender<bool>,
}

impl Leadership {
    /// The leader from the start, with unfenced writes: a nimbus that runs no election.
    pub fn standalone() -> Self {
        let (leading, _) = watch::channel(true);
        Leadership { inner: Arc::new(Inner { standalone: true, latch: Default::default(), leading }) }
    }

    /// A candidate: a follower until [`Election`] makes it the leader.
    pub fn candidate() -> Self {
        let (leading, _) = watch::channel(false);
        Leadership { inner: Arc::new(Inner { standalone: false, latch: Default::default(), leading }) }
    }

    pub fn is_leader(&self) -> bool {
        *self.inner.leading.borrow()
    }

    /// Resolves once this nimbus leads.
    pub async fn leading(&self) {
        let mut rx = self.inner.leading.subscribe();
        // The sender lives in `self`, so `wait_for` cannot fail while we wait.
        let _ = rx.wait_for(|leading| *leading).await;
    }

    /// Our election node while we have one.
    pub fn election_node(&self) -> Option<String> {
        self.latch()
    }

    fn latch(&self) -> Option<String> {
        self.inner.latch.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    fn set_latch(&self, latch: Option<String>) {
        *self.inner.latch.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = latch;
    }

    fn lead(&self) {
        self.inner.leading.send_replace(true);
    }

    /// Resolves once this nimbus does not lead (at once when it does not).
    pub async fn deposed(&self) {
        let mut rx = self.inner.leading.subscribe();
        let _ = rx.wait_for(|leading| !*leading).await;
    }

    /// Steps down if `latch` is still our election node and we lead: a refusal or a deletion
    /// seen for an older node (a previous term) changes nothing. Returns whether we stepped down.
    pub fn step_down(&self, latch: &str) -> bool {
        if self.inner.standalone || self.latch().as_deref() != Some(latch) {
            return false;
        }
        let stepped = self.inner.leading.send_if_modified(|leading| std::mem::replace(leading, false));
        if stepped {
            tracing::warn!(node = %latch, "our election node is gone: stepping down to follower");
        }
        stepped
    }

    /// The check every leader write carries: our election node, at version 0 (it is never
    /// written). `None` for a standalone nimbus; an error when this nimbus does not lead.
    fn fence(&self) -> Result<Option<Op>, coord::Error> {
        if self.inner.standalone {
            return Ok(None);
        }
        match self.latch() {
            Some(path) if self.is_leader() => Ok(Some(Op::Check { path, version: 0 })),
            latch => Err(not_leading(latch)),
        }
    }
}

impl Leadership {
    /// The fence as an operation to put first in a multi (`None`: standalone, unfenced); an
    /// error when this nimbus does not lead.
    pub fn fence_op(&self) -> coord::Result<Option<Op>> {
        self.fence()
    }

    /// The error of a multi whose fence (`fence`, from [`Leadership::fence_op`]) failed: our
    /// election node is gone, so this nimbus steps down (see [`Leadership::step_down`]).
    pub fn refused(&self, fence: &Op) -> coord::Error {
        self.step_down(fence.path());
        not_leading(Some(fence.path().to_owned()))
    }
}

fn not_leading(latch: Option<String>) -> coord::Error {
    coord::Error::Backend {
        path: latch,
        message: "this nimbus is not the leader (or lost its election node): nothing was written".into(),
    }
}

/// Sends `op` fenced by `leadership` (see the module docs). Errors of `op` itself come back as
/// a plain call would return them (`NoNode`, `BadVersion`, ...); a failed fence is a
/// non-retryable [`coord::Error::Backend`] naming the election node.
async fn fenced(session: &Session, leadership: &Leadership, op: Op) -> coord::Result<()> {
    let Some(check) = leadership.fence()? else {
        return match session.multi(std::slice::from_ref(&op)).await {
            Ok(_) => Ok(()),
            Err(coord::Error::MultiFailed { source, .. }) => Err(*source),
            Err(e) => Err(e),
        };
    };
    let ops = [check, op];
    match session.multi(&ops).await {
        Ok(_) => Ok(()),
        Err(coord::Error::MultiFailed { index: 0, .. }) => Err(leadership.refused(&ops[0])),
        Err(coord::Error::MultiFailed { source, .. }) => Err(*source),
        Err(e) => Err(e),
    }
}

/// A fenced create of a persistent node (its parent must exist).
pub async fn create(
    session: &Session,
    leadership: &Leadership,
    path: &str,
    data: &[u8],
) -> coord::Result<()> {
    let op = Op::Create { path: path.to_owned(), data: data.to_vec(), mode: CreateMode::Persistent };
    fenced(session, leadership, op).await
}

/// A fenced compare-and-set (`None`: any version).
pub async fn set(
    session: &Session,
    leadership: &Leadership,
    path: &str,
    data: &[u8],
    version: Option<i32>,
) -> coord::Result<()> {
    let op = Op::SetData { path: path.to_owned(), data: data.to_vec(), version };
    fenced(session, leadership, op).await
}

/// A fenced delete (`None`: any version).
pub async fn delete(
    session: &Session,
    leadership: &Leadership,
    path: &str,
    version: Option<i32>,
) -> coord::Result<()> {
    fenced(session, leadership, Op::Delete { path: path.to_owned(), version }).await
}

/// [`Session::delete_recursive`] with every delete fenced; a node already gone is not an error.
pub async fn delete_recursive(session: &Session, leadership: &Leadership, path: &str) -> coord::Result<()> {
    // Depth-first, children before parents; nodes appearing meanwhile (a worker's heartbeat,
    // a follower recording its code copy) make the parent's delete fail NotEmpty: walk it again,
    // a bounded number of times.
    let mut stack = vec![(path.to_owned(), false)];
    let mut retries = 0;
    while let Some((node, expanded)) = stack.pop() {
        if !expanded {
            match session.children(&node).await {
                Ok(children) => {
                    stack.push((node.clone(), true));
                    stack.extend(children.into_iter().map(|c| (coord::join(&node, &c), false)));
                }
                Err(coord::Error::NoNode { .. }) => {}
                Err(e) => return Err(e),
            }
            continue;
        }
        match delete(session, leadership, &node, None).await {
            Ok(()) | Err(coord::Error::NoNode { .. }) => {}
            Err(coord::Error::NotEmpty { .. }) if retries < 8 => {
                retries += 1;
                stack.push((node, false));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Every registered nimbus, by address (undecodable entries skipped).
pub async fn nimbuses(session: &Session, paths: &StormPaths) -> coord::Result<Vec<NimbusSummary>> {
    let dir = paths.nimbuses_dir();
    let mut found = Vec::new();
    for name in session.children_or_empty(&dir).await? {
        let path = coord::join(&dir, &name);
        match session.read::<NimbusSummary>(&path).await {
            Ok((summary, _)) => found.push(summary),
            Err(coord::Error::NoNode { .. }) => {}
            Err(coord::Error::Decode(e)) => tracing::debug!("skipping {path}: {e}"),
            Err(e) => return Err(e),
        }
    }
    found.sort_by_key(NimbusSummary::address);
    Ok(found)
}

/// The leader's API address, if a nimbus says it leads.
pub async fn leader_address(session: &Session, paths: &StormPaths) -> coord::Result<Option<String>> {
    Ok(nimbuses(session, paths).await?.into_iter().find(|n| n.is_leader).map(|n| n.address()))
}

/// Copies the code of stored topologies to this nimbus; see the module docs.
#[derive(Debug, Clone)]
pub struct Replicator {
    session: Arc<Session>,
    paths: StormPaths,
    code: CodeStore,
    /// Our own address: not a source, and our name under `/blobstore/<id>`.
    address: String,
    token: Option<String>,
    /// TLS towards the other nimbuses (`nimbus.http.tls.ca`, client certificate).
    tls: Option<ClientTls>,
    /// Largest code file copied (`nimbus.code.max.upload.bytes`).
    max_file_bytes: u64,
}

/// What one replication round left missing, and why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Missing(pub BTreeMap<TopologyId, String>);

impl Missing {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(id, why)| format!("{id} ({why})")).collect();
        f.write_str(&parts.join(", "))
    }
}

impl Replicator {
    pub fn new(
        session: Arc<Session>,
        paths: StormPaths,
        code: CodeStore,
        address: String,
        token: Option<String>,
        max_file_bytes: u64,
    ) -> Self {
        Replicator { session, paths, code, address, token, tls: None, max_file_bytes }
    }

    /// Copies over TLS with `tls` (`None`: plain HTTP).
    pub fn with_tls(mut self, tls: Option<ClientTls>) -> Self {
        self.tls = tls;
        self
    }

    /// Stored topologies (names under `/storms` that are ids).
    async fn stored(&self) -> coord::Result<BTreeSet<TopologyId>> {
        let names = self.session.children_or_empty(&self.paths.storms_dir()).await?;
        Ok(names.iter().filter_map(|n| n.parse().ok()).collect())
    }

    /// Stored topologies whose code this nimbus lacks and must hold to lead: those submitted
    /// through an elected leader (which created `/blobstore/<id>`). A topology without that node
    /// (stored before nimbus HA, or a base written by hand) does not block the election: no
    /// nimbus may hold its code, and waiting for it would leave the cluster without a leader.
    /// Neither does a killed topology: completing its kill needs no code, and when the nimbus
    /// that took the submit died before any other copied it, no nimbus ever will.
    pub async fn lacking(&self) -> coord::Result<Vec<TopologyId>> {
        let mut lacking = Vec::new();
        for id in self.stored().await? {
            if self.code.holds(&id).await
                || self.session.exists(&self.paths.blobstore_topology(&id)).await?.is_none()
            {
                continue;
            }
            match self.session.read::<StormBase>(&self.paths.storm(&id)).await {
                Ok((base, _)) if base.status == TopologyStatus::Killed => continue,
                Err(coord::Error::NoNode { .. }) => continue,
                _ => lacking.push(id),
            }
        }
        Ok(lacking)
    }

    /// One round: copies what is missing, records what is held, and (`remove_stale`, followers
    /// only) deletes the code of topologies no longer stored. Returns what is still missing.
    pub async fn sync(&self, remove_stale: bool) -> coord::Result<Missing> {
        let stored = self.stored().await?;
        if remove_stale && let Ok(local) = self.code.topologies().await {
            for id in local.into_iter().filter(|id| !stored.contains(id)) {
                match self.code.remove(&id).await {
                    Ok(()) => {
                        tracing::info!(topology = %id, "removed the code of a topology no longer stored")
                    }
                    Err(e) => tracing::warn!(topology = %id, "cannot remove stale code: {e}"),
                }
            }
        }
        let mut missing = Missing::default();
        let mut sources: Option<Vec<String>> = None;
        for id in &stored {
            if !self.code.holds(id).await {
                // Leader first: it surely has the code; then the other nimbuses.
                let sources = match &sources {
                    Some(s) => s,
                    None => sources.insert(self.sources().await?),
                };
                if let Err(why) = self.fetch(id, sources).await {
                    missing.0.insert(id.clone(), why);
                    continue;
                }
                tracing::info!(topology = %id, "code copied from another nimbus");
            }
            self.record_holder(id).await?;
        }
        Ok(missing)
    }

    async fn sources(&self) -> coord::Result<Vec<String>> {
        let mut all = nimbuses(&self.session, &self.paths).await?;
        all.sort_by_key(|n| !n.is_leader);
        Ok(all.into_iter().map(|n| n.address()).filter(|a| *a != self.address).collect())
    }

    /// `/blobstore/<id>/<us>`, ephemeral; its parent is the leader's (gone with the topology).
    async fn record_holder(&self, id: &TopologyId) -> coord::Result<()> {
        let Ok(path) = self.paths.code_holder(id, &self.address) else { return Ok(()) };
        match self.session.create(&path, b"", CreateMode::Ephemeral).await {
            Ok(_) | Err(coord::Error::NodeExists { .. } | coord::Error::NoNode { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Copies topology `id`'s code from the first source that has all of it; the error says
    /// why none did.
    async fn fetch(&self, id: &TopologyId, sources: &[String]) -> Result<(), String> {
        if sources.is_empty() {
            return Err("no other nimbus is registered to copy it from".into());
        }
        let mut reasons = Vec::new();
        for source in sources {
            match self.fetch_from(id, source).await {
                Ok(()) => return Ok(()),
                Err(e) => reasons.push(format!("{source}: {e}")),
            }
        }
        Err(reasons.join("; "))
    }

    async fn fetch_from(&self, id: &TopologyId, source: &str) -> Result<(), String> {
        let mut client = NimbusClient::new(source, self.token.clone()).with_tls(self.tls.clone());
        client.timeout = Duration::from_secs(10);
        // The definition last: holding it means holding the whole code (`CodeStore::holds`).
        for file in [CodeFile::WorkerBinary, CodeFile::Resources, CodeFile::Secret, CodeFile::Topology] {
            let mut download = match client.download_code(id, file).await {
                Ok(d) => d,
                Err(e)
                    if matches!(file, CodeFile::WorkerBinary | CodeFile::Resources)
                        && e.status() == Some(StatusCode::NOT_FOUND) =>
                {
                    continue;
                }
                Err(e) => return Err(e.to_string()),
            };
            let sha256 = download.sha256.clone().ok_or_else(|| format!("{file}: no checksum sent"))?;
            let mut bytes = Vec::new();
            let read = async {
                while let Some(chunk) = download.next_chunk().await? {
                    bytes.extend_from_slice(&chunk);
                    if bytes.len() as u64 > self.max_file_bytes {
                        return Ok::<_, ClientError>(false);
                    }
                }
                Ok(true)
            };
            match tokio::time::timeout(Duration::from_secs(300), read).await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => return Err(format!("{file}: larger than {} bytes", self.max_file_bytes)),
                Ok(Err(e)) => return Err(format!("{file}: {e}")),
                Err(_) => return Err(format!("{file}: download not complete within 300 s")),
            }
            self.code.install_replica(id, file, &bytes, &sha256).await.map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Copies code until this nimbus leads: a round at once, then on every change of
    /// `/storms` and every `every`.
    pub async fn run(self, leadership: Leadership, every: Duration, cancel: CancellationToken) {
        loop {
            if leadership.is_leader() {
                return;
            }
            match self.sync(true).await {
                Ok(missing) if !missing.is_empty() => {
                    tracing::warn!("cannot copy the code of {missing} yet; retrying");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("code replication round failed, retrying: {e}"),
            }
            let watch = self.session.children_watch(&self.paths.storms_dir()).await.ok().map(|(_, w)| w);
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = leadership.leading() => return,
                _ = tokio::time::sleep(every) => {}
                _ = async { match watch { Some(w) => { w.await; } None => std::future::pending().await } } => {}
            }
        }
    }

    /// After a submit: waits until `min` nimbuses (this one included) hold the code of `id`,
    /// at most `within`. Returns how many do.
    pub async fn wait_for_replicas(&self, id: &TopologyId, min: usize, within: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + within;
        let dir = self.paths.blobstore_topology(id);
        loop {
            let held = self.session.children_or_empty(&dir).await.map(|c| c.len()).unwrap_or(0);
            if held >= min || tokio::time::Instant::now() >= deadline {
                return held;
            }
            let watch = self.session.children_watch(&dir).await.ok().map(|(_, w)| w);
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                _ = async { match watch { Some(w) => { w.await; } None => std::future::pending().await } } => {}
            }
        }
    }

    /// Records this nimbus as a holder of `id`'s code (the leader, at submit).
    pub async fn record_own_copy(&self, id: &TopologyId) -> coord::Result<()> {
        self.record_holder(id).await
    }
}

/// This nimbus's part in the election; see the module docs.
#[derive(Debug)]
pub struct Election {
    session: Arc<Session>,
    paths: StormPaths,
    leadership: Leadership,
    me: NimbusSummary,
    replicator: Replicator,
    /// How long a candidate that gave its place up (lacking code) waits before queueing again.
    retry: Duration,
}

impl Election {
    pub fn new(
        session: Arc<Session>,
        paths: StormPaths,
        leadership: Leadership,
        me: NimbusSummary,
        replicator: Replicator,
        retry: Duration,
    ) -> Self {
        Election { session, paths, leadership, me, replicator, retry }
    }

    /// Registers in `/nimbuses` (replacing a previous incarnation's node at once).
    async fn register(&self) -> coord::Result<()> {
        let path = self.paths.nimbus(&self.me.address()).map_err(|_| coord::Error::InvalidPath {
            path: format!("{}/{}", self.paths.nimbuses_dir(), self.me.address()),
            reason: "the nimbus address (storm.local.hostname:nimbus.http.port) is not a valid znode name",
        })?;
        let mut me = self.me.clone();
        me.uptime_secs = now_secs().saturating_sub(me.start_time_secs);
        let data = me.encode();
        for _ in 0..4 {
            match self.session.create(&path, &data, CreateMode::Ephemeral.with_parents()).await {
                Ok(_) => return Ok(()),
                Err(coord::Error::NodeExists { .. }) => match self.session.exists(&path).await? {
                    Some(stat) if stat.ephemeral_owner == Some(self.session.id()) => {
                        self.session.set(&path, &data, None).await?;
                        return Ok(());
                    }
                    Some(stat) => {
                        // A previous incarnation of this nimbus (same address), killed before
                        // its session ended: ours replaces it now.
                        match self.session.delete(&path, Some(stat.version)).await {
                            Ok(()) | Err(coord::Error::NoNode { .. } | coord::Error::BadVersion { .. }) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    None => {}
                },
                Err(e) => return Err(e),
            }
        }
        Err(coord::Error::HeldByOther {
            path,
            owner: coord::SessionId(0),
            data: "another nimbus keeps registering this address".into(),
        })
    }

    /// Resolves once our election node `latch` is gone while the session lives (or at once if
    /// it is), stepping this nimbus down; it stays pending when the session ends (the daemon
    /// stops then) or on `cancel`. A watch lost with a dropped connection is set again.
    pub async fn watch_own_node(&self, latch: &str, cancel: &CancellationToken) {
        loop {
            let watch = match self.session.exists_watch(latch).await {
                Ok((None, _)) => break,
                Ok((Some(_), watch)) => watch,
                Err(e) if e.is_session_lost() => return cancel.cancelled().await,
                Err(e) => {
                    tracing::debug!(node = %latch, "cannot watch our election node, trying again: {e}");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                    }
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                event = watch => match event {
                    WatchEvent::NodeDeleted { .. } => break,
                    WatchEvent::SessionEnded { .. } => return cancel.cancelled().await,
                    _ => {}
                },
            }
        }
        self.leadership.step_down(latch);
    }

    async fn join_queue(&self) -> coord::Result<String> {
        let path = self
            .session
            .create(
                &self.paths.leader_latch_prefix(),
                self.me.address().as_bytes(),
                CreateMode::EphemeralSequential.with_parents(),
            )
            .await?;
        self.leadership.set_latch(Some(path.clone()));
        Ok(path)
    }

    /// Campaigns until this nimbus leads (then returns `Ok`) or `cancel`; errors of the
    /// session are returned (the caller retries or, when the session ended, starts over).
    pub async fn run(&self, cancel: &CancellationToken) -> coord::Result<bool> {
        // After a term that ended with the session alive: our old node (normally gone already)
        // must not stay queued ahead of the others.
        if let Some(old) = self.leadership.latch() {
            match self.session.delete(&old, None).await {
                Ok(()) | Err(coord::Error::NoNode { .. }) => {}
                Err(e) => return Err(e),
            }
            self.leadership.set_latch(None);
        }
        self.register().await?;
        let mut latch = self.join_queue().await?;
        let name = |p: &str| p.rsplit('/').next().unwrap_or_default().to_owned();
        tracing::info!(node = %latch, address = %self.me.address(), "joined the nimbus leader election");
        loop {
            let dir = self.paths.leader_lock_dir();
            let mut queue: Vec<(u32, String)> = self
                .session
                .children(&dir)
                .await?
                .into_iter()
                .filter_map(|c| StormPaths::parse_latch_seq(&c).map(|seq| (seq, c)))
                .collect();
            queue.sort();
            let ours = name(&latch);
            let Some(position) = queue.iter().position(|(_, c)| *c == ours) else {
                // Our node is gone while the session lives (deleted by hand): queue again.
                tracing::warn!(node = %latch, "our election node vanished; joining the queue again");
                latch = self.join_queue().await?;
                continue;
            };
            if position > 0 {
                // Watch only the candidate just before us.
                let predecessor = coord::join(&dir, &queue[position - 1].1);
                let (exists, watch) = self.session.exists_watch(&predecessor).await?;
                if exists.is_none() {
                    continue;
                }
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(false),
                    event = watch => {
                        if let WatchEvent::SessionEnded { state } = event {
                            return Err(coord::Error::Backend { path: None, message: format!("session ended ({state:?})") });
                        }
                    }
                }
                continue;
            }
            // First in line: lead only with the code of every stored topology.
            let lacking = self.replicator.lacking().await?;
            let mut missing =
                if lacking.is_empty() { Missing::default() } else { self.replicator.sync(false).await? };
            missing.0.retain(|id, _| lacking.contains(id));
            if missing.is_empty() {
                self.leadership.lead();
                let mut me = self.me.clone();
                me.is_leader = true;
                me.uptime_secs = now_secs().saturating_sub(me.start_time_secs);
                if let Ok(path) = self.paths.nimbus(&self.me.address()) {
                    self.session.set(&path, &me.encode(), None).await?;
                }
                tracing::info!(node = %latch, address = %self.me.address(), "this nimbus is now the leader");
                return Ok(true);
            }
            // Storm's rule: without the code, give the place up so that a nimbus with it leads.
            tracing::warn!(
                "first in the leader election but lacking the code of {missing}; giving the place up for {} s",
                self.retry.as_secs_f32()
            );
            match self.session.delete(&latch, None).await {
                Ok(()) | Err(coord::Error::NoNode { .. }) => {}
                Err(e) => return Err(e),
            }
            self.leadership.set_latch(None);
            tokio::select! {
                _ = cancel.cancelled() => return Ok(false),
                _ = tokio::time::sleep(self.retry) => {}
            }
            latch = self.join_queue().await?;
        }
    }
}
