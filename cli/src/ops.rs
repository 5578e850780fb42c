//! Storm's operator verbs over nimbus's HTTP API: `submit`, `list`, `kill`, `activate`,
//! `deactivate`, `rebalance`, `errors`. Topologies are named by their name (as in Storm's CLI);
//! an id (`name-counter-secs`) works too.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use cluster_state::structure::TopologyStructure;
use serde_json::{Value, json};

use crate::client::NimbusClient;
use crate::config::ClusterConfig;

/// Where nimbus is.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Cluster config file (YAML, Storm's key names); nimbus is at its `nimbus.http.address`.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// nimbus's API address, overriding the config file.
    #[arg(long, value_name = "HOST:PORT")]
    pub nimbus: Option<String>,
}

impl ClientArgs {
    fn client(&self) -> Result<NimbusClient, String> {
        let config = ClusterConfig::load(self.config.as_deref())?;
        let address = match &self.nimbus {
            Some(a) => a.clone(),
            None => config.nimbus_address()?,
        };
        Ok(NimbusClient::new(address, config.nimbus_token()?))
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

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start: {e}"))
}

/// Finds the id of the topology called `name` (an id is accepted as is, if nimbus has it).
async fn resolve(client: &NimbusClient, name: &str) -> Result<String, String> {
    let summary = client.get("/api/v1/topology/summary").await.map_err(|e| e.to_string())?;
    let topologies = summary["topologies"].as_array().cloned().unwrap_or_default();
    topologies
        .iter()
        .find(|t| t["name"] == name || t["id"] == name)
        .and_then(|t| t["id"].as_str().map(str::to_owned))
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
    let client = cmd.client.client()?;
    runtime()?.block_on(async {
        let topology_upload = client.upload(text.as_bytes(), |_| {}).await.map_err(|e| e.to_string())?;
        let worker_upload = match &binary {
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
                    .await
                    .map_err(|e| e.to_string())?;
                eprintln!();
                Some(id)
            }
            None => None,
        };
        let owner = std::env::var("USER").unwrap_or_default();
        let body = json!({
            "topologyUpload": topology_upload,
            "workerUpload": worker_upload,
            "inactive": cmd.inactive,
            "owner": owner,
        });
        let submitted = client.post("/api/v1/topology/submit", &body).await.map_err(|e| e.to_string())?;
        println!(
            "Submitted topology {} as {} ({}, {} workers)",
            submitted["name"].as_str().unwrap_or("?"),
            submitted["id"].as_str().unwrap_or("?"),
            submitted["status"].as_str().unwrap_or("?"),
            submitted["workers"],
        );
        Ok(())
    })
}

/// `squall list`: Storm's table.
pub fn list(args: ClientArgs) -> Result<(), String> {
    let client = args.client()?;
    runtime()?.block_on(async {
        let summary = client.get("/api/v1/topology/summary").await.map_err(|e| e.to_string())?;
        print!("{}", list_table(&summary));
        Ok(())
    })
}

/// Storm's `list` output for a topology summary.
pub fn list_table(summary: &Value) -> String {
    let topologies = summary["topologies"].as_array().cloned().unwrap_or_default();
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
    for t in &topologies {
        out.push_str(&format!(
            "{:<24} {:<12} {:<10} {:<12} {}\n",
            t["name"].as_str().unwrap_or("?"),
            t["status"].as_str().unwrap_or("?"),
            t["tasksTotal"].to_string(),
            t["workersTotal"].to_string(),
            t["uptimeSeconds"],
        ));
    }
    out
}

/// `squall activate` / `squall deactivate`.
pub fn set_active(cmd: NameCommand, active: bool) -> Result<(), String> {
    let client = cmd.client.client()?;
    let verb = if active { "activate" } else { "deactivate" };
    runtime()?.block_on(async {
        let id = resolve(&client, &cmd.name).await?;
        client.post(&format!("/api/v1/topology/{id}/{verb}"), &json!({})).await.map_err(|e| e.to_string())?;
        println!("{} topology: {}", if active { "Activated" } else { "Deactivated" }, cmd.name);
        Ok(())
    })
}

/// `squall kill`.
pub fn kill(cmd: KillCommand) -> Result<(), String> {
    let client = cmd.client.client()?;
    runtime()?.block_on(async {
        let id = resolve(&client, &cmd.name).await?;
        client
            .post(&format!("/api/v1/topology/{id}/kill/{}", cmd.wait_secs), &json!({}))
            .await
            .map_err(|e| e.to_string())?;
        println!("Killed topology: {} (removed in {} s)", cmd.name, cmd.wait_secs);
        Ok(())
    })
}

/// `-e COMPONENT=N` values, checked.
pub fn parse_executors(values: &[String]) -> Result<BTreeMap<String, u32>, String> {
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
            Ok((component.to_owned(), n))
        })
        .collect()
}

/// `squall rebalance`.
pub fn rebalance(cmd: RebalanceCommand) -> Result<(), String> {
    let executors = parse_executors(&cmd.executors)?;
    let client = cmd.client.client()?;
    runtime()?.block_on(async {
        let id = resolve(&client, &cmd.name).await?;
        let mut options = serde_json::Map::new();
        if let Some(n) = cmd.num_workers {
            options.insert("numWorkers".into(), json!(n));
        }
        if !executors.is_empty() {
            options.insert("executors".into(), json!(executors));
        }
        client
            .post(
                &format!("/api/v1/topology/{id}/rebalance/{}", cmd.wait_secs),
                &json!({"rebalanceOptions": options}),
            )
            .await
            .map_err(|e| e.to_string())?;
        println!("Rebalancing topology: {} (in {} s)", cmd.name, cmd.wait_secs);
        Ok(())
    })
}

/// `squall errors`: the errors components reported, newest first.
pub fn errors(cmd: NameCommand) -> Result<(), String> {
    let client = cmd.client.client()?;
    runtime()?.block_on(async {
        let id = resolve(&client, &cmd.name).await?;
        let reply = client.get(&format!("/api/v1/topology/{id}/errors")).await.map_err(|e| e.to_string())?;
        let errors = reply["errors"].as_array().cloned().unwrap_or_default();
        if errors.is_empty() {
            println!("No errors reported by topology {}.", cmd.name);
        }
        for e in errors {
            println!(
                "{}s ago  {}  {}:{}  {}",
                e["errorLapsedSecs"],
                e["component"].as_str().unwrap_or("?"),
                e["errorHost"].as_str().unwrap_or("?"),
                e["errorPort"],
                e["error"].as_str().unwrap_or("?"),
            );
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executor_options_are_checked() {
        let ok = parse_executors(&["split=4".into(), "count=2".into()]).unwrap();
        assert_eq!(ok.get("split"), Some(&4));
        for (bad, says) in
            [("split", "COMPONENT=N"), ("split=x", "not a whole number"), ("=3", "component is missing")]
        {
            let err = parse_executors(&[bad.into()]).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }

    #[test]
    fn list_prints_storms_table() {
        assert_eq!(list_table(&json!({"topologies": []})), "No topologies running.\n");
        let table = list_table(&json!({"topologies": [
            {"name": "wordcount", "status": "ACTIVE", "tasksTotal": 9, "workersTotal": 2, "uptimeSeconds": 61}
        ]}));
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("Topology_name") && lines[0].contains("Num_workers"));
        assert_eq!(lines[2].find('9'), lines[0].find("Num_tasks"), "columns line up: {table}");
        let row: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(row, ["wordcount", "ACTIVE", "9", "2", "61"]);
    }
}
