//! The receiving side: an accept loop on the worker's port, a thread per peer connection
//! (bounded in number), each dispatching received envelopes to the local executors' inboxes.

use std::collections::{BTreeMap, HashMap};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cluster_state::ids::TaskId;
use crossbeam_channel::Sender;

use super::auth::{self, TopologySecret};
use super::codec::{decode_each, read_frame};
use super::tls::{PeerStream, TransportTls};
use super::{FRAME_LIMIT, TransportStats};
use crate::collector::Batch;
use crate::error::{Error, Result};
use crate::executor::StreamTable;

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
pub(crate) type Dispatch = Arc<BTreeMap<TaskId, Sender<Batch>>>;

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

/// An open connection: a handle for shutdown, and whether its peer has authenticated.
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    authenticated: Arc<AtomicBool>,
}

/// The open connections keyed by a connection number (increasing: the smallest is the
/// oldest); an entry lives as long as its receiver thread (removed by [`ConnGuard`]), or until
/// it is evicted to make room (its socket is shut down, so its thread ends at once).
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
    open.iter().filter(|(_, c)| !c.authenticated.load(Ordering::Relaxed)).map(|(id, _)| *id).min()
}

/// Removes its connection from the table when its receiver thread ends, however it ends.
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

/// Accepts peer connections on the worker's port and dispatches received envelopes to the
/// local executors' inboxes.
#[derive(Debug)]
pub(crate) struct PeerReceiver {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    conns: Arc<Conns>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How long a stop waits for the receiver threads once their sockets are closed.
const STOP_WAIT: Duration = Duration::from_secs(5);

impl PeerReceiver {
    /// Binds `bind:port` and starts accepting.
    pub(crate) fn start(bind: &str, port: u16, setup: ReceiverSetup) -> Result<Self> {
        let listener =
            TcpListener::bind((bind, port)).map_err(|e| Error::io(format!("bind {bind}:{port}"), e))?;
        let addr = listener.local_addr().map_err(|e| Error::io("local address", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Conns> = Arc::default();
        let (s, c) = (stop.clone(), conns.clone());
        let thread = std::thread::Builder::new()
            .name(format!("accept-{port}"))
            .spawn(move || accept_loop(&listener, &s, &c, &setup))
            .map_err(|e| Error::io("start accept thread", e))?;
        Ok(PeerReceiver { addr, stop, conns, thread: Some(thread) })
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
        self.stop.store(true, Ordering::Relaxed);
        // Wake the blocking accept with a connection of our own.
        let wake = if self.addr.ip().is_unspecified() {
            SocketAddr::from(([127, 0, 0, 1], self.addr.port()))
        } else {
            self.addr
        };
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let mut open = self.conns.lock();
        for c in open.values() {
            let _ = c.stream.shutdown(Shutdown::Both);
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
        if self.thread.is_some() {
            self.shutdown();
        }
    }
}

fn accept_loop(listener: &TcpListener, stop: &AtomicBool, conns: &Arc<Conns>, setup: &ReceiverSetup) {
    let mut backoff = ACCEPT_BACKOFF_MIN;
    let mut next_id = 0u64;
    let budget = Arc::new(Mutex::new(LogBudget::new(Instant::now())));
    for stream in listener.incoming() {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                setup.stats.accept_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, retry_in = ?backoff, "cannot accept a peer connection");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        backoff = ACCEPT_BACKOFF_MIN;
        let peer = stream.peer_addr().map_or_else(|_| "?".to_owned(), |a| a.to_string());
        let id = next_id;
        next_id += 1;
        let authenticated = Arc::new(AtomicBool::new(false));
        {
            let mut open = conns.lock();
            if open.len() >= setup.max_connections {
                let Some(victim) = eviction_victim(&open).and_then(|v| open.remove(&v)) else {
                    drop(open);
                    setup.stats.connections_refused.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(%peer, max = setup.max_connections, "too many authenticated peer connections; closing");
                    let _ = stream.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = victim.stream.shutdown(Shutdown::Both);
                setup.stats.connections_evicted.fetch_add(1, Ordering::Relaxed);
            }
            match stream.try_clone() {
                Ok(handle) => {
                    open.insert(id, Conn { stream: handle, authenticated: authenticated.clone() });
                    setup.stats.connections.store(open.len() as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "cannot keep a handle on a peer connection; closing");
                    continue;
                }
            }
        }
        let guard = ConnGuard { conns: conns.clone(), id, stats: setup.stats.clone() };
        let setup = setup.clone();
        let budget = budget.clone();
        let spawned = std::thread::Builder::new().name(format!("recv-{peer}")).spawn(move || {
            let _guard = guard;
            let closer = stream.try_clone();
            if let Err(e) = receive_loop(stream, &peer, &setup, &authenticated) {
                if matches!(e, Error::Handshake { .. }) {
                    setup.stats.handshakes_failed.fetch_add(1, Ordering::Relaxed);
                }
                let verdict =
                    budget.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take(Instant::now());
                if let LogVerdict::Write { previous_suppressed } = verdict {
                    if previous_suppressed > 0 {
                        tracing::warn!(
                            count = previous_suppressed,
                            "more peer connections were closed in the last window without a line each \
                             (see squall_worker_transport_handshakes_failed_total)"
                        );
                    }
                    tracing::warn!(%peer, error = %e, "peer connection closed");
                }
                // The peer must see the close, not write into a socket no one reads.
                if let Ok(c) = closer {
                    let _ = c.shutdown(Shutdown::Both);
                }
            }
        });
        // A thread that did not start dropped its closure, guard included: the entry is gone.
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a receiver thread");
        }
    }
}

fn receive_loop(
    stream: TcpStream,
    peer: &str,
    setup: &ReceiverSetup,
    authenticated: &AtomicBool,
) -> Result<()> {
    // One deadline for TLS and the handshake inside it.
    let deadline = Instant::now() + auth::HANDSHAKE_TIMEOUT;
    let mut r = match &setup.tls {
        Some(tls) => super::tls::accept(stream, tls, deadline, peer)?,
        None => PeerStream::plain(stream),
    };
    auth::server(&mut r, &setup.topology_id, &setup.secret, peer, deadline)?;
    authenticated.store(true, Ordering::Relaxed);
    // An authenticated peer may stay idle as long as it likes (a quiet stream).
    r.tcp().set_read_timeout(None).map_err(|e| Error::io(format!("read from {peer}"), e))?;
    setup.stats.accepted.fetch_add(1, Ordering::Relaxed);
    // One batch per destination inbox, and each task's batch by index (tasks are small dense
    // integers), so an envelope goes to its batch as it is decoded.
    let mut groups: Vec<(Sender<Batch>, Batch)> = Vec::new();
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
    while let Some(frame) = read_frame(&mut r, peer, FRAME_LIMIT)? {
        setup.stats.frames_received.fetch_add(1, Ordering::Relaxed);
        let decoded = decode_each(frame, &setup.table, peer, |env| {
            let group = group_of_task.get(env.task().0 as usize).copied().unwrap_or(u32::MAX);
            if let Some((_, batch)) = groups.get_mut(group as usize) {
                batch.push(env);
            }
        });
        // A corrupt frame is dropped whole, with the connection (acking replays what it held).
        decoded?;
        for (tx, batch) in &mut groups {
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
