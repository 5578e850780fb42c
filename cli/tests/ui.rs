//! The web UI in a real browser: headless Chromium (Debian's `chromium`) driven over WebDriver
//! (`chromedriver`, Debian's `chromium-driver`) against a real multi-process cluster (ZooKeeper,
//! `squall nimbus` with an API token, a `squall supervisor`, word count in worker processes).
//!
//! The story: the cluster page lists the topology; its page shows non-zero emitted counts for
//! every spout and bolt, the component graph and the workers; a component page shows its
//! executors; deactivating from the page asks for confirmation, is refused without the token
//! (nimbus's 401 shown in the dialog) and done with it, and ZooKeeper's `/storms/<id>` then says
//! `inactive`. A screenshot of each page is written to `target/ui-screenshots/` (CI keeps it).
//! Everything is on loopback; every wait is bounded.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cluster_state::ids::TopologyId;
use cluster_state::paths::StormPaths;
use cluster_state::znode::{StormBase, TopologyStatus};
use fantoccini::wd::Capabilities;
use fantoccini::{Client, ClientBuilder, Locator};
use test_harness::eventually;

#[path = "support/cluster.rs"]
mod support;
use support::{Cluster, free_port, text};

const TOKEN: &str = "ui-test-token-7f3a9c";

/// Every component emits: the count bolt emits `(word, count)` with nobody subscribed.
const TOPOLOGY: &str = "name: uiwords\n\
config:\n  topology.workers: 2\n  topology.max.spout.pending: 500\n\
spouts:\n  - id: sentences\n    className: sentence-generator\n    parallelism: 1\n    params: {rate_per_sec: 50}\n\
bolts:\n  - id: split\n    className: split-sentence\n    parallelism: 2\n\
\x20 - id: count\n    className: word-count\n    parallelism: 2\n\
streams:\n  - from: sentences\n    to: split\n    grouping: {type: SHUFFLE}\n\
\x20 - from: split\n    to: count\n    grouping: {type: FIELDS, args: [word]}\n";

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
}

/// `target/ui-screenshots/`, beside the test binaries' own temporary directory.
fn screenshot_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().join("ui-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "{name}: a PNG");
    let path = screenshot_dir().join(format!("{name}.png"));
    std::fs::write(&path, png).unwrap();
    eprintln!("screenshot: {}", path.display());
}

/// `chromedriver` on a free loopback port, killed with the test.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    fn start(chromedriver: &Path, log: &Path) -> Driver {
        let port = free_port();
        let log = std::fs::File::create(log).unwrap();
        let child = Command::new(chromedriver)
            .args([format!("--port={port}"), "--allowed-ips=127.0.0.1".to_owned()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        Driver { child, url: format!("http://127.0.0.1:{port}") }
    }

    /// A headless Chromium session (its profile under `profile`).
    async fn browser(&self, chromium: &Path, profile: &Path) -> Client {
        let args: Vec<String> = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--window-size=1400,1100",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .chain([format!("--user-data-dir={}", profile.display())])
        .collect();
        let mut chrome = serde_json::Map::new();
        chrome.insert("binary".into(), serde_json::Value::from(chromium.display().to_string()));
        chrome.insert("args".into(), serde_json::Value::from(args));
        let mut capabilities = Capabilities::new();
        capabilities.insert("goog:chromeOptions".into(), serde_json::Value::Object(chrome));
        eventually(Duration::from_secs(60), "chromedriver to start a browser session", || async {
            ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
                .capabilities(capabilities.clone())
                .connect(&self.url)
                .await
                .ok()
        })
        .await
    }
}

/// The text of the first element matching `css`, once there is one.
async fn text_of(client: &Client, css: &str) -> Option<String> {
    client.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

/// The emitted count shown for each component in the spouts and bolts tables.
async fn emitted_counts(client: &Client) -> Option<BTreeMap<String, u64>> {
    let mut counts = BTreeMap::new();
    for cell in client.find_all(Locator::Css("#spouts td.emitted, #bolts td.emitted")).await.ok()? {
        let component = cell.attr("data-component").await.ok()??;
        counts.insert(component, cell.text().await.ok()?.trim().parse().ok()?);
    }
    Some(counts)
}

async fn click(client: &Client, css: &str) {
    let element = eventually(Duration::from_secs(30), &format!("{css} on the page"), || async {
        client.find(Locator::Css(css)).await.ok()
    })
    .await;
    element.click().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ui_shows_a_running_topology_and_deactivates_it_with_the_token() {
    let (Some(chromium), Some(chromedriver)) = (which("chromium"), which("chromedriver")) else {
        panic!(
            "the UI test needs Debian's chromium and chromium-driver (`apt-get install chromium chromium-driver`; .ci/run installs them)"
        );
    };
    let mut cluster = Cluster::new("ui_story").await;
    cluster.configure(&format!("nimbus.http.token: {TOKEN}"));
    cluster.start_nimbus();
    cluster.start_supervisor("sup-a", &[free_port(), free_port()]);
    let session = cluster.session().await;
    let file = cluster.dir("uiwords.yaml");
    std::fs::write(&file, TOPOLOGY).unwrap();
    let submitted = eventually(Duration::from_secs(60), "nimbus to take the submit", || async {
        let out = cluster.squall(&["submit", file.to_str().unwrap()]);
        out.status.success().then(|| text(&out))
    })
    .await;
    let id: TopologyId =
        submitted.split(" as ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    let config = std::fs::read_to_string(&cluster.config).unwrap();
    let nimbus = config.lines().find_map(|l| l.strip_prefix("nimbus.http.address: ")).unwrap().to_owned();
    let page = format!("http://{nimbus}/");

    let driver = Driver::start(&chromedriver, &cluster.dir("chromedriver.log"));
    let client = driver.browser(&chromium, &cluster.dir("chromium-profile")).await;

    // The cluster page lists the topology.
    client.goto(&page).await.unwrap();
    let topology_link = format!("#topologies a[data-topology=\"{id}\"]");
    let name = eventually(Duration::from_secs(30), "the topology on the cluster page", || async {
        text_of(&client, &topology_link).await
    })
    .await;
    assert_eq!(name, "uiwords");
    assert!(text_of(&client, "#supervisors").await.is_some(), "the supervisors table");
    screenshot(&client, "cluster").await;

    // Its page: every spout and bolt has emitted tuples (the page refreshes itself).
    click(&client, &topology_link).await;
    let counts =
        eventually(Duration::from_secs(120), "non-zero emitted counts for every component", || async {
            let counts = emitted_counts(&client).await?;
            (counts.len() == 3 && counts.values().all(|n| *n > 0)).then_some(counts)
        })
        .await;
    assert_eq!(counts.keys().map(String::as_str).collect::<Vec<_>>(), ["count", "sentences", "split"]);
    assert_eq!(text_of(&client, "#topology-status").await.as_deref(), Some("ACTIVE"));
    let nodes = client.find_all(Locator::Css("#graph g.node")).await.unwrap();
    assert_eq!(nodes.len(), 3, "the component graph has every component");
    assert_eq!(client.find_all(Locator::Css("#graph path.edge")).await.unwrap().len(), 2, "and both streams");
    eventually(Duration::from_secs(30), "the workers table", || async {
        (client.find_all(Locator::Css("#workers tbody tr")).await.ok()?.len() == 2).then_some(())
    })
    .await;
    screenshot(&client, "topology").await;

    // A component page, from the spouts table.
    click(&client, "#spouts a[data-component=\"sentences\"]").await;
    eventually(Duration::from_secs(30), "the spout's executors", || async {
        let rows = client.find_all(Locator::Css("#executors tbody tr")).await.ok()?;
        (rows.len() == 1).then_some(())
    })
    .await;
    screenshot(&client, "component").await;

    // Deactivate from the topology page: confirmation first, refused without the token.
    client.goto(&format!("{page}#/topology/{id}")).await.unwrap();
    click(&client, "button[data-action=\"deactivate\"]").await;
    let title = text_of(&client, "#confirm-title").await;
    assert_eq!(title.as_deref(), Some("Deactivate"));
    click(&client, "#confirm-ok").await;
    let refused = eventually(Duration::from_secs(30), "nimbus's refusal in the dialog", || async {
        text_of(&client, "#confirm-result").await.filter(|t| !t.is_empty())
    })
    .await;
    assert!(refused.contains("401"), "{refused}");
    let base = session.read::<StormBase>(&StormPaths::default().storm(&id)).await.unwrap().0;
    assert_eq!(base.status, TopologyStatus::Active, "nothing changed without the token");
    screenshot(&client, "confirm").await;
    let token_input = client.find(Locator::Css("#confirm-token")).await.unwrap();
    token_input.send_keys(TOKEN).await.unwrap();
    click(&client, "#confirm-ok").await;
    eventually(Duration::from_secs(30), "the page to show the topology inactive", || async {
        (text_of(&client, "#topology-status").await? == "INACTIVE").then_some(())
    })
    .await;
    let base = session.read::<StormBase>(&StormPaths::default().storm(&id)).await.unwrap().0;
    assert_eq!(base.status, TopologyStatus::Inactive, "ZooKeeper holds the new status");
    screenshot(&client, "deactivated").await;

    // The consumer-group page (word count has none: the page says so).
    client.goto(&format!("{page}#/groups")).await.unwrap();
    eventually(Duration::from_secs(30), "the consumer groups page", || async {
        text_of(&client, "#groups").await.filter(|t| t.contains("No consumer group"))
    })
    .await;
    screenshot(&client, "groups").await;
    client.close().await.unwrap();
}
