//! Multilang benchmark: the word count with its split bolt in Python (pystorm, Storm's
//! multilang protocol over pipes: examples/python-wordcount) against the native split, acking
//! on, `topology.max.spout.pending` 1000, two split tasks. Prints for each: sentences/s,
//! words/s, words per CPU-second (this process from `getrusage` plus the Python subprocesses'
//! threads from `/proc/<pid>/task/*/schedstat`), and where the CPU went (Squall's threads vs
//! the subprocesses); then what the JSON framing costs on Squall's side per tuple (encoding a
//! sentence tuple, parsing a word emit and an ack, as serde_json does them in the shell bolt).
//! Every line ends with the CPU other processes burnt meanwhile and the load average.
//!
//! `cargo bench -p worker --bench multilang [-- <sentences>]` (default 50,000 for Python; the
//! native run takes 20 times as many). Needs python3 with pystorm.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use test_harness::measure::{Window, threads_cpu};
use worker::builtin::{SENTENCE_COUNT, reference_corpus};
use worker::{LocalCluster, Registry};

fn words_in(items: u64) -> u64 {
    let corpus = reference_corpus();
    (0..items).map(|i| corpus[(i % SENTENCE_COUNT as u64) as usize].split(' ').count() as u64).sum()
}

/// Child processes of this one (the shell bolts' subprocesses).
fn children() -> Vec<u32> {
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().is_some_and(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().nth(1).map(|p| p == me))
                    .unwrap_or(false)
            })
        })
        .collect()
}

fn run(label: &str, split: &str, sentences: u64) {
    let resources = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/python-wordcount/resources");
    let yaml = format!(
        "name: bench\n\
         config:\n  topology.workers: 1\n  topology.max.spout.pending: 1000\n  topology.message.timeout.secs: 120\n\
         spouts:\n  - {{id: sentences, className: sentence-generator, params: {{count: {sentences}}}}}\n\
         bolts:\n{split}  - {{id: count, className: word-count, parallelism: 2, params: {{emit: false}}}}\n\
         streams:\n  - {{from: sentences, to: split, grouping: {{type: SHUFFLE}}}}\n\
         \x20 - {{from: split, to: count, grouping: {{type: FIELDS, args: [word]}}}}\n"
    );
    let topology = match Registry::with_builtins().with_resources_dir(&resources).load_str(&yaml) {
        Ok(t) => t,
        Err(e) => return eprintln!("{label}: {e}"),
    };
    let cluster = match LocalCluster::start_inactive(topology) {
        Ok(c) => c,
        Err(e) => return eprintln!("{label}: {e}"),
    };
    // The subprocesses start in `prepare`: wait for them before the clock starts.
    std::thread::sleep(Duration::from_millis(if split.contains("shell") { 1500 } else { 100 }));
    let kids = children();
    let kids_before: Duration = kids.iter().map(|p| threads_cpu(*p)).sum();
    let window = Window::start(&[]);
    cluster.runtime().activate();
    let acked = || {
        cluster
            .runtime()
            .component_stats("sentences")
            .iter()
            .map(|s| s.acked.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    while acked() < sentences && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let kids_cpu: Duration =
        kids.iter().map(|p| threads_cpu(*p)).sum::<Duration>().saturating_sub(kids_before);
    let m = window.finish_with(kids_cpu);
    let done = acked();
    cluster.shutdown(Duration::from_secs(1));
    let words = words_in(done) as f64;
    let own = m.cpu_s - kids_cpu.as_secs_f64();
    println!(
        "{label:<14} {done} sentences in {:.2} s: {:.0} sentences/s, {:.0} words/s, {:.0} words per CPU-s \
         (CPU {:.2} s: squall {:.2} s, subprocesses {:.2} s) {}",
        m.secs,
        done as f64 / m.secs,
        words / m.secs,
        words / m.cpu_s.max(1e-9),
        m.cpu_s,
        own,
        kids_cpu.as_secs_f64(),
        m.context()
    );
}

/// What serde_json costs Squall per tuple on the multilang path: the sentence tuple written to
/// the subprocess, a word emit and an ack read back (the shell bolt's work besides routing).
fn json_cost() {
    let corpus = reference_corpus();
    let n = 200_000u64;
    let started = Instant::now();
    let mut bytes = 0usize;
    for i in 0..n {
        let s = corpus[(i % SENTENCE_COUNT as u64) as usize].as_str();
        let msg = serde_json::json!({"id": i.to_string(), "comp": "sentences", "stream": "default", "task": 5, "tuple": [s]});
        let mut out = serde_json::to_vec(&msg).unwrap_or_default();
        out.extend_from_slice(b"\nend\n");
        bytes += out.len();
    }
    let encode = started.elapsed().as_secs_f64() / n as f64;
    let emit =
        r#"{"command": "emit", "tuple": ["processing"], "anchors": ["123456"], "need_task_ids": false}"#;
    let ack = r#"{"command": "ack", "id": "123456"}"#;
    let started = Instant::now();
    for _ in 0..n {
        let e: serde_json::Value = serde_json::from_str(emit).unwrap_or_default();
        let a: serde_json::Value = serde_json::from_str(ack).unwrap_or_default();
        std::hint::black_box((e, a));
    }
    let parse = started.elapsed().as_secs_f64() / n as f64;
    let words_per_sentence = words_in(SENTENCE_COUNT as u64) as f64 / SENTENCE_COUNT as f64;
    println!(
        "json (squall side): encode a sentence tuple {:.2} us ({} bytes), parse an emit + an ack {:.2} us; \
         per sentence ({words_per_sentence:.1} words) {:.1} us",
        encode * 1e6,
        bytes / n as usize,
        parse * 1e6,
        (encode + parse / 2.0 * (words_per_sentence + 1.0)) * 1e6
    );
}

fn main() {
    let sentences: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(50_000);
    run("native split", "  - {id: split, className: split-sentence, parallelism: 2}\n", sentences * 20);
    run(
        "pystorm split",
        "  - {id: split, className: shell-bolt, parallelism: 2, constructorArgs: [[python3, split.py], [word]]}\n",
        sentences,
    );
    json_cost();
}
