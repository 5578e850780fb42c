//! Soak benchmark of a worker's port (issue 14): word count runs across two workers in this
//! process (sentences and split in A, count in B, every word over loopback TCP, acking on)
//! while B's port is abused for a while by, in rounds until the time is up:
//! 2,000 connect/close cycles (half complete the handshake, as a reconnecting peer would),
//! 2,000 idle connections held open (reopened as B closes them), and 1,000 forged hellos (the
//! right topology id, a wrong secret).
//!
//! Prints the process's descriptors, threads and RSS at baseline and after, B's transport
//! counters, and words counted per second before vs. during the abuse. Not a timed test.
//!
//! On a machine with two or more CPUs the workers (every thread they start inherits the main
//! thread's affinity) run on CPU 0 and the attackers on the others, before and during alike, so
//! "during" measures what the defences cost the worker, not the CPU the attackers take from it.
//! The workers' own CPU time (per-thread `schedstat`, nanoseconds; the attackers' threads are
//! left out by name) gives words per worker CPU-second too. `SQUALL_SOAK_PIN=0` turns pinning off.
//!
//! `SQUALL_SOAK_SECS=<n> cargo bench -p worker --bench soak` (default 600: ten minutes);
//! `SQUALL_SOAK_BASELINE_SECS` (default 20) sets the quiet measurement before.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cluster_state::ids::{SupervisorId, TopologyId, TopologyName, WorkerSlot};
use cluster_state::znode::{Assignment, ExecutorAssignment};
use worker::builtin::{SentenceParams, SentenceSpout, SplitSentence, WordCount, WordCountParams};
use worker::layout::{TaskLayout, plan_worker};
use worker::process::{StaticWorker, TransportOptions};
use worker::transport::{TopologySecret, connect_as_peer};
use worker::{TopologyBuilder, TopologyConfig};

type Error = Box<dyn std::error::Error>;

fn secs_from_env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn free_port() -> Result<u16, Error> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Descriptors, threads and resident memory (MiB) of this process.
fn resources() -> (usize, u64, u64) {
    let fds = std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (fds, field("Threads:"), field("VmRSS:") / 1024)
}

/// Name of the attackers' threads, left out of the workers' CPU time.
const ATTACKER: &str = "soak-attacker";

/// Pins the calling thread to `cpus`; threads it starts afterwards inherit the mask.
fn pin_to(cpus: impl IntoIterator<Item = usize>) -> Result<(), Error> {
    let mut set = rustix::thread::CpuSet::new();
    for cpu in cpus {
        set.set(cpu);
    }
    rustix::thread::sched_setaffinity(None, &set).map_err(|e| format!("sched_setaffinity: {e}"))?;
    Ok(())
}

/// CPU time (ns, from `/proc/self/task/*/schedstat`) of this process's threads that are not
/// attackers: the workers' cost, counted to the nanosecond rather than in 10 ms ticks.
fn worker_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return 0 };
    tasks
        .flatten()
        .filter(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() != ATTACKER))
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()))
        .sum()
}

fn print_resources(when: &str) {
    let (fds, threads, rss) = resources();
    println!("{when:>9}: {fds} descriptors, {threads} threads, {rss} MiB RSS");
}

/// The two workers of a word count: A runs sentences, split and the acker; B runs count.
fn start_workers(secret: &TopologySecret) -> Result<(StaticWorker, StaticWorker, TopologyId), Error> {
    let config = TopologyConfig {
        acker_executors: Some(1),
        max_spout_pending: Some(20_000),
        ..TopologyConfig::default()
    };
    let mut b = TopologyBuilder::new("soak");
    b.config(config);
    b.set_spout("sentences", 1, || SentenceSpout::new(SentenceParams::default()));
    b.set_bolt("split", 1, SplitSentence::default).shuffle_grouping("sentences");
    b.set_bolt("count", 1, || WordCount::new(WordCountParams { emit: false }))
        .fields_grouping("split", ["word"]);
    let topology = Arc::new(b.build()?);
    let layout = Arc::new(TaskLayout::compute(&topology.component_parallelism()));
    let node = SupervisorId::new("soak")?;
    let (port_a, port_b) = (free_port()?, free_port()?);
    let executors = layout
        .executors
        .iter()
        .map(|(e, c)| ExecutorAssignment {
            executor: *e,
            node: node.clone(),
            port: if c.as_str() == "count" { port_b } else { port_a },
            start_time_secs: 0,
        })
        .collect();
    let assignment = Assignment {
        master_code_dir: String::new(),
        node_host: [(node.clone(), "127.0.0.1".to_owned())].into(),
        executors,
    };
    let id = TopologyId::new(&TopologyName::new("soak")?, 1, 1);
    let start = |port: u16| -> Result<StaticWorker, Error> {
        let plan = plan_worker(&layout, &assignment, &WorkerSlot { node: node.clone(), port })
            .map_err(|e| format!("{e:?}"))?;
        let options = TransportOptions::new("127.0.0.1", secret.clone());
        Ok(StaticWorker::start(topology.clone(), layout.clone(), plan, &id, options, None)?)
    };
    let (a, b) = (start(port_a)?, start(port_b)?);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(a.peers_connected() && b.peers_connected()) {
        if Instant::now() > deadline {
            return Err("the two workers did not connect within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    a.runtime.activate();
    b.runtime.activate();
    Ok((a, b, id))
}

/// The load average, so a reader sees whether anything else ran beside the bench.
fn print_load(when: &str) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at {when}: {}", load.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
}

fn counted(b: &StaticWorker) -> u64 {
    b.runtime.component_stats("count").iter().map(|s| s.acked.load(Ordering::Relaxed)).sum()
}

/// Words per second counted by `b` over `secs`, and words per CPU-second of the workers'
/// threads. A thread that ended during the window takes its CPU time with it: none of the
/// workers' threads do here (the attackers' connections are refused or closed, never given
/// threads of their own beyond the handshake, which the count includes while they live).
fn rate_over(b: &StaticWorker, secs: u64) -> (f64, f64) {
    let (n0, t0, c0) = (counted(b), Instant::now(), worker_cpu_ns());
    std::thread::sleep(Duration::from_secs(secs));
    let words = (counted(b) - n0) as f64;
    let cpu = worker_cpu_ns().saturating_sub(c0) as f64 / 1e9;
    (words / t0.elapsed().as_secs_f64(), words / cpu.max(1e-9))
}

/// Runs the three abusers against `addr` until `stop`; counts their rounds.
fn abuse(
    addr: SocketAddr,
    id: &TopologyId,
    secret: &TopologySecret,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<std::thread::JoinHandle<u64>>, Error> {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let rounds = |f: Box<dyn Fn() + Send>, stop: Arc<AtomicBool>| {
        std::thread::Builder::new().name(ATTACKER.to_owned()).spawn(move || {
            if pinned() && cpus > 1 && pin_to(1..cpus).is_err() {
                eprintln!("could not pin an attacker; it shares every CPU");
            }
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                f();
                n += 1;
            }
            n
        })
    };
    let (id1, secret1) = (id.to_string(), secret.clone());
    let cycles = Box::new(move || {
        for i in 0..2000 {
            if i % 2 == 0 {
                drop(connect_as_peer(addr, &id1, &secret1));
            } else {
                drop(TcpStream::connect(addr));
            }
        }
    });
    let idle_stop = stop.clone();
    let idle = Box::new(move || {
        let held: Vec<TcpStream> = (0..2000).filter_map(|_| TcpStream::connect(addr).ok()).collect();
        // Held until the worker has closed them all at its handshake deadline (5 s).
        for _ in 0..60 {
            if idle_stop.load(Ordering::Relaxed) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(held);
    });
    let id2 = id.to_string();
    let forged = Box::new(move || {
        let wrong = TopologySecret::generate();
        for _ in 0..1000 {
            drop(connect_as_peer(addr, &id2, &wrong));
        }
    });
    Ok(vec![rounds(cycles, stop.clone())?, rounds(idle, stop.clone())?, rounds(forged, stop.clone())?])
}

fn pinned() -> bool {
    std::env::var("SQUALL_SOAK_PIN").map_or(true, |v| v != "0")
}

fn main() -> Result<(), Error> {
    let soak_secs = secs_from_env("SQUALL_SOAK_SECS", 600);
    let baseline_secs = secs_from_env("SQUALL_SOAK_BASELINE_SECS", 20);
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    if pinned() && cpus > 1 {
        pin_to([0])?;
        println!("workers pinned to CPU 0, attackers to CPUs 1-{}", cpus - 1);
    } else {
        println!("not pinned: workers and attackers share {cpus} CPU(s)");
    }
    print_load("start");
    let secret = TopologySecret::generate();
    let (a, b, id) = start_workers(&secret)?;
    // Warm up, then the quiet baseline.
    std::thread::sleep(Duration::from_secs(3));
    print_resources("baseline");
    let (before, before_cpu) = rate_over(&b, baseline_secs);
    println!("words/s before: {before:.0} (over {baseline_secs} s), {before_cpu:.0} per worker CPU-s");
    // What the word count itself grows to (counts, queues, the allocator's caches) before any
    // attack: the figure "after" is compared with.
    print_resources("warm");
    let stop = Arc::new(AtomicBool::new(false));
    let abusers = abuse(b.local_addr(), &id, &secret, &stop)?;
    let (during, during_cpu) = rate_over(&b, soak_secs);
    let (fds, threads, rss) = resources();
    println!("   during: {fds} descriptors, {threads} threads, {rss} MiB RSS (attackers' sockets included)");
    println!(
        "words/s during: {during:.0} (over {soak_secs} s), {:.0}% of before",
        100.0 * during / before.max(1.0)
    );
    println!(
        "words per worker CPU-s during: {during_cpu:.0}, {:.0}% of before",
        100.0 * during_cpu / before_cpu.max(1.0)
    );
    print_load("end");
    stop.store(true, Ordering::Relaxed);
    let rounds: Vec<u64> = abusers.into_iter().map(|h| h.join().unwrap_or(0)).collect();
    println!(
        "rounds: {} x 2,000 connect/close, {} x 2,000 idle, {} x 1,000 forged",
        rounds[0], rounds[1], rounds[2]
    );
    // B closes what is left at the handshake deadline.
    let deadline = Instant::now() + Duration::from_secs(15);
    while b.transport.connections.load(Ordering::Relaxed) > 1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    print_resources("after");
    let t = &b.transport;
    println!(
        "worker B: {} connections open, {} accepted, {} handshakes failed, {} evicted in their handshake, {} refused at the limit, {} accept errors",
        t.connections.load(Ordering::Relaxed),
        t.accepted.load(Ordering::Relaxed),
        t.handshakes_failed.load(Ordering::Relaxed),
        t.connections_evicted.load(Ordering::Relaxed),
        t.connections_refused.load(Ordering::Relaxed),
        t.accept_errors.load(Ordering::Relaxed),
    );
    let (after, after_cpu) = rate_over(&b, baseline_secs.min(10));
    println!("words/s after: {after:.0}, {after_cpu:.0} per worker CPU-s");
    a.shutdown(Duration::from_secs(2));
    b.shutdown(Duration::from_secs(2));
    Ok(())
}
