//! The code store's unit tests (uploads, installs, secrets, expiry).

use super::*;

async fn store(limits: CodeStoreLimits) -> (tempfile::TempDir, CodeStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = CodeStore::open(dir.path(), limits).await.unwrap();
    (dir, store)
}

fn topology() -> TopologyId {
    "wc-1-1700000000".parse().unwrap()
}

#[tokio::test]
async fn a_topology_secret_is_random_private_and_served_with_its_checksum() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, store) = store(CodeStoreLimits::default()).await;
    let path = store.install_secret(&topology()).await.unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "readable by nimbus's user only");
    let secret = std::fs::read(&path).unwrap();
    assert_eq!(secret.len(), 32);
    let reader = store.open_code(&topology(), CodeFile::Secret).await.unwrap();
    assert_eq!(reader.sha256, sha256_hex(&secret));
    let other: TopologyId = "wc-2-1700000000".parse().unwrap();
    let other = std::fs::read(store.install_secret(&other).await.unwrap()).unwrap();
    assert_ne!(secret, other, "each topology has its own");
}

#[test]
fn upload_ids_are_uuids_only() {
    let ok = "123e4567-e89b-42d3-a456-426614174000";
    assert_eq!(ok.parse::<UploadId>().unwrap().to_string(), ok);
    assert_eq!(ok.to_uppercase().parse::<UploadId>().unwrap().to_string(), ok);
    for bad in [
        "",
        "..",
        "../etc/passwd",
        "../../stormdist/wc-1-1700000000/worker",
        "123e4567e89b42d3a456426614174000",
        "{123e4567-e89b-42d3-a456-426614174000}",
        "urn:uuid:123e4567-e89b-42d3-a456-426614174000",
        "123e4567-e89b-42d3-a456-42661417400/",
        "123e4567-e89b-42d3-a456-4266141740%2",
        "123e4567-e89b-42d3-a456-426614174000\0",
    ] {
        let err = bad.parse::<UploadId>().unwrap_err();
        assert!(err.to_string().starts_with("invalid upload id"), "{err}");
    }
}

#[test]
fn code_files_and_topology_ids_reject_traversal() {
    assert_eq!("worker".parse::<CodeFile>().unwrap(), CodeFile::WorkerBinary);
    assert_eq!("topology.yaml".parse::<CodeFile>().unwrap(), CodeFile::Topology);
    for bad in ["", ".", "..", "../worker", "worker/", "/etc/passwd", "worker.sha256", "WORKER"] {
        assert!(bad.parse::<CodeFile>().is_err(), "{bad:?}");
    }
    for bad in ["..", "../wc-1-1", "wc/../x-1-1", "..-1-1", "a/b-1-1", "a\\b-1-1", "wc-1", "wc-01-1", ".-1-1"]
    {
        assert!(bad.parse::<TopologyId>().is_err(), "{bad:?}");
    }
}

proptest::proptest! {
    /// Whatever a client sends, what reaches a path is a canonical UUID or a fixed name.
    #[test]
    fn client_strings_never_become_paths(s in "\\PC{0,40}|[0-9a-fA-F./-]{30,40}") {
        if let Ok(id) = s.parse::<UploadId>() {
            let name = id.to_string();
            proptest::prop_assert!(name.len() == 36 && name.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'));
        }
        if let Ok(file) = s.parse::<CodeFile>() {
            proptest::prop_assert!(CodeFile::ALL.contains(&file) && s == file.file_name());
        }
        if let Ok(id) = s.parse::<TopologyId>() {
            let name = id.as_str();
            proptest::prop_assert!(!name.contains('/') && !name.contains('\\') && name != "." && name != "..");
        }
    }
}

#[tokio::test]
async fn upload_finish_install_and_read_back() {
    let (dir, store) = store(CodeStoreLimits::default()).await;
    let data = b"spouts: []\nbolts: []\n";
    let id = store.begin(data.len() as u64).await.unwrap();
    assert_eq!(store.chunk(id, 0, &data[..5]).await.unwrap(), 5);
    assert_eq!(store.chunk(id, 5, &data[5..]).await.unwrap(), data.len() as u64);
    let upload = store.finish(id, &sha256_hex(data).to_uppercase()).await.unwrap();
    assert_eq!((upload.size, upload.sha256.clone()), (data.len() as u64, sha256_hex(data)));
    let path = store.install(&upload, &topology(), CodeFile::Topology).await.unwrap();
    assert_eq!(path, dir.path().join("stormdist/wc-1-1700000000/topology.yaml"));
    assert_eq!(std::fs::read(&path).unwrap(), data);
    assert_eq!(store.pending_uploads(), 0);
    assert!(std::fs::read_dir(dir.path().join("inbox")).unwrap().next().is_none());

    let reader = store.open_code(&topology(), CodeFile::Topology).await.unwrap();
    assert_eq!((reader.size, reader.sha256.as_str()), (data.len() as u64, sha256_hex(data).as_str()));
    let err = store.open_code(&topology(), CodeFile::WorkerBinary).await.unwrap_err();
    assert_eq!(err.to_string(), "topology wc-1-1700000000 has no code file worker");

    // An installed upload is gone: installing it again is refused.
    assert!(matches!(
        store.install(&upload, &topology(), CodeFile::WorkerBinary).await,
        Err(CodeStoreError::UnknownUpload { .. })
    ));
    assert_eq!(store.topologies().await.unwrap(), vec![topology()]);
    store.remove(&topology()).await.unwrap();
    store.remove(&topology()).await.unwrap();
    assert!(!dir.path().join("stormdist/wc-1-1700000000").exists());
}

#[tokio::test]
async fn chunk_rules() {
    let (_dir, store) = store(CodeStoreLimits { max_upload_bytes: 10, ..Default::default() }).await;
    assert!(matches!(store.begin(11).await, Err(CodeStoreError::TooLarge { size: 11, max: 10 })));
    let id = store.begin(6).await.unwrap();
    store.chunk(id, 0, b"abc").await.unwrap();
    // A repeated chunk, a gap, and a chunk past the declared size are all refused.
    let err = store.chunk(id, 0, b"abc").await.unwrap_err();
    assert!(matches!(err, CodeStoreError::WrongOffset { offset: 0, received: 3, .. }), "{err}");
    assert!(matches!(store.chunk(id, 4, b"x").await, Err(CodeStoreError::WrongOffset { .. })));
    let err = store.chunk(id, 3, b"defg").await.unwrap_err();
    assert!(err.to_string().contains("past the declared size of 6"), "{err}");
    // Finishing early is refused and leaves the upload usable.
    let sum = sha256_hex(b"abcdef");
    assert!(matches!(store.finish(id, &sum).await, Err(CodeStoreError::Incomplete { received: 3, .. })));
    store.chunk(id, 3, b"def").await.unwrap();
    assert!(matches!(store.finish(id, "zz").await, Err(CodeStoreError::InvalidChecksum { .. })));
    let upload = store.finish(id, &sum).await.unwrap();
    assert!(matches!(store.chunk(id, 6, b"").await, Err(CodeStoreError::AlreadyFinished { .. })));
    assert!(matches!(store.finish(id, &sum).await, Err(CodeStoreError::AlreadyFinished { .. })));
    assert_eq!(upload.size, 6);
    let unknown = UploadId::generate();
    assert!(matches!(store.chunk(unknown, 0, b"a").await, Err(CodeStoreError::UnknownUpload { .. })));
}

#[tokio::test]
async fn a_checksum_mismatch_discards_the_upload() {
    let (dir, store) = store(CodeStoreLimits::default()).await;
    let id = store.begin(3).await.unwrap();
    store.chunk(id, 0, b"abc").await.unwrap();
    let err = store.finish(id, &sha256_hex(b"abd")).await.unwrap_err();
    assert!(err.to_string().contains("sha256 mismatch"), "{err}");
    assert_eq!(store.pending_uploads(), 0);
    assert!(std::fs::read_dir(dir.path().join("inbox")).unwrap().next().is_none());
    let upload = Upload { id, size: 3, sha256: sha256_hex(b"abc") };
    assert!(matches!(
        store.install(&upload, &topology(), CodeFile::Topology).await,
        Err(CodeStoreError::UnknownUpload { .. })
    ));
}

#[tokio::test]
async fn unfinished_uploads_cannot_be_installed_and_pending_uploads_are_bounded() {
    let (_dir, store) = store(CodeStoreLimits { max_pending_uploads: 2, ..Default::default() }).await;
    let a = store.begin(1).await.unwrap();
    store.begin(1).await.unwrap();
    assert!(matches!(store.begin(1).await, Err(CodeStoreError::TooManyUploads { max: 2 })));
    let upload = Upload { id: a, size: 1, sha256: sha256_hex(b"a") };
    assert!(matches!(
        store.install(&upload, &topology(), CodeFile::Topology).await,
        Err(CodeStoreError::NotFinished { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn abandoned_uploads_expire() {
    let expiration = Duration::from_secs(600);
    let limits = CodeStoreLimits {
        upload_expiration: expiration,
        upload_stall_timeout: expiration,
        ..Default::default()
    };
    let (dir, store) = store(limits).await;
    let idle = store.begin(2).await.unwrap();
    let active = store.begin(2).await.unwrap();
    tokio::time::advance(Duration::from_secs(400)).await;
    store.chunk(active, 0, b"a").await.unwrap();
    tokio::time::advance(Duration::from_secs(200)).await;
    assert_eq!(store.expire().await, 1);
    assert!(matches!(store.chunk(idle, 0, b"a").await, Err(CodeStoreError::UnknownUpload { .. })));
    assert!(!dir.path().join(format!("inbox/{idle}.part")).exists());
    store.chunk(active, 1, b"b").await.unwrap();
}

#[tokio::test]
async fn reopening_clears_the_inbox() {
    let dir = tempfile::tempdir().unwrap();
    let store = CodeStore::open(dir.path(), CodeStoreLimits::default()).await.unwrap();
    let id = store.begin(4).await.unwrap();
    store.chunk(id, 0, b"ab").await.unwrap();
    drop(store);
    let store = CodeStore::open(dir.path(), CodeStoreLimits::default()).await.unwrap();
    assert!(std::fs::read_dir(dir.path().join("inbox")).unwrap().next().is_none());
    assert!(matches!(store.chunk(id, 2, b"cd").await, Err(CodeStoreError::UnknownUpload { .. })));
}
