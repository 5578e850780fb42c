//! The inter-worker transport: length-delimited, batched frames over TCP, one connection per
//! peer, and a receiver that dispatches by task id.
//!
//! Frame: `u32` big-endian payload length, then the payload. The first frame on a connection
//! is the hello (`SQL1` and the topology id); a receiver drops connections from other
//! topologies (a stale worker on a reused port). Every later frame is a batch: `u32` count,
//! then envelopes:
//!
//! ```text
//! tuple: 0u8, task u32, source task u32, stream index u32, anchors u16 x (root u64, edge u64),
//!        values u16 x (tag u8, value)   tag: 0 null, 1 bool u8, 2 int i64, 3 float f64,
//!                                             4 str u32+bytes, 5 bytes u32+bytes
//! ack:   1u8, task u32, kind u8 (0 init, 1 ack, 2 fail, 3 done), root u64, val u64, extra u32
//!        (init: spout task; done: 1 ok / 0 failed)
//! ```
//! Integers are little-endian inside the payload. Stream indices are the same in every worker
//! because they come from the topology definition alone.
//!
//! Senders are threads: each peer has a bounded queue of batches; its thread coalesces them into
//! frames of up to [`MAX_FRAME_ENVELOPES`]. While a peer does not answer, its batches are held
//! (bounded in envelopes and to `HOLD_MAX`) for when it does, then dropped (acking replays them);
//! the thread reconnects with backoff, so one dead worker does not stall the rest. The wire
//! format lives in `codec.rs`.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use cluster_state::ids::TaskId;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::collector::Batch;
use crate::error::{Error, Result};
use crate::executor::StreamTable;

mod codec;

use codec::{bad, decode_each, encode_envelopes, hello, read_frame, write_frame};
#[cfg(test)]
use codec::{decode_batch, encode_batch};

const MAGIC: &[u8; 4] = b"SQL1";
/// Initial capacity of a sender's frame buffer.
pub const MAX_FRAME_BYTES: usize = 256 * 1024;
/// A sender coalesces queued batches into one frame up to this many envelopes.
pub const MAX_FRAME_ENVELOPES: usize = 4096;
/// Frames above this are refused as corrupt.
const FRAME_LIMIT: usize = 64 * 1024 * 1024;
/// Batches a peer's send queue holds before executors block on it.
const PEER_QUEUE_BATCHES: usize = 1024;
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(50);
/// Batches for a peer that does not answer yet (a worker just assigned, still starting) are
/// held and delivered once it does, so their trees complete instead of waiting for the message
/// timeout (and with them a Kafka partition's drained hand-off). Bounded in envelopes and in
/// time: a peer unreachable for longer is gone, and what it would have received is dropped (its
/// trees fail at once when the assignment moves its tasks, or by timeout).
const HOLD_MAX_ENVELOPES: usize = 16_384;
const HOLD_MAX: Duration = Duration::from_secs(10);

/// Counters of the transport, for metrics and tests.
#[derive(Debug, Default)]
pub struct TransportStats {
    pub frames_sent: AtomicU64,
    pub batches_dropped: AtomicU64,
    pub connects: AtomicU64,
    pub frames_received: AtomicU64,
    /// Peer connections accepted (with a valid hello).
    pub accepted: AtomicU64,
}

/// The connection to one peer worker: a queue and the thread draining it.
#[derive(Debug)]
pub(crate) struct PeerSender {
    pub(crate) tx: Sender<Batch>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl PeerSender {
    /// Starts the thread for the peer at `host:port`.
    pub(crate) fn start(
        host: String,
        port: u16,
        topology_id: String,
        stats: Arc<TransportStats>,
    ) -> Result<Self> {
        let (tx, rx) = crossbeam_channel::bounded(PEER_QUEUE_BATCHES);
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("send-{host}:{port}"))
            .spawn(move || send_loop(&host, port, &topology_id, &rx, &s, &stats))
            .map_err(|e| Error::io("start peer sender thread", e))?;
        Ok(PeerSender { tx, stop, thread: Some(thread) })
    }

    /// Flushes what is queued (if connected) and stops the thread.
    pub(crate) fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for PeerSender {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn connect(host: &str, port: u16) -> std::io::Result<TcpStream> {
    let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs()?.collect();
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, Duration::from_secs(2)) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn send_loop(
    host: &str,
    port: u16,
    topology_id: &str,
    rx: &Receiver<Batch>,
    stop: &AtomicBool,
    stats: &TransportStats,
) {
    // Frames are built whole in `frame`, so the stream is written unbuffered (one copy less).
    let mut conn: Option<TcpStream> = None;
    let mut backoff = RECONNECT_MIN;
    let mut next_attempt = std::time::Instant::now();
    let mut frame: Vec<u8> = Vec::with_capacity(MAX_FRAME_BYTES + 4096);
    let mut held = Held::default();
    // Unreachable since when (a new peer counts from its start).
    let mut unreachable_since = Some(std::time::Instant::now());
    loop {
        if conn.is_none() && std::time::Instant::now() >= next_attempt {
            match connect(host, port).and_then(|mut s| {
                write_frame(&mut s, &hello(topology_id))?;
                Ok(s)
            }) {
                Ok(w) => {
                    tracing::info!(peer = %format!("{host}:{port}"), "connected to peer worker");
                    stats.connects.fetch_add(1, Ordering::Relaxed);
                    conn = Some(w);
                    backoff = RECONNECT_MIN;
                    unreachable_since = None;
                }
                Err(e) => {
                    tracing::debug!(peer = %format!("{host}:{port}"), error = %e, "peer worker unreachable");
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
                        return;
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            },
        };
        let Some(w) = conn.as_mut() else {
            let holding = unreachable_since.is_some_and(|since| since.elapsed() < HOLD_MAX);
            if !(holding && held.push(first)) {
                stats.batches_dropped.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        };
        // Coalesce queued batches into one frame: length, one count, all envelopes. Each batch
        // is encoded as it is taken, and both header fields are patched at the end.
        frame.clear();
        frame.extend_from_slice(&[0; 8]);
        let mut count = first.len();
        encode_envelopes(&first, &mut frame);
        drop(first);
        while count < MAX_FRAME_ENVELOPES {
            // Held batches first, so a peer gets its batches in the order they were sent.
            let Some(more) = held.take_if(true).or_else(|| rx.try_recv().ok()) else { break };
            count += more.len();
            encode_envelopes(&more, &mut frame);
        }
        let len = (frame.len() - 4) as u32;
        frame[..4].copy_from_slice(&len.to_be_bytes());
        frame[4..8].copy_from_slice(&(count as u32).to_le_bytes());
        let ok = w.write_all(&frame);
        match ok {
            Ok(()) => {
                stats.frames_sent.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(peer = %format!("{host}:{port}"), error = %e, "lost connection to peer worker");
                stats.batches_dropped.fetch_add(1, Ordering::Relaxed);
                conn = None;
                next_attempt = std::time::Instant::now();
                unreachable_since = Some(std::time::Instant::now());
            }
        }
        if stop.load(Ordering::Relaxed) && rx.is_empty() {
            return;
        }
    }
}

/// Batches held for a peer that does not answer yet, oldest first, at most
/// [`HOLD_MAX_ENVELOPES`] envelopes.
#[derive(Debug, Default)]
struct Held {
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

/// Accepts peer connections on the worker's port and dispatches received envelopes to the
/// local executors' inboxes.
#[derive(Debug)]
pub(crate) struct PeerReceiver {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    thread: Option<JoinHandle<()>>,
}

/// Where received envelopes go: the inbox of each local task.
pub(crate) type Dispatch = Arc<BTreeMap<TaskId, Sender<Batch>>>;

impl PeerReceiver {
    /// Binds `bind:port` and starts accepting.
    pub(crate) fn start(
        bind: &str,
        port: u16,
        topology_id: String,
        table: Arc<StreamTable>,
        dispatch: Dispatch,
        stats: Arc<TransportStats>,
    ) -> Result<Self> {
        let listener =
            TcpListener::bind((bind, port)).map_err(|e| Error::io(format!("bind {bind}:{port}"), e))?;
        let addr = listener.local_addr().map_err(|e| Error::io("local address", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (s, c) = (stop.clone(), conns.clone());
        let thread = std::thread::Builder::new()
            .name(format!("accept-{port}"))
            .spawn(move || {
                for stream in listener.incoming() {
                    if s.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    if let Ok(clone) = stream.try_clone()
                        && let Ok(mut g) = c.lock()
                    {
                        g.retain(|s| s.peer_addr().is_ok());
                        g.push(clone);
                    }
                    let (t, table, dispatch, stats) =
                        (topology_id.clone(), table.clone(), dispatch.clone(), stats.clone());
                    let peer = stream.peer_addr().map_or_else(|_| "?".to_owned(), |a| a.to_string());
                    let spawned = std::thread::Builder::new().name(format!("recv-{peer}")).spawn(move || {
                        // Closed on an error: the accept loop keeps a handle for shutdown, so
                        // dropping this one alone would leave the peer writing into a dead socket.
                        let closer = stream.try_clone();
                        if let Err(e) = receive_loop(stream, &peer, &t, &table, &dispatch, &stats) {
                            tracing::warn!(%peer, error = %e, "peer connection closed");
                            if let Ok(c) = closer {
                                let _ = c.shutdown(Shutdown::Both);
                            }
                        }
                    });
                    if let Err(e) = spawned {
                        tracing::error!(error = %e, "cannot start a receiver thread");
                    }
                }
            })
            .map_err(|e| Error::io("start accept thread", e))?;
        Ok(PeerReceiver { addr, stop, conns, thread: Some(thread) })
    }

    /// The bound address.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and closes every connection.
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
        if let Ok(g) = self.conns.lock() {
            for s in g.iter() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
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

fn receive_loop(
    stream: TcpStream,
    peer: &str,
    topology_id: &str,
    table: &StreamTable,
    dispatch: &BTreeMap<TaskId, Sender<Batch>>,
    stats: &TransportStats,
) -> Result<()> {
    // Frames are read whole (header, then body) straight from the socket: no buffer copy.
    let mut r = stream;
    let Some(h) = read_frame(&mut r, peer)? else { return Ok(()) };
    if h[..] != hello(topology_id)[..] {
        return Err(bad(peer, "hello from another topology or protocol"));
    }
    stats.accepted.fetch_add(1, Ordering::Relaxed);
    // One batch per destination inbox, and each task's batch by index (tasks are small dense
    // integers), so an envelope goes to its batch as it is decoded.
    let mut groups: Vec<(Sender<Batch>, Batch)> = Vec::new();
    let mut group_of_task: Vec<u32> = Vec::new();
    for (task, tx) in dispatch.iter() {
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
        group_of_task[task] = group as u32;
    }
    while let Some(frame) = read_frame(&mut r, peer)? {
        stats.frames_received.fetch_add(1, Ordering::Relaxed);
        let decoded = decode_each(frame, table, peer, |env| {
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
    use proptest::prelude::*;

    use std::io::Read;

    use bytes::Bytes;

    use crate::acker::AckMsg;
    use crate::collector::{Envelope, Sent};
    use crate::tuple::{Anchor, Value};

    use super::*;
    use crate::builtin::{SplitSentence, WordCount};
    use crate::topology::TopologyBuilder;
    use crate::tuple::Anchors;

    fn table() -> StreamTable {
        let mut b = TopologyBuilder::new("t");
        b.set_spout("s", 1, || crate::builtin::SentenceSpout::new(crate::builtin::SentenceParams::default()));
        b.set_bolt("split", 1, SplitSentence::default).shuffle_grouping("s");
        b.set_bolt("count", 1, WordCount::default).fields_grouping("split", ["word"]);
        StreamTable::new(&b.build().unwrap())
    }

    #[test]
    fn batches_round_trip() {
        let table = table();
        let count = table.metas.iter().find(|m| m.component.as_str() == "count").unwrap().clone();
        let values = [
            vec![Value::from("word"), Value::Int(-7)],
            vec![Value::Null, Value::Bool(true)],
            vec![Value::Float(1.5), Value::Bytes(Bytes::from_static(b"\x00\xff"))],
        ];
        let anchors = [
            Anchors::None,
            Anchors::One(Anchor { root: 1, edge: 2 }),
            Anchors::Many(vec![Anchor { root: 3, edge: 4 }, Anchor { root: 5, edge: 6 }]),
        ];
        let mut batch: Batch = values
            .iter()
            .zip(&anchors)
            .enumerate()
            .map(|(i, (v, a))| Envelope::Tuple {
                task: TaskId(i as u32 + 1),
                tuple: Sent {
                    values: v.iter().cloned().collect(),
                    stream: count.index,
                    source_task: TaskId(9),
                    anchors: a.clone(),
                },
            })
            .collect();
        for msg in [
            AckMsg::Init { root: 1, val: 2, spout_task: TaskId(3) },
            AckMsg::Ack { root: 4, val: 5 },
            AckMsg::Fail { root: 6 },
            AckMsg::Done { root: 7, ok: true },
            AckMsg::Done { root: 8, ok: false },
        ] {
            batch.push(Envelope::Ack { task: TaskId(2), msg });
        }
        let mut buf = Vec::new();
        encode_batch(&batch, &mut buf);
        let back = decode_batch(Bytes::from(buf), &table, "test").unwrap();
        assert_eq!(back.len(), batch.len());
        for (a, b) in batch.iter().zip(&back) {
            match (a, b) {
                (Envelope::Tuple { task: ta, tuple: x }, Envelope::Tuple { task: tb, tuple: y }) => {
                    assert_eq!(ta, tb);
                    assert_eq!(x.values, y.values);
                    assert_eq!(x.stream, y.stream);
                    assert_eq!(x.source_task, y.source_task);
                    assert_eq!(x.anchors, y.anchors);
                }
                (Envelope::Ack { task: ta, msg: x }, Envelope::Ack { task: tb, msg: y }) => {
                    assert_eq!((ta, x), (tb, y));
                }
                _ => panic!("envelope kind changed"),
            }
        }
    }

    #[test]
    fn corrupt_batches_are_errors_naming_the_peer() {
        let table = table();
        let cases: &[(&[u8], &str)] = &[
            (b"", "truncated"),
            (&[1, 0, 0, 0, 7, 0, 0, 0, 0], "unknown envelope tag 7"),
            (&[1, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 99, 0, 0, 0, 0, 0], "unknown stream index 99"),
            (&[0, 0, 0, 0, 1], "trailing bytes"),
        ];
        for (bytes, want) in cases {
            let e = decode_batch(Bytes::copy_from_slice(bytes), &table, "10.0.0.1:6700").unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(want) && msg.contains("10.0.0.1:6700"), "{bytes:?}: {msg}");
        }
    }

    /// A one-word tuple from task 2 for task 3 on `stream`.
    fn word(stream: u32, w: &str) -> Envelope {
        Envelope::Tuple {
            task: TaskId(3),
            tuple: Sent {
                values: [Value::from(w)].into_iter().collect(),
                stream,
                source_task: TaskId(2),
                anchors: Anchors::None,
            },
        }
    }

    #[test]
    fn a_corrupt_frame_delivers_nothing_and_closes_the_connection() {
        let table = Arc::new(table());
        let stream = table.metas.iter().find(|m| m.component.as_str() == "split").unwrap().index;
        let (tx, rx) = crossbeam_channel::unbounded();
        let dispatch: Dispatch = Arc::new([(TaskId(3), tx)].into_iter().collect());
        let receiver = PeerReceiver::start(
            "127.0.0.1",
            0,
            "topo-1-1".into(),
            table,
            dispatch,
            Arc::new(TransportStats::default()),
        )
        .unwrap();
        let mut conn = TcpStream::connect(receiver.local_addr()).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write_frame(&mut conn, &hello("topo-1-1")).unwrap();
        let word = |w: &str| word(stream, w);
        // A good frame arrives as one batch.
        let mut good = Vec::new();
        encode_batch(&[word("a"), word("b")], &mut good);
        write_frame(&mut conn, &good).unwrap();
        let batch = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(batch.len(), 2);
        // Two good envelopes, then an unknown tag: none of the frame is delivered.
        let mut bad = Vec::new();
        encode_batch(&[word("c"), word("d")], &mut bad);
        bad[..4].copy_from_slice(&3u32.to_le_bytes());
        bad.extend_from_slice(&[9, 3, 0, 0, 0]);
        write_frame(&mut conn, &bad).unwrap();
        // The receiver closes the connection: the read ends (EOF or reset), then the inbox is
        // checked with nothing more in flight.
        let mut byte = [0u8; 1];
        match conn.read(&mut byte) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("connection still open after a corrupt frame: {other:?}"),
        }
        assert!(rx.try_recv().is_err(), "part of a corrupt frame was delivered");
        receiver.stop();
    }

    #[test]
    fn batches_for_a_peer_that_starts_late_are_delivered_once_it_listens() {
        // A worker just assigned is still starting when its peers send to it: what they send
        // meanwhile is held, not dropped, so the trees complete instead of timing out.
        let table = Arc::new(table());
        let stream = table.metas.iter().find(|m| m.component.as_str() == "split").unwrap().index;
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let stats = Arc::new(TransportStats::default());
        let sender = PeerSender::start("127.0.0.1".into(), port, "topo-1-1".into(), stats.clone()).unwrap();
        let word = |w: &str| word(stream, w);
        sender.tx.send(vec![word("early")]).unwrap();
        sender.tx.send(vec![word("also early")]).unwrap();
        // The peer is not there: its connection attempts fail until it listens.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while stats.connects.load(Ordering::Relaxed) == 0 && !sender.tx.is_empty() {
            assert!(std::time::Instant::now() < deadline, "the sender never took the batches");
            std::thread::sleep(Duration::from_millis(10));
        }
        let (tx, rx) = crossbeam_channel::unbounded();
        let dispatch: Dispatch = Arc::new([(TaskId(3), tx)].into_iter().collect());
        let receiver =
            PeerReceiver::start("127.0.0.1", port, "topo-1-1".into(), table, dispatch, stats.clone())
                .unwrap();
        let mut words = Vec::new();
        while words.len() < 2 {
            let batch = rx.recv_timeout(Duration::from_secs(10)).expect("held batches delivered");
            for e in batch {
                if let Envelope::Tuple { tuple, .. } = e {
                    words.push(tuple.values[0].as_str().unwrap_or_default().to_owned());
                }
            }
        }
        assert_eq!(words, ["early", "also early"], "delivered in order");
        assert_eq!(stats.batches_dropped.load(Ordering::Relaxed), 0);
        sender.stop();
        receiver.stop();
    }

    proptest! {
        /// Garbage from the network never panics the decoder.
        #[test]
        fn decoding_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let table = table();
            let _ = decode_batch(Bytes::from(bytes), &table, "peer");
        }
    }
}
