//! The sending side: one thread per peer worker, draining a bounded queue of batches into
//! frames (see the module doc of `transport`).

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::RecvTimeoutError;

use crate::queue::{QueueReceiver, QueueSender};

use super::auth::{self, TopologySecret};
use super::codec::{FrameBuf, PushError};
use super::tls::{PeerStream, TransportTls};
use super::{
    FRAME_LIMIT, FRAME_TARGET_BYTES, HOLD_MAX, HOLD_MAX_ENVELOPES, MAX_FRAME_ENVELOPES, PEER_QUEUE_BATCHES,
    TransportStats, WRITE_TIMEOUT,
};
use crate::collector::Batch;
use crate::error::{Error, Result};

const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(50);

/// The connection to one peer worker: a queue and the thread draining it.
#[derive(Debug)]
pub(crate) struct PeerSender {
    pub(crate) tx: QueueSender<Batch>,
    stop: Arc<AtomicBool>,
    /// The thread's current connection, so a stop can unblock a write into a peer that reads
    /// nothing.
    conn: Arc<Mutex<Option<TcpStream>>>,
    thread: Option<JoinHandle<()>>,
}

/// Who to send to and as whom.
#[derive(Debug, Clone)]
pub(crate) struct PeerAddr {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) topology_id: String,
    pub(crate) secret: TopologySecret,
    /// TLS with the topology's key (`topology.transport.tls`), or plain TCP.
    pub(crate) tls: Option<TransportTls>,
}

impl PeerSender {
    /// Starts the thread for the peer at `to`.
    pub(crate) fn start(to: PeerAddr, stats: Arc<TransportStats>) -> Result<Self> {
        let (tx, rx) = crate::queue::bounded(PEER_QUEUE_BATCHES);
        let stop = Arc::new(AtomicBool::new(false));
        let conn: Arc<Mutex<Option<TcpStream>>> = Arc::default();
        let (s, c) = (stop.clone(), conn.clone());
        let thread = std::thread::Builder::new()
            .name(format!("send-{}:{}", to.host, to.port))
            .spawn(move || send_loop(&to, &rx, &s, &c, &stats))
            .map_err(|e| Error::io("start peer sender thread", e))?;
        Ok(PeerSender { tx, stop, conn, thread: Some(thread) })
    }

    /// Asks the thread to flush what is queued (if connected) and end. Does not wait.
    pub(crate) fn signal_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Whether the thread has ended.
    pub(crate) fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Closes the connection: a write blocked on a peer that reads nothing fails at once, and
    /// the thread (stop signalled) ends.
    pub(crate) fn force_close(&self) {
        self.signal_stop();
        if let Ok(g) = self.conn.lock()
            && let Some(s) = g.as_ref()
        {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Stops the thread, waiting at most `bound` for it to flush; past that its connection is
    /// closed and it is left to end on its own. Says whether it ended in time.
    pub(crate) fn stop_within(mut self, bound: Duration) -> bool {
        self.signal_stop();
        let deadline = std::time::Instant::now() + bound;
        while !self.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if !self.is_finished() {
            self.force_close();
            return false;
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        true
    }
}

impl Drop for PeerSender {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn connect(to: &PeerAddr, peer: &str) -> Result<PeerStream> {
    let io = |e| Error::io(format!("connect to {peer}"), e);
    let addrs: Vec<SocketAddr> = (to.host.as_str(), to.port).to_socket_addrs().map_err(io)?.collect();
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, Duration::from_secs(2)) {
            Ok(s) => {
                s.set_nodelay(true).map_err(io)?;
                let mut s = open(s, &to.topology_id, &to.secret, to.tls.as_ref(), peer)?;
                // A peer that takes none of our bytes for this long is treated as gone.
                s.tcp().set_write_timeout(Some(WRITE_TIMEOUT)).map_err(io)?;
                s.tcp().set_read_timeout(None).map_err(io)?;
                s.flush().map_err(io)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(io(last))
}

/// The sender's side of a new connection: TLS when configured, then the handshake, both
/// within [`auth::HANDSHAKE_TIMEOUT`].
pub(super) fn open(
    tcp: TcpStream,
    topology_id: &str,
    secret: &TopologySecret,
    tls: Option<&TransportTls>,
    peer: &str,
) -> Result<PeerStream> {
    let deadline = std::time::Instant::now() + auth::HANDSHAKE_TIMEOUT;
    let mut s = match tls {
        Some(tls) => super::tls::connect(tcp, tls, deadline, peer)?,
        None => PeerStream::plain(tcp),
    };
    auth::client(&mut s, topology_id, secret, peer, deadline)?;
    Ok(s)
}

fn send_loop(
    to: &PeerAddr,
    rx: &QueueReceiver<Batch>,
    stop: &AtomicBool,
    shared: &Mutex<Option<TcpStream>>,
    stats: &TransportStats,
) {
    let peer = format!("{}:{}", to.host, to.port);
    // Frames are built whole in `frame`, so the stream is written unbuffered (one copy less).
    let mut conn: Option<PeerStream> = None;
    let mut backoff = RECONNECT_MIN;
    let mut next_attempt = std::time::Instant::now();
    let mut frame = FrameBuf::new(MAX_FRAME_ENVELOPES, FRAME_TARGET_BYTES, FRAME_LIMIT);
    let mut held = Held::default();
    // Unreachable since when (a new peer counts from its start).
    let mut unreachable_since = Some(std::time::Instant::now());
    let set_shared = |s: Option<&PeerStream>| {
        if let Ok(mut g) = shared.lock() {
            *g = s.and_then(|s| s.tcp().try_clone().ok());
        }
    };
    loop {
        if conn.is_none() && !stop.load(Ordering::Relaxed) && std::time::Instant::now() >= next_attempt {
            match connect(to, &peer) {
                Ok(w) => {
                    tracing::info!(%peer, "connected to peer worker");
                    stats.connects.fetch_add(1, Ordering::Relaxed);
                    set_shared(Some(&w));
                    conn = Some(w);
                    backoff = RECONNECT_MIN;
                    unreachable_since = None;
                }
                Err(e) => {
                    if matches!(e, Error::Handshake { .. }) {
                        tracing::warn!(%peer, error = %e, "peer worker refused");
                    } else {
                        tracing::debug!(%peer, error = %e, "peer worker unreachable");
                    }
                    next_attempt = std::time::Instant::now() + backoff;
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                }
            }
        }
        if unreachable_since.is_some_and(|since| since.elapsed() >= HOLD_MAX) {
            let dropped = held.clear();
            stats.batches_dropped.fetch_add(dropped, Ordering::Relaxed);
        }
        let first = match held.take_if(conn.is_some()) {
            Some(b) => b,
            None => match rx.recv_timeout(POLL) {
                Ok(b) => b,
                Err(RecvTimeoutError::Timeout) => {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => break,
            },
        };
        let Some(w) = conn.as_mut() else {
            let holding = unreachable_since.is_some_and(|since| since.elapsed() < HOLD_MAX);
            if !(holding && held.push(first)) {
                stats.batches_dropped.fetch_add(1, Ordering::Relaxed);
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            continue;
        };
        match send_batches(first, &mut held, rx, &mut frame, w, stats) {
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(%peer, error = %e, "lost connection to peer worker");
                stats.batches_dropped.fetch_add(1, Ordering::Relaxed);
                conn = None;
                set_shared(None);
                next_attempt = std::time::Instant::now();
                unreachable_since = Some(std::time::Instant::now());
            }
        }
        if stop.load(Ordering::Relaxed) && (rx.is_empty() || conn.is_none()) {
            break;
        }
    }
    if let Some(c) = conn.as_mut() {
        c.close();
    }
    set_shared(None);
}

/// Writes `first` and whatever is queued behind it (held batches first, so a peer gets its
/// batches in the order they were sent), coalesced into frames until one has been written.
fn send_batches(
    first: Batch,
    held: &mut Held,
    rx: &QueueReceiver<Batch>,
    frame: &mut FrameBuf,
    w: &mut PeerStream,
    stats: &TransportStats,
) -> std::io::Result<()> {
    let written = std::cell::Cell::new(0u64);
    let mut write = |bytes: &[u8]| {
        w.write_all(bytes)?;
        written.set(written.get() + 1);
        Ok(())
    };
    let mut batch = Some(first);
    while let Some(b) = batch.take() {
        for env in &b {
            match frame.push(env, &mut write) {
                Ok(()) => {}
                Err(PushError::Envelope(e)) => {
                    stats.envelopes_unsendable.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(error = %e, "envelope dropped");
                }
                Err(PushError::Io(e)) => return Err(e),
            }
        }
        drop(b);
        if written.get() == 0 {
            batch = held.take_if(true).or_else(|| rx.try_recv().ok());
        }
    }
    frame.flush(&mut write)?;
    // A TLS session holds what was written until flushed (plain TCP: nothing to do).
    w.flush()?;
    stats.frames_sent.fetch_add(written.get(), Ordering::Relaxed);
    Ok(())
}

/// Batches held for a peer that does not answer yet, oldest first, at most
/// [`HOLD_MAX_ENVELOPES`] envelopes.
#[derive(Debug, Default)]
pub(super) struct Held {
    batches: std::collections::VecDeque<Batch>,
    envelopes: usize,
}

impl Held {
    /// Holds `batch` if there is room; says whether it did.
    fn push(&mut self, batch: Batch) -> bool {
        if self.envelopes + batch.len() > HOLD_MAX_ENVELOPES {
            return false;
        }
        self.envelopes += batch.len();
        self.batches.push_back(batch);
        true
    }

    /// The oldest held batch, when `connected`.
    fn take_if(&mut self, connected: bool) -> Option<Batch> {
        if !connected {
            return None;
        }
        let batch = self.batches.pop_front()?;
        self.envelopes -= batch.len();
        Some(batch)
    }

    /// Drops everything held; returns how many batches.
    fn clear(&mut self) -> u64 {
        self.envelopes = 0;
        std::mem::take(&mut self.batches).len() as u64
    }
}
