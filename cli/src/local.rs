//! `squall local <topology.yaml>`: run a topology in this process, with nothing else installed.
//!
//! For now this runs the topology's workers in-process (the worker crate's `LocalCluster`:
//! every executor, acking and groupings as in a cluster, tuples passed in memory). Nimbus and a
//! supervisor over the in-memory coordination backend join it once topology submission lands;
//! the command line stays the same. Progress is printed while it runs, a summary when it stops
//! (after `--duration`, or on Ctrl-C / SIGTERM).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use worker::{LocalCluster, Registry};

/// Drain time for in-flight tuples when stopping (a graceful kill, as `kill -w`).
const DRAIN: Duration = Duration::from_secs(5);

/// `squall local` arguments.
#[derive(Debug, clap::Args)]
pub struct LocalCommand {
    /// The topology file (Flux-style YAML), e.g. examples/wordcount.yaml.
    pub topology: PathBuf,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long, value_name = "SECS")]
    pub duration: Option<u64>,
    /// Seconds between progress lines (0: none).
    #[arg(long, value_name = "SECS", default_value_t = 2)]
    pub progress: u64,
}

/// Per-component totals, summed over its executors.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Totals {
    executors: usize,
    emitted: u64,
    acked: u64,
    failed: u64,
    /// Mean complete latency over the spout executors that report one.
    complete_ms: Option<f64>,
}

fn totals(cluster: &LocalCluster, components: &[(String, bool)]) -> BTreeMap<String, Totals> {
    components
        .iter()
        .map(|(name, is_spout)| {
            let stats: Vec<_> =
                cluster.runtime().component_stats(name).iter().map(|s| s.snapshot()).collect();
            let latencies: Vec<f64> =
                stats.iter().map(|s| s.complete_latency_ms).filter(|&l| *is_spout && l > 0.0).collect();
            let totals = Totals {
                executors: stats.len(),
                emitted: stats.iter().map(|s| s.emitted).sum(),
                acked: stats.iter().map(|s| s.acked).sum(),
                failed: stats.iter().map(|s| s.failed).sum(),
                complete_ms: (!latencies.is_empty())
                    .then(|| latencies.iter().sum::<f64>() / latencies.len() as f64),
            };
            (name.clone(), totals)
        })
        .collect()
}

/// One progress line: the spouts' totals and rates since the previous line.
fn progress_line(
    elapsed: Duration,
    now: &BTreeMap<String, Totals>,
    before: &BTreeMap<String, Totals>,
    since: Duration,
    components: &[(String, bool)],
) -> String {
    let secs = since.as_secs_f64().max(1e-3);
    let mut line = format!("[{:>5.1}s]", elapsed.as_secs_f64());
    for (name, _) in components.iter().filter(|(_, is_spout)| *is_spout) {
        let t = now.get(name).copied().unwrap_or_default();
        let b = before.get(name).copied().unwrap_or_default();
        let rate = (t.acked.saturating_sub(b.acked)) as f64 / secs;
        let _ = write!(
            line,
            " {name}: emitted {} acked {} ({rate:.0}/s) failed {}",
            t.emitted, t.acked, t.failed
        );
    }
    line
}

/// The summary table printed when the topology stops.
fn summary_table(totals: &BTreeMap<String, Totals>, components: &[(String, bool)]) -> String {
    let width = components.iter().map(|(n, _)| n.len()).max().unwrap_or(9).max(9);
    let mut out = format!(
        "{:<width$}  {:>9}  {:>12}  {:>12}  {:>8}  {:>11}\n",
        "component", "executors", "emitted", "acked", "failed", "complete ms"
    );
    for (name, is_spout) in components {
        let t = totals.get(name).copied().unwrap_or_default();
        let latency = match (is_spout, t.complete_ms) {
            (true, Some(ms)) => format!("{ms:.2}"),
            _ => "-".to_owned(),
        };
        let _ = writeln!(
            out,
            "{name:<width$}  {:>9}  {:>12}  {:>12}  {:>8}  {latency:>11}",
            t.executors, t.emitted, t.acked, t.failed
        );
    }
    out
}

/// Runs the command; the error is a message for the user (naming the file and what is wrong).
pub fn execute(cmd: LocalCommand, registry: &Registry) -> Result<(), String> {
    let topology =
        registry.load_file(&cmd.topology).map_err(|e| format!("{}: {e}", cmd.topology.display()))?;
    let mut components: Vec<(String, bool)> =
        topology.components().iter().map(|(id, spec)| (id.to_string(), spec.is_spout())).collect();
    // Spouts first, then bolts, each by name: the order data flows in, roughly.
    components.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let executors: u32 = topology.component_executors().values().sum();
    eprintln!(
        "squall local: running topology {} ({} components, {executors} executors, {} workers in this \
         process){}",
        topology.name(),
        components.len(),
        topology.config().workers,
        match cmd.duration {
            Some(secs) => format!(" for {secs} s"),
            None => "; Ctrl-C to stop".to_owned(),
        }
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let cluster = LocalCluster::start(topology).map_err(|e| format!("cannot start the topology: {e}"))?;
    let started = Instant::now();
    runtime.block_on(async {
        let stop = async {
            match cmd.duration {
                Some(secs) => tokio::time::sleep(Duration::from_secs(secs)).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(stop);
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let period = Duration::from_secs(cmd.progress.max(1));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let (mut before, mut last) = (BTreeMap::new(), Instant::now());
        loop {
            tokio::select! {
                () = &mut stop => break,
                _ = tokio::signal::ctrl_c() => break,
                Some(()) = async { match terminate.as_mut() { Some(t) => t.recv().await, None => None } } => break,
                _ = tick.tick() => {
                    for error in cluster.take_errors() {
                        eprintln!("error in {} (task {}): {}", error.component, error.task, error.error);
                    }
                    if cmd.progress > 0 {
                        let now = totals(&cluster, &components);
                        eprintln!("{}", progress_line(started.elapsed(), &now, &before, last.elapsed(), &components));
                        (before, last) = (now, Instant::now());
                    }
                }
            }
        }
    });

    eprintln!("squall local: stopping (draining in-flight tuples for up to {} s)", DRAIN.as_secs());
    let final_totals = totals(&cluster, &components);
    let ran = started.elapsed();
    cluster.shutdown(DRAIN);
    eprintln!("squall local: ran {:.1} s\n{}", ran.as_secs_f64(), summary_table(&final_totals, &components));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn components() -> Vec<(String, bool)> {
        vec![("sentences".into(), true), ("count".into(), false)]
    }

    #[test]
    fn progress_shows_spout_totals_and_rates() {
        let before: BTreeMap<_, _> =
            [("sentences".to_owned(), Totals { acked: 1000, ..Default::default() })].into_iter().collect();
        let now: BTreeMap<_, _> = [(
            "sentences".to_owned(),
            Totals { executors: 1, emitted: 3100, acked: 3000, failed: 2, complete_ms: Some(1.5) },
        )]
        .into_iter()
        .collect();
        let line =
            progress_line(Duration::from_secs(4), &now, &before, Duration::from_secs(2), &components());
        assert_eq!(line, "[  4.0s] sentences: emitted 3100 acked 3000 (1000/s) failed 2");
    }

    #[test]
    fn summary_lists_every_component_with_latency_for_spouts_only() {
        let totals: BTreeMap<_, _> = [
            (
                "sentences".to_owned(),
                Totals { executors: 1, emitted: 10, acked: 9, failed: 1, complete_ms: Some(2.0) },
            ),
            (
                "count".to_owned(),
                Totals { executors: 2, emitted: 40, acked: 40, failed: 0, complete_ms: None },
            ),
        ]
        .into_iter()
        .collect();
        let table = summary_table(&totals, &components());
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("component") && lines[0].ends_with("complete ms"));
        assert!(lines[1].starts_with("sentences") && lines[1].ends_with("2.00"), "{}", lines[1]);
        assert!(lines[2].starts_with("count") && lines[2].trim_end().ends_with('-'), "{}", lines[2]);
    }
}
