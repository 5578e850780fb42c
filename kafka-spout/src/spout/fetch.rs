//! The spout's fetch path: messages taken from librdkafka a batch at a time
//! (`rd_kafka_consume_batch_queue`: one call per batch where `BaseConsumer::poll` made one per
//! message, with an event and a reference count allocated for each), and the client's log
//! lines and errors served on their own queue.
//!
//! The only unsafe code of the crate, kept to these wrappers:
//! - [`Fetcher::new`] takes a reference to the consumer's queue (where the fetched messages of
//!   every assigned partition and the consumer errors arrive) and to the main queue (log lines,
//!   client errors, statistics, commit replies), and stops forwarding the main queue into the
//!   consumer queue, which rdkafka's `BaseConsumer` set up (`rd_kafka_poll_set_consumer`). The
//!   batch call returns only messages and consumer errors; any other operation reaching it
//!   (a commit reply, which rdkafka routes to the main queue) would abort the process in
//!   librdkafka, so the main queue must stay apart. The spout assigns partitions itself (no
//!   `subscribe`): no rebalance operation is ever queued.
//! - A [`Batch`] owns the messages the call returned and destroys each one
//!   (`rd_kafka_message_destroy`) when dropped, after the spout has copied what it keeps; a
//!   [`Fetched`] borrows one of them.
//! - [`Fetcher::serve_events`] drains the main queue without waiting: log lines go to the
//!   task's [`SpoutContext`] as `BaseConsumer::poll` sent them, client errors too and back to
//!   the caller; anything else (statistics, commit replies) is destroyed.
//! - Dropping a [`Fetcher`] forwards the main queue to the consumer queue again (rdkafka's
//!   close serves only the latter) and gives both queue references back before its `Arc` of
//!   the consumer goes, so the client outlives them.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::Arc;

use rdkafka::ClientContext as _;
use rdkafka::bindings as rd;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::Consumer as _;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use crate::context::TaskConsumer;

/// Events served from the main queue per call at most (log lines arrive a few at a time).
const MAX_EVENTS: usize = 64;

/// A reference to a librdkafka queue, given back on drop.
struct Queue(NonNull<rd::rd_kafka_queue_t>);

// SAFETY: librdkafka's queues are locked internally; a handle may be used and destroyed from
// any thread.
unsafe impl Send for Queue {}
// SAFETY: as above.
unsafe impl Sync for Queue {}

impl Drop for Queue {
    fn drop(&mut self) {
        // SAFETY: the handle is ours (from `rd_kafka_queue_get_*`) and destroyed only here.
        unsafe { rd::rd_kafka_queue_destroy(self.0.as_ptr()) }
    }
}

/// A spout task's consumer, read a batch at a time.
pub(crate) struct Fetcher {
    /// Fields drop in order: the queues before the client they belong to.
    consumer_queue: Queue,
    main_queue: Queue,
    /// The batch call's output array, reused.
    slots: Vec<*mut rd::rd_kafka_message_t>,
    consumer: Arc<TaskConsumer>,
}

// SAFETY: `slots` only holds pointers while a `Batch` (which borrows the fetcher mutably) is
// alive; between batches it holds none that are live. The queues are `Send`.
unsafe impl Send for Fetcher {}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher").field("batch", &self.slots.capacity()).finish()
    }
}

impl Fetcher {
    /// Reads `consumer` (created with a `group.id`, so it has a consumer queue) in batches of
    /// at most `max_batch` messages. Log lines and errors are then served only by
    /// [`Fetcher::serve_events`].
    pub(crate) fn new(consumer: Arc<TaskConsumer>, max_batch: usize) -> Result<Self, String> {
        let rk = consumer.client().native_ptr();
        // SAFETY: `rk` is the live client `consumer` holds; each call returns a new reference
        // (or null), given back by `Queue`'s drop.
        let (consumer_queue, main_queue) =
            unsafe { (rd::rd_kafka_queue_get_consumer(rk), rd::rd_kafka_queue_get_main(rk)) };
        let consumer_queue = NonNull::new(consumer_queue).map(Queue);
        let main_queue = NonNull::new(main_queue).map(Queue);
        let (Some(consumer_queue), Some(main_queue)) = (consumer_queue, main_queue) else {
            return Err("librdkafka gave no consumer queue (the consumer needs a group.id)".into());
        };
        // SAFETY: both handles are live; a null destination ends the forwarding.
        unsafe { rd::rd_kafka_queue_forward(main_queue.0.as_ptr(), std::ptr::null_mut()) };
        Ok(Fetcher { consumer_queue, main_queue, slots: Vec::with_capacity(max_batch.max(1)), consumer })
    }

    /// Takes what librdkafka has ready, at most `max` messages (and the batch size), without
    /// waiting. Consumer errors (end of partition, offset resets, fetch errors) come as
    /// messages with [`Fetched::error`] set.
    pub(crate) fn fetch(&mut self, max: usize) -> Batch<'_> {
        let max = max.min(self.slots.capacity());
        self.slots.clear();
        // SAFETY: the queue is live and `slots` has room for `max` pointers, which librdkafka
        // writes before returning how many it wrote; each is then owned by the `Batch`.
        let n = unsafe {
            rd::rd_kafka_consume_batch_queue(self.consumer_queue.0.as_ptr(), 0, self.slots.as_mut_ptr(), max)
        };
        // -1: an error (librdkafka sets errno); nothing was taken.
        let n = usize::try_from(n).unwrap_or(0).min(max);
        // SAFETY: librdkafka initialised the first `n` slots.
        unsafe { self.slots.set_len(n) };
        Batch { messages: &mut self.slots }
    }

    /// Moves `partition`'s fetch position to `offset` without waiting (librdkafka's seek):
    /// messages of it fetched earlier and still queued are discarded by librdkafka (the seek
    /// bumps the partition's version, and older messages are filtered out of the queue).
    pub(crate) fn seek(&self, topic: &str, partition: i32, offset: i64) -> Result<(), KafkaError> {
        self.consumer.seek(topic, partition, rdkafka::Offset::Offset(offset), std::time::Duration::ZERO)
    }

    /// Serves what waits on the main queue, without waiting: log lines and client errors go
    /// to the task's context (as `BaseConsumer::poll` sent them); each client error is also
    /// passed to `on_error`, with its reason. Other events are dropped.
    pub(crate) fn serve_events(&self, mut on_error: impl FnMut(String)) {
        let context = self.consumer.context();
        for _ in 0..MAX_EVENTS {
            // SAFETY: the queue is live; a non-null event is ours until destroyed below.
            let event = unsafe { rd::rd_kafka_queue_poll(self.main_queue.0.as_ptr(), 0) };
            let Some(event) = NonNull::new(event) else { return };
            let event = Event(event);
            let ev = event.0.as_ptr();
            // SAFETY: `ev` is live until `event` drops; librdkafka's strings live as long.
            match unsafe { rd::rd_kafka_event_type(ev) } {
                rd::RD_KAFKA_EVENT_LOG => {
                    let (mut fac, mut text, mut level) = (std::ptr::null(), std::ptr::null(), 0);
                    // SAFETY: as above; the out-pointers are valid.
                    if unsafe { rd::rd_kafka_event_log(ev, &mut fac, &mut text, &mut level) } == 0 {
                        // SAFETY: set by librdkafka to NUL-terminated strings of the event.
                        let (fac, text) = unsafe { (c_str(fac), c_str(text)) };
                        context.log(log_level(level), &fac, &text);
                    }
                }
                rd::RD_KAFKA_EVENT_ERROR => {
                    // SAFETY: as above.
                    let (code, reason, fatal) = unsafe {
                        (
                            rd::rd_kafka_event_error(ev),
                            c_str(rd::rd_kafka_event_error_string(ev)),
                            rd::rd_kafka_event_error_is_fatal(ev) != 0,
                        )
                    };
                    let code = RDKafkaErrorCode::from(code);
                    context.error(KafkaError::Global(code), reason.trim());
                    let fatal = if fatal { "fatal " } else { "" };
                    on_error(format!("{fatal}{code}: {}", reason.trim()));
                }
                _ => {}
            }
        }
    }
}

impl Drop for Fetcher {
    fn drop(&mut self) {
        // The consumer goes back as rdkafka set it up: its close (in `BaseConsumer`'s drop)
        // polls the consumer queue only. Without this, librdkafka's destroy waited forever on
        // a broker thread (seen in the mock-cluster tests, after commits and watermark reads).
        // SAFETY: both handles are live until the fields drop, after this.
        unsafe { rd::rd_kafka_queue_forward(self.main_queue.0.as_ptr(), self.consumer_queue.0.as_ptr()) };
    }
}

/// An event taken from a queue, destroyed on drop.
struct Event(NonNull<rd::rd_kafka_event_t>);

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event is ours (from `rd_kafka_queue_poll`) and destroyed only here.
        unsafe { rd::rd_kafka_event_destroy(self.0.as_ptr()) }
    }
}

/// A C string of librdkafka's, as text (empty for null).
///
/// # Safety
/// `s` is null or a NUL-terminated string alive for the call.
unsafe fn c_str(s: *const std::ffi::c_char) -> String {
    if s.is_null() {
        return String::new();
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

/// A syslog level (librdkafka's) as rdkafka's.
fn log_level(level: i32) -> RDKafkaLogLevel {
    match level {
        0 => RDKafkaLogLevel::Emerg,
        1 => RDKafkaLogLevel::Alert,
        2 => RDKafkaLogLevel::Critical,
        3 => RDKafkaLogLevel::Error,
        4 => RDKafkaLogLevel::Warning,
        5 => RDKafkaLogLevel::Notice,
        6 => RDKafkaLogLevel::Info,
        _ => RDKafkaLogLevel::Debug,
    }
}

/// The messages one call returned; each is destroyed when the batch drops.
pub(crate) struct Batch<'a> {
    messages: &'a mut Vec<*mut rd::rd_kafka_message_t>,
}

impl Batch<'_> {
    pub(crate) fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = Fetched<'_>> {
        // SAFETY: each pointer is a live message owned by this batch until it drops.
        self.messages.iter().filter_map(|&m| unsafe { m.as_ref() }).map(Fetched)
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        for m in self.messages.drain(..) {
            // SAFETY: returned by `rd_kafka_consume_batch_queue`, destroyed once, here; no
            // `Fetched` outlives the batch.
            unsafe { rd::rd_kafka_message_destroy(m) }
        }
    }
}

/// One message (or consumer error) of a [`Batch`].
#[derive(Clone, Copy)]
pub(crate) struct Fetched<'a>(&'a rd::rd_kafka_message_t);

impl<'a> Fetched<'a> {
    /// Set for a consumer error (end of partition, offset reset, fetch error), not a message.
    pub(crate) fn error(&self) -> Option<RDKafkaErrorCode> {
        (self.0.err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
            .then(|| RDKafkaErrorCode::from(self.0.err))
    }

    /// A consumer error's text (librdkafka puts it in the payload).
    pub(crate) fn error_text(&self) -> String {
        String::from_utf8_lossy(self.payload().unwrap_or_default()).into_owned()
    }

    /// The topic's name (empty when librdkafka gives none, or not UTF-8, which Kafka's topic
    /// names always are).
    pub(crate) fn topic(&self) -> &'a str {
        if self.0.rkt.is_null() {
            return "";
        }
        // SAFETY: the message holds a reference to its topic, whose name is a NUL-terminated
        // string alive as long as the topic.
        let name = unsafe { rd::rd_kafka_topic_name(self.0.rkt) };
        if name.is_null() {
            return "";
        }
        // SAFETY: as above.
        unsafe { CStr::from_ptr(name) }.to_str().unwrap_or_default()
    }

    pub(crate) fn partition(&self) -> i32 {
        self.0.partition
    }

    pub(crate) fn offset(&self) -> i64 {
        self.0.offset
    }

    pub(crate) fn key(&self) -> Option<&'a [u8]> {
        // SAFETY: librdkafka's key of `key_len` bytes, alive as long as the message.
        unsafe { bytes_of(self.0.key, self.0.key_len) }
    }

    pub(crate) fn payload(&self) -> Option<&'a [u8]> {
        // SAFETY: librdkafka's payload of `len` bytes, alive as long as the message.
        unsafe { bytes_of(self.0.payload, self.0.len) }
    }

    /// Create or log-append time in milliseconds, if the message has one.
    pub(crate) fn timestamp_ms(&self) -> Option<i64> {
        let mut kind = rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE;
        // SAFETY: a live message and a valid out-pointer.
        let ts = unsafe { rd::rd_kafka_message_timestamp(self.0, &mut kind) };
        (kind != rd::rd_kafka_timestamp_type_t::RD_KAFKA_TIMESTAMP_NOT_AVAILABLE).then_some(ts)
    }
}

/// `len` bytes at `ptr`, `None` for a null pointer.
///
/// # Safety
/// `ptr` is null or points to `len` bytes alive for `'a`.
unsafe fn bytes_of<'a>(ptr: *mut std::ffi::c_void, len: usize) -> Option<&'a [u8]> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: the caller's promise.
    Some(unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::time::{Duration, Instant};

    use rdkafka::{Offset, TopicPartitionList};

    use super::*;
    use crate::context::SpoutContext;

    #[test]
    fn client_errors_are_served_on_their_own_queue_and_never_in_a_batch() {
        // Nothing listens on port 1: librdkafka reports the refused connections as client
        // errors on its main queue.
        let consumer: TaskConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", "127.0.0.1:1")
            .set("group.id", "g")
            .create_with_context(SpoutContext { component: "spout".into(), task: 1 })
            .unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("t", 0, Offset::Beginning).unwrap();
        consumer.assign(&tpl).unwrap();
        let mut fetcher = Fetcher::new(Arc::new(consumer), 8).unwrap();
        let mut errors = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while errors.is_empty() {
            assert!(Instant::now() < deadline, "no client error served");
            // Had the main queue stayed forwarded, the error would be swallowed here.
            assert!(fetcher.fetch(8).is_empty());
            fetcher.serve_events(|e| errors.push(e));
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(errors.iter().any(|e| e.contains("127.0.0.1:1")), "{errors:?}");
    }
}
