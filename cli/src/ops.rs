//! Storm's operator verbs over nimbus's HTTP API: `submit`, `list`, `kill`, `activate`,
//! `deactivate`, `rebalance`, `errors`. Topologies are named by their name (as in Storm's CLI);
//! an id (`name-counter-secs`) works too.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use cluster_state::api::{
    Count, LogConfigRequest, LoggerLevelRequest, NimbusSummaries, RebalanceOptions, SubmitTopology,
    TopologySummaries,
};
use cluster_state::ids::{ComponentId, TopologyId};
use cluster_state::structure::TopologyStructure;
use cluster_state::znode::LoggerName;
use nimbus_client::{ClientError, NimbusClient};

use crate::config::ClusterConfig;

/// Where nimbus is.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Cluster config file (YAML, Storm's key names); nimbus is at its `nimbus.http.address`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// nimbus's API address (or several, comma-separated: the leader is found among them),
    /// overriding the config file's `nimbus.seeds` / `nimbus.http.address`.
    #[arg(long, value_name = "HOST:PORT[,HOST:PORT...]")]
    pub nimbus: Option<String>,
}

impl ClientArgs {
    /// A client of every nimbus named (`--nimbus`, else `nimbus.seeds`, else
    /// `nimbus.http.address`), following the leader through a failover.
    pub(crate) fn client(&self) -> Result<NimbusClient, String> {
        let config = ClusterConfig::load(self.config.as_deref())?;
        let seeds: Vec<String> = match &self.nimbus {
            Some(a) => a.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect(),
            None => config.nimbus_seeds()?,
        };
        if let Some(bad) = seeds.iter().find(|s| nimbus::daemon::parse_host_port(s).is_none()) {
            return Err(format!("nimbus address {bad:?} is not host:port"));
        }
        if seeds.is_empty() {
            return Err("--nimbus names no address".to_owned());
        }
        Ok(NimbusClient::with_seeds(seeds, config.nimbus_token()?).with_tls(config.nimbus_tls()?))
    }
}

/// `squall submit`.
#[derive(Debug, clap::Args)]
pub struct SubmitCommand {
    /// The topology file (Flux-style YAML).
    pub file: PathBuf,
    /// The user's own worker binary (built with the worker crate and their components); without
    /// it, supervisors run the topology on the squall binary's built-in components.
    #[arg(long, value_name = "PATH")]
    pub worker_binary: Option<PathBuf>,
    /// The directory of the shell components' files (scripts, requirement lists), uploaded with
    /// the topology and their working directory on the supervisors (Storm: the jar's
    /// `resources/`). Default: `resources/` beside the topology file, when there is one.
    #[arg(long, value_name = "DIR")]
    pub resources: Option<PathBuf>,
    /// Submit deactivated: spouts stay paused until `squall activate`.
    #[arg(long)]
    pub inactive: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// A verb on one topology: `activate`, `deactivate`, `errors`.
#[derive(Debug, clap::Args)]
pub struct NameCommand {
    /// The topology's name (or id).
    pub name: String,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `squall kill`.
#[derive(Debug, clap::Args)]
pub struct KillCommand {
    /// The topology's name (or id).
    pub name: String,
    /// Seconds between deactivating the spouts and removing the topology, so in-flight tuples
    /// can finish (Storm's default is the message timeout, 30 s unless the topology sets it).
    #[arg(short = 'w', long = "wait", value_name = "SECS", default_value_t = 30)]
    pub wait_secs: u64,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `squall rebalance`.
#[derive(Debug, clap::Args)]
pub struct RebalanceCommand {
    /// The topology's name (or id).
    pub name: String,
    /// Seconds with spouts paused before the executors move.
    #[arg(short = 'w', long = "wait", value_name = "SECS", default_value_t = 30)]
    pub wait_secs: u64,
    /// The new number of workers.
    #[arg(short = 'n', long = "num-workers", value_name = "N")]
    pub num_workers: Option<u32>,
    /// A component's new executor count, `COMPONENT=N` (repeatable).
    #[arg(short = 'e', long = "executors", value_name = "COMPONENT=N")]
    pub executors: Vec<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start: {e}"))
}

/// A failed call worded for the operator: what to do next when nimbus does not answer.
pub fn explain(e: ClientError) -> String {
    match e {
        ClientError::Unreachable { .. } => format!(
            "{e} (is `squall nimbus` running there? set nimbus.http.address in the config file or pass --nimbus)"
        ),
        e => e.to_string(),
    }
}

/// Finds the id of the topology called `name` (an id is accepted as is, if nimbus has it).
pub(crate) async fn resolve(client: &NimbusClient, name: &str) -> Result<TopologyId, String> {
    let summary = client.topology_summary().await.map_err(explain)?;
    summary
        .topologies
        .into_iter()
        .find(|t| t.name.as_str() == name || t.id.as_str() == name)
        .map(|t| t.id)
        .ok_or_else(|| {
            format!("no topology named {name:?} is running; `squall list` shows the ones that are")
        })
}

/// `squall submit`: checks the file here, uploads it (and the worker binary), submits.
pub fn submit(cmd: SubmitCommand, components: &worker::Registry) -> Result<(), String> {
    let text = std::fs::read_to_string(&cmd.file)
        .map_err(|e| format!("cannot read topology file {}: {e}", cmd.file.display()))?;
    // Without a worker binary the squall binary's components run it: check it fully here, so
    // a bad class or stream is reported before anything is uploaded. With one, the structure
    // is what can be checked; the user's binary resolves the classes.
    match cmd.worker_binary {
        None => {
            components.load_file(&cmd.file).map_err(|e| e.to_string())?;
        }
        Some(_) => {
            TopologyStructure::from_flux(&text).map_err(|e| format!("{}: {e}", cmd.file.display()))?;
        }
    }
    let binary = match &cmd.worker_binary {
        Some(path) => Some(
            std::fs::read(path).map_err(|e| format!("cannot read worker binary {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let resources = resources_archive(&cmd.file, cmd.resources.as_deref())?;
    let client = cmd.client.client()?;
    runtime()?.block_on(async {
        // Uploads live on the nimbus that received them: when the leader changes during a
        // submit, the whole submit starts again at the new leader.
        let deadline = tokio::time::Instant::now() + client.failover;
        loop {
            let leader = client.current();
            match submit_once(&client, &cmd, &text, binary.as_deref(), resources.as_deref()).await {
                Err(e)
                    if client.current() != leader
                        && tokio::time::Instant::now() < deadline
                        && (e.is_retryable() || e.status() == Some(nimbus_client::StatusCode::NOT_FOUND)) =>
                {
                    eprintln!("squall submit: the leader changed during the submit ({e}); submitting again");
                }
                other => return other.map_err(explain),
            }
        }
    })
}

/// The resources archive to upload with `topology_file`: `dir` packed, or `resources/` beside
/// the file when there is one; `None` when neither.
pub fn resources_archive(topology_file: &Path, dir: Option<&Path>) -> Result<Option<Vec<u8>>, String> {
    let dir = match dir {
        Some(d) if d.is_dir() => d.to_owned(),
        Some(d) => return Err(format!("--resources {}: not a directory", d.display())),
        None => {
            let beside =
                topology_file.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            let d = beside.join(cluster_state::resources::DIR_NAME);
            if !d.is_dir() {
                return Ok(None);
            }
            d
        }
    };
    let archive = cluster_state::resources::pack_dir(&dir).map_err(|e| e.to_string())?;
    eprintln!("resources: {} ({} KiB packed)", dir.display(), archive.len().div_ceil(1024));
    Ok(Some(archive))
}

async fn submit_once(
    client: &NimbusClient,
    cmd: &SubmitCommand,
    text: &str,
    binary: Option<&[u8]>,
    resources: Option<&[u8]>,
) -> Result<(), ClientError> {
    {
        let topology_upload = client.upload(text.as_bytes(), |_| {}).await?;
        let worker_upload = match binary {
            Some(bytes) => {
                let total = bytes.len() as f64 / 1_048_576.0;
                let id = client
                    .upload(bytes, |sent| {
                        eprint!(
                            "\ruploading the worker binary: {:.1} / {total:.1} MiB",
                            sent as f64 / 1_048_576.0
                        );
                        let _ = std::io::stderr().flush();
                    })
                    .await?;
                eprintln!();
                Some(id)
            }
            None => None,
        };
        let resources_upload = match resources {
            Some(bytes) => Some(client.upload(bytes, |_| {}).await?),
            None => None,
        };
        let request = SubmitTopology {
            topology_upload,
            worker_upload,
            resources_upload,
            inactive: cmd.inactive,
            owner: std::env::var("USER").unwrap_or_default(),
        };
        let submitted = client.submit(&request).await?;
        println!(
            "Submitted topology {} as {} ({}, {} workers)",
            submitted.name, submitted.id, submitted.status, submitted.workers
        );
        Ok(())
    }
}

/// `squall list`: Storm's table.
pub fn list(args: ClientArgs) -> Result<(), String> {
    let client = args.client()?;
    runtime()?.block_on(async {
        let summary = client.topology_summary().await.map_err(explain)?;
        print!("{}", list_table(&summary));
        Ok(())
    })
}

/// `squall nimbus-summary`: every nimbus and who leads.
pub fn nimbus_summary(args: ClientArgs) -> Result<(), String> {
    let client = args.client()?;
    runtime()?.block_on(async {
        let summary = client.nimbus_summary().await.map_err(explain)?;
        print!("{}", nimbus_table(&summary));
        Ok(())
    })
}

/// One line per nimbus: address, status (Storm UI's words), version, uptime.
pub fn nimbus_table(summary: &NimbusSummaries) -> String {
    if summary.nimbuses.is_empty() {
        return "No nimbus is registered in ZooKeeper.\n".to_owned();
    }
    let mut out = format!(
        "{:<28} {:<14} {:<10} {}\n{}\n",
        "Nimbus",
        "Status",
        "Version",
        "Uptime_secs",
        "-".repeat(66)
    );
    for n in &summary.nimbuses {
        out.push_str(&format!(
            "{:<28} {:<14} {:<10} {}\n",
            n.address(),
            n.status,
            n.version,
            n.nimbus_up_time_seconds
        ));
    }
    out
}

/// Storm's `list` output for a topology summary.
pub fn list_table(summary: &TopologySummaries) -> String {
    let topologies = &summary.topologies;
    if topologies.is_empty() {
        return "No topologies running.\n".to_owned();
    }
    let mut out = format!(
        "{:<24} {:<12} {:<10} {:<12} {}\n{}\n",
        "Topology_name",
        "Status",
        "Num_tasks",
        "Num_workers",
        "Uptime_secs",
        "-".repeat(72)
    );
    for t in topologies {
        out.push_str(&format!(
            "{:<24} {:<12} {:<10} {:<12} {}\n",
            t.name.as_str(),
            t.status,
            t.tasks_total,
            t.workers_total,
            t.uptime_seconds,
        ));
    }
    out
}

/// `squall activate` / `squall deactivate`.
pub fn set_active(cmd: NameCommand, active: bool) -> Result<(), String> {
    let client = cmd.client.client()?;
    runtime()?.block_on(async {
        let id = resolve(&client, &cmd.name).await?;
        let done = if active { client.activate(&id).await } else { client.deactivate(&id).await };
        done.map_err(explain)?;
        println!("{} topology: {}", if active { "Activated" } else { "Deactivated" }, cmd.name);
        Ok(())
    })
}

/// `squall kill`.
pub fn kill(cmd: KillCommand) -> Result<(), String> {
    let client = cmd.client.client()?;
    runtime()?.block_on(async {
        let id = resolve(&client, &cmd.name).await?;
        client.kill(&id, cmd.wait_secs).await.map_err(explain)?;
        println!("Killed topology: {} (removed in {} s)", cmd.name, cmd.wait_secs);
        Ok(())
    })
}

/// `-e COMPONENT=N` values, checked.
pub fn parse_executors(values: &[String]) -> Result<BTreeMap<ComponentId, Count>, String> {
    values
        .iter()
        .map(|v| {
            let (component, n) =
                v.split_once('=').ok_or_else(|| format!("-e {v:?}: COMPONENT=N is expected"))?;
            let n: u32 =
                n.parse().map_err(|_| format!("-e {v:?}: {n:?} is not a whole number of executors"))?;
            if component.is_empty() {
                return Err(format!("-e {v:?}: the component is missing"));
            }
            let component = ComponentId::new(component).map_err(|e| format!("-e {v:?}: {e}"))?;
            Ok((component, Count(n)))
        })
        .collect()
}

/// `squall rebalance`.
pub fn rebalance(cmd: RebalanceCommand) -> Result<(), String> {
    let executors = parse_executors(&cmd.executors)?;
    let client = cmd.client.client()?;
    runtime()?.block_on(async {
        let id = resolve(&client, &cmd.name).await?;
        let options = RebalanceOptions { num_workers: cmd.num_workers.map(Count), executors };
        client.rebalance(&id, cmd.wait_secs, options).await.map_err(explain)?;
        println!("Rebalancing topology: {} (in {} s)", cmd.name, cmd.wait_secs);
        Ok(())
    })
}

/// `squall errors`: the errors components reported, newest first.
pub fn errors(cmd: NameCommand) -> Result<(), String> {
    let client = cmd.client.client()?;
    runtime()?.block_on(async {
        let id = resolve(&client, &cmd.name).await?;
        let errors = client.errors(&id).await.map_err(explain)?.errors;
        if errors.is_empty() {
            println!("No errors reported by topology {}.", cmd.name);
        }
        for e in errors {
            println!(
                "{}s ago  {}  {}:{}  {}",
                e.error_lapsed_secs, e.component, e.error_host, e.error_port, e.error
            );
        }
        Ok(())
    })
}

/// `squall set-log-level`.
#[derive(Debug, clap::Args)]
pub struct SetLogLevelCommand {
    /// The topology's name (or id).
    pub name: String,
    /// `LOGGER=LEVEL[:TIMEOUT-SECS]` (repeatable): LOGGER is ROOT (the default level) or a
    /// module path (`kafka_spout`, `worker::builtin`); LEVEL one of TRACE, DEBUG, INFO, WARN,
    /// ERROR, OFF; without a timeout the level stays until changed again.
    #[arg(required = true, value_name = "LOGGER=LEVEL[:TIMEOUT-SECS]")]
    pub levels: Vec<String>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Reads `LOGGER=LEVEL[:TIMEOUT-SECS]` (Storm's `-l` argument).
fn parse_log_level(spec: &str) -> Result<(LoggerName, LoggerLevelRequest), String> {
    let (logger, rest) =
        spec.split_once('=').ok_or_else(|| format!("{spec:?}: LOGGER=LEVEL[:TIMEOUT-SECS] is required"))?;
    let (level, timeout) = match rest.split_once(':') {
        Some((level, secs)) => {
            let secs = secs
                .parse::<u64>()
                .map_err(|_| format!("{spec:?}: timeout {secs:?} is not a whole number of seconds"))?;
            (level, secs)
        }
        None => (rest, 0),
    };
    Ok((logger.parse()?, LoggerLevelRequest { target_level: level.parse()?, timeout }))
}

/// `squall set-log-level`: changes log levels of a running topology's workers, no restart.
pub fn set_log_level(cmd: SetLogLevelCommand) -> Result<(), String> {
    let levels = cmd.levels.iter().map(|s| parse_log_level(s)).collect::<Result<_, _>>()?;
    let client = cmd.client.client()?;
    runtime()?.block_on(async {
        let id = resolve(&client, &cmd.name).await?;
        let request = LogConfigRequest { named_logger_levels: levels };
        let view = client.set_log_config(&id, &request).await.map_err(explain)?;
        for (logger, level) in view.named_logger_levels {
            match level.timeout_epoch {
                Some(ms) => {
                    let left = ms.saturating_sub(cluster_state::clock::now_millis()).div_ceil(1000);
                    println!("{logger}={} for {left}s more", level.target_level);
                }
                None => println!("{logger}={}", level.target_level),
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_levels_are_storms_specs() {
        let (logger, level) = parse_log_level("worker::builtin=debug:30").unwrap();
        assert_eq!(
            (logger.as_str(), level.target_level.as_str(), level.timeout),
            ("worker::builtin", "DEBUG", 30)
        );
        assert_eq!(parse_log_level("ROOT=WARN").unwrap().1.timeout, 0);
        for (bad, says) in [
            ("ROOT", "LOGGER=LEVEL"),
            ("ROOT=LOUD", "one of TRACE"),
            ("ROOT=DEBUG:x", "whole number"),
            ("a,b=DEBUG", "module path"),
        ] {
            let err = parse_log_level(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn executor_options_are_checked() {
        let ok = parse_executors(&["split=4".into(), "count=2".into()]).unwrap();
        assert_eq!(ok.get(&ComponentId::new("split").unwrap()), Some(&Count(4)));
        for (bad, says) in [
            ("split", "COMPONENT=N"),
            ("split=x", "not a whole number"),
            ("=3", "component is missing"),
            ("a/b=3", "invalid component id"),
        ] {
            let err = parse_executors(&[bad.into()]).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn nimbus_summary_names_the_leader() {
        let view = |host: &str, status: &str| cluster_state::api::NimbusSummaryView {
            host: host.into(),
            port: 8080,
            status: status.into(),
            version: "0.1.0".into(),
            nimbus_up_time: "1s".into(),
            nimbus_up_time_seconds: 1,
        };
        let table = nimbus_table(&NimbusSummaries {
            nimbuses: vec![view("n1", "Leader"), view("n2", "Not a Leader")],
        });
        let rows: Vec<Vec<&str>> = table
            .lines()
            .skip(2)
            .map(|l| l.split("  ").filter(|c| !c.is_empty()).map(str::trim).collect())
            .collect();
        assert_eq!(rows, [["n1:8080", "Leader", "0.1.0", "1"], ["n2:8080", "Not a Leader", "0.1.0", "1"]]);
        assert!(nimbus_table(&NimbusSummaries { nimbuses: vec![] }).contains("No nimbus"));
    }

    #[test]
    fn list_prints_storms_table() {
        assert_eq!(list_table(&TopologySummaries { topologies: vec![] }), "No topologies running.\n");
        let table = list_table(&TopologySummaries {
            topologies: vec![cluster_state::api::TopologySummary {
                id: "wordcount-1-1700000000".parse().unwrap(),
                name: cluster_state::ids::TopologyName::new("wordcount").unwrap(),
                status: "ACTIVE".into(),
                uptime: "1m 1s".into(),
                uptime_seconds: 61,
                tasks_total: 9,
                workers_total: 2,
                executors_total: 5,
                owner: String::new(),
            }],
        });
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("Topology_name") && lines[0].contains("Num_workers"));
        assert_eq!(lines[2].find('9'), lines[0].find("Num_tasks"), "columns line up: {table}");
        let row: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(row, ["wordcount", "ACTIVE", "9", "2", "61"]);
    }
}
