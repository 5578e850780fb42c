//! The Kafka producer bolt (a sink): writes a field of each tuple as the record value (and
//! optionally another as the key) and acks the input only once the broker acknowledged the
//! write; a write the broker refuses, or that times out (`message.timeout.ms`), fails the input
//! so the spout replays it.
//!
//! librdkafka reports deliveries on its own polling thread; they reach the executor thread
//! through a channel, and each report wakes the executor ([`Bolt::waker`]), which applies
//! them in [`Bolt::poll`] at once: the last writes of a burst are acked as soon as the broker
//! answered, not at the next input. (They waited for a tick tuple, up to a second, before.)
//!
//! A producer that hit a fatal error (librdkafka's word: an idempotent producer whose state
//! with the broker it can no longer reason about, a write lost under
//! `enable.gapless.guarantee`) refuses every write from then on. The bolt fails the inputs
//! whose writes were in flight (the spout replays them) and starts a new producer. Before, it
//! failed every input from then on, and the topology replayed the same tuples into a dead
//! producer until it was restarted.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

use prometheus::IntCounter;
use rdkafka::ClientContext;
use rdkafka::error::KafkaError;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use worker::{Bolt, BoltCollector, ComponentError, TopologyContext, Tuple, Value};

use crate::config::KafkaBoltConfig;
use crate::error::Error;
use crate::metrics::BoltMetrics;

/// How long `cleanup` waits for writes still in flight.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends delivery reports (write number, outcome) to the executor thread, and wakes it.
struct DeliveryContext {
    reports: std::sync::Mutex<Sender<(usize, Result<(), KafkaError>)>>,
    /// Bounded to one: wake-ups while the executor has not woken yet coalesce.
    wake: crossbeam_channel::Sender<()>,
}

impl ClientContext for DeliveryContext {}

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, write: usize) {
        let outcome = result.as_ref().map(|_| ()).map_err(|(e, _)| e.clone());
        // The bolt is gone (shutdown): nobody is left to ack.
        let _ = self.reports.lock().unwrap_or_else(std::sync::PoisonError::into_inner).send((write, outcome));
        // Full: a wake-up is already pending, and it applies this report too.
        let _ = self.wake.try_send(());
    }
}

/// The producer bolt. One per task.
pub struct KafkaBolt {
    config: Arc<KafkaBoltConfig>,
    metrics: BoltMetrics,
    running: Option<Running>,
    wake_tx: crossbeam_channel::Sender<()>,
    wake_rx: crossbeam_channel::Receiver<()>,
}

impl std::fmt::Debug for KafkaBolt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaBolt").field("topic", &self.config.topic).finish_non_exhaustive()
    }
}

struct Running {
    producer: ThreadedProducer<DeliveryContext>,
    reports: Reports,
    in_flight: HashMap<usize, Tuple>,
    next_write: usize,
    written: IntCounter,
    errors: IntCounter,
    restarts: IntCounter,
}

/// Where a producer's delivery reports come: (write number, outcome).
type Reports = Receiver<(usize, Result<(), KafkaError>)>;

/// A producer whose delivery reports come to the returned receiver and wake the executor
/// through `wake`.
fn start_producer(
    config: &KafkaBoltConfig,
    wake: &crossbeam_channel::Sender<()>,
) -> Result<(ThreadedProducer<DeliveryContext>, Reports), Error> {
    let (tx, reports) = channel();
    let context = DeliveryContext { reports: std::sync::Mutex::new(tx), wake: wake.clone() };
    let producer = config
        .producer_config()
        .create_with_context(context)
        .map_err(|source| Error::Client { context: "creating the producer", source })?;
    Ok((producer, reports))
}

impl KafkaBolt {
    /// A bolt task with this (validated) configuration.
    pub fn new(config: Arc<KafkaBoltConfig>, metrics: BoltMetrics) -> Self {
        let (wake_tx, wake_rx) = crossbeam_channel::bounded(1);
        KafkaBolt { config, metrics, running: None, wake_tx, wake_rx }
    }
}

fn bytes(value: &Value) -> Option<Vec<u8>> {
    match value {
        Value::Null => None,
        Value::Bytes(b) => Some(b.to_vec()),
        Value::Str(s) => Some(s.as_bytes().to_vec()),
        other => Some(other.to_string().into_bytes()),
    }
}

impl Running {
    /// After a fatal error of the producer (if it has one): fails every input whose write was
    /// in flight (its outcome is unknown; the spout replays it) and replaces the producer with
    /// a new one. Says whether it did; an error when no new producer could be made.
    fn restart_if_fatal(
        &mut self,
        config: &KafkaBoltConfig,
        wake: &crossbeam_channel::Sender<()>,
        out: &mut BoltCollector<'_>,
    ) -> Result<bool, Error> {
        let Some((code, reason)) = self.producer.client().fatal_error() else { return Ok(false) };
        tracing::error!(topic = %config.topic, ?code, %reason, in_flight = self.in_flight.len(), "the Kafka producer hit a fatal error: failing the writes in flight (they replay) and starting a new producer");
        out.report_error(format!(
            "kafka producer: fatal error {code:?}: {reason}; its writes in flight replay, a new producer takes over"
        ));
        for (_, input) in self.in_flight.drain() {
            self.errors.inc();
            out.fail(&input);
        }
        let (producer, reports) = start_producer(config, wake)?;
        // The old producer's reports (of the writes just failed) go with its channel; dropping
        // it purges what it still held and waits for that at most 0.5 s (rdkafka's drop).
        drop(std::mem::replace(&mut self.producer, producer));
        self.reports = reports;
        self.restarts.inc();
        Ok(true)
    }

    /// Acks or fails the inputs whose writes were answered; with `wait`, blocks (bounded) for
    /// at least one answer.
    fn apply_reports(&mut self, out: &mut BoltCollector<'_>, wait: Option<Duration>) {
        let mut first = wait.and_then(|w| self.reports.recv_timeout(w).ok());
        loop {
            let Some((write, outcome)) = first.take().or_else(|| self.reports.try_recv().ok()) else { break };
            let Some(input) = self.in_flight.remove(&write) else { continue };
            match outcome {
                Ok(()) => {
                    self.written.inc();
                    out.ack(&input);
                }
                Err(e) => {
                    self.errors.inc();
                    out.report_error(format!("kafka producer: {e}"));
                    out.fail(&input);
                }
            }
        }
    }
}

impl Bolt for KafkaBolt {
    fn prepare(&mut self, context: &TopologyContext) -> Result<(), ComponentError> {
        let (producer, reports) = start_producer(&self.config, &self.wake_tx)?;
        let labels = [context.component_id.as_str(), self.config.topic.as_str()];
        self.running = Some(Running {
            producer,
            reports,
            in_flight: HashMap::new(),
            next_write: 0,
            written: self.metrics.written.with_label_values(&labels),
            errors: self.metrics.write_errors.with_label_values(&labels),
            restarts: self.metrics.producer_restarts.with_label_values(&labels),
        });
        Ok(())
    }

    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let Some(r) = &mut self.running else { return Ok(()) };
        if input.is_tick() {
            r.apply_reports(out, None);
            return Ok(());
        }
        while r.in_flight.len() >= self.config.max_in_flight as usize {
            r.apply_reports(out, Some(Duration::from_millis(100)));
        }
        r.apply_reports(out, None);
        let value = input
            .get_by_field(&self.config.value_field)
            .ok_or_else(|| Error::MissingField { field: self.config.value_field.clone() })?;
        let key = match &self.config.key_field {
            Some(field) => match input.get_by_field(field) {
                Some(v) => bytes(v),
                None => return Err(Box::new(Error::MissingField { field: field.clone() })),
            },
            None => None,
        };
        let payload = bytes(value);
        let write = r.next_write;
        r.next_write = r.next_write.wrapping_add(1);
        let mut record: BaseRecord<'_, [u8], [u8], usize> =
            BaseRecord::with_opaque_to(&self.config.topic, write);
        if let Some(k) = key.as_deref() {
            record = record.key(k);
        }
        if let Some(p) = payload.as_deref() {
            record = record.payload(p);
        }
        let mut restarted = false;
        loop {
            match r.producer.send(record) {
                Ok(()) => break,
                // librdkafka's queue is full: wait for answers, then try again.
                Err((KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull), back)) => {
                    record = back;
                    r.apply_reports(out, Some(Duration::from_millis(100)));
                }
                // Refused for a fatal error: once more, with a new producer.
                Err((source, back)) => {
                    if !restarted && r.restart_if_fatal(&self.config, &self.wake_tx, out)? {
                        restarted = true;
                        record = back;
                        continue;
                    }
                    return Err(Box::new(Error::Produce { topic: self.config.topic.clone(), source }));
                }
            }
        }
        r.in_flight.insert(write, input.clone());
        Ok(())
    }

    /// Applies the delivery reports that woke the executor (or that arrived since its last
    /// pass: it polls at least every 50 ms).
    ///
    /// A fatal error is looked for here too, so that a bolt whose inputs stopped (all failed,
    /// their replays not here yet) has a working producer when they come.
    fn poll(&mut self, out: &mut BoltCollector<'_>) {
        if let Some(r) = &mut self.running {
            r.apply_reports(out, None);
            if let Err(e) = r.restart_if_fatal(&self.config, &self.wake_tx, out) {
                out.report_error(format!("kafka producer: {e}"));
            }
        }
    }

    fn waker(&self) -> Option<crossbeam_channel::Receiver<()>> {
        Some(self.wake_rx.clone())
    }

    fn cleanup(&mut self) {
        if let Some(r) = &mut self.running
            && let Err(e) = r.producer.flush(FLUSH_TIMEOUT)
        {
            tracing::warn!(topic = %self.config.topic, error = %e, "flushing the producer on shutdown");
        }
    }
}
