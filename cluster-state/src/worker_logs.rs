//! Where a worker's log lives, and the size-rotated file it is written to.
//!
//! Storm's place and names: `<storm.local.dir>/workers-artifacts/<topology-id>/<port>/worker.log`,
//! rotated to `worker.log.1` (newest) .. `worker.log.<max.files - 1>` (oldest), with the
//! process's own stdout and stderr (a panic, anything not logged through `tracing`) in
//! `worker.log.out` beside it. The worker writes `worker.log` itself ([`RotatingFile`]); the
//! supervisor creates the directory and points the child's stdout / stderr at `worker.log.out`;
//! the supervisor's log viewer reads them back by topology and port, so no client ever names a
//! file (both segments are validated ids).
//!
//! Rotation happens before a write that would take the file past `max_bytes`, so a file holds
//! whole events (the log formatter writes each event in one call) and never more than
//! `max_bytes` unless one event alone is larger.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use crate::files;
use crate::ids::TopologyId;

/// The directory under `storm.local.dir` holding every worker's artifacts (Storm's name).
pub const ARTIFACTS_DIR: &str = "workers-artifacts";
/// The worker's log file (Storm's name).
pub const WORKER_LOG: &str = "worker.log";
/// The worker process's stdout and stderr (Storm's name).
pub const WORKER_OUT: &str = "worker.log.out";
/// Storm's `worker.xml`: `SizeBasedTriggeringPolicy size="100 MB"`.
pub const DEFAULT_MAX_BYTES: u64 = 100 * 1024 * 1024;
/// Storm's `worker.xml`: `DefaultRolloverStrategy max="9"`, nine rotated files plus the live one.
pub const DEFAULT_MAX_FILES: u32 = 10;

/// `<local_dir>/workers-artifacts/<topology-id>/<port>`.
pub fn artifacts_dir(local_dir: &Path, topology: &TopologyId, port: u16) -> PathBuf {
    local_dir.join(ARTIFACTS_DIR).join(topology.as_str()).join(port.to_string())
}

/// `<local_dir>/workers-artifacts/<topology-id>/<port>/worker.log`.
pub fn worker_log(local_dir: &Path, topology: &TopologyId, port: u16) -> PathBuf {
    artifacts_dir(local_dir, topology, port).join(WORKER_LOG)
}

/// One of a worker's log files, by kind and generation: what a client names instead of a path
/// (the supervisor's log viewer, `squall logs`). `Log(0)` is `worker.log`, `Log(3)` is
/// `worker.log.3`; `Out(0)` is `worker.log.out`, `Out(2)` is `worker.log.out.2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum LogFile {
    /// `worker.log` (0) or one of its rotated files.
    Log(u32),
    /// `worker.log.out` (0), the process's stdout and stderr, or one of its rotated files.
    Out(u32),
}

/// The highest generation a [`LogFile`] name may carry (far above any `worker.log.max.files`
/// worth keeping; it only bounds what a client may ask for).
pub const MAX_GENERATION: u32 = 9_999;

impl LogFile {
    /// The live `worker.log`.
    pub const LOG: LogFile = LogFile::Log(0);
    /// The live `worker.log.out`.
    pub const OUT: LogFile = LogFile::Out(0);

    /// The file's name in the worker's artifacts directory.
    pub fn file_name(self) -> String {
        match self {
            LogFile::Log(0) => WORKER_LOG.to_owned(),
            LogFile::Log(n) => format!("{WORKER_LOG}.{n}"),
            LogFile::Out(0) => WORKER_OUT.to_owned(),
            LogFile::Out(n) => format!("{WORKER_OUT}.{n}"),
        }
    }

    /// Its path under `local_dir` for the worker of `topology` on `port`.
    pub fn path(self, local_dir: &Path, topology: &TopologyId, port: u16) -> PathBuf {
        artifacts_dir(local_dir, topology, port).join(self.file_name())
    }
}

impl std::fmt::Display for LogFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.file_name())
    }
}

/// A name that is not one of a worker's log files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown log file {0:?}: must be worker.log, worker.log.N, worker.log.out or worker.log.out.N \
     (N from 1 to 9999)"
)]
pub struct UnknownLogFile(pub String);

impl TryFrom<String> for LogFile {
    type Error = UnknownLogFile;
    fn try_from(name: String) -> Result<Self, UnknownLogFile> {
        name.parse()
    }
}

impl From<LogFile> for String {
    fn from(file: LogFile) -> String {
        file.file_name()
    }
}

impl std::str::FromStr for LogFile {
    type Err = UnknownLogFile;

    fn from_str(name: &str) -> Result<Self, UnknownLogFile> {
        let bad = || UnknownLogFile(name.chars().take(80).collect());
        let generation = |rest: &str| -> Result<u32, UnknownLogFile> {
            if rest.is_empty() {
                return Ok(0);
            }
            let digits = rest.strip_prefix('.').ok_or_else(bad)?;
            // Digits only, no leading zero: one name per file.
            if digits.is_empty() || digits.starts_with('0') || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            digits.parse::<u32>().ok().filter(|n| *n <= MAX_GENERATION).ok_or_else(bad)
        };
        if let Some(rest) = name.strip_prefix(WORKER_OUT) {
            return generation(rest).map(LogFile::Out);
        }
        if let Some(rest) = name.strip_prefix(WORKER_LOG) {
            return generation(rest).map(LogFile::Log);
        }
        Err(bad())
    }
}

/// How a log file is rotated: `worker.log.max.bytes` and `worker.log.max.files` (every file
/// counted, the live one included; at least 1, where the file is truncated instead).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRotation {
    pub max_bytes: u64,
    pub max_files: u32,
}

impl Default for LogRotation {
    fn default() -> Self {
        LogRotation { max_bytes: DEFAULT_MAX_BYTES, max_files: DEFAULT_MAX_FILES }
    }
}

/// The `n`th rotated file of `path` (`worker.log.3`); 0 is `path` itself.
pub fn rotated(path: &Path, n: u32) -> PathBuf {
    if n == 0 {
        return path.to_owned();
    }
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// An append-only log file rotated by size; clones share the file. Writes are serialised by a
/// mutex, so one `write` call is never split between two files.
#[derive(Debug, Clone)]
pub struct RotatingFile {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    rotation: LogRotation,
    file: File,
    size: u64,
}

impl RotatingFile {
    /// Opens (creating, owner-only) `path` for appending; its directory must exist.
    pub fn open(path: &Path, rotation: LogRotation) -> io::Result<Self> {
        let file = files::private_append().open(path)?;
        let size = file.metadata()?.len();
        let rotation = LogRotation { max_files: rotation.max_files.max(1), ..rotation };
        Ok(RotatingFile {
            inner: Arc::new(Mutex::new(Inner { path: path.to_owned(), rotation, file, size })),
        })
    }
}

impl Inner {
    /// Shifts `path.(k)` to `path.(k+1)` from the oldest kept down, drops the one past the
    /// limit, and starts a new empty `path`.
    fn rotate(&mut self) -> io::Result<()> {
        let archives = self.rotation.max_files - 1;
        if archives == 0 {
            self.file.set_len(0)?;
            self.size = 0;
            return Ok(());
        }
        shift_archives(&self.path, archives, 0)?;
        self.file = files::private_append().open(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

/// Makes room for a new `path.(first + 1)`: drops `path.(archives)`, then renames `path.(k)` to
/// `path.(k + 1)` from the oldest kept down to `first` (0: the live file itself moves).
fn shift_archives(path: &Path, archives: u32, first: u32) -> io::Result<()> {
    match std::fs::remove_file(rotated(path, archives)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    for n in (first..archives).rev() {
        match std::fs::rename(rotated(path, n), rotated(path, n + 1)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// Rotates a file that another process keeps open for appending (`worker.log.out`, the
/// worker's stdout and stderr, which the kernel writes to directly) when it holds more than
/// `rotation.max_bytes`: logrotate's `copytruncate`. The archives shift (`.1` to `.2` ...,
/// the oldest past `max_files` dropped), the live file is copied to `.1`, then truncated; the
/// writer, in append mode, goes on at its new end. Bytes written between the copy's end and
/// the truncation are lost (a moment; renaming instead would lose nothing but leave the writer
/// appending to the renamed file for ever). Whether it rotated.
pub fn copy_truncate(path: &Path, rotation: LogRotation) -> io::Result<bool> {
    let size = match std::fs::metadata(path) {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    if size <= rotation.max_bytes {
        return Ok(false);
    }
    let archives = rotation.max_files.max(1) - 1;
    let mut live = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
    if archives > 0 {
        shift_archives(path, archives, 1)?;
        let mut copy = files::private_file().open(rotated(path, 1))?;
        io::copy(&mut live, &mut copy)?;
    }
    live.set_len(0)?;
    Ok(true)
}

impl Write for RotatingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if inner.size > 0 && inner.size.saturating_add(buf.len() as u64) > inner.rotation.max_bytes {
            inner.rotate()?;
        }
        inner.file.write_all(buf)?;
        inner.size = inner.size.saturating_add(buf.len() as u64);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).file.flush()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn the_path_is_storms() {
        let id: TopologyId = "wc-1-1700000000".parse().unwrap();
        assert_eq!(
            worker_log(Path::new("/var/storm"), &id, 6700),
            Path::new("/var/storm/workers-artifacts/wc-1-1700000000/6700/worker.log")
        );
        assert_eq!(rotated(Path::new("/l/worker.log"), 2), Path::new("/l/worker.log.2"));
    }

    #[test]
    fn rotates_by_size_and_keeps_a_bounded_number_of_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(WORKER_LOG);
        let mut log = RotatingFile::open(&path, LogRotation { max_bytes: 100, max_files: 3 }).unwrap();
        for i in 0..50 {
            log.write_all(format!("line {i:04} of the worker log\n").as_bytes()).unwrap();
        }
        let mut names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["worker.log", "worker.log.1", "worker.log.2"]);
        for name in &names {
            let text = std::fs::read_to_string(dir.path().join(name)).unwrap();
            assert!(text.len() <= 100, "{name} has {} bytes", text.len());
            assert!(text.ends_with('\n') && text.starts_with("line "), "{name} splits an event: {text:?}");
        }
        // The newest lines are in the live file, the ones before in .1.
        assert!(std::fs::read_to_string(&path).unwrap().contains("line 0049"));
        let one = std::fs::read_to_string(rotated(&path, 1)).unwrap();
        let live_first = std::fs::read_to_string(&path).unwrap()[5..9].parse::<u32>().unwrap();
        assert!(one.contains(&format!("line {:04}", live_first - 1)), "{one}");
    }

    #[test]
    fn a_file_another_writer_appends_to_is_copied_and_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(WORKER_OUT);
        // The worker's stdout: opened once for appending, never reopened.
        let mut writer = files::private_append().open(&path).unwrap();
        let rotation = LogRotation { max_bytes: 50, max_files: 3 };
        assert!(!copy_truncate(&path, rotation).unwrap(), "nothing to rotate below the limit");
        for round in 0..5 {
            writer.write_all(format!("round {round}: {}\n", "x".repeat(60)).as_bytes()).unwrap();
            assert!(copy_truncate(&path, rotation).unwrap());
            assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        }
        writer.write_all(b"after\n").unwrap();
        // Appending goes on at the truncated file's start, not at the old offset.
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "after\n");
        assert!(std::fs::read_to_string(rotated(&path, 1)).unwrap().starts_with("round 4:"));
        assert!(std::fs::read_to_string(rotated(&path, 2)).unwrap().starts_with("round 3:"));
        assert!(!rotated(&path, 3).exists());
        assert!(!copy_truncate(&dir.path().join("absent"), rotation).unwrap());
    }

    #[test]
    fn a_single_file_is_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(WORKER_LOG);
        let mut log = RotatingFile::open(&path, LogRotation { max_bytes: 10, max_files: 1 }).unwrap();
        log.write_all(b"12345678\n").unwrap();
        log.write_all(b"abcdefgh\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "abcdefgh\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
