//! Executor statistics: counters and latencies that heartbeats and metrics read.
//!
//! Executors count locally and publish with relaxed atomics once per batch; latencies are
//! sampled (Storm's `topology.stats.sample.rate` 0.05: one tuple in 20).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cluster_state::ids::ExecutorId;
use cluster_state::znode::ExecutorStats;
use hdrhistogram::Histogram;

/// One tuple in this many has its execute latency measured (Storm's 0.05 sample rate).
pub(crate) const SAMPLE_EVERY: u64 = 20;

/// Live statistics of one executor.
#[derive(Debug)]
pub struct ExecStats {
    pub executor: ExecutorId,
    pub emitted: AtomicU64,
    pub transferred: AtomicU64,
    pub acked: AtomicU64,
    pub failed: AtomicU64,
    /// Spout tuples emitted and not yet acked or failed (spouts only).
    pub pending: AtomicU64,
    execute_ns: AtomicU64,
    execute_samples: AtomicU64,
    complete_ns: AtomicU64,
    complete_samples: AtomicU64,
    /// Complete latency in microseconds (spouts), for percentiles.
    complete_us: Mutex<Option<Histogram<u64>>>,
}

impl ExecStats {
    pub(crate) fn new(executor: ExecutorId) -> Self {
        ExecStats {
            executor,
            emitted: AtomicU64::new(0),
            transferred: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            pending: AtomicU64::new(0),
            execute_ns: AtomicU64::new(0),
            execute_samples: AtomicU64::new(0),
            complete_ns: AtomicU64::new(0),
            complete_samples: AtomicU64::new(0),
            complete_us: Mutex::new(Histogram::new_with_bounds(1, 60_000_000, 2).ok()),
        }
    }

    pub(crate) fn record_execute(&self, d: Duration) {
        self.execute_ns.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        self.execute_samples.fetch_add(1, Ordering::Relaxed);
    }

    /// Merges a batch of complete latencies (spout executor, once per loop at most).
    pub(crate) fn record_complete(&self, local: &mut Histogram<u64>, sum_ns: u64, n: u64) {
        if n == 0 {
            return;
        }
        self.complete_ns.fetch_add(sum_ns, Ordering::Relaxed);
        self.complete_samples.fetch_add(n, Ordering::Relaxed);
        if let Ok(mut guard) = self.complete_us.lock()
            && let Some(h) = guard.as_mut()
        {
            let _ = h.add(&*local);
        }
        local.reset();
    }

    /// Complete latency percentiles `(p50, p99)` in microseconds, and the sample count.
    pub fn complete_percentiles_us(&self) -> (u64, u64, u64) {
        match self.complete_us.lock() {
            Ok(guard) => match guard.as_ref() {
                Some(h) => (h.value_at_quantile(0.5), h.value_at_quantile(0.99), h.len()),
                None => (0, 0, 0),
            },
            Err(_) => (0, 0, 0),
        }
    }

    /// Clears the latency histogram (benchmarks measure a window).
    pub fn reset_complete_histogram(&self) {
        if let Ok(mut guard) = self.complete_us.lock()
            && let Some(h) = guard.as_mut()
        {
            h.reset();
        }
    }

    /// The heartbeat's view.
    pub fn snapshot(&self) -> ExecutorStats {
        let avg_ms = |ns: &AtomicU64, n: &AtomicU64| {
            let n = n.load(Ordering::Relaxed);
            if n == 0 { 0.0 } else { ns.load(Ordering::Relaxed) as f64 / n as f64 / 1e6 }
        };
        let execute = avg_ms(&self.execute_ns, &self.execute_samples);
        ExecutorStats {
            executor: self.executor,
            emitted: self.emitted.load(Ordering::Relaxed),
            transferred: self.transferred.load(Ordering::Relaxed),
            acked: self.acked.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            execute_latency_ms: execute,
            // Bolts ack within execute in every built-in; Squall reports the sampled execute
            // time as process latency until acks outside execute are timed too.
            process_latency_ms: execute,
            complete_latency_ms: avg_ms(&self.complete_ns, &self.complete_samples),
        }
    }
}
