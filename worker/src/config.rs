//! Topology configuration: Storm's keys, Storm's defaults (defaults.yaml), validated once.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The longest `squall.batch.flush.interval.us` accepted (every partial batch may wait that
/// long at each hop), and the longest `squall.spout.wait.short.us`.
const MAX_FLUSH_INTERVAL_US: u64 = 1_000_000;

/// A topology's `config:` section. Keys are Storm's dotted names.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopologyConfig {
    /// `topology.workers`: worker processes (slots) to run the topology on. Storm: 1.
    #[serde(rename = "topology.workers")]
    pub workers: u32,
    /// `topology.acker.executors`: acker executors; `null` means one per worker (Storm's
    /// default), `0` turns acking off (spout tuples are acked as soon as they are emitted).
    #[serde(rename = "topology.acker.executors")]
    pub acker_executors: Option<u32>,
    /// `topology.message.timeout.secs`: a spout tuple whose tree is not complete in this time
    /// fails. Storm: 30.
    #[serde(rename = "topology.message.timeout.secs")]
    pub message_timeout_secs: u64,
    /// `topology.max.spout.pending`: pending (emitted, not yet acked or failed) tuples per spout
    /// task; `null` is unbounded (Storm's default). Only tuples with a message id count.
    ///
    /// It bounds the complete latency too: tuples in flight are the rate times the time each
    /// spends in the topology (Little's law), so a bound of a span of the rate keeps a backlog
    /// (after the host stalled a thread) from queueing much more than that span of work. Take
    /// about half the latency you want: a backlog drains only a little faster than the rate,
    /// and each tuple waits behind about a bound's worth while it does. Word count at 373-404k
    /// sentences/s on 2 cores: 0.5 ms of the rate kept p99 <= 1 ms in 18 of 18 runs against 2
    /// of 18 with 20,000, at the same delivered rate (1 ms of it, at 429-439k: 12 of 18, p99
    /// up to 1.6 ms); a bound of 215 cut full load to 642k from 757k sentences/s.
    #[serde(rename = "topology.max.spout.pending")]
    pub max_spout_pending: Option<u32>,
    /// `topology.tick.tuple.freq.secs`: tick tuples to every bolt task at this period; `null`
    /// sends none (Storm's default).
    #[serde(rename = "topology.tick.tuple.freq.secs")]
    pub tick_tuple_freq_secs: Option<u64>,
    /// `topology.executor.receive.buffer.size`: tuples a bolt executor's inbound queue holds
    /// before senders block. Storm 2: 32768.
    #[serde(rename = "topology.executor.receive.buffer.size")]
    pub executor_receive_buffer_size: u32,
    /// `topology.producer.batch.size`: tuples an executor groups per destination before handing
    /// them over (a partial batch goes as soon as the executor runs out of input, so a trickle
    /// is never held back). Storm 2 defaults to 1; Squall uses 1024: a consumer that keeps up
    /// waits between batches, and waking it per 1024 tuples instead of per 64 halves the CPU a
    /// saturated pipeline spends per tuple (`cargo bench -p worker --bench wordcount`), while
    /// the complete latency at half load stays under 1 ms. Lower it to trade CPU for latency.
    #[serde(rename = "topology.producer.batch.size")]
    pub producer_batch_size: u32,
    /// `squall.batch.flush.interval.us`: the pace of partial batches, in microseconds. An
    /// executor that runs out of input hands its partial batches over at once, unless a
    /// destination got three within one interval: then it gets at most one per interval (the
    /// batch keeps collecting until due), for as long as holding it merges more than one
    /// pass's output. A full batch always goes at once, and a trickle is not held back. At
    /// half load this cut a word count's CPU per sentence by 40%, for ~85 us more median
    /// latency. 0 hands every partial batch over as soon as the executor runs out of input.
    /// Storm 2's nearest is `topology.batch.flush.interval.millis` (1 ms, a timer flushing
    /// every executor's partial batches). Squall: 100.
    #[serde(rename = "squall.batch.flush.interval.us")]
    pub batch_flush_interval_us: u64,
    /// `squall.executor.inline.downstream`: whether a bolt executor that works on the last
    /// batch in its queue, or a spout executor with no verdicts waiting, runs a partial batch
    /// for an idle bolt executor of its worker on its own thread, instead of queueing it and
    /// waking that executor's thread; only a batch expected to take at most 1 ms by what that
    /// executor's recent batches took per tuple. What runs so hands its own partial batches
    /// over the same way. At partial load fewer threads then compete for the cores (a word
    /// count's spout splits and counts its own sentences, with no hand-over, while they keep
    /// up); under load every executor keeps its own thread. Only for topologies without cycles.
    /// Flink's nearest is operator chaining. A bolt that panics while run inline stops its own
    /// executor, not the upstream one. Squall: true (word count at 450k sentences/s, two
    /// cores: p99 complete latency <= 1 ms in 16 of 24 runs against 10 of 24 with it off, and
    /// more sentences per CPU-second in 4 of 4 pairs; at full load and on Kafka -> word count
    /// no loss beyond the host's noise; spouts and chains since 2026-11-28: see
    /// `docs/performance-log.md`).
    #[serde(rename = "squall.executor.inline.downstream")]
    pub inline_downstream: bool,
    /// `topology.sleep.spout.wait.strategy.time.ms`: how long a spout that emitted nothing (or
    /// hit max pending) waits before trying again, in milliseconds. Storm: 1.
    #[serde(rename = "topology.sleep.spout.wait.strategy.time.ms")]
    pub spout_wait_ms: u64,
    /// `squall.spout.wait.short.us`: how long a spout that emitted nothing waits at first, in
    /// microseconds: it looks again this often for the first
    /// `topology.sleep.spout.wait.strategy.time.ms` of an idle streak, then at that longer
    /// wait until it emits again (an idle spout wakes ten times in a streak's first
    /// millisecond, then as often as before). A spout whose input trickles in (a rate limit, a
    /// fetch that just came in) then emits it in small bursts instead of one burst per
    /// millisecond that the whole pipeline works through in order: word count at 200k
    /// sentences/s on two cores, median complete latency 70-72 against 455-465 us and p99
    /// 112-128 against 915-983 us, at the same CPU per sentence. A spout held back by
    /// `topology.max.spout.pending` waits the longer wait (its verdicts end it). 0 waits the
    /// longer wait only. Storm 2's nearest is `WaitStrategyProgressive` (parks, then sleeps
    /// `topology.spout.wait.progressive.level3.sleep.millis`). Squall: 100.
    #[serde(rename = "squall.spout.wait.short.us")]
    pub spout_wait_short_us: u64,
    /// `squall.spout.linger.us`: after a pass that emitted but ran dry within this many
    /// microseconds (a rate-limited spout, a trickle of fetches), a spout executor waits until
    /// that long after the pass began before its next, taking verdicts meanwhile. Without it,
    /// a spout emitting a steady stream at partial load makes passes of one to four tuples
    /// back to back, and its thread, running the tree inline, never leaves the core that
    /// woken downstream threads and the host's own work need (issue 21: with it and a spout's
    /// thread taking a few queued batches over, `BoltCell::try_run`, word count's half-load p99
    /// <= 1 ms held in 6, 5, 4 of 6 runs against 4, 3, 3 before, interleaved; neither alone did
    /// better than before). What a tuple waits here is before its emit, so complete latency
    /// does not count it. 0: no wait. Squall: 10.
    #[serde(rename = "squall.spout.linger.us")]
    pub spout_linger_us: u64,
    /// `topology.enable.message.timeouts`: whether pending tuples time out. Storm: true.
    #[serde(rename = "topology.enable.message.timeouts")]
    pub enable_message_timeouts: bool,
    /// `topology.error.throttle.interval.secs`: window of the error report rate limit. Storm: 10.
    #[serde(rename = "topology.error.throttle.interval.secs")]
    pub error_throttle_interval_secs: u64,
    /// `topology.max.error.report.per.interval`: errors reported per component and window.
    /// Storm: 5.
    #[serde(rename = "topology.max.error.report.per.interval")]
    pub max_error_report_per_interval: u32,
    /// `squall.workerbeats.zk.secs`: the shortest time between two writes of a worker's
    /// `/storm/workerbeats` node, which is also written only when its content changed (liveness
    /// goes through the supervisor's heartbeat to nimbus; the node is for tools). Squall: 60.
    #[serde(rename = "squall.workerbeats.zk.secs")]
    pub workerbeats_zk_secs: u64,
    /// `topology.subprocess.timeout.secs`: a multilang subprocess that says nothing this long
    /// (a bolt: not even to heartbeats; a spout: no `sync` to a command) is killed and restarted.
    /// Storm: null, meaning `supervisor.worker.timeout.secs` (30).
    #[serde(rename = "topology.subprocess.timeout.secs")]
    pub subprocess_timeout_secs: Option<u64>,
    /// `topology.shellbolt.max.pending`: tuples queued for a shell bolt's subprocess before its
    /// executor waits. Storm: 100.
    #[serde(rename = "topology.shellbolt.max.pending")]
    pub shellbolt_max_pending: u32,
    /// `topology.transport.tls`: whether the topology's workers talk to each other over mutual
    /// TLS 1.3 with the topology's key (derived from its secret; see `transport`'s `tls.rs`)
    /// instead of plain TCP. The HMAC handshake runs either way. Squall: false (plain TCP,
    /// as `squall local` and loopback tests want).
    #[serde(rename = "topology.transport.tls")]
    pub transport_tls: bool,
    /// `squall.worker.cpu.latency.us`: how fast, in microseconds, each worker process of the
    /// topology asks idle CPUs to wake while it runs (Linux PM QoS, held through
    /// `/dev/cpu_dma_latency`; see `cpu_latency`). At 0 idle CPUs poll instead of halting, so
    /// waking a parked executor thread costs its sender little: word count at half load on 2
    /// cores, median complete latency 40-43 against 79-88 us, and p99 <= 1 ms in 18 of 18 runs
    /// against 13 of 18 with a neighbour process taking 3 ms of every 33 (issue 21). Idle
    /// CPUs then spend power and host CPU time polling, for the whole machine, while a worker
    /// holds it. A worker that may not write the device logs a warning and runs on. Squall:
    /// null (the machine's setting).
    #[serde(rename = "squall.worker.cpu.latency.us")]
    pub cpu_latency_us: Option<u32>,
}

impl Default for TopologyConfig {
    /// Storm's defaults.yaml, except `topology.producer.batch.size` (see its doc).
    fn default() -> Self {
        TopologyConfig {
            workers: 1,
            acker_executors: None,
            message_timeout_secs: 30,
            max_spout_pending: None,
            tick_tuple_freq_secs: None,
            executor_receive_buffer_size: 32768,
            producer_batch_size: 1024,
            spout_wait_ms: 1,
            spout_wait_short_us: 100,
            spout_linger_us: 10,
            batch_flush_interval_us: 100,
            inline_downstream: true,
            enable_message_timeouts: true,
            error_throttle_interval_secs: 10,
            max_error_report_per_interval: 5,
            workerbeats_zk_secs: 60,
            subprocess_timeout_secs: None,
            shellbolt_max_pending: 100,
            transport_tls: false,
            cpu_latency_us: None,
        }
    }
}

impl TopologyConfig {
    /// Checks ranges; the error names the key.
    pub fn validate(&self) -> Result<()> {
        let positive = |key: &'static str, v: u64| {
            if v == 0 { Err(Error::BadConfig { key, reason: "must be at least 1".into() }) } else { Ok(()) }
        };
        positive("topology.workers", u64::from(self.workers))?;
        positive("topology.message.timeout.secs", self.message_timeout_secs)?;
        positive("topology.executor.receive.buffer.size", u64::from(self.executor_receive_buffer_size))?;
        positive("topology.producer.batch.size", u64::from(self.producer_batch_size))?;
        positive("topology.error.throttle.interval.secs", self.error_throttle_interval_secs)?;
        positive("squall.workerbeats.zk.secs", self.workerbeats_zk_secs)?;
        if let Some(p) = self.max_spout_pending {
            positive("topology.max.spout.pending", u64::from(p))?;
        }
        positive("topology.shellbolt.max.pending", u64::from(self.shellbolt_max_pending))?;
        if let Some(t) = self.subprocess_timeout_secs {
            positive("topology.subprocess.timeout.secs", t)?;
        }
        if let Some(t) = self.tick_tuple_freq_secs {
            positive("topology.tick.tuple.freq.secs", t)?;
        }
        // `default` completes the error: what the key is when it is not set.
        let at_most_a_second = |key: &'static str, us: u64, default: &str| {
            if us > MAX_FLUSH_INTERVAL_US {
                let reason = format!("must be at most {MAX_FLUSH_INTERVAL_US} (1 s); {default}");
                Err(Error::BadConfig { key, reason })
            } else {
                Ok(())
            }
        };
        at_most_a_second(
            "squall.batch.flush.interval.us",
            self.batch_flush_interval_us,
            "100 is the default",
        )?;
        at_most_a_second("squall.spout.wait.short.us", self.spout_wait_short_us, "100 is the default")?;
        at_most_a_second("squall.spout.linger.us", self.spout_linger_us, "10 is the default")?;
        if let Some(us) = self.cpu_latency_us {
            let default = "unset (null) leaves the machine's setting; 0 keeps idle CPUs polling";
            at_most_a_second("squall.worker.cpu.latency.us", u64::from(us), default)?;
        }
        if self.producer_batch_size > self.executor_receive_buffer_size {
            return Err(Error::BadConfig {
                key: "topology.producer.batch.size",
                reason: "must not exceed topology.executor.receive.buffer.size".into(),
            });
        }
        Ok(())
    }

    /// Acker executors in effect: the configured count, else one per worker.
    pub fn effective_acker_executors(&self) -> u32 {
        self.acker_executors.unwrap_or(self.workers)
    }

    /// Batches a bolt's inbound queue holds.
    pub(crate) fn queue_batches(&self) -> usize {
        (self.executor_receive_buffer_size / self.producer_batch_size.max(1)).max(2) as usize
    }
}
