//! Topology code on this machine: downloaded from nimbus into
//! `<storm.local.dir>/stormdist/<topology-id>/`, checked against the SHA-256 nimbus recorded at
//! upload, and deleted when no assignment needs it any more (Storm's supervisor
//! `download-storm-code` and its cleanup).
//!
//! A download goes to a temporary directory next to the final one and is renamed into place
//! only when every file arrived and matched its checksum, so a topology directory that exists is
//! complete: a crash mid-download leaves only a temporary directory, removed on the next sync.
//! Each file's checksum is kept beside it (`<file>.sha256`), and [`CodeSync::ensure_verified`]
//! re-checks the local copy against it before a worker is launched from it: a copy that was
//! edited or damaged is downloaded again and swapped in whole (running workers keep the files
//! they opened); if that download fails, the damaged copy stays and nothing is launched from it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cluster_state::code::CodeFile;
use cluster_state::files;
use cluster_state::ids::TopologyId;
use nimbus_client::{ClientError, NimbusClient, StatusCode};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

const TMP_PREFIX: &str = ".download-";

/// Why a topology's code could not be brought here.
#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    #[error("cannot reach nimbus at {nimbus}: {reason}")]
    Nimbus { nimbus: String, reason: String },
    #[error("nimbus answered {status} for {file} of topology {topology}: {body}")]
    Status { topology: TopologyId, file: CodeFile, status: StatusCode, body: String },
    #[error("nimbus sent {file} of topology {topology} without a checksum")]
    NoChecksum { topology: TopologyId, file: CodeFile },
    #[error(
        "{file} of topology {topology} arrived corrupt (sha256 {actual}, nimbus says {expected}); it will be downloaded again"
    )]
    Checksum { topology: TopologyId, file: CodeFile, expected: String, actual: String },
    #[error(
        "the local copy of {file} of topology {topology} does not match its download ({reason}); it will be downloaded again"
    )]
    Modified { topology: TopologyId, file: CodeFile, reason: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("the resources of topology {topology} cannot be unpacked: {reason}")]
    Resources { topology: TopologyId, reason: String },
}

/// Where a code file's checksum is kept beside it.
fn checksum_path(file: &Path) -> PathBuf {
    let mut path = file.as_os_str().to_owned();
    path.push(".sha256");
    PathBuf::from(path)
}

/// The SHA-256 of a file, streamed (a worker binary can be large).
fn sha256_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match file.read(&mut buf)? {
            0 => return Ok(hex::encode(hash.finalize())),
            n => hash.update(&buf[..n]),
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CodeError + '_ {
    move |source| CodeError::Io { path: path.to_path_buf(), source }
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct CodeSync {
    /// nimbus's API.
    pub nimbus: NimbusClient,
    /// `<storm.local.dir>/stormdist`.
    pub stormdist: PathBuf,
    /// Bound on one file's download.
    pub timeout: Duration,
}

impl CodeSync {
    /// Code under `<local_dir>/stormdist`, fetched from nimbus at `nimbus` (`host:port`).
    pub fn new(nimbus: impl Into<String>, local_dir: &Path) -> Self {
        CodeSync {
            nimbus: NimbusClient::new(nimbus, None),
            stormdist: local_dir.join("stormdist"),
            timeout: Duration::from_secs(300),
        }
    }

    /// Code under `<local_dir>/stormdist`, fetched from whichever of the nimbuses at `seeds`
    /// holds it (HA: a nimbus that is down or lacks the code is skipped). One round over the
    /// seeds per download: the supervisor's own backoff (2 s doubling) tries again.
    pub fn with_seeds(seeds: Vec<String>, local_dir: &Path) -> Self {
        let mut nimbus = NimbusClient::with_seeds(seeds, None);
        nimbus.failover = Duration::ZERO;
        CodeSync { nimbus, stormdist: local_dir.join("stormdist"), timeout: Duration::from_secs(300) }
    }

    /// Where a topology's code lives here.
    pub fn topology_dir(&self, topology: &TopologyId) -> PathBuf {
        self.stormdist.join(topology.as_str())
    }

    /// Whether the topology's code is here (complete, since it is installed atomically).
    pub fn has(&self, topology: &TopologyId) -> bool {
        self.topology_dir(topology).join(CodeFile::Topology.file_name()).is_file()
    }

    /// Makes sure the topology's code is here, downloading it if not. Returns its directory.
    pub async fn ensure(&self, topology: &TopologyId) -> Result<PathBuf, CodeError> {
        let dir = self.topology_dir(topology);
        if self.has(topology) {
            return Ok(dir);
        }
        self.fetch(topology, false).await
    }

    /// [`CodeSync::ensure`], and then checks the local copy against the checksums recorded at
    /// its download; one that does not match is downloaded again (see the module docs).
    pub async fn ensure_verified(&self, topology: &TopologyId) -> Result<PathBuf, CodeError> {
        let dir = self.topology_dir(topology);
        if !self.has(topology) {
            return self.fetch(topology, false).await;
        }
        let (check, topology_id) = (dir.clone(), topology.clone());
        let verified = tokio::task::spawn_blocking(move || verify(&check, &topology_id))
            .await
            .map_err(|e| CodeError::Io { path: dir.clone(), source: std::io::Error::other(e) })?;
        match verified {
            Ok(()) => Ok(dir),
            Err(e) => {
                tracing::warn!(error = %e, "local topology code does not match its checksum");
                self.fetch(topology, true).await
            }
        }
    }

    /// Downloads the topology's code into a temporary directory and installs it; `replace`:
    /// over an existing copy (moved aside first, then deleted).
    async fn fetch(&self, topology: &TopologyId, replace: bool) -> Result<PathBuf, CodeError> {
        let dir = self.topology_dir(topology);
        files::create_private_dir_all_async(&self.stormdist).await.map_err(io(&self.stormdist))?;
        let tmp = self.stormdist.join(format!("{TMP_PREFIX}{}-{}", topology, uuid::Uuid::new_v4()));
        files::create_private_dir_all_async(&tmp).await.map_err(io(&tmp))?;
        let result = self.download_all(topology, &tmp).await;
        let result = match result {
            Ok(()) if replace => self.swap_in(&tmp, &dir).await,
            Ok(()) => match tokio::fs::rename(&tmp, &dir).await {
                Ok(()) => Ok(dir),
                // Another sync installed it meanwhile: theirs is as good as ours.
                Err(_) if self.has(topology) => Ok(dir),
                Err(e) => Err(CodeError::Io { path: dir, source: e }),
            },
            Err(e) => Err(e),
        };
        let _ = tokio::fs::remove_dir_all(&tmp).await;
        result
    }

    /// Replaces `dir` by `fresh`: the old copy is renamed aside (a temporary name the next
    /// cleanup removes too), the new one renamed in, the old one deleted.
    async fn swap_in(&self, fresh: &Path, dir: &Path) -> Result<PathBuf, CodeError> {
        let old = self.stormdist.join(format!("{TMP_PREFIX}replaced-{}", uuid::Uuid::new_v4()));
        match tokio::fs::rename(dir, &old).await {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(CodeError::Io { path: dir.to_path_buf(), source: e }),
        }
        tokio::fs::rename(fresh, dir).await.map_err(io(dir))?;
        let _ = tokio::fs::remove_dir_all(&old).await;
        Ok(dir.to_path_buf())
    }

    async fn download_all(&self, topology: &TopologyId, into: &Path) -> Result<(), CodeError> {
        for file in CodeFile::ALL {
            let target = into.join(file.file_name());
            match tokio::time::timeout(self.timeout, self.download(topology, file, &target)).await {
                Ok(Ok(())) => {}
                // A topology without its own worker binary runs on the squall binary; one
                // without a secret (submitted before there were any) is refused by its worker,
                // which names the file.
                Ok(Err(CodeError::Status { status: StatusCode::NOT_FOUND, .. })) if file.is_optional() => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    return Err(CodeError::Nimbus {
                        nimbus: self.nimbus.address.clone(),
                        reason: format!("downloading {file} of {topology} took over {:?}", self.timeout),
                    });
                }
            }
        }
        // The shell components' files, unpacked beside the archive (checked first: the
        // archive's checksum matched nimbus's record).
        let archive = into.join(CodeFile::Resources.file_name());
        if archive.is_file() {
            let dest = into.join(cluster_state::resources::DIR_NAME);
            tokio::task::spawn_blocking(move || {
                let file = std::fs::File::open(&archive)?;
                cluster_state::resources::unpack(std::io::BufReader::new(file), &dest)
                    .map_err(std::io::Error::other)
            })
            .await
            .map_err(|e| CodeError::Io { path: into.to_path_buf(), source: std::io::Error::other(e) })?
            .map_err(|e| CodeError::Resources { topology: topology.clone(), reason: e.to_string() })?;
        }
        Ok(())
    }

    /// Streams one file to `target`, hashing as it goes.
    async fn download(&self, topology: &TopologyId, file: CodeFile, target: &Path) -> Result<(), CodeError> {
        let from_client = |e: ClientError| match e {
            ClientError::Refused { status, message, .. } => {
                CodeError::Status { topology: topology.clone(), file, status, body: message }
            }
            ClientError::Unreachable { address, reason } => CodeError::Nimbus { nimbus: address, reason },
            other @ ClientError::NotLeader { .. } => {
                CodeError::Nimbus { nimbus: self.nimbus.current(), reason: other.to_string() }
            }
            other @ (ClientError::BadAnswer { .. } | ClientError::Tls { .. }) => {
                CodeError::Nimbus { nimbus: self.nimbus.current(), reason: other.to_string() }
            }
        };
        let mut download = self.nimbus.download_code(topology, file).await.map_err(from_client)?;
        let expected = download
            .sha256
            .take()
            .ok_or_else(|| CodeError::NoChecksum { topology: topology.clone(), file })?;
        // Owner-only (the secret above all) before a byte of it is written.
        let mut out = files::private_file_async().open(target).await.map_err(io(target))?;
        let mut hash = Sha256::new();
        while let Some(data) = download.next_chunk().await.map_err(from_client)? {
            hash.update(&data);
            out.write_all(&data).await.map_err(io(target))?;
        }
        out.sync_all().await.map_err(io(target))?;
        let actual = hex::encode(hash.finalize());
        if actual != expected {
            return Err(CodeError::Checksum { topology: topology.clone(), file, expected, actual });
        }
        let sum = checksum_path(target);
        let mut sum_file = files::private_file_async().open(&sum).await.map_err(io(&sum))?;
        sum_file.write_all(expected.as_bytes()).await.map_err(io(&sum))?;
        if file == CodeFile::WorkerBinary {
            use std::os::unix::fs::PermissionsExt;
            tokio::fs::set_permissions(target, std::fs::Permissions::from_mode(files::EXECUTABLE_MODE))
                .await
                .map_err(io(target))?;
        }
        Ok(())
    }

    /// Deletes the code of every topology not in `keep`, and leftover temporary downloads.
    /// Returns the topologies removed.
    pub fn remove_stale(&self, keep: &BTreeSet<TopologyId>) -> Vec<TopologyId> {
        let Ok(entries) = std::fs::read_dir(&self.stormdist) else { return Vec::new() };
        let mut removed = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let stale = match name.parse::<TopologyId>() {
                Ok(id) if !keep.contains(&id) => Some(Some(id)),
                Ok(_) => None,
                Err(_) if name.starts_with(TMP_PREFIX) => Some(None),
                // Not ours to judge: leave it.
                Err(_) => None,
            };
            if let Some(id) = stale {
                match std::fs::remove_dir_all(entry.path()) {
                    Ok(()) => removed.extend(id),
                    Err(e) => {
                        tracing::warn!(path = %entry.path().display(), error = %e, "cannot remove stale code")
                    }
                }
            }
        }
        removed.sort();
        removed
    }
}

/// Checks each code file in `dir` against the checksum recorded beside it at download.
fn verify(dir: &Path, topology: &TopologyId) -> Result<(), CodeError> {
    for file in CodeFile::ALL {
        let path = dir.join(file.file_name());
        let modified = |reason: String| CodeError::Modified { topology: topology.clone(), file, reason };
        let recorded = match std::fs::read_to_string(checksum_path(&path)) {
            Ok(sum) => sum.trim().to_owned(),
            // A topology without its own worker binary has neither file; one submitted before
            // topology secrets existed has no secret (its worker refuses to start and says so).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !path.exists() && file.is_optional() => {
                continue;
            }
            Err(e) => return Err(modified(format!("no checksum recorded: {e}"))),
        };
        let actual = sha256_file(&path).map_err(|e| modified(format!("cannot read it: {e}")))?;
        if actual != recorded {
            return Err(modified(format!("sha256 {actual}, downloaded as {recorded}")));
        }
    }
    Ok(())
}
