//! `squall logs NAME [--component C] [--port P] [--lines N] [--follow]`: a topology's worker
//! logs without a shell on the machines. Nimbus's topology page lists the workers with their
//! host, port and supervisor's log viewer (`logViewer`); each supervisor's log viewer serves the
//! last lines of a worker's `worker.log` (or another of its files, `--file`), which are printed
//! prefixed by `host:port`. `--follow` then asks each log viewer for what was appended, every
//! `--interval` seconds, until Ctrl-C, and nimbus for the workers every 5 s: a worker that
//! starts (a rebalance, a reassignment) is followed from its last lines, one that went away is
//! dropped, each said on stderr.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use cluster_state::api::{LogRead, MAX_READ_BYTES, TopologyDetail, WorkerSummary};
use cluster_state::ids::TopologyId;
use cluster_state::tls::ClientTls;
use cluster_state::worker_logs::LogFile;
use nimbus_client::{LogViewerClient, LogViewerError};

use crate::config::ClusterConfig;
use crate::ops::{ClientArgs, explain, resolve, runtime};

/// The longest `--interval` between polls of `--follow`.
const MAX_INTERVAL_SECS: u64 = 60;

/// `squall logs`.
#[derive(Debug, clap::Args)]
pub struct LogsCommand {
    /// The topology's name (or id).
    pub name: String,
    /// Only the workers running this component's tasks.
    #[arg(short = 'c', long, value_name = "COMPONENT")]
    pub component: Option<String>,
    /// Only the worker on this port.
    #[arg(short = 'p', long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub port: Option<u16>,
    /// How many of the last lines to print per worker (1 to 10000).
    #[arg(short = 'n', long, value_name = "N", default_value_t = 20)]
    pub lines: u32,
    /// Keep printing what the workers append, until Ctrl-C.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Seconds between polls with --follow (1 to 60).
    #[arg(long, value_name = "SECS", default_value_t = 1)]
    pub interval: u64,
    /// The file to read: worker.log (the worker's log), worker.log.out (its stdout and
    /// stderr), or a rotated one (worker.log.1, ...).
    #[arg(long, value_name = "FILE", default_value = "worker.log")]
    pub file: LogFile,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// One worker being read: where, and how far its file was printed.
struct Followed {
    /// `host:port`: names the worker in every printed line, and tells workers apart.
    label: String,
    topology: TopologyId,
    port: u16,
    viewer: LogViewerClient,
    /// The byte after the last one printed.
    offset: u64,
    /// Bytes of an unfinished last line, printed once it ends.
    partial: String,
}

/// `squall logs`.
pub fn logs(cmd: LogsCommand) -> Result<(), String> {
    LogRead::Tail { lines: cmd.lines }.validate().map_err(|e| format!("--lines: {e}"))?;
    if cmd.interval == 0 || cmd.interval > MAX_INTERVAL_SECS {
        return Err(format!("--interval {}: from 1 to {MAX_INTERVAL_SECS} seconds", cmd.interval));
    }
    let config = ClusterConfig::load(cmd.client.config.as_deref())?;
    let (token, tls) = (config.nimbus_token()?, config.nimbus_tls()?);
    let client = cmd.client.client()?;
    runtime()?.block_on(async {
        let id = resolve(&client, &cmd.name).await?;
        let detail = client.topology(&id).await.map_err(explain)?;
        let workers = select_workers(&detail, cmd.component.as_deref(), cmd.port)?;
        let mut followed = Vec::new();
        for worker in workers {
            followed.push(connect(worker, token.clone(), tls.clone())?);
        }
        let mut failures = Vec::new();
        for worker in &mut followed {
            if let Err(e) = worker.tail(cmd.file, cmd.lines).await {
                failures.push(e);
            }
        }
        if !failures.is_empty() {
            return Err(failures.join("\n"));
        }
        if cmd.follow {
            let watch = Workers { client: &client, id: &id, cmd: &cmd, token, tls };
            follow(&mut followed, &watch, Duration::from_secs(cmd.interval)).await;
        }
        Ok(())
    })
}

/// How often `--follow` asks nimbus which workers to read: a rebalance or a failure moves
/// executors to other workers, and a worker that starts is followed from its last lines.
const REFRESH_WORKERS: Duration = Duration::from_secs(5);

/// What `--follow` needs to find the topology's workers again.
struct Workers<'a> {
    client: &'a nimbus_client::NimbusClient,
    id: &'a TopologyId,
    cmd: &'a LogsCommand,
    token: Option<String>,
    tls: Option<ClientTls>,
}

impl Workers<'_> {
    /// Brings `followed` up to the topology's current workers: new ones are added (their last
    /// `--lines` lines printed), gone ones dropped, each change said on stderr.
    async fn refresh(&self, followed: &mut Vec<Followed>, failing: &mut Option<String>) {
        let selected = match self.client.topology(self.id).await {
            Ok(detail) => {
                select_workers(&detail, self.cmd.component.as_deref(), self.cmd.port).and_then(|ws| {
                    ws.into_iter().map(|w| connect(w, self.token.clone(), self.tls.clone())).collect()
                })
            }
            Err(e) => Err(format!("cannot list the workers of {} again: {}", self.id, explain(e))),
        };
        let selected: Vec<Followed> = match selected {
            Ok(s) => s,
            Err(message) => {
                // Said once until it changes; the workers already followed are kept.
                if failing.as_ref() != Some(&message) {
                    eprintln!("{message}");
                    *failing = Some(message);
                }
                return;
            }
        };
        *failing = None;
        followed.retain(|f| {
            let kept = selected.iter().any(|s| s.label == f.label);
            if !kept {
                eprintln!("[{}] no longer a worker of {}; not followed any more", f.label, self.id);
            }
            kept
        });
        for mut worker in selected {
            if followed.iter().any(|f| f.label == worker.label) {
                continue;
            }
            eprintln!("[{}] a new worker of {}; followed from its last lines", worker.label, self.id);
            if let Err(e) = worker.tail(self.cmd.file, self.cmd.lines).await {
                eprintln!("{e}");
            }
            followed.push(worker);
        }
    }
}

/// The topology's workers to read: all, or those running `component`, or the one on `port`.
pub fn select_workers<'a>(
    detail: &'a TopologyDetail,
    component: Option<&str>,
    port: Option<u16>,
) -> Result<Vec<&'a WorkerSummary>, String> {
    let name = detail.summary.name.as_str();
    if detail.workers.is_empty() {
        return Err(format!("topology {name} has no workers yet (`squall list` shows its status)"));
    }
    let mut workers: Vec<&WorkerSummary> = detail.workers.iter().collect();
    if let Some(component) = component {
        let known = detail
            .spouts
            .iter()
            .map(|s| s.spout_id.as_str())
            .chain(detail.bolts.iter().map(|b| b.bolt_id.as_str()));
        let known: Vec<&str> = known.collect();
        if !known.contains(&component) {
            return Err(format!(
                "topology {name} has no component {component:?}; its components: {}",
                known.join(", ")
            ));
        }
        workers.retain(|w| w.component_num_tasks.keys().any(|c| c.as_str() == component));
        if workers.is_empty() {
            return Err(format!("no worker of topology {name} runs {component:?} yet"));
        }
    }
    if let Some(port) = port {
        let ports: Vec<String> = workers.iter().map(|w| format!("{}:{}", w.host, w.port)).collect();
        workers.retain(|w| w.port == port);
        if workers.is_empty() {
            return Err(format!(
                "topology {name} has no worker on port {port}; its workers: {}",
                ports.join(", ")
            ));
        }
    }
    Ok(workers)
}

fn connect(
    worker: &WorkerSummary,
    token: Option<String>,
    tls: Option<ClientTls>,
) -> Result<Followed, String> {
    let label = format!("{}:{}", worker.host, worker.port);
    let Some(endpoint) = &worker.log_viewer else {
        return Err(format!(
            "{label}: supervisor {} publishes no log viewer (a supervisor older than `squall logs`?)",
            worker.supervisor_id
        ));
    };
    let tls = match (worker.log_viewer_scheme.is_http(), tls) {
        (true, _) => None,
        (false, Some(tls)) => Some(tls),
        (false, None) => {
            return Err(format!(
                "{label}: supervisor {}'s log viewer at {endpoint} is HTTPS; set nimbus.http.tls.ca in the \
                 config file to the CA its certificate chains to",
                worker.supervisor_id
            ));
        }
    };
    Ok(Followed {
        label,
        topology: worker.topology_id.clone(),
        port: worker.port,
        viewer: LogViewerClient::new(endpoint.clone(), token, tls),
        offset: 0,
        partial: String::new(),
    })
}

impl Followed {
    /// Prints the last `lines` lines of `file` and remembers where they ended.
    async fn tail(&mut self, file: LogFile, lines: u32) -> Result<(), String> {
        let chunk = self
            .viewer
            .read(&self.topology, self.port, file, LogRead::Tail { lines })
            .await
            .map_err(|e| worker_error(&self.label, file, e))?;
        self.offset = chunk.start + chunk.length;
        print_lines(&self.label, &mut self.partial, &chunk.data);
        Ok(())
    }
}

fn worker_error(label: &str, file: LogFile, e: LogViewerError) -> String {
    format!("{label}: cannot read {file}: {e}")
}

/// Prints the whole lines of `data` after what `partial` holds, each prefixed by `label`;
/// keeps an unfinished last line in `partial`.
fn print_lines(label: &str, partial: &mut String, data: &str) {
    partial.push_str(data);
    let Some(end) = partial.rfind('\n') else { return };
    let mut out = std::io::stdout().lock();
    for line in partial[..end].split('\n') {
        let _ = writeln!(out, "[{label}] {line}");
    }
    let _ = out.flush();
    partial.drain(..=end);
}

/// Polls every worker every `interval` for what its file gained, until Ctrl-C or SIGTERM,
/// asking nimbus for the topology's workers every [`REFRESH_WORKERS`]. A file that shrank was
/// rotated: reading starts over at its beginning. A worker that cannot be read is reported once
/// until it can again.
async fn follow(workers: &mut Vec<Followed>, watch: &Workers<'_>, interval: Duration) {
    let file = watch.cmd.file;
    let stop = cluster_state::signal::terminate_requested();
    tokio::pin!(stop);
    let mut failing: BTreeMap<String, String> = BTreeMap::new();
    let mut listing_failed = None;
    let mut next_refresh = tokio::time::Instant::now() + REFRESH_WORKERS;
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tokio::time::sleep(interval) => {}
        }
        if tokio::time::Instant::now() >= next_refresh {
            watch.refresh(workers, &mut listing_failed).await;
            next_refresh = tokio::time::Instant::now() + REFRESH_WORKERS;
        }
        for worker in workers.iter_mut() {
            // Whole reads until caught up, at most a few per poll so one busy worker does not
            // starve the others.
            for _ in 0..4 {
                let read = LogRead::Range { start: worker.offset, length: MAX_READ_BYTES };
                match worker.viewer.read(&worker.topology, worker.port, file, read).await {
                    Ok(chunk) if chunk.file_size < worker.offset => {
                        // Rotated: the new file from its start.
                        worker.offset = 0;
                        worker.partial.clear();
                    }
                    Ok(chunk) => {
                        failing.remove(&worker.label);
                        worker.offset = chunk.start + chunk.length;
                        print_lines(&worker.label, &mut worker.partial, &chunk.data);
                        if chunk.length < MAX_READ_BYTES {
                            break;
                        }
                    }
                    Err(e) => {
                        let message = worker_error(&worker.label, file, e);
                        if failing.get(&worker.label) != Some(&message) {
                            eprintln!("{message}");
                            failing.insert(worker.label.clone(), message);
                        }
                        break;
                    }
                }
            }
        }
    }
}
