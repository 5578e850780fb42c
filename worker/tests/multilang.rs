#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Shell components (Storm's multilang protocol) with real pystorm and streamparse subprocesses
//! (installed from PyPI by `.ci/run`): the Python word count counts what the native one does,
//! a pystorm spout gets its acks and fails back, and a subprocess writing garbage is an error
//! naming it and the line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use worker::builtin::reference_sentence;
use worker::multilang::{ShellSpec, ShellSpout};
use worker::{
    Bolt, BoltCollector, ComponentError, Fields, LocalCluster, Registry, TopologyBuilder, TopologyConfig,
    Tuple,
};

/// The Python example's resources: pystorm's split bolt, streamparse's count bolt.
fn example_resources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/python-wordcount/resources")
}

fn require_python_packages() {
    let out = std::process::Command::new("python3").args(["-c", "import pystorm, streamparse"]).output();
    match out {
        Ok(o) if o.status.success() => {}
        other => panic!(
            "these tests need python3 with pystorm and streamparse (`.ci/run` installs them): {other:?}"
        ),
    }
}

/// The first error reports of `cluster`, waiting up to 30 s for one.
fn first_errors(cluster: &LocalCluster) -> Vec<worker::ErrorReport> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut errors = Vec::new();
    while errors.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        errors.extend(cluster.take_errors());
    }
    errors
}

type Counts = Arc<Mutex<BTreeMap<String, i64>>>;

/// Keeps the highest count seen per word.
struct Capture(Counts);

impl Bolt for Capture {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let word = input.get_str(0).ok_or("no word")?.to_owned();
        let count = input.get_int(1).ok_or("no count")?;
        let mut counts = self.0.lock().unwrap();
        let c = counts.entry(word).or_insert(0);
        *c = (*c).max(count);
        out.ack(input);
        Ok(())
    }
}

fn registry_with_capture(counts: &Counts) -> Registry {
    let mut registry = Registry::with_builtins().with_resources_dir(example_resources());
    let counts = counts.clone();
    registry.register_bolt("capture", move |_| {
        let counts = counts.clone();
        Ok(Arc::new(move || Box::new(Capture(counts.clone())) as Box<dyn Bolt>))
    });
    registry
}

const SENTENCES: u64 = 3000;

fn wordcount_yaml(split: &str, count: &str) -> String {
    format!(
        "name: wc\n\
         config:\n  topology.workers: 1\n  topology.max.spout.pending: 500\n\
         spouts:\n  - id: sentences\n    className: sentence-generator\n    parallelism: 1\n    params: {{count: {SENTENCES}}}\n\
         bolts:\n{split}{count}  - id: sink\n    className: capture\n    parallelism: 1\n\
         streams:\n  - from: sentences\n    to: split\n    grouping: {{type: SHUFFLE}}\n\
         \x20 - from: split\n    to: count\n    grouping: {{type: FIELDS, args: [word]}}\n\
         \x20 - from: count\n    to: sink\n    grouping: {{type: GLOBAL}}\n"
    )
}

/// Runs the word count until its spout acked every sentence; returns the final counts.
fn run_wordcount(split: &str, count: &str) -> BTreeMap<String, i64> {
    let counts: Counts = Arc::default();
    let topology = registry_with_capture(&counts).load_str(&wordcount_yaml(split, count)).unwrap();
    let cluster = LocalCluster::start(topology).unwrap();
    let acked = || {
        cluster
            .runtime()
            .component_stats("sentences")
            .iter()
            .map(|s| s.acked.load(std::sync::atomic::Ordering::Relaxed))
            .sum::<u64>()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while acked() < SENTENCES && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (errors, done) = (cluster.take_errors(), acked());
    cluster.shutdown(Duration::from_secs(2));
    assert_eq!(done, SENTENCES, "every sentence acked; errors: {errors:?}");
    assert!(errors.is_empty(), "{errors:?}");
    counts.lock().unwrap().clone()
}

#[test]
fn pystorm_split_and_streamparse_count_count_what_the_native_word_count_does() {
    require_python_packages();
    let native = run_wordcount(
        "  - id: split\n    className: split-sentence\n    parallelism: 2\n",
        "  - id: count\n    className: word-count\n    parallelism: 2\n",
    );
    let python = run_wordcount(
        "  - id: split\n    className: org.apache.storm.flux.wrappers.bolts.FluxShellBolt\n    \
         constructorArgs: [[python3, split.py], [word]]\n    parallelism: 2\n",
        "  - id: count\n    className: shell-bolt\n    \
         constructorArgs: [[python3, count.py], [word, count]]\n    parallelism: 2\n",
    );
    // The reference corpus, counted here: the independent answer both must give.
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for k in 0..SENTENCES {
        for w in reference_sentence(k % 1024).split(' ') {
            *expected.entry(w.to_owned()).or_default() += 1;
        }
    }
    assert_eq!(native, expected);
    assert_eq!(python, expected);
}

/// Fails every tenth tuple it sees, acks the rest; records what it acked.
struct FailTenth {
    seen: u64,
    acked: Arc<Mutex<BTreeSet<i64>>>,
}

impl Bolt for FailTenth {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        self.seen += 1;
        if self.seen.is_multiple_of(10) {
            out.fail(input);
        } else {
            self.acked.lock().unwrap().insert(input.get_int(0).ok_or("no n")?);
            out.ack(input);
        }
        Ok(())
    }
}

/// Collects the numbers the Python spout says were acked (its `acked` stream, emitted from its
/// `ack` callback).
struct AckedByPython(Arc<Mutex<BTreeSet<i64>>>);

impl Bolt for AckedByPython {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        self.0.lock().unwrap().insert(input.get_int(0).ok_or("no n")?);
        out.ack(input);
        Ok(())
    }
}

const NUMBERS_SPOUT: &str = r#"
from pystorm import Spout


class Numbers(Spout):
    def initialize(self, conf, ctx):
        self.total = conf["test.numbers"]
        self.next = 0
        self.replay = []
        self.done = set()

    def next_tuple(self):
        if self.replay:
            n = self.replay.pop()
        elif self.next < self.total:
            n = self.next
            self.next += 1
        else:
            return
        self.emit([n], tup_id="n%d" % n, need_task_ids=(n % 7 == 0))

    def ack(self, tup_id):
        n = int(tup_id[1:])
        if n not in self.done:
            self.done.add(n)
            self.emit([n], stream="acked")

    def fail(self, tup_id):
        self.replay.append(int(tup_id[1:]))


Numbers().run()
"#;

#[test]
fn a_pystorm_spout_gets_acks_and_fails_and_every_message_is_eventually_acked() {
    require_python_packages();
    const N: i64 = 2000;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("number_spout.py"), NUMBERS_SPOUT).unwrap();
    let spec = ShellSpec {
        command: vec!["python3".into(), "number_spout.py".into()],
        component_config: [("test.numbers".to_owned(), serde_json::Value::from(N))].into_iter().collect(),
        outputs: vec![("default".into(), Fields::new(["n"])), ("acked".into(), Fields::new(["n"]))],
        working_dir: dir.path().to_owned(),
    };
    let (bolt_acked, python_acked) =
        (Arc::new(Mutex::new(BTreeSet::new())), Arc::new(Mutex::new(BTreeSet::new())));
    let mut b = TopologyBuilder::new("numbers");
    b.config(TopologyConfig {
        max_spout_pending: Some(200),
        message_timeout_secs: 30,
        ..TopologyConfig::default()
    });
    b.set_spout("numbers", 1, move || ShellSpout::new(spec.clone()));
    let acked = bolt_acked.clone();
    b.set_bolt("flaky", 2, move || FailTenth { seen: 0, acked: acked.clone() }).shuffle_grouping("numbers");
    let acked = python_acked.clone();
    b.set_bolt("acked", 1, move || AckedByPython(acked.clone())).grouping(
        "numbers",
        "acked",
        worker::Grouping::Global,
    );
    let cluster = LocalCluster::start(b.build().unwrap()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while python_acked.lock().unwrap().len() < N as usize && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = cluster.runtime().component_stats("numbers");
    let failed: u64 = stats.iter().map(|s| s.failed.load(std::sync::atomic::Ordering::Relaxed)).sum();
    let errors = cluster.take_errors();
    cluster.shutdown(Duration::from_secs(2));
    assert!(errors.is_empty(), "{errors:?}");
    let all: BTreeSet<i64> = (0..N).collect();
    // Every number's ack reached the Python spout (which said so on its stream) ...
    assert_eq!(*python_acked.lock().unwrap(), all);
    assert_eq!(*bolt_acked.lock().unwrap(), all);
    // ... after about a tenth of the emits failed and were replayed by the spout.
    assert!(failed >= (N as u64) / 20, "failed {failed}");
}

#[test]
fn a_subprocess_writing_garbage_is_an_error_naming_it_and_the_line() {
    let yaml = "name: junk\n\
                spouts:\n  - id: sentences\n    className: sentence-generator\n    params: {count: 10}\n\
                bolts:\n  - id: junk\n    className: shell-bolt\n    constructorArgs:\n      \
                - [python3, -c, \"import sys; print('{\\\"pid\\\": 1}'); print('end'); print('this is not json', flush=True); sys.stdin.read()\"]\n      \
                - [word]\n\
                streams:\n  - {from: sentences, to: junk, grouping: {type: SHUFFLE}}\n";
    let topology = Registry::with_builtins().load_str(yaml).unwrap();
    let cluster = LocalCluster::start(topology).unwrap();
    let errors = first_errors(&cluster);
    cluster.shutdown(Duration::from_secs(1));
    let error = &errors.first().expect("an error report").error;
    assert!(error.contains("shell bolt \"junk\""), "{error}");
    assert!(error.contains("garbage at line 3 of its output"), "{error}");
    assert!(error.contains("\"this is not json\""), "{error}");
    assert_eq!(errors[0].component.as_str(), "junk");
}

#[test]
fn a_shell_component_that_cannot_start_is_an_error_naming_its_command() {
    let yaml = "name: missing\n\
                spouts:\n  - id: s\n    className: shell-spout\n    constructorArgs: [[./no-such-program], [x]]\n\
                bolts:\n  - {id: print, className: log}\n\
                streams:\n  - {from: s, to: print, grouping: {type: SHUFFLE}}\n";
    let topology = Registry::with_builtins().with_resources_dir(std::env::temp_dir()).load_str(yaml).unwrap();
    let cluster = LocalCluster::start(topology).unwrap();
    let errors = first_errors(&cluster);
    cluster.shutdown(Duration::from_secs(1));
    let error = &errors.first().expect("an error report").error;
    assert!(error.contains("shell spout \"s\""), "{error}");
    assert!(error.contains("no-such-program"), "{error}");
    assert!(error.contains("cannot start"), "{error}");
}

#[test]
fn flux_shell_components_are_checked_when_loaded() {
    let load = |bolt: &str| {
        let yaml = format!(
            "name: t\nspouts:\n  - {{id: s, className: sentence-generator}}\nbolts:\n{bolt}\n\
             streams:\n  - {{from: s, to: b, grouping: {{type: SHUFFLE}}}}\n"
        );
        Registry::with_builtins().load_str(&yaml).map(|_| ()).map_err(|e| e.to_string())
    };
    assert_eq!(load("  - {id: b, className: shell-bolt, constructorArgs: [[python3, b.py], [w]]}"), Ok(()));
    // The command alone: the streams come from configMethods (or the bolt is a sink).
    assert_eq!(load("  - {id: b, className: shell-bolt, constructorArgs: [[python3, b.py]]}"), Ok(()));
    assert_eq!(
        load("  - {id: b, className: shell-bolt, constructorArgs: [[python3, b.py], {k: 1}, [w]]}"),
        Ok(())
    );
    for (bolt, says) in [
        ("  - {id: b, className: shell-bolt}", "missing constructorArgs"),
        ("  - {id: b, className: shell-bolt, constructorArgs: [[], [w]]}", "the command is empty"),
        ("  - {id: b, className: shell-bolt, constructorArgs: [python3, [w]]}", "the command must be a list"),
        ("  - {id: b, className: shell-bolt, constructorArgs: [[p], [w], [x], [y]]}", "4 constructorArgs"),
        ("  - {id: b, className: shell-bolt, constructorArgs: [[p], [w]], params: {x: 1}}", "not params"),
        ("  - {id: b, className: log, constructorArgs: [[p], [w]]}", "only for shell components"),
    ] {
        let err = load(bolt).unwrap_err();
        assert!(err.contains(says) && err.contains("\"b\""), "{bolt}: {err}");
    }
}

#[test]
fn a_slow_shell_bolt_holds_its_spout_back_instead_of_queueing() {
    // A subprocess that reads nothing: its bolt's queues fill, and the spout (unreliable, so
    // max.spout.pending does not limit it) is held by backpressure, with bounded memory.
    // Shutting down waits for the subprocess timeout (the bolt is stuck writing until then).
    let yaml = "name: slow\n\
                config:\n  topology.executor.receive.buffer.size: 64\n  topology.producer.batch.size: 8\n  topology.acker.executors: 0\n  topology.subprocess.timeout.secs: 4\n\
                spouts:\n  - {id: s, className: sentence-generator, params: {reliable: false}}\n\
                bolts:\n  - id: slow\n    className: shell-bolt\n    constructorArgs:\n      \
                - [python3, -c, \"import sys,time; print('{\\\"pid\\\": 1}'); print('end', flush=True); time.sleep(600)\"]\n      \
                - [w]\n\
                streams:\n  - {from: s, to: slow, grouping: {type: SHUFFLE}}\n";
    let topology = Registry::with_builtins().load_str(yaml).unwrap();
    let cluster = LocalCluster::start(topology).unwrap();
    let emitted = || {
        cluster
            .runtime()
            .component_stats("s")
            .iter()
            .map(|s| s.emitted.load(std::sync::atomic::Ordering::Relaxed))
            .sum::<u64>()
    };
    // Time to fill everything, then a second in which nothing more goes out (both within the
    // 4 s after which the silent subprocess would be given up).
    std::thread::sleep(Duration::from_millis(2000));
    let last = emitted();
    std::thread::sleep(Duration::from_millis(1000));
    let after = emitted();
    cluster.shutdown(Duration::from_secs(1));
    // The pipe (64 KiB), the write queue (100) and the bolt's inbox (64) hold a few thousand
    // sentences at most; an unthrottled spout emits millions in 3 s.
    assert!(after < 20_000, "emitted {after}");
    assert_eq!(after, last, "the spout is held, not emitting");
}

#[test]
fn a_subprocess_that_exits_is_an_error_with_its_status_and_last_words() {
    let yaml = "name: exits\n\
                spouts:\n  - {id: s, className: sentence-generator, params: {count: 5}}\n\
                bolts:\n  - id: dies\n    className: shell-bolt\n    constructorArgs:\n      \
                - [python3, -c, \"import sys; sys.stderr.write('boom at start\\\\n'); sys.exit(3)\"]\n      \
                - [w]\n\
                streams:\n  - {from: s, to: dies, grouping: {type: SHUFFLE}}\n";
    let topology = Registry::with_builtins().load_str(yaml).unwrap();
    let cluster = LocalCluster::start(topology).unwrap();
    let errors = first_errors(&cluster);
    cluster.shutdown(Duration::from_secs(1));
    let error = &errors.first().expect("an error report").error;
    assert!(error.contains("shell bolt \"dies\""), "{error}");
    assert!(error.contains("exit status: 3"), "{error}");
    assert!(error.contains("boom at start"), "{error}");
}

const LENGTHS_BOLT: &str = r#"
from pystorm import Bolt


class Lengths(Bolt):
    auto_anchor = True
    auto_ack = True
    auto_fail = True

    def process(self, tup):
        words = [w for w in tup.values[0].split(" ") if w]
        for word in words:
            self.emit([word])
            self.emit([word, len(word)], stream="lengths")
        self.report_metric("words", len(words))
        self.send_message({"command": "metrics", "name": "sentences"})


Lengths().run()
"#;

/// Sums the `length` field of what it sees.
struct SumLengths(Arc<Mutex<(u64, i64)>>);

impl Bolt for SumLengths {
    fn execute(&mut self, input: &Tuple, out: &mut BoltCollector<'_>) -> Result<(), ComponentError> {
        let mut seen = self.0.lock().unwrap();
        seen.0 += 1;
        seen.1 += input.get_int(1).ok_or("no length")?;
        out.ack(input);
        Ok(())
    }
}

#[test]
fn a_pystorm_bolt_emits_on_a_stream_named_in_flux_and_counts_its_own_metrics() {
    require_python_packages();
    const N: u64 = 500;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("lengths.py"), LENGTHS_BOLT).unwrap();
    let lengths = Arc::new(Mutex::new((0u64, 0i64)));
    let mut registry = Registry::with_builtins().with_resources_dir(dir.path());
    let sink = lengths.clone();
    registry.register_bolt("sum-lengths", move |_| {
        let sink = sink.clone();
        Ok(Arc::new(move || Box::new(SumLengths(sink.clone())) as Box<dyn Bolt>))
    });
    let yaml = format!(
        r#"
name: lengths
spouts:
  - {{id: sentences, className: sentence-generator, params: {{count: {N}}}}}
bolts:
  - id: split
    className: org.apache.storm.flux.wrappers.bolts.FluxShellBolt
    constructorArgs:
      - [python3, lengths.py]
    configMethods:
      - {{name: setDefaultStream, args: [[word]]}}
      - {{name: setNamedStream, args: [lengths, [word, length]]}}
  - {{id: count, className: word-count}}
  - {{id: sum, className: sum-lengths}}
streams:
  - {{from: sentences, to: split, grouping: {{type: SHUFFLE}}}}
  - {{from: split, to: count, grouping: {{type: FIELDS, args: [word]}}}}
  - {{from: split, to: sum, grouping: {{type: GLOBAL, streamId: lengths}}}}
"#
    );
    let cluster = LocalCluster::start(registry.load_str(&yaml).unwrap()).unwrap();
    let acked = || {
        let stats = cluster.runtime().component_stats("sentences");
        stats.iter().map(|s| s.acked.load(std::sync::atomic::Ordering::Relaxed)).sum::<u64>()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while acked() < N && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let done = acked();
    let counts: Vec<Vec<(String, u64)>> =
        cluster.runtime().component_stats("split").iter().map(|s| s.counts()).collect();
    let errors = cluster.take_errors();
    cluster.shutdown(Duration::from_secs(2));
    assert_eq!(done, N, "every sentence acked; errors: {errors:?}");
    assert!(errors.is_empty(), "{errors:?}");
    // The reference corpus, measured here.
    let (mut words, mut letters) = (0u64, 0i64);
    for k in 0..N {
        for w in reference_sentence(k % 1024).split(' ') {
            words += 1;
            letters += w.len() as i64;
        }
    }
    assert_eq!(*lengths.lock().unwrap(), (words, letters), "(tuples, letters) on the lengths stream");
    let mut total: BTreeMap<String, u64> = BTreeMap::new();
    for (name, value) in counts.into_iter().flatten() {
        *total.entry(name).or_default() += value;
    }
    assert_eq!(total, BTreeMap::from([("sentences".to_owned(), N), ("words".to_owned(), words)]));
}
