//! A millisecond timeline of one latency run, to tell what a bad moment of the tail began
//! with (`SQUALL_BENCH_TIMELINE=1`; a diagnosis, not a figure: its 1 kHz sampler is one more
//! thread on the machine).
//!
//! Every millisecond a sampler thread records how late it woke, the spout's emitted and acked
//! counts, and each thread of this process's time on a CPU and time waiting in a run queue
//! (`/proc/self/task/<tid>/schedstat`). Sentences in flight (emitted, not acked) above one
//! millisecond of the rate mark a backlog; for each backlog the report gives what the moments
//! before it and the backlog itself held:
//! - the sampler woke late: the machine held every thread off (a host stall);
//! - a thread waited in the run queue: it was runnable, a core was not free for it;
//! - a thread was busy on a CPU: the backlog was its work to drain;
//! - no thread busy nor waiting: a thread was parked and not woken in time.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// One millisecond tick.
struct Tick {
    late_us: u64,
    emitted: u64,
    acked: u64,
    /// Per thread of [`Sampler::threads`]: (time on a CPU, run-queue wait), nanoseconds, cumulative.
    threads: Vec<(u64, u64)>,
}

pub struct Sampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Tick>>>,
    /// The process's threads when the sampler started: their names.
    names: Vec<String>,
}

/// The process's threads: name and open `schedstat` file.
fn threads() -> Vec<(String, File)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return out };
    for entry in dir.flatten() {
        let path = entry.path();
        let name = std::fs::read_to_string(path.join("comm")).unwrap_or_default().trim().to_owned();
        if let Ok(stat) = File::open(path.join("schedstat")) {
            out.push((name, stat));
        }
    }
    out
}

/// (time on a CPU, run-queue wait) in nanoseconds from an open `schedstat` file.
fn schedstat(file: &File) -> (u64, u64) {
    let mut buf = [0u8; 96];
    let n = file.read_at(&mut buf, 0).unwrap_or(0);
    let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
    let mut fields = text.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
    (fields.next().unwrap_or(0), fields.next().unwrap_or(0))
}

/// Each thread's time on a CPU over a window (each latency run prints it per sentence,
/// `thread_us`): which executor's thread took more per sentence in a run whose backlog stood.
pub struct BusyThreads {
    start: Vec<(String, File, u64)>,
}

impl BusyThreads {
    /// Notes every thread now alive (they must outlive the window: a thread that ended
    /// reads as none).
    pub fn start() -> BusyThreads {
        BusyThreads {
            start: threads()
                .into_iter()
                .map(|(name, file)| {
                    let (cpu, _) = schedstat(&file);
                    (name, file, cpu)
                })
                .collect(),
        }
    }

    /// The threads that took at least 2% of what they all took since `start`, busiest first,
    /// with their seconds on a CPU (the hiccup probe left out: its CPU is not the run's).
    pub fn finish(self) -> Vec<(String, f64)> {
        let mut took: Vec<(String, f64)> = self
            .start
            .iter()
            .filter(|(name, _, _)| name != "hiccup-probe")
            .map(|(name, file, before)| {
                (name.clone(), schedstat(file).0.saturating_sub(*before) as f64 / 1e9)
            })
            .collect();
        let total: f64 = took.iter().map(|(_, s)| s).sum();
        took.retain(|(_, s)| *s >= 0.02 * total);
        took.sort_by(|a, b| b.1.total_cmp(&a.1));
        took
    }
}

impl Sampler {
    /// Starts sampling `counts` (the spout's emitted and acked sentences) and every thread now
    /// alive.
    pub fn start(counts: impl Fn() -> (u64, u64) + Send + 'static) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let threads = threads();
        let names = threads.iter().map(|(n, _)| n.clone()).collect();
        let files: Vec<File> = threads.into_iter().map(|(_, f)| f).collect();
        let thread = std::thread::Builder::new()
            .name("timeline".into())
            .spawn(move || {
                let mut ticks = Vec::with_capacity(8192);
                let mut next = Instant::now();
                while !flag.load(Ordering::Relaxed) {
                    next += Duration::from_millis(1);
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    let late = Instant::now().saturating_duration_since(next);
                    let (emitted, acked) = counts();
                    ticks.push(Tick {
                        late_us: late.as_micros() as u64,
                        emitted,
                        acked,
                        threads: files.iter().map(schedstat).collect(),
                    });
                    if late > Duration::from_millis(1) {
                        next = Instant::now();
                    }
                }
                ticks
            })
            .ok();
        Sampler { stop, thread, names }
    }

    /// Stops sampling; the report of the backlogs at `rate` sentences a second.
    pub fn finish(mut self, rate: f64) -> String {
        self.stop.store(true, Ordering::Relaxed);
        let ticks = self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default();
        report(&ticks, &self.names, rate)
    }
}

/// One backlog: ticks `start..end` with more than a millisecond of sentences in flight.
struct Backlog {
    start: usize,
    end: usize,
    peak: u64,
}

fn report(ticks: &[Tick], names: &[String], rate: f64) -> String {
    if ticks.len() < 3 {
        return "timeline: no ticks".into();
    }
    let per_ms = (rate / 1000.0).max(1.0) as u64;
    let in_flight = |t: &Tick| t.emitted.saturating_sub(t.acked);
    let mut backlogs = Vec::new();
    let mut open: Option<Backlog> = None;
    for (i, t) in ticks.iter().enumerate() {
        let n = in_flight(t);
        match (&mut open, n > per_ms) {
            (Some(b), true) => b.peak = b.peak.max(n),
            (None, true) => open = Some(Backlog { start: i, end: i + 1, peak: n }),
            (Some(_), false) => {
                if let Some(mut b) = open.take() {
                    b.end = i;
                    backlogs.push(b);
                }
            }
            (None, false) => {}
        }
    }
    if let Some(mut b) = open {
        b.end = ticks.len();
        backlogs.push(b);
    }
    // The threads that did the work: the busiest four over the run.
    let total = |k: usize| {
        let (first, last) = (&ticks[0].threads, &ticks[ticks.len() - 1].threads);
        last.get(k).map_or(0, |l| l.0.saturating_sub(first.get(k).map_or(0, |f| f.0)))
    };
    let mut busiest: Vec<usize> = (0..names.len()).collect();
    busiest.sort_by_key(|&k| std::cmp::Reverse(total(k)));
    busiest.truncate(4);
    // A thread's (CPU, wait) in microseconds over ticks `a..b` (from tick a - 1's reading).
    let spent = |k: usize, a: usize, b: usize| -> (u64, u64) {
        let (from, to) = (&ticks[a.saturating_sub(1)].threads, &ticks[b.min(ticks.len()) - 1].threads);
        match (from.get(k), to.get(k)) {
            (Some(f), Some(t)) => (t.0.saturating_sub(f.0) / 1000, t.1.saturating_sub(f.1) / 1000),
            _ => (0, 0),
        }
    };
    let mut out = format!(
        "timeline: {} ms, {} backlogs over {} sentences in flight (1 ms at the rate); threads {}",
        ticks.len(),
        backlogs.len(),
        per_ms,
        busiest.iter().map(|&k| names[k].as_str()).collect::<Vec<_>>().join(", ")
    );
    let (mut host, mut queued, mut busy, mut parked) = (0, 0, 0, 0);
    // Every backlog is classified; the ten deepest are printed, in time order.
    let mut deepest: Vec<usize> = (0..backlogs.len()).collect();
    deepest.sort_by_key(|&i| std::cmp::Reverse(backlogs[i].peak));
    deepest.truncate(10);
    for (i, b) in backlogs.iter().enumerate() {
        let before = b.start.saturating_sub(2);
        let late = ticks[before..b.end].iter().map(|t| t.late_us).max().unwrap_or(0);
        let emitted_before = ticks[b.start].emitted.saturating_sub(ticks[before.saturating_sub(1)].emitted);
        let threads: Vec<(u64, u64)> = busiest.iter().map(|&k| spent(k, before, b.end)).collect();
        let span_us = ((b.end - before) * 1000) as u64;
        let max_wait = threads.iter().map(|t| t.1).max().unwrap_or(0);
        let max_cpu = threads.iter().map(|t| t.0).max().unwrap_or(0);
        let kind = if late > 500 {
            host += 1;
            "host stall"
        } else if max_wait > 300 {
            queued += 1;
            "runnable, no core"
        } else if max_cpu * 10 > span_us * 7 {
            busy += 1;
            "busy"
        } else {
            parked += 1;
            "parked"
        };
        if !deepest.contains(&i) {
            continue;
        }
        out.push_str(&format!(
            "\n    at {} ms for {} ms: peak {} in flight ({:.1} ms of the rate), sampler late <= {} us, emitted {} in the 2 ms before; {kind}; cpu/wait us: {}",
            b.start,
            b.end - b.start,
            b.peak,
            b.peak as f64 / per_ms as f64,
            late,
            emitted_before,
            busiest
                .iter()
                .zip(&threads)
                .map(|(&k, (c, w))| format!("{} {c}/{w}", names[k]))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    out.push_str(&format!(
        "\n    backlogs: {host} after a host stall, {queued} with a thread runnable and no core, {busy} busy, {parked} parked"
    ));
    out
}
