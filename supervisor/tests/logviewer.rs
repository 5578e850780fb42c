//! The supervisor's log viewer over HTTP, as `squall logs` reads it (`LogViewerClient`) and as a
//! hostile client would call it (raw requests): tails, byte ranges, downloads, the file list, the
//! token, and paths that try to leave the worker's log directory.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::Path;

use cluster_state::api::{API_PREFIX, LogRead, MAX_READ_BYTES};
use cluster_state::ids::TopologyId;
use cluster_state::logviewer::{LogViewer, serve};
use cluster_state::worker_logs::{self, LogFile};
use nimbus_client::{LogViewerClient, LogViewerError, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "log-viewer-test-token";

struct Viewer {
    address: String,
    cancel: CancellationToken,
    server: tokio::task::JoinHandle<()>,
}

async fn start(local_dir: &Path) -> Viewer {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let cancel = CancellationToken::new();
    let viewer = LogViewer { local_dir: local_dir.to_owned(), token: Some(TOKEN.to_owned()) };
    let server = tokio::spawn(serve(listener, prometheus::Registry::new(), viewer, None, cancel.clone()));
    Viewer { address, cancel, server }
}

/// A raw HTTP/1.0 GET: status line and headers, body.
async fn raw_get(address: &str, path: &str, token: Option<&str>) -> (String, Vec<u8>) {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n{auth}\r\n").as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let split = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    (String::from_utf8_lossy(&answer[..split]).into_owned(), answer[split + 4..].to_vec())
}

fn write_log(path: &Path, lines: std::ops::Range<u32>, padding: usize) {
    let mut file = std::fs::File::create(path).unwrap();
    for i in lines {
        writeln!(file, "line {i:06} of the worker's log{}", ".".repeat(padding)).unwrap();
    }
}

#[tokio::test]
async fn a_workers_log_is_served_by_topology_port_and_file_only_with_the_token() {
    let local = tempfile::tempdir().unwrap();
    let topology: TopologyId = "wc-1-1700000000".parse().unwrap();
    let dir = worker_logs::artifacts_dir(local.path(), &topology, 6700);
    std::fs::create_dir_all(&dir).unwrap();
    write_log(&LogFile::LOG.path(local.path(), &topology, 6700), 1000..1200, 0);
    write_log(&LogFile::Log(1).path(local.path(), &topology, 6700), 0..1000, 0);
    // 10,000 lines of it are larger than one read: a tail sees only the last MAX_READ_BYTES.
    write_log(&LogFile::OUT.path(local.path(), &topology, 6700), 0..20_000, 200);
    std::fs::write(dir.join("not-a-log"), b"secret").unwrap();
    std::fs::write(local.path().join("outside"), b"outside the artifacts").unwrap();
    let viewer = start(local.path()).await;
    let client = LogViewerClient::new(viewer.address.clone(), Some(TOKEN.to_owned()), None);

    let files = client.files(&topology, 6700).await.unwrap();
    let listed: Vec<(String, u64)> = files.files.iter().map(|f| (f.file.to_string(), f.size)).collect();
    let names: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["worker.log", "worker.log.out", "worker.log.1"], "{listed:?}");

    // The last lines, whole.
    let tail = client.read(&topology, 6700, LogFile::LOG, LogRead::Tail { lines: 3 }).await.unwrap();
    assert_eq!(
        tail.data,
        "line 001197 of the worker's log\nline 001198 of the worker's log\nline 001199 of the worker's log\n"
    );
    assert_eq!(tail.start + tail.length, tail.file_size);
    // A byte range of a rotated file.
    let line = "line 000000 of the worker's log\n".len() as u64;
    let range = client
        .read(&topology, 6700, LogFile::Log(1), LogRead::Range { start: 10 * line, length: line })
        .await
        .unwrap();
    assert_eq!(range.data, "line 000010 of the worker's log\n");
    // A tail never returns more than one read's bound, and only whole lines.
    let big = client.read(&topology, 6700, LogFile::OUT, LogRead::Tail { lines: 10_000 }).await.unwrap();
    let long_line = line + 200;
    assert!(big.length <= MAX_READ_BYTES && big.length > MAX_READ_BYTES - long_line, "{}", big.length);
    assert!(
        big.data.starts_with("line ")
            && big.data.ends_with(&format!("line 019999 of the worker's log{}\n", ".".repeat(200)))
    );
    assert_eq!(big.data.lines().count() as u64, big.length / long_line);

    // A download is the whole file, streamed.
    let download = format!("{API_PREFIX}/logs/{topology}/6700/worker.log.out/download");
    let (head, body) = raw_get(&viewer.address, &download, Some(TOKEN)).await;
    assert!(head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, std::fs::read(LogFile::OUT.path(local.path(), &topology, 6700)).unwrap());

    // Without the token, or with another: refused, for every log route.
    for token in [None, Some("wrong")] {
        let other = LogViewerClient::new(viewer.address.clone(), token.map(str::to_owned), None);
        let refused = other.read(&topology, 6700, LogFile::LOG, LogRead::default()).await.unwrap_err();
        assert_eq!(refused.status(), Some(StatusCode::UNAUTHORIZED), "{refused}");
        assert!(matches!(other.files(&topology, 6700).await, Err(LogViewerError::Refused { .. })));
        let (head, body) = raw_get(&viewer.address, &download, token).await;
        assert!(head.contains(" 401 "), "{head}");
        assert!(!String::from_utf8_lossy(&body).contains("line 0"));
    }
    // /metrics stays open, as on every process.
    let (head, _) = raw_get(&viewer.address, "/metrics", None).await;
    assert!(head.contains(" 200 "), "{head}");

    // A worker or file that is not here is a 404 naming it.
    let missing = client.read(&topology, 6701, LogFile::LOG, LogRead::default()).await.unwrap_err();
    assert_eq!(missing.status(), Some(StatusCode::NOT_FOUND));
    assert!(missing.to_string().contains("port 6701"), "{missing}");
    let missing = client.read(&topology, 6700, LogFile::Log(7), LogRead::default()).await.unwrap_err();
    assert!(missing.to_string().contains("no worker.log.7"), "{missing}");

    // Paths that try to name something else: refused before any file is opened.
    for (path, status, says) in [
        (format!("{API_PREFIX}/logs/{topology}/6700/not-a-log"), " 404 ", "unknown log file"),
        (format!("{API_PREFIX}/logs/{topology}/6700/..%2F..%2F..%2Foutside"), " 404 ", "unknown log file"),
        (format!("{API_PREFIX}/logs/../6700/worker.log"), " 400 ", "topology id"),
        (format!("{API_PREFIX}/logs/{topology}/0/worker.log"), " 400 ", "from 1 to 65535"),
        (format!("{API_PREFIX}/logs/{topology}/6700/worker.log?lines=100000"), " 400 ", "lines 100000"),
        (
            format!("{API_PREFIX}/logs/{topology}/6700/worker.log?start=0&length={}", MAX_READ_BYTES + 1),
            " 400 ",
            "length",
        ),
    ] {
        let (head, body) = raw_get(&viewer.address, &path, Some(TOKEN)).await;
        let body = String::from_utf8_lossy(&body);
        assert!(head.contains(status), "{path}: {head}");
        assert!(body.contains(says), "{path}: {body}");
        assert!(!body.contains("secret") && !body.contains("outside the"), "{path}: {body}");
    }
    viewer.cancel.cancel();
    viewer.server.await.unwrap();
}
