//! [`StaticWorker`]: one worker's executors and peer connections for a given plan, without
//! ZooKeeper; what `process::run` drives, and what benchmarks and embedders use directly.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use cluster_state::ids::{SupervisorId, TaskId, TopologyId, WorkerSlot};
use cluster_state::znode::Assignment;

use crate::collector::{Batch, ErrorReport};
use crate::error::{Error, Result};
use crate::layout::{TaskLayout, WorkerPlan, plan_worker};
use crate::runtime::{RuntimeParts, WorkerRuntime};
use crate::topology::Topology;
use crate::transport::{
    DEFAULT_MAX_CONNECTIONS, PeerAddr, PeerReceiver, PeerSender, ReceiverSetup, TopologySecret,
    TransportStats, TransportTls,
};

/// Where remote tasks go: task -> index into the peer queues, and the queues.
type RemoteRoutes = (BTreeMap<TaskId, usize>, Vec<crate::queue::QueueSender<Batch>>);

/// How long a stopped peer's sender may flush before its connection is closed: it is not
/// waited for (the worker's control loop is async), only checked at the next reconcile.
const SENDER_STOP_GRACE: Duration = Duration::from_secs(5);

/// The peer connections and the routes they imply.
#[derive(Debug)]
struct Peers {
    senders: BTreeMap<(WorkerSlot, String), PeerSender>,
    /// Senders of peers no longer wanted, flushing, with when they were told to stop.
    stopping: Vec<(PeerSender, Instant)>,
    topology_id: String,
    secret: TopologySecret,
    tls: Option<TransportTls>,
}

impl Peers {
    fn new(topology_id: &TopologyId, secret: TopologySecret, tls: Option<TransportTls>) -> Self {
        Peers {
            senders: BTreeMap::new(),
            stopping: Vec::new(),
            topology_id: topology_id.to_string(),
            secret,
            tls,
        }
    }

    /// Starts senders for new peers, stops those no longer needed, returns the routes. Never
    /// waits on a sender thread: this runs on the worker's async control loop.
    fn reconcile(&mut self, plan: &WorkerPlan, stats: &Arc<TransportStats>) -> Result<RemoteRoutes> {
        let wanted: BTreeMap<(WorkerSlot, String), ()> =
            plan.peers.iter().map(|(s, h)| ((s.clone(), h.clone()), ())).collect();
        let stale: Vec<(WorkerSlot, String)> =
            self.senders.keys().filter(|k| !wanted.contains_key(*k)).cloned().collect();
        for k in stale {
            if let Some(s) = self.senders.remove(&k) {
                s.signal_stop();
                self.stopping.push((s, Instant::now()));
            }
        }
        self.reap();
        for key in wanted.keys() {
            if !self.senders.contains_key(key) {
                let to = PeerAddr {
                    host: key.1.clone(),
                    port: key.0.port,
                    topology_id: self.topology_id.clone(),
                    secret: self.secret.clone(),
                    tls: self.tls.clone(),
                };
                self.senders.insert(key.clone(), PeerSender::start(to, stats.clone())?);
            }
        }
        let index: BTreeMap<WorkerSlot, usize> =
            self.senders.keys().enumerate().map(|(i, (s, _))| (s.clone(), i)).collect();
        let dests = self.senders.values().map(|s| s.tx.clone()).collect();
        let remote = plan.remote_tasks.iter().filter_map(|(t, s)| index.get(s).map(|i| (*t, *i))).collect();
        Ok((remote, dests))
    }

    /// Forgets stopped senders whose thread ended, and closes the connection of those past
    /// their grace (a peer that reads nothing keeps a write blocked until then).
    fn reap(&mut self) {
        self.stopping.retain(|(s, since)| {
            if s.is_finished() {
                return false;
            }
            if since.elapsed() >= SENDER_STOP_GRACE {
                s.force_close();
            }
            true
        });
    }

    /// Stops every sender, letting each flush for at most `bound` (blocking: for shutdown).
    fn stop(self, bound: Duration) {
        for s in self.senders.values() {
            s.signal_stop();
        }
        let deadline = Instant::now() + bound;
        for (_, s) in self.senders {
            if !s.stop_within(deadline.saturating_duration_since(Instant::now())) {
                tracing::warn!("a peer did not take our last frames within {bound:?}; connection closed");
            }
        }
        for (s, _) in self.stopping {
            s.force_close();
        }
    }
}

/// How a worker's port is set up.
#[derive(Debug, Clone)]
pub struct TransportOptions {
    /// Address the port is bound on.
    pub bind_host: String,
    /// The topology's secret: peers prove they hold it (see `transport`).
    pub secret: TopologySecret,
    /// Inbound connections open at once ([`WorkerConfig::max_peer_connections`](crate::process::WorkerConfig::max_peer_connections)).
    pub max_connections: usize,
    /// Mutual TLS with the topology's key, derived from `secret` ([`TransportTls`]):
    /// `topology.transport.tls`. Every worker of a topology must agree.
    pub tls: bool,
}

impl TransportOptions {
    /// Binds `bind_host` with the default connection limit, plain TCP.
    pub fn new(bind_host: impl Into<String>, secret: TopologySecret) -> Self {
        TransportOptions {
            bind_host: bind_host.into(),
            secret,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            tls: false,
        }
    }
}

/// One worker's executors and connections for a given plan, without ZooKeeper: what [`run`](crate::process::run)
/// drives, and what benchmarks and embedders can use with an assignment of their own.
#[derive(Debug)]
pub struct StaticWorker {
    /// The executors.
    pub runtime: WorkerRuntime,
    /// Transport counters.
    pub transport: Arc<TransportStats>,
    pub(crate) plan: WorkerPlan,
    peers: Peers,
    receiver: PeerReceiver,
}

impl StaticWorker {
    /// Starts the executors of `plan` (inactive), connects to its peers and listens on the
    /// slot's port (`options.bind_host`). `port` comes from the plan's slot.
    pub fn start(
        topology: Arc<Topology>,
        layout: Arc<TaskLayout>,
        plan: WorkerPlan,
        topology_id: &TopologyId,
        options: TransportOptions,
        errors: Option<tokio::sync::mpsc::Sender<ErrorReport>>,
    ) -> Result<Self> {
        let transport = Arc::new(TransportStats::default());
        let tls = if options.tls { Some(TransportTls::for_topology(&options.secret)?) } else { None };
        let mut peers = Peers::new(topology_id, options.secret.clone(), tls.clone());
        let (remote_tasks, remote_dests) = peers.reconcile(&plan, &transport)?;
        let local = Arc::new(plan.local_tasks.clone());
        let runtime = WorkerRuntime::start(RuntimeParts {
            topology,
            layout,
            executors: plan.local_executors.iter().map(|e| (*e, local.clone())).collect(),
            remote_tasks,
            remote_dests,
            errors,
            start_active: false,
        })?;
        let setup = ReceiverSetup {
            topology_id: topology_id.to_string(),
            secret: options.secret,
            tls,
            table: runtime.table.clone(),
            dispatch: Arc::new(runtime.inboxes.clone()),
            stats: transport.clone(),
            max_connections: options.max_connections,
        };
        let receiver = PeerReceiver::start(&options.bind_host, plan.slot.port, setup)?;
        Ok(StaticWorker { runtime, transport, plan, peers, receiver })
    }

    /// Every executor of `topology` in this one worker, listening on `port` (0: any free one)
    /// with no peers: for benchmarks and probes of the transport without a cluster.
    pub fn alone(
        topology: Topology,
        topology_id: &TopologyId,
        port: u16,
        options: TransportOptions,
    ) -> Result<Self> {
        let layout = Arc::new(TaskLayout::compute(&topology.component_parallelism()));
        let node = SupervisorId::new("local")
            .map_err(|e| Error::BadAssignment { topology: topology_id.to_string(), reason: e.to_string() })?;
        let slot = WorkerSlot { node: node.clone(), port };
        let assignment = Assignment {
            master_code_dir: String::new(),
            node_host: [(node.clone(), options.bind_host.clone())].into(),
            executors: layout
                .executors
                .keys()
                .map(|e| cluster_state::znode::ExecutorAssignment {
                    executor: *e,
                    node: node.clone(),
                    port,
                    start_time_secs: 0,
                })
                .collect(),
        };
        let plan = plan_worker(&layout, &assignment, &slot).map_err(|e| Error::BadAssignment {
            topology: topology_id.to_string(),
            reason: format!("{e:?}"),
        })?;
        StaticWorker::start(Arc::new(topology), layout, plan, topology_id, options, None)
    }

    /// The address the worker listens on.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.receiver.local_addr()
    }

    /// Whether a connection to and from every peer is up.
    pub fn peers_connected(&self) -> bool {
        let n = self.plan.peers.len() as u64;
        self.transport.connects.load(Ordering::Relaxed) >= n
            && self.transport.accepted.load(Ordering::Relaxed) >= n
    }

    /// Applies a new plan with the same local executors: peers are reconnected and routes
    /// replaced.
    pub fn update(&mut self, plan: WorkerPlan) -> Result<()> {
        let (remote, dests) = self.peers.reconcile(&plan, &self.transport)?;
        self.runtime.set_remote(&remote, &dests);
        if tasks_moved(&self.plan, &plan) {
            self.runtime.tasks_moved();
        }
        self.plan = plan;
        Ok(())
    }

    /// Forgets stopped peer senders that ended, and closes those past their grace.
    pub(crate) fn reap_peers(&mut self) {
        self.peers.reap();
    }

    /// Graceful stop: drain up to `drain`, stop executors, flush peers (for at most `drain`
    /// too), stop listening.
    pub fn shutdown(self, drain: Duration) {
        self.runtime.shutdown(drain);
        self.peers.stop(drain);
        self.receiver.stop();
    }
}

/// Whether a task that ran on another worker under `old` runs elsewhere (or nowhere) under
/// `new`: its old worker is gone or restarts, so trees that passed through it are lost.
fn tasks_moved(old: &WorkerPlan, new: &WorkerPlan) -> bool {
    old.remote_tasks.iter().any(|(task, slot)| new.remote_tasks.get(task) != Some(slot))
}
