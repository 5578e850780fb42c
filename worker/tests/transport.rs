#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// The counting allocator below is the one unsafe thing: `GlobalAlloc` is an unsafe trait.
#![allow(unsafe_code)]
//! A worker's port under abuse, measured as an operator would: this process's descriptors
//! (`/proc/self/fd`), threads (`/proc/self/status`), heap bytes in use (a counting allocator:
//! virtual memory mostly measures glibc's per-thread arenas) and the transport's counters,
//! while connections open and close, sit idle, trickle a handshake, or announce huge frames.
//! The tests count process-wide resources, so they run one at a time.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::AtomicUsize;

use std::io::Write;
use std::net::TcpStream;
use std::sync::Mutex;
use std::sync::atomic::Ordering;
use std::time::Duration;

use cluster_state::ids::{TopologyId, TopologyName};
use test_harness::wait_for;
use worker::builtin::{SentenceParams, SentenceSpout, SplitSentence, WordCount};
use worker::process::{StaticWorker, TransportOptions};
use worker::transport::{FRAME_LIMIT, TopologySecret, connect_as_peer};
use worker::{Topology, TopologyBuilder};

/// Heap bytes in use.
static HEAP: AtomicUsize = AtomicUsize::new(0);

struct Counting;

// SAFETY: every call is passed to `System` unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HEAP.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        HEAP.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HEAP.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        HEAP.fetch_add(new_size, Ordering::Relaxed);
        HEAP.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One test at a time: they measure the whole process.
static EXCLUSIVE: Mutex<()> = Mutex::new(());

fn wordcount() -> Topology {
    let mut b = TopologyBuilder::new("wc");
    b.set_spout("sentences", 1, || SentenceSpout::new(SentenceParams::default()));
    b.set_bolt("split", 1, SplitSentence::default).shuffle_grouping("sentences");
    b.set_bolt("count", 1, WordCount::default).fields_grouping("split", ["word"]);
    b.build().unwrap()
}

fn id() -> TopologyId {
    TopologyId::new(&TopologyName::new("wc").unwrap(), 1, 1_700_000_000)
}

fn worker(max_connections: usize, secret: &TopologySecret) -> StaticWorker {
    let options = TransportOptions { max_connections, ..TransportOptions::new("127.0.0.1", secret.clone()) };
    StaticWorker::alone(wordcount(), &id(), 0, options).unwrap()
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A `/proc/self/status` field in its unit (kB for sizes).
fn status(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn until(what: &str, done: impl FnMut() -> bool) {
    wait_for(Duration::from_secs(30), what, done);
}

#[test]
fn connect_close_cycles_leave_no_descriptor_behind() {
    let _one = EXCLUSIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let secret = TopologySecret::generate();
    let w = worker(256, &secret);
    let addr = w.local_addr();
    let before = fds();
    // Peers that reconnect (a handshake, then a normal close) and probes that close at once.
    for _ in 0..250 {
        drop(connect_as_peer(addr, id().as_str(), &secret).unwrap());
        drop(TcpStream::connect(addr).unwrap());
    }
    until("every connection forgotten", || w.transport.connections.load(Ordering::Relaxed) == 0);
    until("descriptors back to the baseline", || fds() <= before + 4);
    assert_eq!(w.transport.accepted.load(Ordering::Relaxed), 250);
    w.shutdown(Duration::from_secs(1));
}

#[test]
fn idle_connections_slow_handshakes_and_huge_frame_headers_stay_bounded() {
    let _one = EXCLUSIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let secret = TopologySecret::generate();
    const MAX: usize = 64;
    let w = worker(MAX, &secret);
    let addr = w.local_addr();
    let (threads_before, heap_before) = (status("Threads:"), HEAP.load(Ordering::Relaxed));
    // 20 authenticated peers each announce a frame of the largest size and send 1 KiB of it:
    // a buffer of the announced size each would be 1.25 GiB.
    let mut big = Vec::new();
    for _ in 0..20 {
        let mut s = connect_as_peer(addr, id().as_str(), &secret).unwrap();
        s.write_all(&u32::try_from(FRAME_LIMIT).unwrap().to_be_bytes()).unwrap();
        s.write_all(&[0; 1024]).unwrap();
        big.push(s);
    }
    // The 20 are authenticated on the worker's side before anything else arrives (the
    // oldest connection still in its handshake is the one evicted at the limit).
    until("20 peers authenticated", || w.transport.accepted.load(Ordering::Relaxed) == 20);
    // 20 slow handshakes: a hello announced, a few bytes of it sent, never the rest.
    let mut slow = Vec::new();
    for _ in 0..20 {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&100u32.to_be_bytes()).unwrap();
        s.write_all(b"SQL2").unwrap();
        slow.push(s);
    }
    // And 1,000 connections that say nothing.
    let idle: Vec<TcpStream> = (0..1000).map(|_| TcpStream::connect(addr).unwrap()).collect();
    // Over the limit, each new connection takes the place of the oldest one still in its
    // handshake; none is refused while such a one is open.
    let evicted = || w.transport.connections_evicted.load(Ordering::Relaxed);
    until("connections over the limit evicted", || evicted() >= 1040 - MAX as u64);
    assert_eq!(w.transport.connections_refused.load(Ordering::Relaxed), 0);
    let open = w.transport.connections.load(Ordering::Relaxed);
    assert!(open <= MAX as u64, "{open} connections open, limit {MAX}");
    let threads = status("Threads:");
    assert!(threads <= threads_before + MAX as u64 + 4, "threads {threads_before} -> {threads}");
    let heap_mib = HEAP.load(Ordering::Relaxed).saturating_sub(heap_before) / (1024 * 1024);
    assert!(heap_mib < 64, "the heap grew by {heap_mib} MiB");
    // Connections that did not complete the handshake are closed at its deadline (or were
    // evicted); the authenticated peers stay, idle as they may be.
    until("unauthenticated connections closed", || w.transport.connections.load(Ordering::Relaxed) == 20);
    until("every unauthenticated connection failed its handshake", || {
        w.transport.handshakes_failed.load(Ordering::Relaxed) == 1020
    });
    // The port is still usable.
    drop(connect_as_peer(addr, id().as_str(), &secret).unwrap());
    drop((big, slow, idle));
    w.shutdown(Duration::from_secs(1));
    until("receiver threads gone", || status("Threads:") <= threads_before + 4);
}

/// User + system CPU seconds of this process so far, from `/proc/self/stat` opened already
/// (no descriptor may be left to open it).
fn cpu_secs(stat: &std::fs::File) -> f64 {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 1024];
    let n = stat.read_at(&mut buf, 0).unwrap();
    let stat = String::from_utf8_lossy(&buf[..n]);
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    // utime and stime, in USER_HZ (100 on Linux), are fields 14 and 15: 11 and 12 after ')'.
    (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / 100.0
}

#[test]
fn out_of_descriptors_the_accept_loop_backs_off_and_recovers() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let _one = EXCLUSIVE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let secret = TopologySecret::generate();
    let w = worker(256, &secret);
    let addr = w.local_addr();
    let limit = getrlimit(Resource::Nofile);
    // Room for the test's own connections, none for the worker to accept them with. Each
    // accepted connection takes a descriptor in this process too, so 30 attempts exhaust 20;
    // but when the accept loop keeps pace with the connects, every connection that got a
    // descriptor is accepted and none waits: then the round is tried again.
    let stat = std::fs::File::open("/proc/self/stat").unwrap();
    let mut clients: Vec<TcpStream> = Vec::new();
    for round in 1..=10 {
        let low = u64::try_from(fds()).unwrap() + 20;
        setrlimit(Resource::Nofile, rustix::process::Rlimit { current: Some(low), maximum: limit.maximum })
            .unwrap();
        clients = (0..30).filter_map(|_| TcpStream::connect(addr).ok()).collect();
        let failed = || w.transport.accept_errors.load(Ordering::Relaxed) > 0;
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while !failed() && std::time::Instant::now() < deadline {
            std::thread::park_timeout(Duration::from_millis(20));
        }
        if failed() {
            break;
        }
        assert!(round < 10, "no accept failed in 10 rounds of 30 connections with 20 descriptors free");
        setrlimit(Resource::Nofile, limit).unwrap();
        clients.clear();
    }
    // Over the next second the accept loop retries with backoff instead of spinning a core
    // (it did: 100% CPU while descriptors ran out).
    let (cpu0, errors0) = (cpu_secs(&stat), w.transport.accept_errors.load(Ordering::Relaxed));
    let t0 = std::time::Instant::now();
    while t0.elapsed() < Duration::from_secs(1) {
        std::thread::park_timeout(Duration::from_millis(100));
    }
    let (cpu, retries) =
        (cpu_secs(&stat) - cpu0, w.transport.accept_errors.load(Ordering::Relaxed) - errors0);
    assert!(retries < 200, "{retries} accept retries in a second");
    assert!(cpu < 0.5, "{cpu:.2} CPU seconds in one second");
    setrlimit(Resource::Nofile, limit).unwrap();
    drop(clients);
    until("the worker accepting again", || connect_as_peer(addr, id().as_str(), &secret).is_ok());
    w.shutdown(Duration::from_secs(1));
}
