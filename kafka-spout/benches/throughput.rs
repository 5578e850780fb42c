//! Kafka -> count, side by side on one tansu broker and topic (BENCHMARKS.md): a raw rdkafka
//! consumer that assigns every partition and counts, and the topology kafka spout -> counting
//! bolt with acking on. Prints rates, rates per CPU-second of this process, and the ratio
//! (goal >= 0.8); the median of `SQUALL_BENCH_RUNS` (default 3) interleaved runs each.
//!
//! Measured as the peers' `kafka_rust_raw` is (`../shared/peers/kafka/rust`): rates from the
//! first message to the last (not from start-up), the raw consumer configured like it, CPU from
//! `getrusage` (microseconds, every thread), and each run's line says what other processes
//! burnt meanwhile (`other_cpu_s`, the broker excluded), the load average and, where the
//! kernel runs a DAMON monitor, its `kdamond` thread's CPU milliseconds (`kdamond_ms`).
//!
//! Then Kafka -> word count (BENCHMARKS.md): the reference sentences as message values, a raw
//! rdkafka consumer splitting and counting into a map (the "plain consumer + dict" baseline), and
//! the topology kafka spout -> split -> fields(word) -> count with acking on.
//!
//! `cargo bench -p kafka-spout --bench throughput` (needs tansu: `SQUALL_TANSU` or on PATH).
//! `SQUALL_BENCH_ONLY=count|words` runs one part. `SQUALL_BENCH_MESSAGES` (default 3,000,000 100-byte messages, 8 partitions: several seconds
//! per run).
//! Knobs for investigating: `SQUALL_BENCH_ACKERS` (`0`: acking off), `SQUALL_BENCH_SPOUT_WAIT_MS`,
//! `SQUALL_BENCH_RDKAFKA` (`key=value,...` passed to the spout's librdkafka consumer),
//! `SQUALL_BENCH_TIMELINE` (set: print the spout's acked count every 100 ms, to see stalls).
//! `SQUALL_BENCH_INLINE=1|0` turns `squall.executor.inline.downstream` on or off in the word count.
//! `SQUALL_BENCH_THREADS` (set: per thread of the spout topology, time on a CPU, runnable and
//! asleep during the run, and per component the time blocked on a full queue downstream: says
//! whether the spout thread computes or waits, and on what).
//! The spout's registry is the in-memory ensemble: ZooKeeper only sees a commit every
//! `offsets.commit.interval.ms`, which is not what is measured here.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../tests/support/tansu.rs"]
mod tansu;

// As in the `squall` binary (see there): mimalloc, not glibc malloc.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cluster_state::coord::Ensemble;
use kafka_spout::{KafkaSpout, KafkaSpoutConfig, SpoutEnv};
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::sync::OnceLock;

use test_harness::measure::{Measured, Window, median};
use worker::{Bolt, BoltCollector, ComponentError, LocalCluster, TopologyBuilder, TopologyConfig, Tuple};

const PARTITIONS: i32 = 8;
const TOPIC: &str = "bench";

/// Per thread name of this process: nanoseconds on a CPU, nanoseconds runnable but waiting
/// for one, and time slices, from /proc/self/task/*/schedstat (threads still alive). What is
/// left of the wall time is time the thread slept (blocked on a queue, a lock or a timeout).
fn sched() -> std::collections::BTreeMap<String, (u64, u64, u64)> {
    let mut m = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return m };
    for e in tasks.flatten() {
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default().trim().to_owned();
        let st = std::fs::read_to_string(e.path().join("schedstat")).unwrap_or_default();
        let v: Vec<u64> = st.split_whitespace().filter_map(|x| x.parse().ok()).collect();
        if v.len() == 3 {
            let x = m.entry(comm).or_insert((0, 0, 0));
            x.0 += v[0];
            x.1 += v[1];
            x.2 += v[2];
        }
    }
    m
}

fn produce(bootstrap: &str, n: u64) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .unwrap();
    let payload = [b'x'; 100];
    for i in 0..n {
        let key = i.to_string();
        let partition = (i % PARTITIONS as u64) as i32;
        let mut record = BaseRecord::to(TOPIC).key(&key).payload(&payload[..]).partition(partition);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(120)).unwrap();
}

/// One run: the first-to-last time that rates are computed from, and the whole run's
/// measurement (start-up included: its CPU and the context).
struct Run {
    secs: f64,
    measured: Measured,
}

impl Run {
    fn cpu(&self) -> f64 {
        self.measured.cpu_s.max(1e-9)
    }
}

/// Messages per second of `runs`, their median.
fn rate(runs: &[Run], n: u64) -> f64 {
    median(runs.iter().map(|r| n as f64 / r.secs).collect())
}

/// The time from `first` (set when the first message arrived) to now.
fn since_first(first: &OnceLock<Instant>, start: Instant) -> f64 {
    first.get().copied().unwrap_or(start).elapsed().as_secs_f64()
}

/// A raw consumer configured as the peers' `kafka_rust_raw`.
fn raw_client(bootstrap: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group) // required by librdkafka; no subscribe, no commit
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.max.bytes", "52428800")
        .set("max.partition.fetch.bytes", "10485760")
        .set("queued.min.messages", "1000000")
        // The peers' run.sh passes `fetch.wait.max.ms=$FETCH_WAIT_MS` (10) to `kafka_rust_raw`;
        // with librdkafka's 500 the consumer waits on the broker most of a run.
        .set("fetch.wait.max.ms", "10")
        .create()
        .unwrap()
}

fn raw_consumer(broker: &tansu::Tansu, n: u64) -> Run {
    let consumer = raw_client(&broker.bootstrap(), "raw");
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(TOPIC, p, rdkafka::Offset::Beginning).unwrap();
    }
    let window = Window::start(&[broker.pid()]);
    let start = Instant::now();
    consumer.assign(&tpl).unwrap();
    let (mut count, first) = (0, OnceLock::new());
    let deadline = start + Duration::from_secs(600);
    while count < n && Instant::now() < deadline {
        if let Some(Ok(_)) = consumer.poll(Duration::from_millis(100)) {
            first.get_or_init(Instant::now);
            count += 1;
        }
    }
    assert_eq!(count, n, "raw consumer read everything");
    Run { secs: since_first(&first, start), measured: window.finish() }
}

/// `B`, noting when its first tuple arrived (the executors publish their counters only now
/// and then, too late to tell when the first message got through).
struct FirstSeen<B>(B, Arc<OnceLock<Instant>>);

impl<B: Bolt> Bolt for FirstSeen<B> {
    fn declare_outputs(&self, declarer: &mut worker::OutputDeclarer) {
        self.0.declare_outputs(declarer);
    }

    fn prepare(&mut self, context: &worker::TopologyContext) -> Result<(), ComponentError> {
        self.0.prepare(context)
    }

    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        self.1.get_or_init(Instant::now);
        self.0.execute(input, out)
    }

    fn cleanup(&mut self) {
        self.0.cleanup();
    }
}

/// Counts and acks; notes when the first tuple arrived.
struct Count(Arc<AtomicU64>, Arc<OnceLock<Instant>>);

impl Bolt for Count {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        if self.0.fetch_add(1, Ordering::Relaxed) == 0 {
            self.1.get_or_init(Instant::now);
        }
        out.ack(input);
        Ok(())
    }
}

fn spout_topology(broker: &tansu::Tansu, n: u64, run: usize) -> Run {
    let bootstrap = broker.bootstrap();
    let bootstrap = bootstrap.as_str();
    let metrics = prometheus::Registry::new();
    let mut env = SpoutEnv::register(&metrics).unwrap();
    env.ensemble = Some(Ensemble::in_memory());
    let mut config = KafkaSpoutConfig {
        bootstrap_servers: bootstrap.into(),
        topics: vec![TOPIC.into()],
        group_id: format!("bench-{run}"),
        auto_offset_reset: consumer_registry::OffsetReset::Smallest,
        ..KafkaSpoutConfig::default()
    };
    config.librdkafka.insert("fetch.wait.max.ms".into(), "10".into());
    for (k, v) in std::env::var("SQUALL_BENCH_RDKAFKA")
        .unwrap_or_default()
        .split(',')
        .filter_map(|kv| kv.split_once('='))
    {
        config.librdkafka.insert(k.into(), v.into());
    }
    let config = Arc::new(config);
    let counted = Arc::new(AtomicU64::new(0));
    let mut builder = TopologyBuilder::new("bench");
    let wait: u64 =
        std::env::var("SQUALL_BENCH_SPOUT_WAIT_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let ackers: Option<u32> = std::env::var("SQUALL_BENCH_ACKERS").ok().and_then(|v| v.parse().ok());
    builder.config(TopologyConfig {
        max_spout_pending: Some(20_000),
        spout_wait_ms: wait,
        acker_executors: ackers,
        ..TopologyConfig::default()
    });
    builder.set_spout("kafka", 1, move || KafkaSpout::new(config.clone(), env.clone()));
    let (c, first) = (counted.clone(), Arc::new(OnceLock::new()));
    let f = first.clone();
    builder.set_bolt("count", 1, move || Count(c.clone(), f.clone())).shuffle_grouping("kafka");
    let window = Window::start(&[broker.pid()]);
    let start = Instant::now();
    let cluster = LocalCluster::start(builder.build().unwrap()).unwrap();
    let acked = || {
        cluster
            .runtime()
            .component_stats("kafka")
            .iter()
            .map(|s| s.acked.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let deadline = start + Duration::from_secs(600);
    let mut marks: Vec<(u128, u64)> = Vec::new();
    while acked() < n && Instant::now() < deadline {
        if marks.last().is_none_or(|(t, _)| start.elapsed().as_millis() - t >= 100) {
            marks.push((start.elapsed().as_millis(), acked()));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if std::env::var("SQUALL_BENCH_TIMELINE").is_ok() {
        eprintln!("timeline (ms, acked): {marks:?}");
    }
    let run = Run { secs: since_first(&first, start), measured: window.finish() };
    print_threads(&run, &cluster, &["kafka"]);
    assert_eq!(acked(), n, "spout acked everything");
    assert!(counted.load(Ordering::Relaxed) >= n);
    cluster.shutdown(Duration::from_secs(5));
    run
}

/// With `SQUALL_BENCH_THREADS`: the executors' and librdkafka's threads (alive until the
/// topology shuts down), each one's time on a CPU, runnable and asleep during `run`; then each
/// component's time blocked on a full queue downstream (backpressure), which is part of
/// "asleep" (and of "runnable" right after).
fn print_threads(run: &Run, cluster: &LocalCluster, components: &[&str]) {
    if std::env::var_os("SQUALL_BENCH_THREADS").is_none() {
        return;
    }
    for (name, (on_cpu, runqueue, slices)) in sched() {
        if ["kafka", "split", "count", "__acker", "rdk:"].iter().any(|p| name.starts_with(p)) {
            eprintln!(
                "  {name:16} on cpu {:5.0} ms, runnable {:4.0} ms, asleep {:5.0} ms ({slices} slices)",
                on_cpu as f64 / 1e6,
                runqueue as f64 / 1e6,
                (run.measured.secs * 1e3 - (on_cpu + runqueue) as f64 / 1e6).max(0.0),
            );
        }
    }
    for c in components {
        let ns: u64 = cluster
            .runtime()
            .component_stats(c)
            .iter()
            .map(|s| s.backpressure_ns.load(Ordering::Relaxed))
            .sum();
        eprintln!("  {c:16} blocked on a full queue downstream {:5.0} ms", ns as f64 / 1e6);
    }
}

/// The runtime's own ceiling: the built-in generator spout (no Kafka) -> count, acking on,
/// same topology config.
fn generator_topology(n: u64) -> Run {
    use worker::builtin::{SentenceParams, SentenceSpout};
    let counted = Arc::new(AtomicU64::new(0));
    let mut builder = TopologyBuilder::new("ceiling");
    builder.config(TopologyConfig { max_spout_pending: Some(20_000), ..TopologyConfig::default() });
    builder.set_spout("gen", 1, move || {
        SentenceSpout::new(SentenceParams { count: Some(n), ..SentenceParams::default() })
    });
    let (c, first) = (counted.clone(), Arc::new(OnceLock::new()));
    let f = first.clone();
    builder.set_bolt("count", 1, move || Count(c.clone(), f.clone())).shuffle_grouping("gen");
    let window = Window::start(&[]);
    let start = Instant::now();
    let cluster = LocalCluster::start(builder.build().unwrap()).unwrap();
    let acked = || {
        cluster.runtime().component_stats("gen").iter().map(|s| s.acked.load(Ordering::Relaxed)).sum::<u64>()
    };
    let deadline = start + Duration::from_secs(600);
    while acked() < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let run = Run { secs: since_first(&first, start), measured: window.finish() };
    cluster.shutdown(Duration::from_secs(5));
    run
}

/// Diagnostic: a bare spout that polls librdkafka (zero timeout) and emits the offset
/// untracked, to separate the executor's polling pattern from the Kafka spout's own work.
struct BareSpout {
    bootstrap: String,
    consumer: Option<BaseConsumer>,
}

impl worker::Spout for BareSpout {
    fn declare_outputs(&self, declarer: &mut worker::OutputDeclarer) {
        if std::env::var_os("SQUALL_BENCH_BARE_COPY").is_some() {
            declarer.declare(worker::Fields::new(["offset", "key", "value"]));
        } else {
            declarer.declare(worker::Fields::new(["offset"]));
        }
    }

    fn open(&mut self, _: &worker::TopologyContext) -> Result<(), ComponentError> {
        let consumer: BaseConsumer = if std::env::var_os("SQUALL_BENCH_BARE_SPOUT_CONFIG").is_some() {
            let mut config = KafkaSpoutConfig {
                bootstrap_servers: self.bootstrap.clone(),
                topics: vec![TOPIC.into()],
                group_id: "bare".into(),
                ..KafkaSpoutConfig::default()
            };
            config.librdkafka.insert("fetch.wait.max.ms".into(), "10".into());
            config.consumer_config().create()?
        } else {
            ClientConfig::new()
                .set("bootstrap.servers", &self.bootstrap)
                .set("group.id", "bare")
                .set("fetch.wait.max.ms", "10")
                .create()?
        };
        if std::env::var_os("SQUALL_BENCH_BARE_INCREMENTAL").is_some() {
            for p in 0..PARTITIONS {
                let mut tpl = rdkafka::TopicPartitionList::new();
                tpl.add_partition_offset(TOPIC, p, rdkafka::Offset::Beginning)?;
                consumer.incremental_assign(&tpl)?;
            }
        } else {
            let mut tpl = rdkafka::TopicPartitionList::new();
            for p in 0..PARTITIONS {
                tpl.add_partition_offset(TOPIC, p, rdkafka::Offset::Beginning)?;
            }
            consumer.assign(&tpl)?;
        }
        self.consumer = Some(consumer);
        Ok(())
    }

    fn next_tuple(&mut self, out: &mut worker::SpoutCollector<'_>) -> Result<(), ComponentError> {
        let Some(c) = &self.consumer else { return Ok(()) };
        for _ in 0..64 {
            match c.poll(Duration::ZERO) {
                Some(Ok(m)) => {
                    use rdkafka::message::Message;
                    if std::env::var_os("SQUALL_BENCH_BARE_COPY").is_some() {
                        let b = |x: Option<&[u8]>| {
                            x.map_or(worker::Value::Null, |x| worker::Value::Bytes(x.to_vec().into()))
                        };
                        let v = vec![worker::Value::Int(m.offset()), b(m.key()), b(m.payload())];
                        let keep = v.clone();
                        out.emit(v, None)?;
                        drop(keep);
                    } else {
                        out.emit(vec![worker::Value::Int(m.offset())], None)?;
                    }
                }
                _ => break,
            }
        }
        Ok(())
    }
}

fn bare_topology(bootstrap: &str, n: u64) -> Run {
    let counted = Arc::new(AtomicU64::new(0));
    let mut builder = TopologyBuilder::new("bare");
    let b = bootstrap.to_owned();
    builder.set_spout("bare", 1, move || BareSpout { bootstrap: b.clone(), consumer: None });
    let (c, first) = (counted.clone(), Arc::new(OnceLock::new()));
    let f = first.clone();
    builder.set_bolt("count", 1, move || Count(c.clone(), f.clone())).shuffle_grouping("bare");
    let window = Window::start(&[]);
    let start = Instant::now();
    let cluster = LocalCluster::start(builder.build().unwrap()).unwrap();
    let deadline = start + Duration::from_secs(600);
    while counted.load(Ordering::Relaxed) < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let run = Run { secs: since_first(&first, start), measured: window.finish() };
    cluster.shutdown(Duration::from_secs(5));
    run
}

const SENTENCES_TOPIC: &str = "sentences";

/// Stream item `i` of the reference corpus as message `i`, round-robin over the partitions.
fn produce_sentences(bootstrap: &str, n: u64) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("queue.buffering.max.messages", "1000000")
        .create()
        .unwrap();
    let corpus = worker::builtin::reference_corpus();
    for i in 0..n {
        let sentence = corpus[(i % corpus.len() as u64) as usize].as_bytes();
        let partition = (i % PARTITIONS as u64) as i32;
        let mut record = BaseRecord::<(), [u8]>::to(SENTENCES_TOPIC).payload(sentence).partition(partition);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(120)).unwrap();
}

/// Words in the first `n` stream items.
fn words_in(n: u64) -> u64 {
    let corpus = worker::builtin::reference_corpus();
    (0..n).map(|i| corpus[(i % corpus.len() as u64) as usize].split(' ').count() as u64).sum()
}

/// The baseline: one consumer assigned every partition, splitting each value and counting words
/// in a map.
fn raw_word_count(broker: &tansu::Tansu, n: u64) -> Run {
    let consumer = raw_client(&broker.bootstrap(), "raw-words");
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(SENTENCES_TOPIC, p, rdkafka::Offset::Beginning).unwrap();
    }
    let window = Window::start(&[broker.pid()]);
    let start = Instant::now();
    consumer.assign(&tpl).unwrap();
    let mut counts: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
    let (mut messages, deadline, first) = (0, start + Duration::from_secs(600), OnceLock::new());
    while messages < n && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            first.get_or_init(Instant::now);
            messages += 1;
            let text = std::str::from_utf8(rdkafka::Message::payload(&m).unwrap_or_default()).unwrap_or("");
            for word in text.split(' ') {
                match counts.get_mut(word) {
                    Some(c) => *c += 1,
                    None => {
                        counts.insert(word.to_owned(), 1);
                    }
                }
            }
        }
    }
    let run = Run { secs: since_first(&first, start), measured: window.finish() };
    assert_eq!(messages, n, "raw consumer read everything");
    assert_eq!(counts.values().sum::<u64>(), words_in(n));
    run
}

/// kafka spout -> split (the message value) -> fields(word) -> count, acking on.
fn spout_word_count(broker: &tansu::Tansu, n: u64, run: usize) -> Run {
    let bootstrap = broker.bootstrap();
    let bootstrap = bootstrap.as_str();
    use worker::builtin::{SplitParams, SplitSentence, WordCount, WordCountParams};
    let metrics = prometheus::Registry::new();
    let mut env = SpoutEnv::register(&metrics).unwrap();
    env.ensemble = Some(Ensemble::in_memory());
    let mut config = KafkaSpoutConfig {
        bootstrap_servers: bootstrap.into(),
        topics: vec![SENTENCES_TOPIC.into()],
        group_id: format!("bench-words-{run}"),
        auto_offset_reset: consumer_registry::OffsetReset::Smallest,
        ..KafkaSpoutConfig::default()
    };
    config.librdkafka.insert("fetch.wait.max.ms".into(), "10".into());
    let config = Arc::new(config);
    let mut builder = TopologyBuilder::new("kafka-words");
    builder.config(TopologyConfig {
        max_spout_pending: Some(20_000),
        // `SQUALL_BENCH_INLINE=1|0`: whether split may count its words on its own thread.
        inline_downstream: std::env::var("SQUALL_BENCH_INLINE")
            .map_or(TopologyConfig::default().inline_downstream, |v| v != "0"),
        ..TopologyConfig::default()
    });
    builder.set_spout("kafka", 1, move || KafkaSpout::new(config.clone(), env.clone()));
    let first = Arc::new(OnceLock::new());
    let f = first.clone();
    builder
        .set_bolt("split", 1, move || {
            FirstSeen(SplitSentence::new(SplitParams { field: Some("value".into()) }), f.clone())
        })
        .shuffle_grouping("kafka");
    builder
        .set_bolt("count", 1, || WordCount::new(WordCountParams { emit: false }))
        .fields_grouping("split", ["word"]);
    let window = Window::start(&[broker.pid()]);
    let start = Instant::now();
    let cluster = LocalCluster::start(builder.build().unwrap()).unwrap();
    let acked = |c: &str| {
        cluster.runtime().component_stats(c).iter().map(|s| s.acked.load(Ordering::Relaxed)).sum::<u64>()
    };
    let deadline = start + Duration::from_secs(600);
    while acked("kafka") < n && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let run = Run { secs: since_first(&first, start), measured: window.finish() };
    print_threads(&run, &cluster, &["kafka", "split"]);
    assert_eq!(acked("kafka"), n, "spout acked every sentence");
    assert_eq!(acked("count"), words_in(n), "every word counted");
    cluster.shutdown(Duration::from_secs(5));
    run
}

fn main() {
    let n: u64 =
        std::env::var("SQUALL_BENCH_MESSAGES").ok().and_then(|v| v.parse().ok()).unwrap_or(3_000_000);
    let runs: usize = std::env::var("SQUALL_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    // `SQUALL_BENCH_ONLY=count|words`: one of the two parts.
    let only = std::env::var("SQUALL_BENCH_ONLY").ok();
    let part = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let broker = tansu::Tansu::start_in_memory();
    if part("count") {
        count_part(&broker, n, runs);
    }
    if part("words") {
        words_part(&broker, n, runs);
    }
}

/// Kafka -> count against the raw consumer.
fn count_part(broker: &tansu::Tansu, n: u64, runs: usize) {
    broker.create_topic(TOPIC, PARTITIONS);
    let t = Instant::now();
    produce(&broker.bootstrap(), n);
    println!(
        "produced {n} x 100-byte messages to {PARTITIONS} partitions in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let ceiling = generator_topology(n);
    println!(
        "runtime ceiling (generator spout -> count, acking, no Kafka): {:.0} tuples/s ({:.0} per CPU-s) {}",
        n as f64 / ceiling.secs,
        n as f64 / ceiling.cpu(),
        ceiling.measured.context()
    );
    if std::env::var_os("SQUALL_BENCH_BARE").is_some() {
        let bare = bare_topology(&broker.bootstrap(), n);
        println!("bare polling spout -> count, no acking: {:.0} msgs/s", n as f64 / bare.secs);
    }
    // Interleaved: raw, spout, raw, spout... so drift on the machine hits both alike.
    let (mut raw, mut spout) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let r = raw_consumer(broker, n);
        let s = spout_topology(broker, n, run);
        println!(
            "run {run}: raw consumer {:>9.0} msgs/s ({:>9.0} per CPU-s, {}) | spout -> count, acking {:>9.0} msgs/s ({:>9.0} per CPU-s, {}) | ratio {:.2}",
            n as f64 / r.secs,
            n as f64 / r.cpu(),
            r.measured.context(),
            n as f64 / s.secs,
            n as f64 / s.cpu(),
            s.measured.context(),
            r.secs / s.secs
        );
        raw.push(r);
        spout.push(s);
    }
    let per_cpu = |v: &[Run]| median(v.iter().map(|r| n as f64 / r.cpu()).collect());
    let ratio = median(raw.iter().zip(&spout).map(|(r, s)| r.secs / s.secs).collect());
    println!(
        "median of {runs}: raw consumer {:.0} msgs/s ({:.0} per CPU-s); spout -> count with acking {:.0} msgs/s ({:.0} per CPU-s); ratio {ratio:.2} (goal >= 0.8)",
        rate(&raw, n),
        per_cpu(&raw),
        rate(&spout, n),
        per_cpu(&spout),
    );
}

/// Kafka -> word count against the consumer + map.
fn words_part(broker: &tansu::Tansu, n: u64, runs: usize) {
    broker.create_topic(SENTENCES_TOPIC, PARTITIONS);
    produce_sentences(&broker.bootstrap(), n);
    let words = words_in(n) as f64;
    println!("Kafka -> word count: {n} reference sentences ({words:.0} words) in {PARTITIONS} partitions");
    let (mut raw, mut spout) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let r = raw_word_count(broker, n);
        let s = spout_word_count(broker, n, run);
        println!(
            "run {run}: consumer + map {:>9.0} msgs/s ({:>9.0} words per CPU-s, {}) | spout -> split -> count, acking {:>9.0} msgs/s, {:>10.0} words/s ({:>9.0} words per CPU-s, {}) | ratio {:.2}",
            n as f64 / r.secs,
            words / r.cpu(),
            r.measured.context(),
            n as f64 / s.secs,
            words / s.secs,
            words / s.cpu(),
            s.measured.context(),
            r.secs / s.secs
        );
        raw.push(r);
        spout.push(s);
    }
    let words_per_cpu = |v: &[Run]| median(v.iter().map(|r| words / r.cpu()).collect());
    let ratio = median(raw.iter().zip(&spout).map(|(r, s)| r.secs / s.secs).collect());
    println!(
        "median of {runs}: consumer + map {:.0} msgs/s ({:.0} words per CPU-s); spout -> split -> count with acking {:.0} msgs/s = {:.0} words/s ({:.0} words per CPU-s); ratio {ratio:.2} (goal >= 1.0)",
        rate(&raw, n),
        words_per_cpu(&raw),
        rate(&spout, n),
        median(spout.iter().map(|r| words / r.secs).collect()),
        words_per_cpu(&spout),
    );
}
