//! The inter-worker transport: length-delimited, batched frames over TCP, one connection per
//! peer, authenticated with the topology's secret, and a receiver that dispatches by task id.
//!
//! Frame: `u32` big-endian payload length, then the payload. A connection opens with a
//! handshake (`auth.rs`): the sender's hello (`SQL2`, a nonce, the topology id), then each side
//! proves it holds the topology's secret over the other's nonce (HMAC-SHA256); a connection
//! that fails it, or has not completed it within [`HANDSHAKE_TIMEOUT`](auth::HANDSHAKE_TIMEOUT),
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
//! peers; more are closed at once and counted), reads each with a thread of its own whose
//! buffer grows only as bytes arrive, and forgets a connection when its thread ends.
//!
//! Layout: `codec.rs` (the wire format, [`FrameBuf`](codec::FrameBuf)), `auth.rs` (secret and
//! handshake), `send.rs` (`PeerSender`), `receive.rs` (`PeerReceiver`).

use std::sync::atomic::AtomicU64;
use std::time::Duration;

mod auth;
mod codec;
mod receive;
mod send;

pub use auth::{SECRET_BYTES, TopologySecret};
#[cfg(test)]
use receive::Dispatch;
pub(crate) use receive::{PeerReceiver, ReceiverSetup};
pub(crate) use send::{PeerAddr, PeerSender};

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
    /// Inbound connections closed at once because the limit was reached.
    pub connections_refused: AtomicU64,
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

    use cluster_state::ids::TaskId;

    use super::codec::{decode_batch, encode_batch, write_frame};
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
        PeerAddr { host: "127.0.0.1".into(), port, topology_id: "topo-1-1".into(), secret: secret() }
    }

    fn receiver(
        port: u16,
        table: Arc<StreamTable>,
        dispatch: Dispatch,
        stats: &Arc<TransportStats>,
        secret: &TopologySecret,
    ) -> PeerReceiver {
        let setup = ReceiverSetup {
            topology_id: "topo-1-1".into(),
            secret: secret.clone(),
            table,
            dispatch,
            stats: stats.clone(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
        };
        PeerReceiver::start("127.0.0.1", port, setup).unwrap()
    }

    /// A raw connection that completed the handshake with `secret`.
    fn connected(addr: std::net::SocketAddr, secret: &TopologySecret) -> TcpStream {
        let mut conn = TcpStream::connect(addr).unwrap();
        auth::client(&mut conn, "topo-1-1", secret, "test").unwrap();
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
        let (tx, rx) = crossbeam_channel::unbounded();
        let dispatch: Dispatch = Arc::new([(TaskId(3), tx)].into_iter().collect());
        let receiver = receiver(0, table, dispatch, &Arc::default(), &secret());
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
        let (tx, rx) = crossbeam_channel::unbounded();
        let dispatch: Dispatch = Arc::new([(TaskId(3), tx)].into_iter().collect());
        let receiver = receiver(port, table, dispatch, &stats, &secret());
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

    proptest! {
        /// Garbage from the network never panics the decoder.
        #[test]
        fn decoding_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let table = table();
            let _ = decode_batch(Bytes::from(bytes), &table, "peer");
        }
    }
}
