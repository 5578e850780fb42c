//! A small durable file for the supervisor's local state (its id, the workers it started).
//!
//! Writes are atomic: the new content goes to a temporary file in the same directory, is
//! synced, and is renamed over the old one (then the directory is synced), so a crash leaves
//! either the old or the new state, never a mix. Reads verify a header with the body's length
//! and CRC-32, so a truncated, hand-edited or bit-rotten file is reported as
//! [`LocalStateError::Corrupt`], naming the file, and never taken for good data: the caller
//! logs it and rebuilds from ZooKeeper.
//!
//! Format (UTF-8): one header line, then the JSON body:
//!
//! ```text
//! squall-local-state v1 len=57 crc32=1c291ca3
//! {"supervisor_id":"...","workers":{}}
//! ```

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

const MAGIC: &str = "squall-local-state v1";

/// A local state file that could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum LocalStateError {
    /// The file exists but does not hold a valid state: rebuild it.
    #[error("local state file {path} is corrupt ({reason}); it will be rebuilt")]
    Corrupt { path: PathBuf, reason: String },
    /// The file system refused.
    #[error("local state file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// One state file.
#[derive(Debug, Clone)]
pub struct LocalState {
    path: PathBuf,
}

impl LocalState {
    /// The state kept at `path` (its directory must exist).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        LocalState { path: path.into() }
    }

    /// Where the state lives.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the state; `None` when there is none yet.
    pub fn load<T: DeserializeOwned>(&self) -> Result<Option<T>, LocalStateError> {
        let bytes = match fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(LocalStateError::Io { path: self.path.clone(), source }),
        };
        let corrupt = |reason: String| LocalStateError::Corrupt { path: self.path.clone(), reason };
        let newline =
            bytes.iter().position(|&b| b == b'\n').ok_or_else(|| corrupt("no header line".into()))?;
        let (header, body) = (&bytes[..newline], &bytes[newline + 1..]);
        let header = std::str::from_utf8(header).map_err(|_| corrupt("header is not UTF-8".into()))?;
        let (len, crc) = parse_header(header).ok_or_else(|| corrupt(format!("bad header {header:?}")))?;
        if body.len() != len {
            return Err(corrupt(format!("body is {} bytes, header says {len}", body.len())));
        }
        let actual = crc32fast::hash(body);
        if actual != crc {
            return Err(corrupt(format!("checksum {actual:08x} does not match header {crc:08x}")));
        }
        serde_json::from_slice(body).map(Some).map_err(|e| corrupt(format!("body does not parse: {e}")))
    }

    /// Replaces the state atomically.
    pub fn store<T: Serialize>(&self, state: &T) -> Result<(), LocalStateError> {
        let io_error = |source| LocalStateError::Io { path: self.path.clone(), source };
        let body = serde_json::to_vec(state).map_err(|e| io_error(io::Error::other(e)))?;
        let dir = match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut tmp = self.path.clone().into_os_string();
        tmp.push(format!(".tmp-{}", std::process::id()));
        let tmp = PathBuf::from(tmp);
        let written = (|| {
            let mut file = cluster_state::files::private_file().open(&tmp)?;
            writeln!(file, "{MAGIC} len={} crc32={:08x}", body.len(), crc32fast::hash(&body))?;
            file.write_all(&body)?;
            file.sync_all()?;
            fs::rename(&tmp, &self.path)?;
            // The rename itself must survive a power cut.
            File::open(&dir)?.sync_all()
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written.map_err(io_error)
    }

    /// Removes the state (a corrupt file before rebuilding, say). Missing is fine.
    pub fn remove(&self) -> Result<(), LocalStateError> {
        match fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(LocalStateError::Io { path: self.path.clone(), source: e })
            }
            _ => Ok(()),
        }
    }
}

/// `squall-local-state v1 len=N crc32=HEX` -> (N, crc).
fn parse_header(header: &str) -> Option<(usize, u32)> {
    let rest = header.strip_prefix(MAGIC)?.strip_prefix(" len=")?;
    let (len, crc) = rest.split_once(" crc32=")?;
    let crc = (crc.len() == 8).then(|| u32::from_str_radix(crc, 16).ok()).flatten()?;
    Some((len.parse().ok()?, crc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct State {
        supervisor_id: String,
        workers: BTreeMap<String, u16>,
    }

    fn sample() -> State {
        State { supervisor_id: "sup-1".into(), workers: [("w1".to_owned(), 6700)].into_iter().collect() }
    }

    fn corrupt_reason(state: &LocalState) -> String {
        match state.load::<State>() {
            Err(LocalStateError::Corrupt { path, reason }) => {
                assert_eq!(path, state.path());
                reason
            }
            other => panic!("expected a corrupt-file error, got {other:?}"),
        }
    }

    #[test]
    fn round_trip_and_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let state = LocalState::new(dir.path().join("supervisor.state"));
        assert_eq!(state.load::<State>().unwrap(), None);
        state.store(&sample()).unwrap();
        assert_eq!(state.load::<State>().unwrap(), Some(sample()));
        let mut changed = sample();
        changed.workers.clear();
        state.store(&changed).unwrap();
        assert_eq!(state.load::<State>().unwrap(), Some(changed));
        // No temporary files are left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        state.remove().unwrap();
        state.remove().unwrap();
        assert_eq!(state.load::<State>().unwrap(), None);
    }

    #[test]
    fn damage_of_every_kind_is_detected_and_named() {
        let dir = tempfile::tempdir().unwrap();
        let state = LocalState::new(dir.path().join("s"));
        state.store(&sample()).unwrap();
        let good = fs::read(state.path()).unwrap();

        let mut flipped = good.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 0x20;
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (flipped, "checksum"),
            (good[..good.len() - 3].to_vec(), "bytes"),
            (b"".to_vec(), "no header"),
            (b"garbage\n{}".to_vec(), "bad header"),
            (b"\xff\xfe\n{}".to_vec(), "UTF-8"),
            (format!("{MAGIC} len=2 crc32={:08x}\n{{}}", crc32fast::hash(b"{}")).into_bytes(), "parse"),
        ];
        for (bytes, expected) in cases {
            fs::write(state.path(), &bytes).unwrap();
            let reason = corrupt_reason(&state);
            assert!(reason.contains(expected), "{reason:?} should mention {expected:?}");
        }
        let err = state.load::<State>().unwrap_err().to_string();
        assert!(err.contains(&state.path().display().to_string()) && err.contains("rebuilt"), "{err}");
    }

    #[test]
    fn a_failed_write_keeps_the_old_state() {
        let dir = tempfile::tempdir().unwrap();
        let state = LocalState::new(dir.path().join("s"));
        state.store(&sample()).unwrap();
        // A directory where the temporary file should go makes the write fail.
        let blocker = dir.path().join(format!("s.tmp-{}", std::process::id()));
        fs::create_dir(&blocker).unwrap();
        let mut changed = sample();
        changed.supervisor_id = "other".into();
        assert!(matches!(state.store(&changed), Err(LocalStateError::Io { .. })));
        assert_eq!(state.load::<State>().unwrap(), Some(sample()));
    }
}
