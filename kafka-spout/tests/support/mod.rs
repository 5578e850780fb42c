//! Shared pieces of the spout's integration tests: librdkafka's mock cluster, producing and
//! reading numbered messages, reading the registry, a recording bolt, polling with a deadline.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod tansu;
pub mod traffic;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_state::coord::{Ensemble, Session, SessionOptions};
use kafka_spout::KafkaSpoutConfig;
use rdkafka::ClientConfig;
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext};
use worker::{Bolt, BoltCollector, ComponentError, Tuple};

pub use test_harness::wait_until;

/// librdkafka's in-process mock cluster with some topics.
pub struct MockKafka {
    cluster: MockCluster<'static, DefaultProducerContext>,
}

impl MockKafka {
    pub fn start(topics: &[(&str, i32)]) -> Self {
        let cluster = MockCluster::new(1).unwrap();
        for (topic, partitions) in topics {
            cluster.create_topic(topic, *partitions, 1).unwrap();
        }
        MockKafka { cluster }
    }

    pub fn bootstrap(&self) -> String {
        self.cluster.bootstrap_servers()
    }

    /// The group coordinator refuses the next `n` offset commits (a non-retryable error, so
    /// each commit call fails once), as a broker that lost its coordinator would.
    pub fn refuse_offset_commits(&self, n: usize) {
        use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
        let errors = vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED; n];
        self.cluster.request_errors(RDKafkaApiKey::OffsetCommit, &errors);
    }

    /// The next `n` produce requests are answered "out of order sequence number", as a broker
    /// that lost an idempotent producer's earlier write answers the next one: fatal to a
    /// producer with `enable.gapless.guarantee`.
    pub fn answer_produces_out_of_order(&self, n: usize) {
        use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
        let errors = vec![RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER; n];
        self.cluster.request_errors(RDKafkaApiKey::Produce, &errors);
    }

    /// Offset commits are answered again.
    pub fn accept_offset_commits(&self) {
        self.cluster.clear_request_errors(rdkafka::types::RDKafkaApiKey::OffsetCommit);
    }

    /// The next fetch is answered "offset out of range" for every partition in it, as tansu
    /// answers now and then, under a concurrent producer, at an offset it has just served.
    pub fn answer_next_fetch_out_of_range(&self) {
        use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
        self.cluster
            .request_errors(RDKafkaApiKey::Fetch, &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE]);
    }
}

/// Produces numbers `range` to `topic`: key and value are the decimal number, partition
/// `n % partitions`. One record per batch: tansu 0.6 answers a fetch at an offset inside a
/// record batch with the *next* batch (a fetch at 1 of a batch 0..249 starts at 250), so a
/// consumer resuming mid-batch would skip records. One-record batches make every offset a
/// batch start.
pub fn produce(bootstrap: &str, topic: &str, partitions: i32, range: std::ops::Range<u64>) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "0")
        .set("batch.num.messages", "1")
        .create()
        .unwrap();
    for n in range {
        let text = n.to_string();
        let partition = i32::try_from(n % u64::try_from(partitions).unwrap()).unwrap();
        let mut record = BaseRecord::to(topic).key(&text).payload(&text).partition(partition);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(10));
                }
            }
        }
    }
    traffic::flush_all(&producer, bootstrap);
}

/// Every value in `topic` (all partitions from the start), as numbers, once `expect` distinct
/// numbers are there or `within` passes.
pub fn read_numbers(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    expect: usize,
    within: Duration,
) -> Vec<u64> {
    read_records(bootstrap, topic, partitions, expect, within, 0).into_iter().map(|(_, n)| n).collect()
}

/// Every record of `topic` (all partitions from the start) as (key, number), once `expect`
/// distinct numbers are there (then `drain_idle_polls` more empty polls, to catch what else is
/// already written) or `within` passes.
pub fn read_records(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    expect: usize,
    within: Duration,
    drain_idle_polls: u32,
) -> Vec<(String, u64)> {
    read_timed_records(bootstrap, topic, partitions, expect, within, drain_idle_polls)
        .into_iter()
        .map(|(key, n, _)| (key, n))
        .collect()
}

/// Like [`read_records`], with each record's timestamp (milliseconds since the epoch: when the
/// producing bolt handed it to its producer).
pub fn read_timed_records(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    expect: usize,
    within: Duration,
    drain_idle_polls: u32,
) -> Vec<(String, u64, Option<i64>)> {
    let consumer = traffic::reader(bootstrap, topic, partitions);
    let mut out = Vec::new();
    let mut distinct = std::collections::BTreeSet::new();
    let deadline = Instant::now() + within;
    let mut idle_after_complete = 0;
    while Instant::now() < deadline && !(distinct.len() >= expect && idle_after_complete >= drain_idle_polls)
    {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let key = String::from_utf8(m.key().unwrap_or_default().to_vec()).unwrap();
                let n: u64 = std::str::from_utf8(m.payload().unwrap()).unwrap().parse().unwrap();
                distinct.insert(n);
                out.push((key, n, m.timestamp().to_millis()));
            }
            _ if distinct.len() >= expect => idle_after_complete += 1,
            _ => {}
        }
    }
    out
}

/// A plain consumer of `group` (never joining it), to read and write the group's offsets in
/// Kafka as Kafka's own tools do: an independent checker of the spout's commits.
fn group_consumer(bootstrap: &str, group: &str) -> rdkafka::consumer::BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap()
}

/// The offsets Kafka's group coordinator holds for `group` on partitions `0..partitions` of
/// `topic` (`None`: nothing committed; a failed read is `None` too, for polling).
pub fn kafka_committed(bootstrap: &str, group: &str, topic: &str, partitions: i32) -> Vec<Option<i64>> {
    use rdkafka::consumer::Consumer;
    let consumer = group_consumer(bootstrap, group);
    let mut list = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition(topic, p);
    }
    let Ok(read) = consumer.committed_offsets(list, Duration::from_secs(10)) else {
        return vec![None; partitions as usize];
    };
    (0..partitions)
        .map(|p| match read.find_partition(topic, p)?.offset() {
            rdkafka::Offset::Offset(o) => Some(o),
            _ => None,
        })
        .collect()
}

/// Commits `offset` for `group` on `topic`/`partition` in Kafka, as a plain consumer would.
pub fn kafka_commit(bootstrap: &str, group: &str, topic: &str, partition: i32, offset: i64) {
    use rdkafka::consumer::{CommitMode, Consumer};
    let consumer = group_consumer(bootstrap, group);
    let mut list = rdkafka::TopicPartitionList::new();
    list.add_partition_offset(topic, partition, rdkafka::Offset::Offset(offset)).unwrap();
    consumer.commit(&list, CommitMode::Sync).unwrap();
}

/// A small runtime to read the registry from synchronous tests. It has a thread of its own: the
/// session pings the server between calls, so a test busy elsewhere for longer than the session
/// timeout (producing 20,000 records to a loaded broker took 26 s) does not find it expired.
pub struct Zk {
    runtime: tokio::runtime::Runtime,
    session: Session,
}

impl Zk {
    pub fn connect(ensemble: &Ensemble) -> Self {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let session = runtime.block_on(ensemble.connect(&SessionOptions::default())).unwrap();
        Zk { runtime, session }
    }

    pub fn committed(&self, group: &str, topic: &str, partition: i32) -> Option<i64> {
        let path = format!("/consumers/{group}/offsets/{topic}/{partition}");
        let (bytes, _) = self.runtime.block_on(self.session.get(&path)).ok()?;
        std::str::from_utf8(&bytes).ok()?.parse().ok()
    }

    pub fn set_committed(&self, group: &str, topic: &str, partition: i32, offset: i64) {
        use cluster_state::coord::CreateMode;
        let path = format!("/consumers/{group}/offsets/{topic}/{partition}");
        self.runtime
            .block_on(self.session.create(
                &path,
                offset.to_string().as_bytes(),
                CreateMode::Persistent.with_parents(),
            ))
            .unwrap();
    }

    /// Overwrites (or creates) a committed offset, as `squall offsets reset` does.
    pub fn reset_committed(&self, group: &str, topic: &str, partition: i32, offset: i64) {
        self.write_committed(group, topic, partition, offset.to_string().as_bytes());
    }

    /// Overwrites (or creates) the offset node of a partition with `bytes`, a number or not.
    pub fn write_committed(&self, group: &str, topic: &str, partition: i32, bytes: &[u8]) {
        let path = format!("/consumers/{group}/offsets/{topic}/{partition}");
        self.runtime.block_on(self.session.set_or_create(&path, bytes)).unwrap();
    }

    /// The registered members of `group` (`/consumers/<group>/ids`).
    pub fn ids(&self, group: &str) -> Vec<String> {
        self.runtime.block_on(self.session.children(&format!("/consumers/{group}/ids"))).unwrap_or_default()
    }

    /// Owner (consumer thread id) of each owned partition of `topic`.
    pub fn owners(&self, group: &str, topic: &str) -> BTreeMap<i32, String> {
        let dir = format!("/consumers/{group}/owners/{topic}");
        let Ok(children) = self.runtime.block_on(self.session.children(&dir)) else { return BTreeMap::new() };
        children
            .into_iter()
            .filter_map(|c| {
                let (bytes, _) = self.runtime.block_on(self.session.get(&format!("{dir}/{c}"))).ok()?;
                Some((c.parse().ok()?, String::from_utf8(bytes).ok()?))
            })
            .collect()
    }

    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.runtime.block_on(f)
    }
}

/// A spout config for tests: start from the beginning, commit often, short fetch waits.
pub fn spout_config(bootstrap: &str, topic: &str, group: &str) -> KafkaSpoutConfig {
    let mut config = KafkaSpoutConfig {
        bootstrap_servers: bootstrap.into(),
        topics: vec![topic.into()],
        group_id: group.into(),
        auto_offset_reset: consumer_registry::OffsetReset::Smallest,
        offsets_commit_interval_ms: 100,
        ..KafkaSpoutConfig::default()
    };
    config.registry.rebalance_backoff_ms = 200;
    config.librdkafka.insert("fetch.wait.max.ms".into(), "10".into());
    config
}

/// One emitted tuple as a bolt saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub topic: String,
    pub partition: i64,
    pub offset: i64,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub timestamp: Option<i64>,
}

impl Seen {
    pub fn number(&self) -> u64 {
        std::str::from_utf8(&self.value).unwrap().parse().unwrap()
    }
}

/// What a [`Recorder`] saw and did.
#[derive(Debug, Default)]
pub struct Record {
    pub seen: Mutex<Vec<Seen>>,
    pub acked: AtomicU64,
    pub failed: AtomicU64,
}

/// What a [`Recorder`] does with a tuple.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ack,
    Fail,
    /// Neither: the tuple times out (`topology.message.timeout.secs`).
    Drop,
}

/// Decides a tuple's fate from what it is and how often it was delivered before.
pub type Decide = dyn Fn(&Seen, usize) -> Verdict + Send + Sync;

/// Records every tuple and does with it what `decide(seen, earlier deliveries)` says.
pub struct Recorder {
    pub record: Arc<Record>,
    pub decide: Arc<Decide>,
}

impl Recorder {
    pub fn new(
        record: &Arc<Record>,
        decide: impl Fn(&Seen, usize) -> Verdict + Send + Sync + 'static,
    ) -> Self {
        Recorder { record: record.clone(), decide: Arc::new(decide) }
    }
}

impl Bolt for Recorder {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let bytes =
            |i: usize| input.get(i).and_then(|v| v.as_bytes()).map(|b| b.to_vec()).unwrap_or_default();
        let seen = Seen {
            topic: input.get_str(0).unwrap().to_owned(),
            partition: input.get_int(1).unwrap(),
            offset: input.get_int(2).unwrap(),
            key: bytes(3),
            value: bytes(4),
            timestamp: input.get_int(5),
        };
        let deliveries = {
            let mut all = self.record.seen.lock().unwrap();
            let n = all.iter().filter(|s| s.partition == seen.partition && s.offset == seen.offset).count();
            all.push(seen.clone());
            n
        };
        match (self.decide)(&seen, deliveries) {
            Verdict::Ack => {
                self.record.acked.fetch_add(1, Ordering::Relaxed);
                out.ack(input);
            }
            Verdict::Fail => {
                self.record.failed.fetch_add(1, Ordering::Relaxed);
                out.fail(input);
            }
            Verdict::Drop => {}
        }
        Ok(())
    }
}

impl Record {
    pub fn numbers(&self) -> std::collections::BTreeSet<u64> {
        self.seen.lock().unwrap().iter().map(Seen::number).collect()
    }

    pub fn len(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// (partition, offset) pairs delivered more than once, with their counts.
    pub fn duplicates(&self) -> BTreeMap<(i64, i64), usize> {
        let mut counts: BTreeMap<(i64, i64), usize> = BTreeMap::new();
        for s in self.seen.lock().unwrap().iter() {
            *counts.entry((s.partition, s.offset)).or_default() += 1;
        }
        counts.into_iter().filter(|(_, n)| *n > 1).collect()
    }
}

/// A deterministic "random" 10%: fails about one delivery in ten.
pub fn ten_percent(seen: &Seen, deliveries: usize) -> Verdict {
    let mut x = (seen.partition as u64) << 40 ^ seen.offset as u64 ^ (deliveries as u64) << 56;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    if (x ^ (x >> 31)).is_multiple_of(10) { Verdict::Fail } else { Verdict::Ack }
}

pub fn ack_all(_: &Seen, _: usize) -> Verdict {
    Verdict::Ack
}

/// Sum of a counter family's samples whose labels include all of `labels`.
pub fn metric(registry: &prometheus::Registry, name: &str, labels: &[(&str, &str)]) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|f| f.name() == name)
        .flat_map(|f| f.get_metric().iter())
        .filter(|m| {
            labels.iter().all(|(k, v)| m.get_label().iter().any(|l| l.name() == *k && l.value() == *v))
        })
        .map(|m| m.get_counter().get_value() + m.get_gauge().get_value())
        .sum()
}
