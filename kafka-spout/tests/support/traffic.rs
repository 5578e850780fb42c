//! Steady traffic for the fault stories: numbers produced at a fixed rate, and the arrival time
//! of every number read back from an output topic. Shared with `cli/tests/cluster.rs`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer as _};

/// The longest any traffic thread runs: never longer than a test waits.
const LIMIT: Duration = Duration::from_secs(900);

/// Produces numbers from 0 on to `topic` (key and value the decimal number, partition
/// `n % partitions`, one record per batch: see `support::produce`) at about `per_sec` until
/// `stop`. `next` is the next number to be sent, so every number below a reading of it was
/// handed to the producer before that reading.
pub fn produce_paced(
    bootstrap: String,
    topic: &'static str,
    partitions: u64,
    per_sec: u64,
    next: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("linger.ms", "0")
            .set("batch.num.messages", "1")
            .create()
            .unwrap();
        let started = Instant::now();
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) && started.elapsed() < LIMIT {
            let due = started.elapsed().as_millis() as u64 * per_sec / 1000;
            while n < due {
                let text = n.to_string();
                let partition = i32::try_from(n % partitions).unwrap();
                let mut record = BaseRecord::to(topic).key(&text).payload(&text).partition(partition);
                loop {
                    match producer.send(record) {
                        Ok(()) => break,
                        Err((_, back)) => {
                            record = back;
                            producer.poll(Duration::from_millis(5));
                        }
                    }
                }
                n += 1;
                next.store(n, Ordering::SeqCst);
            }
            producer.poll(Duration::from_millis(5));
        }
        flush_all(&producer, &bootstrap);
    })
}

/// Waits until every record handed to `producer` is acknowledged by the broker, for up to two
/// minutes: a loaded machine (a CI run beside compilers) can hold one flush past 30 s although
/// nothing is lost. Panics naming how many records are still unacknowledged.
pub fn flush_all<C: rdkafka::producer::ProducerContext + 'static>(
    producer: &impl rdkafka::producer::Producer<C>,
    bootstrap: &str,
) {
    let started = Instant::now();
    while producer.flush(Duration::from_secs(10)).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{} records to {bootstrap} still unacknowledged after {:?}",
            producer.in_flight_count(),
            started.elapsed()
        );
    }
}

/// Producer `writer` of `writers` sends its share of `0..writers * each` (the numbers `n` with
/// `n % writers == writer`) to `topic`, keyed "partition:offset" of a 4-partition input as the
/// pipeline tests' output is (the partition is the key's hash), in librdkafka's default batches,
/// starting when every writer is ready (`start`); returns how many writes the broker
/// acknowledged, once every write is answered.
pub fn produce_keyed_counted(
    bootstrap: &str,
    topic: &str,
    writer: u64,
    writers: u64,
    each: u64,
    start: &std::sync::Barrier,
) -> u64 {
    use rdkafka::producer::{DeliveryResult, ProducerContext, ThreadedProducer};
    struct Count(AtomicU64);
    impl rdkafka::ClientContext for Count {}
    impl ProducerContext for Count {
        type DeliveryOpaque = ();
        fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
            if result.is_ok() {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    let producer: ThreadedProducer<Count> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create_with_context(Count(AtomicU64::new(0)))
        .unwrap();
    start.wait();
    for n in (writer..writers * each).step_by(writers as usize) {
        let (key, value) = (format!("{}:{}", n % 4, n / 4), n.to_string());
        let mut record = BaseRecord::to(topic).key(&key).payload(&value);
        while let Err((_, back)) = producer.send(record) {
            record = back;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    flush_all(&producer, bootstrap);
    producer.context().0.load(Ordering::Relaxed)
}

/// Every number arriving in `topic` (all partitions, from the start) with when it arrived,
/// appended to `seen` until `stop`.
pub fn record_arrivals(
    bootstrap: String,
    topic: &'static str,
    partitions: i32,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<(u64, Instant)>>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let consumer = reader(&bootstrap, topic, partitions);
        let started = Instant::now();
        while !stop.load(Ordering::Relaxed) && started.elapsed() < LIMIT {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(50))
                && let Some(n) = m.payload().and_then(|p| std::str::from_utf8(p).ok()?.parse().ok())
            {
                seen.lock().unwrap().push((n, Instant::now()));
            }
        }
    })
}

/// A consumer of every partition of `topic` from the start, outside any group.
pub fn reader(bootstrap: &str, topic: &str, partitions: i32) -> BaseConsumer {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "test-reader")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, rdkafka::Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    consumer
}
