//! Executor statistics: counters and latencies that heartbeats and metrics read.
//!
//! Executors count locally and publish with relaxed atomics once per batch; latencies are
//! sampled (Storm's `topology.stats.sample.rate` 0.05: one tuple in 20).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use cluster_state::ids::ExecutorId;
use cluster_state::znode::ExecutorStats;
use hdrhistogram::Histogram;

/// One tuple in this many has its execute latency measured (Storm's 0.05 sample rate).
pub(crate) const SAMPLE_EVERY: u64 = 20;

/// Upper bounds (seconds) of the latency histograms' buckets, shared by execute and complete
/// latency (Prometheus histograms; `+Inf` is implied).
pub const LATENCY_BUCKETS: [f64; 12] =
    [0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0];

/// [`LATENCY_BUCKETS`] in nanoseconds (rounded), for sorting a sample without floating point.
const LATENCY_BUCKETS_NS: [u64; LATENCY_BUCKETS.len()] = {
    let mut ns = [0; LATENCY_BUCKETS.len()];
    let mut i = 0;
    while i < ns.len() {
        ns[i] = (LATENCY_BUCKETS[i] * 1e9 + 0.5) as u64;
        i += 1;
    }
    ns
};

/// The clock that times sampled executes: the CPU's time-stamp counter where it runs at a
/// constant rate (x86-64 with an invariant TSC, AArch64), read without the fence of
/// `Instant::now` and scaled to nanoseconds by a calibration done once per process (at most
/// 200 ms, as a worker starts its executors); the monotonic clock elsewhere.
pub(crate) fn sample_clock() -> &'static quanta::Clock {
    static CLOCK: std::sync::OnceLock<quanta::Clock> = std::sync::OnceLock::new();
    CLOCK.get_or_init(quanta::Clock::new)
}

/// Execute latencies one executor thread sampled since it last added them to its
/// [`ExecStats`], timed by [`sample_clock`]: plain counters, added once per batch
/// ([`ExecuteSamples::publish`]). Three atomic adds and a search over floats per sample cost a
/// counting bolt ~5% of its words per CPU-s.
#[derive(Debug)]
pub(crate) struct ExecuteSamples {
    clock: &'static quanta::Clock,
    /// Executes until the next one timed (a countdown: a remainder per execute was a
    /// multiplication on every tuple).
    until_sample: u64,
    ns: u64,
    count: u64,
    buckets: [u64; LATENCY_BUCKETS.len() + 1],
}

impl ExecuteSamples {
    pub(crate) fn new() -> Self {
        ExecuteSamples {
            clock: sample_clock(),
            until_sample: SAMPLE_EVERY,
            ns: 0,
            count: 0,
            buckets: [0; LATENCY_BUCKETS.len() + 1],
        }
    }

    /// Whether this execute is one of every [`SAMPLE_EVERY`] to time.
    #[inline]
    pub(crate) fn due(&mut self) -> bool {
        self.until_sample -= 1;
        if self.until_sample == 0 {
            self.until_sample = SAMPLE_EVERY;
            return true;
        }
        false
    }

    /// The clock's reading now, to start timing an execute.
    #[inline]
    pub(crate) fn start(&self) -> u64 {
        self.clock.raw()
    }

    /// Nanoseconds from `started` (a [`Self::start`]) until now.
    #[inline]
    pub(crate) fn nanos_since(&self, started: u64) -> u64 {
        self.clock.delta_as_nanos(started, self.clock.raw())
    }

    /// Records the execute timed from `started` (a [`Self::start`]) until now.
    #[inline]
    pub(crate) fn record_since(&mut self, started: u64) {
        let ns = self.nanos_since(started);
        self.record(ns);
    }

    #[inline]
    fn record(&mut self, ns: u64) {
        self.ns = self.ns.saturating_add(ns);
        self.count += 1;
        let bucket = LATENCY_BUCKETS_NS.iter().position(|&b| ns <= b).unwrap_or(LATENCY_BUCKETS_NS.len());
        self.buckets[bucket] += 1;
    }

    /// Adds the samples to `stats` and starts over.
    pub(crate) fn publish(&mut self, stats: &ExecStats) {
        if self.count == 0 {
            return;
        }
        stats.execute_ns.fetch_add(self.ns, Ordering::Relaxed);
        stats.execute_samples.fetch_add(self.count, Ordering::Relaxed);
        for (total, n) in stats.execute_buckets.iter().zip(&mut self.buckets) {
            if *n > 0 {
                total.fetch_add(std::mem::take(n), Ordering::Relaxed);
            }
        }
        (self.ns, self.count) = (0, 0);
    }
}

/// Names a component may count under (Storm's `CountShellMetric` by name; the multilang
/// `metrics` command); more are refused, so a component cannot grow the worker's metrics page
/// without bound.
pub const MAX_COMPONENT_METRICS: usize = 64;

/// Why a component's count was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CountError {
    #[error("metric name {0:?} is not 1 to 64 characters of letters, digits, '_', '.', ':' or '-'")]
    BadName(String),
    #[error("metric {0:?} would pass the limit of {MAX_COMPONENT_METRICS} metric names per executor")]
    TooMany(String),
}

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
    /// Sampled execute latencies per bucket of [`LATENCY_BUCKETS`] (the last: above them all).
    execute_buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    /// Time this executor's emits waited for a full downstream queue (backpressure), ns.
    pub backpressure_ns: AtomicU64,
    /// The component's own counts by name ([`ExecStats::count`]), in first-use order.
    counts: Mutex<Vec<(String, u64)>>,
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
            execute_buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            backpressure_ns: AtomicU64::new(0),
            counts: Mutex::new(Vec::new()),
        }
    }

    /// Adds `by` to the component's count `name` (off the tuple path: a lock and a scan of at
    /// most [`MAX_COMPONENT_METRICS`] names).
    pub(crate) fn count(&self, name: &str, by: u64) -> Result<(), CountError> {
        let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-');
        if name.is_empty() || name.len() > 64 || !name.chars().all(valid) {
            return Err(CountError::BadName(name.to_owned()));
        }
        let mut counts = self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, value)) = counts.iter_mut().find(|(n, _)| n == name) {
            *value = value.saturating_add(by);
        } else if counts.len() >= MAX_COMPONENT_METRICS {
            return Err(CountError::TooMany(name.to_owned()));
        } else {
            counts.push((name.to_owned(), by));
        }
        Ok(())
    }

    /// The component's counts by name.
    pub fn counts(&self) -> Vec<(String, u64)> {
        self.counts.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Sampled execute latency as a Prometheus histogram: cumulative counts per bucket of
    /// [`LATENCY_BUCKETS`], the sample count and the sum in seconds.
    pub fn execute_histogram(&self) -> (Vec<u64>, u64, f64) {
        let mut cumulative = Vec::with_capacity(LATENCY_BUCKETS.len());
        let mut running = 0;
        for bucket in &self.execute_buckets[..LATENCY_BUCKETS.len()] {
            running += bucket.load(Ordering::Relaxed);
            cumulative.push(running);
        }
        let count = running + self.execute_buckets[LATENCY_BUCKETS.len()].load(Ordering::Relaxed);
        (cumulative, count, self.execute_ns.load(Ordering::Relaxed) as f64 / 1e9)
    }

    /// Complete latency as a Prometheus histogram (from the recorded percentiles' histogram):
    /// cumulative counts per bucket of [`LATENCY_BUCKETS`], the count and the sum in seconds.
    pub fn complete_histogram(&self) -> (Vec<u64>, u64, f64) {
        let Ok(guard) = self.complete_us.lock() else { return (vec![0; LATENCY_BUCKETS.len()], 0, 0.0) };
        let Some(h) = guard.as_ref() else { return (vec![0; LATENCY_BUCKETS.len()], 0, 0.0) };
        let cumulative = LATENCY_BUCKETS.iter().map(|b| h.count_between(0, (b * 1e6) as u64)).collect();
        (cumulative, h.len(), h.mean() * h.len() as f64 / 1e6)
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

    /// The complete latency at quantile `q` (0.999 for p99.9) in microseconds; 0 without
    /// samples.
    pub fn complete_quantile_us(&self, q: f64) -> u64 {
        match self.complete_us.lock() {
            Ok(guard) => guard.as_ref().map_or(0, |h| h.value_at_quantile(q)),
            Err(_) => 0,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nanosecond_bounds_are_the_latency_buckets() {
        for (ns, secs) in LATENCY_BUCKETS_NS.iter().zip(LATENCY_BUCKETS) {
            assert_eq!(*ns, (secs * 1e9).round() as u64, "bucket {secs} s");
        }
    }

    #[test]
    fn samples_reach_the_histogram_in_their_buckets_when_published() {
        let stats = ExecStats::new(
            ExecutorId::new(cluster_state::ids::TaskId(1), cluster_state::ids::TaskId(1)).unwrap(),
        );
        let mut samples = ExecuteSamples::new();
        // On a bound, just above it, past the last bound.
        for ns in [10_000, 10_001, 7_000_000_000] {
            samples.record(ns);
        }
        assert_eq!(stats.execute_histogram().1, 0, "nothing is seen before it is published");
        samples.publish(&stats);
        let (cumulative, count, sum) = stats.execute_histogram();
        assert_eq!(count, 3);
        assert_eq!(cumulative[0], 1, "10 us is in the first bucket (le 1e-5)");
        assert_eq!(cumulative[1], 2, "10.001 us in the second (le 5e-5)");
        assert_eq!(*cumulative.last().unwrap(), 2, "7 s is above every bound");
        assert!((sum - 7.000_020_001).abs() < 1e-9, "sum {sum}");
        samples.publish(&stats);
        assert_eq!(stats.execute_histogram().1, 3, "published samples start over");
    }

    #[test]
    fn the_sample_clock_keeps_time_with_the_monotonic_clock() {
        let clock = sample_clock();
        let (raw0, t0) = (clock.raw(), std::time::Instant::now());
        while t0.elapsed() < std::time::Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let (raw1, elapsed) = (clock.raw(), t0.elapsed().as_nanos() as f64);
        let measured = clock.delta_as_nanos(raw0, raw1) as f64;
        assert!(
            (measured - elapsed).abs() < elapsed * 0.05,
            "sample clock {measured} ns, Instant {elapsed} ns"
        );
    }
}
