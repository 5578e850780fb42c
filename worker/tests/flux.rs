#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The Flux loader: a good file loads; each bad file is rejected with an error naming the
//! element and line, and nothing runs.

use worker::{Error, Registry};

const GOOD: &str = r#"
name: wordcount
config:
  topology.workers: 2
  topology.max.spout.pending: 1000
spouts:
  - id: sentences
    className: sentence-generator
    parallelism: 1
    params: {rate_per_sec: 1000, count: 100}
bolts:
  - id: split
    className: split-sentence
    parallelism: 2
  - id: count
    className: word-count
    parallelism: 3
    numTasks: 6
streams:
  - name: "sentences --> split"
    from: sentences
    to: split
    grouping:
      type: SHUFFLE
  - from: split
    to: count
    grouping:
      type: FIELDS
      args: [word]
"#;

fn load(text: &str) -> Result<worker::Topology, Error> {
    Registry::with_builtins().load_str(text)
}

#[test]
fn a_good_file_loads_with_storm_defaults_for_the_rest() {
    let t = load(GOOD).unwrap();
    assert_eq!(t.name(), "wordcount");
    assert_eq!(t.config().workers, 2);
    assert_eq!(t.config().max_spout_pending, Some(1000));
    assert_eq!(t.config().message_timeout_secs, 30);
    let execs: Vec<(String, u32)> =
        t.component_executors().into_iter().map(|(c, n)| (c.to_string(), n)).collect();
    assert_eq!(
        execs,
        vec![("__acker".into(), 2), ("count".into(), 3), ("sentences".into(), 1), ("split".into(), 2)]
    );
    assert_eq!(t.component("count").unwrap().num_tasks, 6);
}

/// Replaces `from` by `to` in the good file (which must contain it).
fn bad(from: &str, to: &str) -> Error {
    assert!(GOOD.contains(from), "test bug: {from:?} not in the good file");
    match load(&GOOD.replacen(from, to, 1)) {
        Ok(_) => panic!("{from:?} -> {to:?} was accepted"),
        Err(e) => e,
    }
}

#[test]
fn bad_files_name_the_element_and_line() {
    // (change, expected variant check, expected message fragments)
    type Check = fn(&Error) -> bool;
    let cases: Vec<(&str, &str, Check, Vec<&str>)> = vec![
        (
            "className: word-count",
            "className: word-counter",
            |e| matches!(e, Error::UnknownComponent { .. }),
            vec!["line 16", "bolts[1] \"count\" className", "\"word-counter\"", "known: filter"],
        ),
        (
            "  - from: split\n    to: count",
            "  - from: splitter\n    to: count",
            |e| matches!(e, Error::UnknownComponent { .. }),
            vec!["line 25", "streams[1] \"splitter --> count\"", "unknown component \"splitter\""],
        ),
        (
            "    to: split\n",
            "    to: nowhere\n",
            |e| matches!(e, Error::UnknownComponent { .. }),
            vec!["line 21", "streams[0] \"sentences --> split\"", "\"nowhere\""],
        ),
        (
            "      type: SHUFFLE",
            "      type: SHUFFLE\n      streamId: errors",
            |e| matches!(e, Error::UnknownStream { .. }),
            vec!["line 21", "streams[0]", "declares no stream \"errors\"", "known: default"],
        ),
        (
            "args: [word]",
            "args: [wrd]",
            |e| matches!(e, Error::BadGroupingField { .. }),
            vec!["line 25", "streams[1] \"split --> count\"", "no field \"wrd\"", "known: word"],
        ),
        (
            "  - id: count",
            "  - id: split",
            |e| matches!(e, Error::DuplicateId { .. }),
            vec!["line 15", "bolts[1] \"split\"", "duplicate component id \"split\""],
        ),
        (
            "  - id: split",
            "  - id: split.words",
            |e| matches!(e, Error::BadName { .. }),
            vec!["line 12", "bolts[0] \"split.words\"", "invalid name"],
        ),
        (
            "name: wordcount",
            "name: word:count",
            |e| matches!(e, Error::BadName { .. }),
            vec!["line 2", "name", "\"word:count\""],
        ),
        (
            "    parallelism: 2",
            "    paralelism: 2",
            |e| matches!(e, Error::Yaml { .. }),
            vec!["line 14", "unknown field `paralelism`"],
        ),
        (
            "  topology.workers: 2",
            "  topology.wrokers: 2",
            |e| matches!(e, Error::Yaml { .. }),
            vec!["line 4", "topology.wrokers"],
        ),
        (
            "      type: SHUFFLE",
            "      type: RANDOM",
            |e| matches!(e, Error::Yaml { .. }),
            vec!["line 24", "RANDOM"],
        ),
        (
            "  topology.max.spout.pending: 1000",
            "  topology.max.spout.pending: 0",
            |e| matches!(e, Error::BadConfig { .. }),
            vec!["topology.max.spout.pending", "at least 1"],
        ),
        (
            "  topology.max.spout.pending: 1000",
            "  topology.max.spout.pending: 1000\n  squall.batch.flush.interval.us: 5000000",
            |e| matches!(e, Error::BadConfig { .. }),
            vec!["squall.batch.flush.interval.us", "at most 1000000 (1 s)"],
        ),
        (
            "  topology.max.spout.pending: 1000",
            "  topology.max.spout.pending: 1000\n  squall.spout.wait.short.us: 2000000",
            |e| matches!(e, Error::BadConfig { .. }),
            vec!["squall.spout.wait.short.us", "at most 1000000 (1 s)"],
        ),
        (
            "  topology.max.spout.pending: 1000",
            "  topology.max.spout.pending: 1000\n  squall.spout.linger.us: 1000001",
            |e| matches!(e, Error::BadConfig { .. }),
            vec!["squall.spout.linger.us", "at most 1000000 (1 s)", "10 is the default"],
        ),
        (
            "  topology.max.spout.pending: 1000",
            "  topology.max.spout.pending: 1000\n  squall.worker.cpu.latency.us: 2000000",
            |e| matches!(e, Error::BadConfig { .. }),
            vec!["squall.worker.cpu.latency.us", "at most 1000000 (1 s)", "machine's setting"],
        ),
        (
            "  topology.max.spout.pending: 1000",
            "  topology.max.spout.pending: 1000\n  squall.worker.cpu.latency.us: -1",
            |e| matches!(e, Error::Yaml { .. }),
            vec!["squall.worker.cpu.latency.us"],
        ),
        (
            "params: {rate_per_sec: 1000, count: 100}",
            "params: {rate: 1000}",
            |e| matches!(e, Error::BadParams { .. }),
            vec!["line 7", "spouts[0] \"sentences\"", "unknown field `rate`"],
        ),
        (
            "    parallelism: 3\n    numTasks: 6",
            "    parallelism: 3\n    numTasks: 2",
            |e| matches!(e, Error::BadParallelism { .. }),
            vec!["bolts[1] \"count\"", "numTasks 2 is less than parallelism 3"],
        ),
        (
            "      type: SHUFFLE",
            "      type: SHUFFLE\n      args: [word]",
            |e| matches!(e, Error::BadGrouping { .. }),
            vec!["streams[0]", "only FIELDS grouping takes args"],
        ),
    ];
    for (from, to, check, fragments) in cases {
        let e = bad(from, to);
        let msg = e.to_string();
        assert!(check(&e), "{from:?} -> {to:?}: unexpected variant: {e:?}");
        for f in fragments {
            assert!(msg.contains(f), "{from:?} -> {to:?}: {msg:?} lacks {f:?}");
        }
    }
}

#[test]
fn user_components_register_next_to_the_builtins() {
    let mut registry = Registry::with_builtins();
    registry.register_bolt("shout", |_| {
        Ok(std::sync::Arc::new(|| Box::new(worker::builtin::LogSink) as Box<dyn worker::Bolt>))
    });
    let text = GOOD.replacen("className: word-count", "className: shout", 1);
    assert!(registry.load_str(&text).is_ok());
}

#[test]
fn a_missing_file_names_the_path() {
    let e =
        Registry::with_builtins().load_file(std::path::Path::new("/nonexistent/topology.yaml")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/topology.yaml"), "{e}");
}

/// Nimbus reads only the structure of a topology file (`cluster_state::structure`); it must
/// count executors and tasks exactly as the worker's loader does, or the two disagree on task
/// ids.
#[test]
fn nimbus_reads_the_same_structure_as_the_loader() {
    let mut files = vec![GOOD.to_owned(), GOOD.replace("topology.workers: 2", "topology.acker.executors: 0")];
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");
    for entry in std::fs::read_dir(examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            files.push(std::fs::read_to_string(path).unwrap());
        }
    }
    let mut registry = Registry::with_builtins();
    kafka_like_components(&mut registry);
    for text in files {
        let topology = registry.load_str(&text).unwrap();
        let structure = cluster_state::structure::TopologyStructure::from_flux(&text).unwrap();
        assert_eq!(structure.name.as_str(), topology.name());
        assert_eq!(structure.num_workers, topology.config().workers);
        let shapes: Vec<_> =
            structure.components.iter().map(|(c, s)| (c.clone(), s.executors, s.tasks)).collect();
        assert_eq!(shapes, topology.component_parallelism(), "{text}");
    }
}

/// Example files may name the Kafka components (registered by the `squall` binary, not this
/// crate); stand-ins with the same names let the loader check the rest of those files.
fn kafka_like_components(registry: &mut Registry) {
    registry.register_spout("kafka-spout", |_| {
        Ok(std::sync::Arc::new(|| {
            Box::new(worker::builtin::SentenceSpout::new(Default::default())) as Box<dyn worker::Spout>
        }))
    });
    registry.register_bolt("kafka-bolt", |_| {
        Ok(std::sync::Arc::new(|| Box::new(worker::builtin::LogSink) as Box<dyn worker::Bolt>))
    });
}

/// A word count whose split bolt is a shell bolt declared Flux's way, with `configMethods`.
const SHELL: &str = r#"
name: shellstreams
spouts:
  - id: sentences
    className: sentence-generator
    params: {rate_per_sec: 1000, count: 100}
bolts:
  - id: split
    className: org.apache.storm.flux.wrappers.bolts.FluxShellBolt
    constructorArgs:
      - [python3, split.py]
    configMethods:
      - name: setDefaultStream
        args:
          - [word]
      - name: setNamedStream
        args:
          - lengths
          - [word, length]
      - name: addComponentConfig
        args: [split.lower, true]
  - id: count
    className: word-count
streams:
  - from: sentences
    to: split
    grouping:
      type: SHUFFLE
  - from: split
    to: count
    grouping:
      type: FIELDS
      args: [length]
      streamId: lengths
"#;

#[test]
fn shell_components_declare_named_streams_with_flux_config_methods() {
    let t = load(SHELL).unwrap();
    let split = t.component("split").unwrap();
    assert_eq!(split.output("default").map(|f| f.names().to_vec()), Some(vec!["word".to_owned()]));
    assert_eq!(
        split.output("lengths").map(|f| f.names().to_vec()),
        Some(vec!["word".to_owned(), "length".to_owned()])
    );
    // A later setter replaces a stream's fields, as Flux's map does.
    let replaced = SHELL.replace("      - name: setNamedStream\n        args:\n          - lengths\n          - [word, length]",
        "      - name: setNamedStream\n        args:\n          - lengths\n          - [word, length]\n      - name: setNamedStream\n        args:\n          - lengths\n          - [length]");
    let t = load(&replaced).unwrap();
    let lengths = t.component("split").unwrap().output("lengths").map(|f| f.names().to_vec());
    assert_eq!(lengths, Some(vec!["length".to_owned()]));

    let cases: [(&str, &str, &[&str]); 5] = [
        // A grouping on a field the named stream does not declare.
        ("      args: [length]\n      streamId", "      args: [size]\n      streamId", &["size"]),
        (
            "          - lengths\n",
            "          - \"\"\n",
            &["bolts[0] \"split\"", "configMethods[1]", "stream name"],
        ),
        (
            "      - name: setDefaultStream",
            "      - name: setOutputFields",
            &["configMethods[0]", "unknown method \"setOutputFields\""],
        ),
        (
            "        args: [split.lower, true]",
            "        args: [split.lower]",
            &["configMethods[2]", "takes args [key, value], got 1"],
        ),
        (
            "          - [word]\n",
            "          - word\n",
            &["configMethods[0]", "output fields must be a list of strings"],
        ),
    ];
    for (from, to, fragments) in cases {
        assert!(SHELL.contains(from), "test bug: {from:?}");
        let msg = match load(&SHELL.replacen(from, to, 1)) {
            Ok(_) => panic!("{from:?} -> {to:?} was accepted"),
            Err(e) => e.to_string(),
        };
        for f in fragments {
            assert!(msg.contains(f), "{from:?} -> {to:?}: {msg:?} lacks {f:?}");
        }
    }
    // Only shell components take configMethods.
    let native = GOOD.replace("    className: split-sentence\n", "    className: split-sentence\n    configMethods:\n      - name: setNamedStream\n        args: [x, [y]]\n");
    let msg = load(&native).map(|_| ()).unwrap_err().to_string();
    assert!(msg.contains("configMethods are only for shell components"), "{msg}");
}
