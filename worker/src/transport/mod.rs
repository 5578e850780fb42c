//! The inter-worker transport: length-delimited, batched frames over TCP, one connection per
//! peer, authenticated with the topology's secret, and a receiver that dispatches by task id.
//! With `topology.transport.tls` every connection is mutual TLS 1.3 first, pinned to the
//! topology's key (`tls.rs`), and everything below runs inside it.
//!
//! Frame: `u32` big-endian payload length, then the payload. A connection opens with a
//! handshake (`auth.rs`): the sender's hello (`SQL2`, a nonce, the topology id), then each side
//! proves it holds the topology's secret over the other's nonce (HMAC-SHA256); a connection
//! that fails it, or has not completed it within `auth::HANDSHAKE_TIMEOUT` (5 s),
//! is closed and counted. Every later frame is a batch: `u32` count, then envelopes:
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
//! frames of up to [`MAX_FRAME_ENVELOPES`] envelopes or [`FRAME_TARGET_BYTES`], never over
//! [`FRAME_LIMIT`] (a larger batch is split between envelopes; an envelope larger than that
//! alone is dropped and counted). While a peer does not answer, its batches are held (bounded
//! in envelopes and to `HOLD_MAX`) for when it does, then dropped (acking replays them); the
//! thread reconnects with backoff, so one dead worker does not stall the rest.
//!
//! The receiver accepts at most a configured number of connections at once (a worker has few
//! peers; at the limit the oldest one still in its handshake is evicted, and only when all are
//! authenticated is a new one closed), runs every handshake on one low-priority gatekeeper
//! thread, reads each authenticated connection with a thread of its own whose buffer grows
//! only as bytes arrive, and forgets a connection when its thread ends.
//!
//! Layout: `codec.rs` (the wire format, `FrameBuf`), `auth.rs` (secret and
//! handshake), `tls.rs` ([`TransportTls`], [`PeerStream`]), `send.rs` (`PeerSender`),
//! `receive.rs` (`PeerReceiver`).

use std::sync::atomic::AtomicU64;
use std::time::Duration;

mod auth;
mod codec;
mod receive;
mod send;
mod tls;

pub use auth::{SECRET_BYTES, TopologySecret};
#[cfg(test)]
use receive::Dispatch;
pub(crate) use receive::{PeerReceiver, ReceiverSetup};
pub(crate) use send::{PeerAddr, PeerSender};
pub use tls::{PeerStream, TransportTls};

/// A sender writes a frame once it holds this many bytes of payload (or
/// [`MAX_FRAME_ENVELOPES`] envelopes, or the queue is empty).
pub const FRAME_TARGET_BYTES: usize = 1024 * 1024;
/// A sender coalesces queued batches into one frame up to this many envelopes.
pub const MAX_FRAME_ENVELOPES: usize = 4096;
/// The largest frame payload: a receiver refuses larger frames as corrupt, and a sender never
/// writes one (an envelope larger than this alone cannot be sent).
pub const FRAME_LIMIT: usize = 64 * 1024 * 1024;
/// Batches a peer's send queue holds before executors block on it.
const PEER_QUEUE_BATCHES: usize = 1024;
/// A peer that takes none of our bytes for this long is treated as gone (the connection is
/// dropped, then re-established): by then every tuple of the frame has timed out under Storm's
/// default `topology.message.timeout.secs` (30).
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Batches for a peer that does not answer yet (a worker just assigned, still starting) are
/// held and delivered once it does, so their trees complete instead of waiting for the message
/// timeout (and with them a Kafka partition's drained hand-off). Bounded in envelopes and in
/// time: a peer unreachable for longer is gone, and what it would have received is dropped (its
/// trees fail at once when the assignment moves its tasks, or by timeout).
const HOLD_MAX_ENVELOPES: usize = 16_384;
const HOLD_MAX: Duration = Duration::from_secs(10);
/// Peer connections a worker keeps open at once by default (`WorkerConfig::max_peer_connections`):
/// a worker has one connection from each peer worker of its topology.
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// Opens a connection to a worker's port as its peer would: the handshake as `topology_id`
/// with `secret`, over plain TCP. For tools and tests (the soak benchmark, a probe); workers
/// connect through their senders.
pub fn connect_as_peer(
    addr: std::net::SocketAddr,
    topology_id: &str,
    secret: &TopologySecret,
) -> crate::Result<std::net::TcpStream> {
    let peer = addr.to_string();
    let mut s = std::net::TcpStream::connect_timeout(&addr, auth::HANDSHAKE_TIMEOUT)
        .map_err(|e| crate::Error::io(format!("connect to {peer}"), e))?;
    auth::client(&mut s, topology_id, secret, &peer, std::time::Instant::now() + auth::HANDSHAKE_TIMEOUT)?;
    Ok(s)
}

/// [`connect_as_peer`] over TLS with the key `tls` (a topology's, see [`TransportTls`]), as
/// the worker of a topology with `topology.transport.tls` connects.
pub fn connect_as_tls_peer(
    addr: std::net::SocketAddr,
    topology_id: &str,
    secret: &TopologySecret,
    tls: &TransportTls,
) -> crate::Result<PeerStream> {
    let peer = addr.to_string();
    let s = std::net::TcpStream::connect_timeout(&addr, auth::HANDSHAKE_TIMEOUT)
        .map_err(|e| crate::Error::io(format!("connect to {peer}"), e))?;
    send::open(s, topology_id, secret, Some(tls), &peer)
}

/// Counters of the transport, for metrics and tests.
#[derive(Debug, Default)]
pub struct TransportStats {
    pub frames_sent: AtomicU64,
    pub batches_dropped: AtomicU64,
    /// Envelopes dropped because they cannot be sent (larger than a frame may be, or a count
    /// beyond its field).
    pub envelopes_unsendable: AtomicU64,
    pub connects: AtomicU64,
    pub frames_received: AtomicU64,
    /// Peer connections accepted (that completed the handshake).
    pub accepted: AtomicU64,
    /// Inbound connections closed for failing the handshake (wrong protocol, topology or
    /// secret, or not done within the deadline).
    pub handshakes_failed: AtomicU64,
    /// Inbound connections closed at once because the limit was reached with every
    /// connection authenticated.
    pub connections_refused: AtomicU64,
    /// Inbound connections still in their handshake closed to make room for a new one at the
    /// limit (the oldest first).
    pub connections_evicted: AtomicU64,
    /// Failed accepts (out of descriptors, say).
    pub accept_errors: AtomicU64,
    /// Inbound connections open now (a gauge).
    pub connections: AtomicU64,
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use std::io::Read;

    use bytes::Bytes;

    use crate::acker::AckMsg;
    use crate::collector::{Batch, Envelope, Sent};
    use crate::tuple::{Anchor, Value};

    use std::net::TcpStream;
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use crate::queue::QueueReceiver as Receiver;
    use cluster_state::ids::TaskId;

    use super::codec::{decode_batch, encode_batch, write_frame};
    use super::tls::TransportTls;
    use super::*;
    use crate::builtin::{SplitSentence, WordCount};
    use crate::executor::StreamTable;
    use crate::topology::TopologyBuilder;
    use crate::tuple::Anchors;

    fn table() -> StreamTable {
        let mut b = TopologyBuilder::new("t");
        b.set_spout("s", 1, || crate::builtin::SentenceSpout::new(crate::builtin::SentenceParams::default()));
        b.set_bolt("split", 1, SplitSentence::default).shuffle_grouping("s");
        b.set_bolt("count", 1, WordCount::default).fields_grouping("split", ["word"]);
        StreamTable::new(&b.build().unwrap())
    }

    /// One secret for every test of this module: senders and receivers of a test agree.
    fn secret() -> TopologySecret {
        static SECRET: std::sync::OnceLock<TopologySecret> = std::sync::OnceLock::new();
        SECRET.get_or_init(TopologySecret::generate).clone()
    }

    fn peer(port: u16) -> PeerAddr {
        PeerAddr {
            host: "127.0.0.1".into(),
            port,
            topology_id: "topo-1-1".into(),
            secret: secret(),
            tls: None,
        }
    }

    fn receiver(
        port: u16,
        table: Arc<StreamTable>,
        dispatch: Dispatch,
        stats: &Arc<TransportStats>,
        secret: &TopologySecret,
        tls: Option<TransportTls>,
    ) -> PeerReceiver {
        let setup = ReceiverSetup {
            topology_id: "topo-1-1".into(),
            secret: secret.clone(),
            tls,
            table,
            dispatch,
            stats: stats.clone(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
        };
        PeerReceiver::start("127.0.0.1", port, setup).unwrap()
    }

    /// A receiver for topo-1-1 delivering task 3's batches to an inbox of `capacity` (or
    /// unbounded), with its stats, inbox and split's stream index.
    fn listening(capacity: Option<usize>) -> (PeerReceiver, Arc<TransportStats>, Receiver<Batch>, u32) {
        listening_with(capacity, None)
    }

    /// [`listening`], over TLS with `tls` when given.
    fn listening_with(
        capacity: Option<usize>,
        tls: Option<TransportTls>,
    ) -> (PeerReceiver, Arc<TransportStats>, Receiver<Batch>, u32) {
        let table = Arc::new(table());
        let stream = split_stream(&table);
        let (tx, rx) = capacity.map_or_else(crate::queue::unbounded, crate::queue::bounded);
        let dispatch: Dispatch = Arc::new([(TaskId(3), tx)].into_iter().collect());
        let stats = Arc::new(TransportStats::default());
        (receiver(0, table, dispatch, &stats, &secret(), tls), stats, rx, stream)
    }

    /// A raw connection that completed the handshake with `secret`.
    fn connected(addr: std::net::SocketAddr, secret: &TopologySecret) -> TcpStream {
        let mut conn = TcpStream::connect(addr).unwrap();
        let deadline = std::time::Instant::now() + auth::HANDSHAKE_TIMEOUT;
        auth::client(&mut conn, "topo-1-1", secret, "test", deadline).unwrap();
        conn
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
            Anchors::Many(Box::new(vec![Anchor { root: 3, edge: 4 }, Anchor { root: 5, edge: 6 }])),
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
        encode_batch(&batch, &mut buf).unwrap();
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
        let (tx, rx) = crate::queue::unbounded();
        let dispatch: Dispatch = Arc::new([(TaskId(3), tx)].into_iter().collect());
        let receiver = receiver(0, table, dispatch, &Arc::default(), &secret(), None);
        let mut conn = connected(receiver.local_addr(), &secret());
        conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let word = |w: &str| word(stream, w);
        // A good frame arrives as one batch.
        let mut good = Vec::new();
        encode_batch(&[word("a"), word("b")], &mut good).unwrap();
        write_frame(&mut conn, &good).unwrap();
        let batch = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(batch.len(), 2);
        // Two good envelopes, then an unknown tag: none of the frame is delivered.
        let mut bad = Vec::new();
        encode_batch(&[word("c"), word("d")], &mut bad).unwrap();
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
        let sender = PeerSender::start(peer(port), stats.clone()).unwrap();
        let word = |w: &str| word(stream, w);
        sender.tx.send(vec![word("early")]).unwrap();
        sender.tx.send(vec![word("also early")]).unwrap();
        // The peer is not there: its connection attempts fail until it listens.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while stats.connects.load(Ordering::Relaxed) == 0 && !sender.tx.is_empty() {
            assert!(std::time::Instant::now() < deadline, "the sender never took the batches");
            std::thread::sleep(Duration::from_millis(10));
        }
        let (tx, rx) = crate::queue::unbounded();
        let dispatch: Dispatch = Arc::new([(TaskId(3), tx)].into_iter().collect());
        let receiver = receiver(port, table, dispatch, &stats, &secret(), None);
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
        assert!(sender.stop_within(Duration::from_secs(10)));
        receiver.stop();
    }

    /// A tuple for task 3 carrying `len` bytes, tagged with `n` (its first bytes).
    fn blob(stream: u32, n: u32, len: usize) -> Envelope {
        let mut bytes = vec![0u8; len.max(4)];
        bytes[..4].copy_from_slice(&n.to_le_bytes());
        Envelope::Tuple {
            task: TaskId(3),
            tuple: Sent {
                values: [Value::Bytes(Bytes::from(bytes))].into_iter().collect(),
                stream,
                source_task: TaskId(2),
                anchors: Anchors::None,
            },
        }
    }

    fn tag_of(env: &Envelope) -> u32 {
        match env {
            Envelope::Tuple { tuple, .. } => match &tuple.values[0] {
                Value::Bytes(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                _ => u32::MAX,
            },
            Envelope::Ack { .. } => u32::MAX,
        }
    }

    /// The stream index of split's output (one field, as `blob` and `word` fill it).
    fn split_stream(table: &StreamTable) -> u32 {
        table.metas.iter().find(|m| m.component.as_str() == "split").unwrap().index
    }

    #[test]
    fn frames_are_cut_by_bytes_below_the_limit_and_an_oversized_envelope_alone_is_refused() {
        let table = table();
        let stream = split_stream(&table);
        const LIMIT: usize = 256 * 1024;
        let mut frames: Vec<Vec<u8>> = Vec::new();
        let mut write = |f: &[u8]| {
            frames.push(f.to_vec());
            Ok(())
        };
        let mut frame = codec::FrameBuf::new(MAX_FRAME_ENVELOPES, 64 * 1024, LIMIT);
        // 40 KiB tuples: a batch of 100 is 4 MB, far over the limit; one of 300 KiB cannot go.
        for n in 0..100 {
            frame.push(&blob(stream, n, 40 * 1024), &mut write).unwrap();
            if n == 50 {
                match frame.push(&blob(stream, 999, 300 * 1024), &mut write) {
                    Err(codec::PushError::Envelope(e)) => {
                        assert!(e.to_string().contains("over the frame limit"), "{e}");
                    }
                    other => panic!("oversized envelope accepted: {other:?}"),
                }
            }
        }
        frame.flush(&mut write).unwrap();
        let mut tags = Vec::new();
        for f in &frames {
            let len = u32::from_be_bytes([f[0], f[1], f[2], f[3]]) as usize;
            assert_eq!(len, f.len() - 4);
            assert!(len <= LIMIT, "a frame of {len} bytes");
            let batch = decode_batch(Bytes::copy_from_slice(&f[4..]), &table, "test").unwrap();
            tags.extend(batch.iter().map(tag_of));
        }
        assert!(frames.len() > 1);
        assert_eq!(tags, (0..100).collect::<Vec<_>>(), "every envelope, in order, and only those");
    }

    #[test]
    fn counts_beyond_their_fields_are_errors_not_truncations() {
        let table = table();
        let stream = split_stream(&table);
        let many = Envelope::Tuple {
            task: TaskId(3),
            tuple: Sent {
                values: (0..70_000).map(|_| Value::Null).collect(),
                stream,
                source_task: TaskId(2),
                anchors: Anchors::None,
            },
        };
        let e = encode_batch(&[many], &mut Vec::new()).unwrap_err().to_string();
        assert!(e.contains("task 3") && e.contains("70000 values"), "{e}");
        let anchors = Envelope::Tuple {
            task: TaskId(3),
            tuple: Sent {
                values: [Value::Null].into_iter().collect(),
                stream,
                source_task: TaskId(2),
                anchors: Anchors::Many(Box::new((0..70_000).map(|i| Anchor { root: i, edge: i }).collect())),
            },
        };
        let e = encode_batch(&[anchors], &mut Vec::new()).unwrap_err().to_string();
        assert!(e.contains("70000 anchors"), "{e}");
    }

    #[test]
    fn megabyte_tuples_cross_between_workers_in_frames_under_the_limit() {
        // Kafka messages up to 1 MB are normal: a batch of them is larger than a frame may be
        // (80 MiB here), and once went as one frame that the receiver refused, forever.
        let (receiver, stats, rx, stream) = listening(None);
        let sender = PeerSender::start(peer(receiver.local_addr().port()), stats.clone()).unwrap();
        let mut batch: Batch = (0..80).map(|n| blob(stream, n, 1024 * 1024)).collect();
        // One envelope larger than any frame: dropped and counted, the rest still arrive.
        batch.insert(40, blob(stream, 999, FRAME_LIMIT + 1));
        sender.tx.send(batch).unwrap();
        let mut tags = Vec::new();
        while tags.len() < 80 {
            let got = rx.recv_timeout(Duration::from_secs(30)).expect("megabyte tuples delivered");
            tags.extend(got.iter().map(tag_of));
        }
        assert_eq!(tags, (0..80).collect::<Vec<_>>());
        assert_eq!(stats.envelopes_unsendable.load(Ordering::Relaxed), 1);
        assert_eq!(stats.connects.load(Ordering::Relaxed), 1, "the connection survived");
        assert!(stats.frames_received.load(Ordering::Relaxed) > 1);
        assert!(sender.stop_within(Duration::from_secs(10)));
        receiver.stop();
    }

    fn poll_until(what: &str, done: impl FnMut() -> bool) {
        test_harness::wait_for(Duration::from_secs(20), what, done);
    }

    #[test]
    fn a_peer_without_the_secret_is_refused_and_counted() {
        let (receiver, stats, rx, stream) = listening(None);
        let addr = receiver.local_addr();
        // Knowing the topology id (the open API publishes it) is not enough.
        let e = connect_as_peer(addr, "topo-1-1", &TopologySecret::generate()).unwrap_err().to_string();
        assert!(e.contains("does not hold the secret"), "{e}");
        // Nor is the old hello, the topology id alone.
        let mut old = TcpStream::connect(addr).unwrap();
        write_frame(&mut old, b"SQL1topo-1-1").unwrap();
        let mut frame = Vec::new();
        encode_batch(&[word(stream, "injected")], &mut frame).unwrap();
        let _ = write_frame(&mut old, &frame);
        // A sender of the same topology with another secret never gets through either.
        let forged = PeerAddr { secret: TopologySecret::generate(), ..peer(addr.port()) };
        let forger = PeerSender::start(forged, Arc::new(TransportStats::default())).unwrap();
        forger.tx.send(vec![word(stream, "forged")]).unwrap();
        poll_until("three refused handshakes", || stats.handshakes_failed.load(Ordering::Relaxed) >= 3);
        // The right secret gets through, and its tuple is the only one delivered.
        let mut good = connect_as_peer(addr, "topo-1-1", &secret()).unwrap();
        let mut frame = Vec::new();
        encode_batch(&[word(stream, "genuine")], &mut frame).unwrap();
        write_frame(&mut good, &frame).unwrap();
        let batch = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(batch.len(), 1);
        assert!(
            matches!(&batch[0], Envelope::Tuple { tuple, .. } if tuple.values[0].as_str() == Some("genuine"))
        );
        assert!(rx.try_recv().is_err(), "a forged tuple was delivered");
        assert_eq!(stats.accepted.load(Ordering::Relaxed), 1);
        forger.force_close();
        receiver.stop();
    }

    /// A relay in front of `upstream` for one connection, keeping what the client sent.
    fn sniffing_relay(upstream: std::net::SocketAddr) -> (u16, Arc<std::sync::Mutex<Vec<u8>>>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = seen.clone();
        std::thread::spawn(move || {
            let (mut client, _) = listener.accept().unwrap();
            let mut server = TcpStream::connect(upstream).unwrap();
            let (mut client_r, mut server_w) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                while let Ok(n @ 1..) = client_r.read(&mut buf) {
                    kept.lock().unwrap().extend_from_slice(&buf[..n]);
                    if std::io::Write::write_all(&mut server_w, &buf[..n]).is_err() {
                        break;
                    }
                }
            });
            let _ = std::io::copy(&mut server, &mut client);
        });
        (port, seen)
    }

    #[test]
    fn over_tls_only_the_topologys_key_gets_in_and_tuples_cross_encrypted() {
        let tls = TransportTls::for_topology(&secret()).unwrap();
        let (receiver, stats, rx, stream) = listening_with(None, Some(tls.clone()));
        let addr = receiver.local_addr();

        // A worker of the topology, through a relay that keeps every byte it sends.
        let (relay, wire) = sniffing_relay(addr);
        let sender = PeerSender::start(
            PeerAddr { tls: Some(tls.clone()), ..peer(relay) },
            Arc::new(TransportStats::default()),
        )
        .unwrap();
        sender.tx.send(vec![word(stream, "confidential-word")]).unwrap();
        let batch = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(matches!(&batch[0], Envelope::Tuple { tuple, .. }
            if tuple.values[0].as_str() == Some("confidential-word")));
        let wire = wire.lock().unwrap().clone();
        assert!(wire.len() > 100, "the relay saw the connection");
        let on_wire = |needle: &[u8]| wire.windows(needle.len()).any(|w| w == needle);
        assert!(!on_wire(b"confidential-word"), "the tuple crossed in clear");
        assert!(!on_wire(b"topo-1-1") && !on_wire(b"SQL2"), "the handshake crossed in clear");

        // A plaintext peer, even with the secret, is refused.
        let e = connect_as_peer(addr, "topo-1-1", &secret()).unwrap_err();
        assert!(matches!(e, crate::Error::Handshake { .. } | crate::Error::Io { .. }), "{e}");
        // A worker of another topology: its key is not the one pinned (by either side).
        let other = TopologySecret::generate();
        let e =
            connect_as_tls_peer(addr, "topo-1-1", &secret(), &TransportTls::for_topology(&other).unwrap())
                .unwrap_err();
        assert!(e.to_string().contains("TLS"), "{e}");
        // An impostor that accepts the receiver's key but presents another: the receiver
        // refuses it (under TLS 1.3 the impostor learns it in the handshake inside).
        let impostor = TransportTls::build(&other, &secret()).unwrap();
        let e = connect_as_tls_peer(addr, "topo-1-1", &secret(), &impostor).unwrap_err();
        assert!(matches!(e, crate::Error::Handshake { .. }), "{e}");
        poll_until("three refused handshakes", || stats.handshakes_failed.load(Ordering::Relaxed) >= 3);
        assert_eq!(stats.handshakes_failed.load(Ordering::Relaxed), 3);
        assert_eq!(stats.accepted.load(Ordering::Relaxed), 1, "only the topology's worker got in");
        assert!(rx.try_recv().is_err());

        // The other way round: a TLS sender to a plain receiver is refused and counted there.
        let (plain, plain_stats, _plain_rx, _) = listening(None);
        assert!(connect_as_tls_peer(plain.local_addr(), "topo-1-1", &secret(), &tls).is_err());
        poll_until("the plain receiver refusing TLS", || {
            plain_stats.handshakes_failed.load(Ordering::Relaxed) == 1
        });
        assert!(sender.stop_within(Duration::from_secs(5)));
        plain.stop();
        receiver.stop();
    }

    #[test]
    fn stopping_a_sender_blocked_on_a_peer_that_reads_nothing_is_bounded() {
        // The peer's inbox takes one batch and is never drained: its receiver blocks, TCP
        // buffers fill, and the sender's write blocks.
        let (receiver, stats, inbox, stream) = listening(Some(1));
        let sender = PeerSender::start(peer(receiver.local_addr().port()), stats.clone()).unwrap();
        for n in 0..64 {
            sender.tx.send(vec![blob(stream, n, 1024 * 1024)]).unwrap();
        }
        poll_until("the sender blocked in a write", || {
            stats.frames_received.load(Ordering::Relaxed) >= 2 && sender.tx.len() > 8
        });
        let started = std::time::Instant::now();
        assert!(!sender.stop_within(Duration::from_millis(200)), "a blocked sender cannot flush");
        assert!(started.elapsed() < Duration::from_secs(2), "stop took {:?}", started.elapsed());
        drop(inbox);
        receiver.stop();
    }

    #[test]
    fn connections_over_the_limit_are_closed_at_once_and_counted() {
        let table = Arc::new(table());
        let (tx, _rx) = crate::queue::unbounded();
        let dispatch: Dispatch = Arc::new([(TaskId(3), tx)].into_iter().collect());
        let stats = Arc::new(TransportStats::default());
        let setup = ReceiverSetup {
            topology_id: "topo-1-1".into(),
            secret: secret(),
            tls: None,
            table,
            dispatch,
            stats: stats.clone(),
            max_connections: 4,
        };
        let receiver = PeerReceiver::start("127.0.0.1", 0, setup).unwrap();
        let idle: Vec<TcpStream> =
            (0..10).map(|_| TcpStream::connect(receiver.local_addr()).unwrap()).collect();
        // At the limit, each new connection takes the place of the oldest one still in its
        // handshake: never more than 4 open.
        poll_until("six evicted", || stats.connections_evicted.load(Ordering::Relaxed) >= 6);
        assert_eq!(stats.connections.load(Ordering::Relaxed), 4);
        // A real peer gets in while the idle connections are held: it evicts one of them.
        let mut good = Vec::new();
        for _ in 0..4 {
            good.push(connect_as_peer(receiver.local_addr(), "topo-1-1", &secret()).unwrap());
        }
        poll_until("four peers accepted", || stats.accepted.load(Ordering::Relaxed) == 4);
        assert_eq!(stats.connections_evicted.load(Ordering::Relaxed), 10);
        // Every place is taken by an authenticated peer: a new connection is refused.
        let _late = TcpStream::connect(receiver.local_addr()).unwrap();
        poll_until("one refused", || stats.connections_refused.load(Ordering::Relaxed) == 1);
        assert_eq!(stats.connections.load(Ordering::Relaxed), 4);
        drop(idle);
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
