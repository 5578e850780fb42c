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
    let nanos: u64 = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()))
        .sum();
    Duration::from_nanos(nanos)
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
        let nanos = stat.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        total = Some(total.unwrap_or(Duration::ZERO) + Duration::from_nanos(nanos));
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
        let thread_cpu = || {
            let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
            Duration::from_nanos(stat.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0))
        };
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
}
