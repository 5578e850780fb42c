//! Code sync against a real nimbus API: the code arrives complete and checked, a second sync does
//! not download again, a topology nimbus does not have is a clear error leaving nothing behind,
//! a corrupt download is refused, and stale code goes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::Path;

use cluster_state::code::CodeFile;
use cluster_state::coord::{CreateMode, Ensemble, SessionOptions};
use cluster_state::ids::TopologyId;
use cluster_state::paths::StormPaths;
use nimbus::NimbusConfig;
use nimbus::code_store::{CodeStore, CodeStoreLimits, sha256_hex};
use supervisor::code_sync::{CodeError, CodeSync};
use tokio_util::sync::CancellationToken;

const YAML: &[u8] = b"name: wc\nspouts: []\n";

async fn install(nimbus_dir: &Path, topology: &TopologyId, file: CodeFile, bytes: &[u8]) {
    let store = CodeStore::open(nimbus_dir, CodeStoreLimits::default()).await.unwrap();
    let upload = store.begin(bytes.len() as u64).await.unwrap();
    store.chunk(upload, 0, bytes).await.unwrap();
    let upload = store.finish(upload, &sha256_hex(bytes)).await.unwrap();
    store.install(&upload, topology, file).await.unwrap();
}

/// A nimbus serving `local_dir`'s code on a free port; stops when the token is cancelled. The
/// `topologies` get a base record, or nimbus's cleanup would remove their code as orphans.
async fn nimbus(local_dir: &Path, topologies: &[&TopologyId]) -> (String, CancellationToken) {
    nimbus_with_token(local_dir, topologies, None).await
}

async fn nimbus_with_token(
    local_dir: &Path,
    topologies: &[&TopologyId],
    token: Option<&str>,
) -> (String, CancellationToken) {
    let ensemble = Ensemble::in_memory();
    let session = ensemble.connect(&SessionOptions::default()).await.unwrap();
    for id in topologies {
        let path = StormPaths::default().storm(id);
        session.create(&path, b"{}", CreateMode::Persistent.with_parents()).await.unwrap();
    }
    let config = NimbusConfig {
        local_dir: local_dir.to_path_buf(),
        http_token: token.map(str::to_owned),
        ..NimbusConfig::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let shutdown = CancellationToken::new();
    let registry = prometheus::Registry::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let _ = nimbus::serve(config, listener, ensemble, &registry, stop).await;
    });
    (addr, shutdown)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_checks_reuses_and_cleans_up() {
    let nimbus_local = tempfile::tempdir().unwrap();
    let supervisor_local = tempfile::tempdir().unwrap();
    let wc: TopologyId = "wc-1-1700000000".parse().unwrap();
    let old: TopologyId = "old-2-1600000000".parse().unwrap();
    let binary = vec![7u8; 300_000];
    install(&nimbus_local.path().join("nimbus"), &wc, CodeFile::Topology, YAML).await;
    install(&nimbus_local.path().join("nimbus"), &wc, CodeFile::WorkerBinary, &binary).await;
    install(&nimbus_local.path().join("nimbus"), &old, CodeFile::Topology, YAML).await;
    let store =
        CodeStore::open(&nimbus_local.path().join("nimbus"), CodeStoreLimits::default()).await.unwrap();
    let secret = std::fs::read(store.install_secret(&wc).await.unwrap()).unwrap();
    let (addr, shutdown) = nimbus(nimbus_local.path(), &[&wc, &old]).await;
    let sync = CodeSync::new(addr, supervisor_local.path());

    let dir = sync.ensure(&wc).await.unwrap();
    assert_eq!(std::fs::read(dir.join("topology.yaml")).unwrap(), YAML);
    assert_eq!(std::fs::read(dir.join("worker")).unwrap(), binary);
    use std::os::unix::fs::PermissionsExt;
    // The owner runs it; nobody else reads the user's code.
    assert_eq!(std::fs::metadata(dir.join("worker")).unwrap().permissions().mode() & 0o777, 0o700);
    // The workers' secret: the same bytes, readable by the supervisor's user only.
    assert_eq!(std::fs::read(dir.join("topology.secret")).unwrap(), secret);
    assert_eq!(std::fs::metadata(dir.join("topology.secret")).unwrap().permissions().mode() & 0o777, 0o600);

    // Already here: no second download (it would fail: the file is gone from nimbus).
    std::fs::remove_dir_all(nimbus_local.path().join("nimbus/stormdist").join(wc.as_str())).unwrap();
    assert_eq!(sync.ensure(&wc).await.unwrap(), dir);

    // A topology without its own worker binary runs on squall's: only the definition comes.
    let old_dir = sync.ensure(&old).await.unwrap();
    assert!(old_dir.join("topology.yaml").exists() && !old_dir.join("worker").exists());

    // Unknown to nimbus: an error naming it, and nothing left behind.
    let gone: TopologyId = "gone-3-1700000000".parse().unwrap();
    let err = sync.ensure(&gone).await.unwrap_err();
    assert!(matches!(err, CodeError::Status { status, .. } if status == 404), "{err}");
    assert!(err.to_string().contains("gone-3-1700000000"), "{err}");
    assert!(!sync.has(&gone));
    let leftovers: Vec<_> =
        std::fs::read_dir(&sync.stormdist).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(leftovers.len(), 2, "only the two installed topologies: {leftovers:?}");

    // Only `wc` is still assigned: `old` goes.
    let removed = sync.remove_stale(&BTreeSet::from([wc.clone()]));
    assert_eq!(removed, vec![old.clone()]);
    assert!(sync.has(&wc) && !sync.has(&old));
    shutdown.cancel();
}

/// Every file under `dir` is 0600 (a worker binary 0700), every directory 0700.
fn assert_owner_only(dir: &Path) {
    use cluster_state::files::mode_of;
    assert_eq!(mode_of(dir).unwrap(), 0o700, "{}", dir.display());
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            assert_owner_only(&path);
        } else {
            let wanted = if path.file_name().is_some_and(|n| n == "worker") { 0o700 } else { 0o600 };
            assert_eq!(mode_of(&path).unwrap(), wanted, "{}", path.display());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_needs_nimbus_token_and_lands_owner_only_on_both_sides() {
    let nimbus_local = tempfile::tempdir().unwrap();
    let supervisor_local = tempfile::tempdir().unwrap();
    let wc: TopologyId = "wc-1-1700000000".parse().unwrap();
    let nimbus_dir = nimbus_local.path().join("nimbus");
    install(
        &nimbus_dir,
        &wc,
        CodeFile::Topology,
        b"name: wc
spouts: []
sasl.password: hunter22
",
    )
    .await;
    install(&nimbus_dir, &wc, CodeFile::WorkerBinary, &[1u8; 1000]).await;
    let store = CodeStore::open(&nimbus_dir, CodeStoreLimits::default()).await.unwrap();
    store.install_secret(&wc).await.unwrap();
    let (addr, shutdown) = nimbus_with_token(nimbus_local.path(), &[&wc], Some("s3cret")).await;

    // Without the token (or with a wrong one): 401, and nothing is left behind.
    let mut sync = CodeSync::new(addr, supervisor_local.path());
    for token in [None, Some("wrong".to_owned())] {
        sync.nimbus.token = token;
        let err = sync.ensure(&wc).await.unwrap_err();
        assert!(matches!(err, CodeError::Status { status, .. } if status == 401), "{err}");
        assert!(!sync.has(&wc));
    }
    sync.nimbus.token = Some("s3cret".into());
    let dir = sync.ensure(&wc).await.unwrap();
    assert!(dir.join("worker").exists() && dir.join("topology.secret").exists());
    assert_owner_only(&sync.stormdist);
    // nimbus's copies (and its inbox) too; the worker binary is not run there: 0600.
    use cluster_state::files::mode_of;
    assert_eq!(mode_of(&nimbus_dir).unwrap(), 0o700);
    for file in ["topology.yaml", "topology.yaml.sha256", "worker", "topology.secret"] {
        let path = nimbus_dir.join("stormdist").join(wc.as_str()).join(file);
        assert_eq!(mode_of(&path).unwrap(), 0o600, "{}", path.display());
    }
    for dir in ["inbox", "stormdist"] {
        assert_eq!(mode_of(&nimbus_dir.join(dir)).unwrap(), 0o700, "{dir}");
    }
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_download_is_refused() {
    let nimbus_local = tempfile::tempdir().unwrap();
    let supervisor_local = tempfile::tempdir().unwrap();
    let wc: TopologyId = "wc-1-1700000000".parse().unwrap();
    install(&nimbus_local.path().join("nimbus"), &wc, CodeFile::Topology, YAML).await;
    // The file changes on nimbus's disk after its checksum was recorded.
    let served = nimbus_local.path().join("nimbus/stormdist").join(wc.as_str()).join("topology.yaml");
    std::fs::write(&served, b"name: tampered\nspouts: []\n").unwrap();
    let (addr, shutdown) = nimbus(nimbus_local.path(), &[&wc]).await;
    let sync = CodeSync::new(addr, supervisor_local.path());
    let err = sync.ensure(&wc).await.unwrap_err();
    assert!(matches!(err, CodeError::Checksum { .. }), "{err}");
    assert!(!sync.has(&wc));
    shutdown.cancel();
}

#[tokio::test]
async fn an_unreachable_nimbus_is_named() {
    let supervisor_local = tempfile::tempdir().unwrap();
    let port = test_harness::free_port();
    let sync = CodeSync::new(format!("127.0.0.1:{port}"), supervisor_local.path());
    let err = sync.ensure(&"wc-1-1700000000".parse().unwrap()).await.unwrap_err();
    assert!(matches!(err, CodeError::Nimbus { .. }) && err.to_string().contains(&port.to_string()), "{err}");
}
