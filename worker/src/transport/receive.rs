//! The receiving side: a low-priority gatekeeper that accepts on the worker's port and runs
//! the handshakes, and a thread per authenticated peer connection (bounded in number), each
//! dispatching received envelopes to the local executors' inboxes.

use std::collections::{BTreeMap, HashMap};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::queue::QueueSender;
use cluster_state::ids::TaskId;
use tokio_util::sync::CancellationToken;

use super::auth::{self, TopologySecret};
use super::codec::{BatchSink, CONNECTION_TEXTS, decode_each, read_frame};
use super::tls::{PeerStream, TransportTls};
use super::{FRAME_LIMIT, TransportStats};
use crate::collector::Batch;
use crate::error::{Error, Result};
use crate::executor::StreamTable;
use crate::tuple::TextCache;

/// How long the accept loop waits after a failed accept (out of descriptors, say), doubling up
/// to [`ACCEPT_BACKOFF_MAX`]: retrying at once would spin a core while nothing can change.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Warnings about closed inbound connections allowed per [`LOG_WINDOW`]; the rest are counted
/// and summed up in one line, written before the next window's first warning. A port under attack sees hundreds of failed handshakes a second,
/// and a line for each would flood the log (the counters keep the exact figures).
const LOG_BUDGET: u32 = 10;
const LOG_WINDOW: Duration = Duration::from_secs(10);

/// How many warnings may still be written in the current window.
#[derive(Debug)]
struct LogBudget {
    window_start: Instant,
    written: u32,
    suppressed: u64,
}

/// What to do with one more warning.
#[derive(Debug, PartialEq, Eq)]
enum LogVerdict {
    /// Write it, after a summary of the `previous_suppressed` warnings of the window before.
    Write { previous_suppressed: u64 },
    /// Count it only.
    Suppress,
}

impl LogBudget {
    fn new(now: Instant) -> Self {
        LogBudget { window_start: now, written: 0, suppressed: 0 }
    }

    fn take(&mut self, now: Instant) -> LogVerdict {
        let mut previous_suppressed = 0;
        if now.saturating_duration_since(self.window_start) >= LOG_WINDOW {
            previous_suppressed = std::mem::take(&mut self.suppressed);
            *self = LogBudget { window_start: now, written: 0, suppressed: 0 };
        }
        if self.written < LOG_BUDGET {
            self.written += 1;
            LogVerdict::Write { previous_suppressed }
        } else {
            self.suppressed += 1;
            LogVerdict::Suppress
        }
    }
}

/// Where received envelopes go: the inbox of each local task.
pub(crate) type Dispatch = Arc<BTreeMap<TaskId, QueueSender<Batch>>>;

/// What the receiver needs besides its port.
#[derive(Debug, Clone)]
pub(crate) struct ReceiverSetup {
    pub(crate) topology_id: String,
    pub(crate) secret: TopologySecret,
    /// TLS with the topology's key (`topology.transport.tls`), or plain TCP.
    pub(crate) tls: Option<TransportTls>,
    pub(crate) table: Arc<StreamTable>,
    pub(crate) dispatch: Dispatch,
    pub(crate) stats: Arc<TransportStats>,
    /// Connections open at once; more are closed as they are accepted.
    pub(crate) max_connections: usize,
}

/// An open connection: how to close it, and whether its peer has authenticated.
#[derive(Debug)]
struct Conn {
    /// Cancelled to close a connection still in its handshake (on the gatekeeper).
    handshake: CancellationToken,
    /// The socket of an authenticated connection (its receiver thread reads it).
    stream: Option<TcpStream>,
}

impl Conn {
    fn authenticated(&self) -> bool {
        self.stream.is_some()
    }

    fn close(&self) {
        self.handshake.cancel();
        if let Some(s) = &self.stream {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// The open connections keyed by a connection number (increasing: the smallest is the
/// oldest); an entry lives as long as its handshake and then its receiver thread (removed by
/// [`ConnGuard`]), or until it is evicted to make room.
#[derive(Debug, Default)]
struct Conns {
    open: Mutex<HashMap<u64, Conn>>,
    ended: Condvar,
}

impl Conns {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Conn>> {
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// At the connection limit, the connection that makes room for a new one: the oldest still in
/// its handshake. Idle or slow connections that never authenticate then cannot lock a real
/// peer out (its handshake takes well under a millisecond on a LAN); only when every
/// connection is authenticated is a new one refused.
fn eviction_victim(open: &HashMap<u64, Conn>) -> Option<u64> {
    open.iter().filter(|(_, c)| !c.authenticated()).map(|(id, _)| *id).min()
}

/// Removes its connection from the table when its handshake fails or its receiver thread
/// ends, however it ends.
struct ConnGuard {
    conns: Arc<Conns>,
    id: u64,
    stats: Arc<TransportStats>,
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let mut open = self.conns.lock();
        open.remove(&self.id);
        self.stats.connections.store(open.len() as u64, Ordering::Relaxed);
        drop(open);
        self.conns.ended.notify_all();
    }
}

/// An authenticated connection on its way from the gatekeeper to a receiver thread.
struct Admitted {
    stream: PeerStream,
    peer: String,
    guard: ConnGuard,
}

/// Accepts peer connections on the worker's port and dispatches received envelopes to the
/// local executors' inboxes.
///
/// Two threads besides one per authenticated peer. The *gatekeeper* accepts and runs every
/// handshake on a single-threaded runtime at a lower CPU priority (nice +10), so whatever
/// strangers do to the port (connect and close, sit idle, send forged hellos) costs the worker
/// one thread that yields to the executors, and no thread or buffer per connection.
/// The *spawner*, at normal priority, starts the receiver thread of each connection the
/// gatekeeper admits (a thread inherits its creator's priority).
#[derive(Debug)]
pub(crate) struct PeerReceiver {
    addr: SocketAddr,
    stop: CancellationToken,
    conns: Arc<Conns>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// How long a stop waits for the receiver threads once their sockets are closed.
const STOP_WAIT: Duration = Duration::from_secs(5);

/// How much lower the gatekeeper's priority is than the worker's (nice values; 19 at most).
/// Ten steps make its CFS weight about a tenth of an executor's (110 against 1024 at nice 0),
/// so on a saturated CPU strangers cost the executors at most a few percent, and handshakes
/// still complete within their deadline: it is never starved outright, as nice 19 under busy
/// executors at a lower nice value was (0.1 s of CPU in a 10-minute soak).
const GATEKEEPER_NICE_STEPS: i32 = 10;

impl PeerReceiver {
    /// Binds `bind:port` and starts accepting.
    pub(crate) fn start(bind: &str, port: u16, setup: ReceiverSetup) -> Result<Self> {
        let listener =
            TcpListener::bind((bind, port)).map_err(|e| Error::io(format!("bind {bind}:{port}"), e))?;
        let addr = listener.local_addr().map_err(|e| Error::io("local address", e))?;
        listener.set_nonblocking(true).map_err(|e| Error::io(format!("listen on {addr}"), e))?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| Error::io("start the transport's gatekeeper runtime", e))?;
        let stop = CancellationToken::new();
        let conns: Arc<Conns> = Arc::default();
        let (admit, admitted) = crossbeam_channel::unbounded::<Admitted>();
        let spawner = {
            let setup = setup.clone();
            std::thread::Builder::new()
                .name(format!("recv-spawn-{port}"))
                .spawn(move || spawn_receivers(&admitted, &setup))
                .map_err(|e| Error::io("start the receiver spawner thread", e))?
        };
        let (s, c) = (stop.clone(), conns.clone());
        let gatekeeper = std::thread::Builder::new()
            .name(format!("gate-{port}"))
            .spawn(move || {
                lower_priority();
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => gatekeeper(listener, s, c, setup, admit).await,
                        Err(e) => tracing::error!(error = %e, "cannot listen for peer connections"),
                    }
                });
            })
            .map_err(|e| Error::io("start the transport's gatekeeper thread", e))?;
        Ok(PeerReceiver { addr, stop, conns, threads: vec![gatekeeper, spawner] })
    }

    /// The bound address.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, closes every connection and waits (bounded) for their threads.
    pub(crate) fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.cancel();
        // The gatekeeper drops every handshake and the listener, then the spawner sees its
        // channel closed.
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let mut open = self.conns.lock();
        for c in open.values() {
            c.close();
        }
        // A receiver thread blocked handing a batch to a full inbox ends once the executors
        // stop; past the bound it is left behind (its socket is closed already).
        let deadline = std::time::Instant::now() + STOP_WAIT;
        while !open.is_empty() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                tracing::warn!(
                    threads = open.len(),
                    "peer receiver threads still running after {STOP_WAIT:?}"
                );
                break;
            }
            open = match self.conns.ended.wait_timeout(open, left) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
    }
}

impl Drop for PeerReceiver {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.shutdown();
        }
    }
}

/// Lowers the calling thread's CPU priority by [`GATEKEEPER_NICE_STEPS`] (Linux: a thread's
/// own nice value). Raising a nice value needs no privilege; failing leaves the thread as it was.
fn lower_priority() {
    let lowered = rustix::process::getpriority_process(None)
        .and_then(|now| rustix::process::setpriority_process(None, (now + GATEKEEPER_NICE_STEPS).min(19)));
    if let Err(e) = lowered {
        tracing::debug!(error = %e, "cannot lower the transport gatekeeper's priority");
    }
}

/// Accepts connections and runs their handshakes until `stop`; hands every authenticated one
/// to `admit`.
async fn gatekeeper(
    listener: tokio::net::TcpListener,
    stop: CancellationToken,
    conns: Arc<Conns>,
    setup: ReceiverSetup,
    admit: crossbeam_channel::Sender<Admitted>,
) {
    let mut backoff = ACCEPT_BACKOFF_MIN;
    let mut next_id = 0u64;
    let mut budget = LogBudget::new(Instant::now());
    let (failed_tx, mut failed) = tokio::sync::mpsc::unbounded_channel::<(String, Error)>();
    let handshakes = tokio_util::task::TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            Some((peer, e)) = failed.recv() => {
                if matches!(e, Error::Handshake { .. }) {
                    setup.stats.handshakes_failed.fetch_add(1, Ordering::Relaxed);
                }
                if let LogVerdict::Write { previous_suppressed } = budget.take(Instant::now()) {
                    if previous_suppressed > 0 {
                        tracing::warn!(
                            count = previous_suppressed,
                            "more peer connections were closed in the last window without a line each \
                             (see squall_worker_transport_handshakes_failed_total)"
                        );
                    }
                    tracing::warn!(%peer, error = %e, "peer connection closed");
                }
                continue;
            }
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok((s, addr)) => (s, addr.to_string()),
            Err(e) => {
                setup.stats.accept_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, retry_in = ?backoff, "cannot accept a peer connection");
                tokio::select! {
                    () = stop.cancelled() => break,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        backoff = ACCEPT_BACKOFF_MIN;
        let id = next_id;
        next_id += 1;
        let cancel = stop.child_token();
        {
            let mut open = conns.lock();
            if open.len() >= setup.max_connections {
                let Some(victim) = eviction_victim(&open).and_then(|v| open.remove(&v)) else {
                    drop(open);
                    setup.stats.connections_refused.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, max = setup.max_connections, "too many authenticated peer connections; closing");
                    continue;
                };
                victim.close();
                setup.stats.connections_evicted.fetch_add(1, Ordering::Relaxed);
            }
            open.insert(id, Conn { handshake: cancel.clone(), stream: None });
            setup.stats.connections.store(open.len() as u64, Ordering::Relaxed);
        }
        let guard = ConnGuard { conns: conns.clone(), id, stats: setup.stats.clone() };
        let (setup, admit, failed_tx, stopping) =
            (setup.clone(), admit.clone(), failed_tx.clone(), stop.clone());
        handshakes.spawn(async move {
            let outcome = tokio::select! {
                () = cancel.cancelled() => {
                    // Evicted to make room: a handshake that did not complete (at a stop,
                    // nothing to count).
                    if !stopping.is_cancelled() {
                        let reason = "evicted before completing its handshake (connection limit)";
                        let _ = failed_tx.send((peer.clone(), Error::Handshake { peer, reason: reason.into() }));
                    }
                    return;
                }
                r = handshake(stream, &setup, &peer) => r,
            };
            let admitted = outcome.and_then(|(stream, tls)| {
                let stream = stream.into_std().map_err(|e| Error::io(format!("take over {peer}"), e))?;
                stream.set_nonblocking(false).map_err(|e| Error::io(format!("take over {peer}"), e))?;
                let handle = stream.try_clone().map_err(|e| Error::io(format!("take over {peer}"), e))?;
                // The TLS session goes with the socket, whatever it holds already decrypted.
                let stream = match tls {
                    Some(session) => PeerStream::server(session, stream),
                    None => PeerStream::plain(stream),
                };
                Ok((stream, handle))
            });
            match admitted {
                Ok((stream, handle)) => {
                    // Evicted meanwhile (its entry is gone): the connection closes here.
                    let registered = match guard.conns.lock().get_mut(&guard.id) {
                        Some(conn) if !cancel.is_cancelled() => {
                            conn.stream = Some(handle);
                            true
                        }
                        _ => false,
                    };
                    if !registered {
                        return;
                    }
                    let _ = admit.send(Admitted { stream, peer, guard });
                }
                Err(e) => {
                    let _ = failed_tx.send((peer, e));
                }
            }
        });
    }
    // Every handshake in progress ends with the listener (their tokens are children of `stop`).
    handshakes.close();
    handshakes.wait().await;
}

/// A new connection's way in, on the gatekeeper: TLS first when the topology asks for it (its
/// key, pinned: see `tls.rs`), then the HMAC handshake (inside TLS), all within
/// [`auth::HANDSHAKE_TIMEOUT`]. Returns the socket, and the TLS session to read it with.
async fn handshake(
    stream: tokio::net::TcpStream,
    setup: &ReceiverSetup,
    peer: &str,
) -> Result<(tokio::net::TcpStream, Option<rustls::ServerConnection>)> {
    let refused = |reason: String| Error::Handshake { peer: peer.to_owned(), reason };
    let exchange = async {
        match &setup.tls {
            None => {
                let mut stream = stream;
                auth::server(&mut stream, &setup.topology_id, &setup.secret, peer).await?;
                Ok((stream, None))
            }
            Some(tls) => {
                let mut stream =
                    tls.acceptor().accept(stream).await.map_err(|e| refused(format!("TLS: {e}")))?;
                auth::server(&mut stream, &setup.topology_id, &setup.secret, peer).await?;
                let (stream, session) = stream.into_inner();
                Ok((stream, Some(session)))
            }
        }
    };
    tokio::time::timeout(auth::HANDSHAKE_TIMEOUT, exchange).await.unwrap_or_else(|_| {
        Err(refused(format!("no complete handshake within {:?}", auth::HANDSHAKE_TIMEOUT)))
    })
}

/// Starts a receiver thread for each admitted connection, until the gatekeeper is gone.
fn spawn_receivers(admitted: &crossbeam_channel::Receiver<Admitted>, setup: &ReceiverSetup) {
    for Admitted { stream, peer, guard } in admitted {
        setup.stats.accepted.fetch_add(1, Ordering::Relaxed);
        let setup = setup.clone();
        let spawned = std::thread::Builder::new().name(format!("recv-{peer}")).spawn(move || {
            let _guard = guard;
            let closer = stream.tcp().try_clone();
            if let Err(e) = receive_loop(stream, &peer, &setup) {
                tracing::warn!(%peer, error = %e, "peer connection closed");
                // The peer must see the close, not write into a socket no one reads.
                if let Ok(c) = closer {
                    let _ = c.shutdown(Shutdown::Both);
                }
            }
        });
        // A thread that did not start dropped its closure, guard and socket included.
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a receiver thread");
        }
    }
}

/// A connection's destinations: one batch per destination inbox, found by task id.
struct Groups {
    groups: Vec<(QueueSender<Batch>, Batch)>,
    group_of_task: Vec<u32>,
    /// Envelopes for tasks this worker does not run (dropped, as a local emit to an unassigned
    /// task is).
    discard: Batch,
}

impl BatchSink for Groups {
    fn batch_for(&mut self, task: TaskId) -> &mut Batch {
        let group = self.group_of_task.get(task.0 as usize).copied().unwrap_or(u32::MAX);
        match self.groups.get_mut(group as usize) {
            Some((_, batch)) => batch,
            None => &mut self.discard,
        }
    }
}

fn receive_loop(stream: PeerStream, peer: &str, setup: &ReceiverSetup) -> Result<()> {
    // An authenticated peer may stay idle as long as it likes (a quiet stream): the socket
    // comes from the gatekeeper in blocking mode with no read timeout.
    let mut r = stream;
    // One batch per destination inbox, and each task's batch by index (tasks are small dense
    // integers), so an envelope goes to its batch as it is decoded.
    let mut groups: Vec<(QueueSender<Batch>, Batch)> = Vec::new();
    let mut group_of_task: Vec<u32> = Vec::new();
    for (task, tx) in setup.dispatch.iter() {
        let group = match groups.iter().position(|(t, _)| t.same_channel(tx)) {
            Some(g) => g,
            None => {
                groups.push((tx.clone(), Vec::new()));
                groups.len() - 1
            }
        };
        let task = task.0 as usize;
        if group_of_task.len() <= task {
            group_of_task.resize(task + 1, u32::MAX);
        }
        group_of_task[task] = u32::try_from(group).unwrap_or(u32::MAX);
    }
    let mut sink = Groups { groups, group_of_task, discard: Vec::new() };
    let mut texts = TextCache::new(CONNECTION_TEXTS);
    while let Some(frame) = read_frame(&mut r, peer, FRAME_LIMIT)? {
        setup.stats.frames_received.fetch_add(1, Ordering::Relaxed);
        let decoded = decode_each(frame, &setup.table, peer, &mut sink, &mut texts);
        sink.discard.clear();
        // A corrupt frame is dropped whole, with the connection (acking replays what it held).
        decoded?;
        for (tx, batch) in &mut sink.groups {
            if !batch.is_empty() {
                let cap = batch.len();
                // Blocks when a bolt's queue is full: backpressure reaches the peer through TCP.
                let _ = tx.send(std::mem::replace(batch, Vec::with_capacity(cap)));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_beyond_the_budget_are_counted_and_summed_up_in_the_next_window() {
        let t0 = Instant::now();
        let mut budget = LogBudget::new(t0);
        for _ in 0..LOG_BUDGET {
            assert_eq!(budget.take(t0), LogVerdict::Write { previous_suppressed: 0 });
        }
        for i in 0..500 {
            assert_eq!(budget.take(t0 + Duration::from_millis(i)), LogVerdict::Suppress);
        }
        // Inside the window still: suppressed.
        assert_eq!(budget.take(t0 + LOG_WINDOW - Duration::from_millis(1)), LogVerdict::Suppress);
        // The next window writes again, naming what the last one left out, once.
        let t1 = t0 + LOG_WINDOW;
        assert_eq!(budget.take(t1), LogVerdict::Write { previous_suppressed: 501 });
        assert_eq!(budget.take(t1), LogVerdict::Write { previous_suppressed: 0 });
    }
}
