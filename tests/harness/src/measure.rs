//! What a benchmark needs to report honest figures: CPU time read precisely (not in 10 ms
//! ticks), the CPU every other process on the machine burnt during the run, and the load
//! average, so a reader can tell a quiet run from a contended one.
//!
//! ```no_run
//! let window = test_harness::measure::Window::start(&[]);
//! // ... the run ...
//! let m = window.finish();
//! println!("{:.2} s, {:.3} CPU-s, {}", m.secs, m.cpu_s, m.context());
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// User + system CPU time of this process, every thread that ever ran included
/// (`getrusage(RUSAGE_SELF)`, microseconds).
pub fn process_cpu() -> Duration {
    // SAFETY: `getrusage` writes one `rusage` that we own and zero-initialised; RUSAGE_SELF is a
    // valid `who`; nothing else is touched.
    #[allow(unsafe_code)]
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return Duration::ZERO;
        }
        usage
    };
    let micros = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    micros(usage.ru_utime) + micros(usage.ru_stime)
}

/// CPU time of the live threads of process `pid` (the sum of each thread's
/// `/proc/<pid>/task/*/schedstat` time on a CPU, nanoseconds). Threads that already ended are
/// not counted: read it while the process's workers still run.
pub fn threads_cpu(pid: u32) -> Duration {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Duration::ZERO };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .map(|s| schedstat_field(&s, 0))
        .sum()
}

/// User + system CPU of process `pid` from `/proc/<pid>/stat`, in clock ticks turned into
/// seconds (10 ms resolution: good enough for what other processes burnt).
fn process_ticks_secs(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, r)| r).split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 11 and 12 after the command.
    (ticks(11) + ticks(12)) / 100.0
}

/// Busy CPU seconds of the whole machine so far (`/proc/stat`: user, nice, system, irq,
/// softirq, steal).
fn machine_busy_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else { return 0.0 };
    let v: Vec<f64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
    // user nice system idle iowait irq softirq steal
    (at(0) + at(1) + at(2) + at(5) + at(6) + at(7)) / 100.0
}

/// Where the kernel lists its DAMON monitors (`kdamond` threads), each with a `pid` file.
const KDAMONDS: &str = "/sys/kernel/mm/damon/admin/kdamonds";

/// Time on a CPU of the kernel's running DAMON monitor threads so far; `None` when none runs.
/// A VM's DAMON pageout scheme (this machine's: up to 50 ms of CPU a second) holds a core for
/// 1-4 ms at a time, which on two busy cores shows in a latency tail far more than its share of
/// `other_cpu_s` says.
pub fn kdamond_cpu() -> Option<Duration> {
    let monitors = std::fs::read_dir(KDAMONDS).ok()?;
    let mut total = None;
    for monitor in monitors.flatten() {
        // `-1` when the monitor is off.
        let pid = std::fs::read_to_string(monitor.path().join("pid")).ok();
        let Some(pid) = pid.and_then(|p| p.trim().parse::<u32>().ok()) else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).unwrap_or_default();
        total = Some(total.unwrap_or(Duration::ZERO) + schedstat_field(&stat, 0));
    }
    total
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut v = text.split_whitespace().filter_map(|x| x.parse::<f64>().ok());
    [v.next().unwrap_or(0.0), v.next().unwrap_or(0.0), v.next().unwrap_or(0.0)]
}

/// A measured run: see [`Window`].
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub secs: f64,
    /// This process's CPU (precise), plus that of the processes named as ours.
    pub cpu_s: f64,
    /// What every other process on the machine burnt meanwhile (the contention).
    pub other_cpu_s: f64,
    /// The 1-minute load average at the end.
    pub load: f64,
    /// CPU milliseconds the kernel's DAMON monitors took meanwhile (part of `other_cpu_s`);
    /// `None` when none ran.
    pub kdamond_ms: Option<f64>,
}

impl Measured {
    /// `other_cpu_s=.. load=..` (and `kdamond_ms=..` when a DAMON monitor ran), for a bench's
    /// output line.
    pub fn context(&self) -> String {
        let kdamond = self.kdamond_ms.map_or(String::new(), |ms| format!(" kdamond_ms={ms:.0}"));
        format!("other_cpu_s={:.2} load={:.2}{kdamond}", self.other_cpu_s, self.load)
    }
}

/// A run in progress: wall time, this process's CPU and the machine's, from `start` on.
#[derive(Debug)]
pub struct Window {
    at: Instant,
    cpu: Duration,
    busy: f64,
    /// Processes that are part of the run (a broker, worker children): their CPU is not
    /// "other".
    ours: Vec<(u32, f64)>,
    kdamond: Option<Duration>,
}

impl Window {
    /// Starts measuring; `ours` are other processes that belong to the run (a broker).
    pub fn start(ours: &[u32]) -> Window {
        Window {
            at: Instant::now(),
            cpu: process_cpu(),
            busy: machine_busy_secs(),
            ours: ours.iter().map(|&p| (p, process_ticks_secs(p))).collect(),
            kdamond: kdamond_cpu(),
        }
    }

    /// The run so far. `extra_cpu` is CPU of ours that this process cannot read itself (e.g.
    /// worker children measured with [`threads_cpu`]); it counts in `cpu_s`.
    pub fn finish_with(&self, extra_cpu: Duration) -> Measured {
        let secs = self.at.elapsed().as_secs_f64();
        let own = (process_cpu().saturating_sub(self.cpu) + extra_cpu).as_secs_f64();
        let ours: f64 = self.ours.iter().map(|&(p, before)| (process_ticks_secs(p) - before).max(0.0)).sum();
        let busy = machine_busy_secs() - self.busy;
        // A monitor restarted meanwhile (a new thread) counts from zero.
        let kdamond_ms = kdamond_cpu().map(|now| {
            let before = self.kdamond.filter(|&b| b <= now).unwrap_or(Duration::ZERO);
            (now - before).as_secs_f64() * 1e3
        });
        let other_cpu_s = (busy - own - ours).max(0.0);
        Measured { secs, cpu_s: own, other_cpu_s, load: load_average()[0], kdamond_ms }
    }

    /// The run so far, CPU of this process only (besides `ours`).
    pub fn finish(&self) -> Measured {
        self.finish_with(Duration::ZERO)
    }
}

/// How late a probe thread woke (see [`HiccupProbe`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Hiccups {
    /// The latest wake-up, microseconds after its deadline.
    pub max_us: u64,
    /// Wake-ups more than 1 ms late.
    pub over_1ms: u64,
    /// Wake-ups in all.
    pub wakes: u64,
    /// How late the wake-ups more than 1 ms late were, in all (microseconds).
    pub late_us: u64,
    /// Of `late_us`, the time the probe sat runnable in this kernel's run queue (its
    /// `schedstat` wait): held off by other threads, ours included, or by a kernel thread that
    /// did not yield. The rest the kernel did not see (a vCPU the hypervisor did not run, a
    /// timer not yet delivered).
    pub queued_us: u64,
    /// The probe thread's own time on a CPU (to take out of a run's CPU).
    pub cpu: Duration,
    /// The median wall time, in nanoseconds, of a fixed piece of arithmetic the probe times
    /// at each wake-up (1,000 dependent rounds of shift, xor, multiply): how fast this
    /// machine's cores ran for the run. A host that gives its vCPUs less (a busy sibling
    /// hyperthread, a lower clock) raises it for every thread alike, which no count of late
    /// wake-ups shows.
    pub calib_ns: u64,
    /// The 90th percentile of the same (a host slow only part of the time moves this first).
    pub calib_p90_ns: u64,
}

impl Hiccups {
    /// Counts one wake-up `late` after its deadline, of which the probe sat `queued` in the
    /// run queue since its previous wake-up; whether it was over 1 ms late.
    pub fn record(&mut self, late: Duration, queued: Duration) -> bool {
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let late_us = us(late);
        self.wakes += 1;
        self.max_us = self.max_us.max(late_us);
        let over = late_us > 1000;
        if over {
            self.over_1ms += 1;
            self.late_us = self.late_us.saturating_add(late_us);
            self.queued_us = self.queued_us.saturating_add(us(queued).min(late_us));
        }
        over
    }

    /// `hiccup_max_us=.. hiccups_over_1ms=.. hiccup_late_ms=.. hiccup_queued_ms=..
    /// calib_ns=<median>/<p90>`, for a bench's output line.
    pub fn context(&self) -> String {
        format!(
            "hiccup_max_us={} hiccups_over_1ms={} hiccup_late_ms={:.1} hiccup_queued_ms={:.1} calib_ns={}/{}",
            self.max_us,
            self.over_1ms,
            self.late_us as f64 / 1e3,
            self.queued_us as f64 / 1e3,
            self.calib_ns,
            self.calib_p90_ns
        )
    }
}

/// A jHiccup-style probe of the platform: a thread of this process that sleeps to deadlines
/// 1 ms apart and records how late it woke. What delays it (a core held by a kernel thread,
/// the hypervisor not running a vCPU, this process's own threads wanting both cores) delays a
/// pipeline thread the same way, so a latency run's tail can be set beside it. At each
/// wake-up it also times a fixed piece of arithmetic ([`Hiccups::calib_ns`]): how fast the
/// cores ran. Costs ~1,000 wake-ups and ~2 ms of a core a second.
#[derive(Debug)]
pub struct HiccupProbe {
    stop: Arc<AtomicBool>,
    /// Wake-ups so far, as the thread counts them.
    wakes: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<Hiccups>>,
}

impl HiccupProbe {
    /// Starts the probe thread.
    pub fn start() -> HiccupProbe {
        let stop = Arc::new(AtomicBool::new(false));
        let wakes = Arc::new(AtomicU64::new(0));
        let (flag, woke) = (stop.clone(), wakes.clone());
        let thread = std::thread::Builder::new()
            .name("hiccup-probe".into())
            .spawn(move || {
                let mut h = Hiccups::default();
                // This thread's own schedstat, kept open: one read per wake-up.
                let stat = std::fs::File::open("/proc/thread-self/schedstat").ok();
                let mut queued_before = stat.as_ref().map_or(Duration::ZERO, queued_time);
                let mut next = Instant::now();
                let mut calib: Vec<u32> = Vec::with_capacity(4096);
                while !flag.load(Ordering::Relaxed) {
                    next += Duration::from_millis(1);
                    std::thread::sleep(next.saturating_duration_since(Instant::now()));
                    let late = Instant::now().saturating_duration_since(next);
                    let queued = stat.as_ref().map_or(Duration::ZERO, queued_time);
                    let waited = queued.saturating_sub(queued_before);
                    queued_before = queued;
                    if h.record(late, waited) {
                        // Deadlines missed while stalled are not owed: start again from now.
                        next = Instant::now();
                    }
                    woke.store(h.wakes, Ordering::Relaxed);
                    let began = Instant::now();
                    std::hint::black_box(calibration(std::hint::black_box(h.wakes)));
                    calib.push(u32::try_from(began.elapsed().as_nanos()).unwrap_or(u32::MAX));
                }
                calib.sort_unstable();
                let at = |q: f64| calib.get((calib.len() as f64 * q) as usize).map_or(0, |&ns| u64::from(ns));
                (h.calib_ns, h.calib_p90_ns) = (at(0.5), at(0.9));
                h.cpu = thread_cpu();
                h
            })
            .ok();
        HiccupProbe { stop, wakes, thread }
    }

    /// Wake-ups so far.
    pub fn wakes(&self) -> u64 {
        self.wakes.load(Ordering::Relaxed)
    }

    /// Stops the probe; what it saw (nothing when its thread could not start).
    pub fn finish(mut self) -> Hiccups {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

/// A fixed piece of arithmetic for [`HiccupProbe`] to time: 1,000 rounds of a shift, an xor
/// and a multiply, each waiting on the one before (~1-2 us on the reference machine; no
/// memory, no branch to mispredict, and not affine, so no compiler folds the loop away): its
/// time follows the core's speed and nothing else.
fn calibration(seed: u64) -> u64 {
    let mut x = seed | 1;
    for _ in 0..1000 {
        x = (x ^ (x >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    x
}

/// The run-queue wait of the thread whose `schedstat` file this is (its second field,
/// nanoseconds), read from the start.
fn queued_time(stat: &std::fs::File) -> Duration {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 96];
    let n = stat.read_at(&mut buf, 0).unwrap_or(0);
    let text = std::str::from_utf8(&buf[..n]).unwrap_or("");
    schedstat_field(text, 1)
}

/// The calling thread's time on a CPU (`/proc/thread-self/schedstat`, nanoseconds).
pub fn thread_cpu() -> Duration {
    schedstat_field(&std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default(), 0)
}

/// Field `i` of a `schedstat` line (0: time on a CPU, 1: time waiting in a run queue; both
/// nanoseconds); zero when missing.
fn schedstat_field(text: &str, i: usize) -> Duration {
    Duration::from_nanos(text.split_whitespace().nth(i).and_then(|v| v.parse().ok()).unwrap_or(0))
}

/// The median of `values` (the upper one of an even count); 0 for none.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_moves_with_work_and_not_in_ticks() {
        // This thread's own CPU clock (not wall time: on a loaded machine 30 ms of wall time
        // once held 6 ms of CPU), an independent reference for the window's reading.
        let window = Window::start(&[]);
        let (started, deadline) = (thread_cpu(), Instant::now() + Duration::from_secs(30));
        let mut x = 0u64;
        while thread_cpu() - started < Duration::from_millis(30) && Instant::now() < deadline {
            for _ in 0..1000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
        }
        std::hint::black_box(x);
        let m = window.finish();
        assert!(m.cpu_s >= 0.02, "{m:?}");
        // A DAMON monitor's CPU is in the context exactly when one runs (this machine's VM).
        assert_eq!(m.kdamond_ms.is_some(), kdamond_cpu().is_some(), "{m:?}");
        assert_eq!(m.context().contains(" kdamond_ms="), m.kdamond_ms.is_some(), "{}", m.context());
        assert!(threads_cpu(std::process::id()) > Duration::ZERO);
        assert!(load_average()[0] >= 0.0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    }

    #[test]
    fn hiccups_count_late_wake_ups_and_the_probe_runs() {
        let mut h = Hiccups::default();
        let us = Duration::from_micros;
        assert!(!h.record(us(80), us(50)));
        assert!(!h.record(us(1000), us(900)));
        assert!(h.record(us(1001), us(1)));
        // A wait longer than the lateness (it began before the deadline) counts up to it.
        assert!(h.record(Duration::from_millis(7), Duration::from_millis(9)));
        assert_eq!(
            (h.wakes, h.over_1ms, h.max_us, h.late_us, h.queued_us),
            (4, 2, 7000, 8001, 7001),
            "{h:?}"
        );
        assert_eq!(
            h.context(),
            "hiccup_max_us=7000 hiccups_over_1ms=2 hiccup_late_ms=8.0 hiccup_queued_ms=7.0 calib_ns=0/0"
        );

        // The live probe wakes about every millisecond and accounts for its own CPU.
        let probe = HiccupProbe::start();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && probe.wakes() < 20 {
            std::thread::sleep(Duration::from_millis(10));
        }
        let h = probe.finish();
        assert!(h.wakes >= 20, "{h:?}");
        assert!(h.cpu > Duration::ZERO, "{h:?}");
        // It timed its arithmetic at each wake-up: 1,000 dependent rounds take a core some
        // ~5,000 cycles, over 500 ns on any core (an affine loop, partly folded, took ~250).
        assert!(h.calib_ns >= 500 && h.calib_p90_ns >= h.calib_ns, "{h:?}");
    }
}
