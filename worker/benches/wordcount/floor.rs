//! The floor under the latency part: the word count's shape as bare threads, at the same rate,
//! on the same machine, in the same invocation ([`Shape`]: a generator with a split and a count
//! thread, or with one thread doing both).
//!
//! A generator thread hands each sentence (its corpus index and the time it was sent) to a
//! split thread, which hands its words (one message a sentence) to a count thread, which
//! counts them and hands the send time back to the generator: complete latency as the spout
//! sees it, with nothing of Squall in between (no tuples, batches, acker or routing). Each
//! hand-over parks its receiver at once when there is nothing for it, as Squall's queues do,
//! so the floor does not buy its latency with spinning cores (with crossbeam's spinning
//! receive it measured no better a tail, at 0.7x the sentences per CPU-second). A sentence crosses
//! three threads on two cores as in Squall and meets the same host: where the floor keeps a
//! latency goal that Squall misses in the same invocation, the difference is Squall's (how
//! long each thread works on a sentence, how sentences are grouped on the way), not the
//! machine's.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use worker::builtin::{MAX_BURST, reference_corpus};

/// A hand-over between two threads that parks at once, as Squall's queues do (no spinning):
/// values under a mutex, and a condition variable signalled only when the receiver waits.
struct Hand<T> {
    state: Mutex<HandState<T>>,
    cv: Condvar,
}

struct HandState<T> {
    values: VecDeque<T>,
    /// The sender is gone.
    closed: bool,
    /// The receiver waits (or is about to).
    waiting: bool,
}

struct Tx<T>(Arc<Hand<T>>);
struct Rx<T>(Arc<Hand<T>>);

fn hand<T>() -> (Tx<T>, Rx<T>) {
    let state = HandState { values: VecDeque::new(), closed: false, waiting: false };
    let h = Arc::new(Hand { state: Mutex::new(state), cv: Condvar::new() });
    (Tx(h.clone()), Rx(h))
}

impl<T> Hand<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HandState<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T> Tx<T> {
    fn send(&self, v: T) {
        let mut s = self.0.lock();
        s.values.push_back(v);
        if std::mem::take(&mut s.waiting) {
            self.0.cv.notify_one();
        }
    }
}

impl<T> Drop for Tx<T> {
    fn drop(&mut self) {
        self.0.lock().closed = true;
        self.0.cv.notify_one();
    }
}

impl<T> Rx<T> {
    /// The next value, waiting until `deadline`; `None` at the deadline or once the sender is
    /// gone and nothing is left.
    fn recv_until(&self, deadline: Instant) -> Option<T> {
        let mut s = self.0.lock();
        loop {
            if let Some(v) = s.values.pop_front() {
                return Some(v);
            }
            let now = Instant::now();
            if s.closed || now >= deadline {
                return None;
            }
            s.waiting = true;
            s = self.0.cv.wait_timeout(s, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

/// What one run measured.
pub struct Floor {
    /// Sentences sent in the measured window and acked by its end.
    pub sentences: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
}

/// The pipeline, running.
pub struct Running {
    generator: std::thread::JoinHandle<Floor>,
}

impl Running {
    /// Waits for the end of the run and its figures.
    pub fn finish(self) -> Option<Floor> {
        self.generator.join().ok()
    }
}

/// Which threads the floor's pipeline has besides its generator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// A split thread and a count thread: the word count's shape with every executor on its own
    /// thread.
    Three,
    /// One thread that splits and counts each sentence: the shape Squall runs at partial load,
    /// where the spout's thread runs the whole tree inline. Its thread does less per sentence
    /// than Squall's (no tuples, batches or acker), so where it misses too, the host's stalls
    /// alone were enough to miss in those minutes.
    One,
}

/// Starts the pipeline at `rate` sentences/s for `warm` + `secs`; it measures the sentences
/// sent in the last `secs` (acked before the end). `None` if a thread could not start.
pub fn start(shape: Shape, rate: f64, warm: Duration, secs: Duration) -> Option<Running> {
    let corpus = reference_corpus();
    // The pipeline's threads wait until their sender is gone.
    let forever = Instant::now() + Duration::from_secs(24 * 3600);
    if shape == Shape::One {
        let (to_worker, worker_in) = hand::<(usize, Instant)>();
        let (to_spout, acks) = hand::<Instant>();
        let worker = std::thread::Builder::new()
            .name("floor-worker".into())
            .spawn(move || {
                let mut counts: HashMap<&'static str, u64> = HashMap::new();
                while let Some((i, sent)) = worker_in.recv_until(forever) {
                    for w in corpus[i % corpus.len()].split(' ') {
                        *counts.entry(w).or_default() += 1;
                    }
                    to_spout.send(sent);
                }
            })
            .ok()?;
        let generator = std::thread::Builder::new()
            .name("floor-generator".into())
            .spawn(move || generate(rate, warm, secs, to_worker, &acks, vec![worker]))
            .ok()?;
        return Some(Running { generator });
    }
    let (to_split, split_in) = hand::<(usize, Instant)>();
    let (to_count, count_in) = hand::<(Vec<&'static str>, Instant)>();
    let (to_spout, acks) = hand::<Instant>();
    let split = std::thread::Builder::new()
        .name("floor-split".into())
        .spawn(move || {
            while let Some((i, sent)) = split_in.recv_until(forever) {
                let words = corpus[i % corpus.len()].split(' ').collect();
                to_count.send((words, sent));
            }
        })
        .ok()?;
    let count = std::thread::Builder::new()
        .name("floor-count".into())
        .spawn(move || {
            let mut counts: HashMap<&'static str, u64> = HashMap::new();
            while let Some((words, sent)) = count_in.recv_until(forever) {
                for w in words {
                    *counts.entry(w).or_default() += 1;
                }
                to_spout.send(sent);
            }
        })
        .ok()?;
    let generator = std::thread::Builder::new()
        .name("floor-generator".into())
        .spawn(move || generate(rate, warm, secs, to_split, &acks, vec![split, count]))
        .ok()?;
    Some(Running { generator })
}

/// The generator's loop: sends what is due, takes acks until the next is due.
fn generate(
    rate: f64,
    warm: Duration,
    secs: Duration,
    to_first: Tx<(usize, Instant)>,
    acks: &Rx<Instant>,
    workers: Vec<std::thread::JoinHandle<()>>,
) -> Floor {
    let start = Instant::now();
    let (from, end) = (start + warm, start + warm + secs);
    let burst = (rate * MAX_BURST.as_secs_f64()) as u64;
    let mut latencies: Vec<u32> = Vec::with_capacity((rate * secs.as_secs_f64() * 1.1) as usize);
    let mut record = |sent: Instant, now: Instant| {
        if sent >= from {
            latencies.push(u32::try_from(now.duration_since(sent).as_micros()).unwrap_or(u32::MAX));
        }
    };
    let mut sent: u64 = 0;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let due = (now.duration_since(start).as_secs_f64() * rate) as u64;
        sent = sent.max(due.saturating_sub(burst));
        while sent < due {
            to_first.send((sent as usize, Instant::now()));
            sent += 1;
        }
        let next = start + Duration::from_secs_f64((sent + 1) as f64 / rate);
        if let Some(t) = acks.recv_until(next.min(end)) {
            record(t, Instant::now());
        }
    }
    // The first worker ends when the generator's sender is gone, then the next.
    drop(to_first);
    for worker in workers {
        let _ = worker.join();
    }
    latencies.sort_unstable();
    let at = |q: f64| {
        latencies.get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
    };
    Floor {
        sentences: latencies.len() as u64,
        p50_us: at(0.5).copied().map_or(0, u64::from),
        p99_us: at(0.99).copied().map_or(0, u64::from),
        p999_us: at(0.999).copied().map_or(0, u64::from),
    }
}
