//! Nimbus's local code directory and chunked uploads, Storm's layout:
//!
//! ```text
//! <nimbus dir>/inbox/<upload-id>.part          an upload in progress (Storm: inbox/stormjar-<uuid>.jar)
//! <nimbus dir>/stormdist/<topology-id>/<file>  installed code, served to supervisors
//! <nimbus dir>/stormdist/<topology-id>/<file>.sha256   its checksum, lowercase hex
//! ```
//!
//! Clients never name a path. An upload is addressed by the [`UploadId`] the server generated
//! (a UUID, so it parses to exactly one file name), a topology by its validated
//! [`TopologyId`], and a code file by the closed [`CodeFile`] enum. Nothing a client sends is
//! joined onto a path without passing through one of those types.
//!
//! Uploads follow Storm's jar upload (`beginFileUpload` / `uploadChunk` / `finishFileUpload`):
//! [`CodeStore::begin`] with the total size, [`CodeStore::chunk`]s at increasing offsets (each
//! offset must equal the bytes received so far, so a retried or reordered chunk is refused, not
//! spliced in), [`CodeStore::finish`] with the SHA-256 the client computed. A finished upload
//! waits for [`CodeStore::install`], which moves it into `stormdist/<id>/` with one rename.
//! Uploads idle for `nimbus.file.copy.expiration.secs` are discarded by [`CodeStore::expire`].

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use cluster_state::files;
use cluster_state::ids::TopologyId;
use cluster_state::secrets::{self, Redactor};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

/// Storm keeps nimbus's uploads in `inbox/` and installed code in `stormdist/`.
const INBOX: &str = "inbox";
const STORMDIST: &str = "stormdist";

/// Limits of the code store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeStoreLimits {
    /// Largest accepted upload, in bytes.
    pub max_upload_bytes: u64,
    /// Uploads begun but neither installed nor abandoned at once; bounds disk and memory used
    /// by clients that begin and never finish.
    pub max_pending_uploads: usize,
    /// Of those, the most one client (by IP address) may hold, so one client cannot take
    /// every slot and block every other submit.
    pub max_pending_uploads_per_client: usize,
    /// An upload without activity for this long is discarded.
    pub upload_expiration: Duration,
    /// An upload still receiving that got no chunk for this long is abandoned and discarded
    /// (a client sends its chunks back to back); a finished one waits for its submit up to
    /// `upload_expiration`.
    pub upload_stall_timeout: Duration,
}

impl Default for CodeStoreLimits {
    fn default() -> Self {
        CodeStoreLimits {
            // Storm bounds jar uploads only through its Thrift buffer; a worker binary built in
            // release mode is tens of MiB, so 512 MiB leaves room without inviting disk fills.
            max_upload_bytes: 512 * 1024 * 1024,
            max_pending_uploads: 32,
            // A submit uploads two files (topology, worker binary); a few submits at once.
            max_pending_uploads_per_client: 8,
            // Storm's defaults.yaml: `nimbus.file.copy.expiration.secs: 600`.
            upload_expiration: Duration::from_secs(600),
            // Squall's: a chunk is at most 8 MiB; a minute without one is a client gone.
            upload_stall_timeout: Duration::from_secs(60),
        }
    }
}

pub use cluster_state::api::UploadId;
pub use cluster_state::code::CodeFile;

/// A finished, verified upload waiting for [`CodeStore::install`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    pub id: UploadId,
    pub size: u64,
    /// Lowercase hex.
    pub sha256: String,
}

/// An installed code file, ready to be served.
#[derive(Debug)]
pub struct CodeFileReader {
    pub file: tokio::fs::File,
    pub size: u64,
    /// Lowercase hex, as recorded at install; supervisors check the download against it.
    pub sha256: String,
}

/// What the code store refuses or fails at. [`CodeStoreError::is_client_error`] separates the
/// requests that were wrong from the disk failing.
#[derive(Debug, thiserror::Error)]
pub enum CodeStoreError {
    #[error("no upload {id}: it never began, was already installed, or expired after inactivity")]
    UnknownUpload { id: UploadId },
    #[error("upload of {size} bytes is larger than the limit of {max} bytes")]
    TooLarge { size: u64, max: u64 },
    #[error("too many uploads in progress ({max}); finish or wait for abandoned ones to expire")]
    TooManyUploads { max: usize },
    #[error(
        "too many uploads in progress from {client} ({max}); finish them, or wait a minute for abandoned ones to be dropped"
    )]
    TooManyUploadsFromClient { client: IpAddr, max: usize },
    #[error("upload {id}: chunk at offset {offset} but {received} bytes were received so far")]
    WrongOffset { id: UploadId, offset: u64, received: u64 },
    #[error("upload {id}: chunk of {len} bytes at offset {offset} goes past the declared size of {size}")]
    PastDeclaredSize { id: UploadId, offset: u64, len: u64, size: u64 },
    #[error("upload {id}: finished after {received} of the declared {size} bytes")]
    Incomplete { id: UploadId, received: u64, size: u64 },
    #[error("upload {id} is already finished; install it or begin a new one")]
    AlreadyFinished { id: UploadId },
    #[error("upload {id} is not finished yet; call finish with its sha256 first")]
    NotFinished { id: UploadId },
    #[error("invalid sha256 {value:?}: must be 64 hex digits")]
    InvalidChecksum { value: String },
    #[error(
        "upload {id}: sha256 mismatch: the client sent {expected}, the bytes received hash to {actual}; the upload was discarded"
    )]
    ChecksumMismatch { id: UploadId, expected: String, actual: String },
    #[error("topology {id} has no code file {file}")]
    NoCode { id: TopologyId, file: CodeFile },
    /// A code file copied from another nimbus does not hash to the checksum it sent.
    #[error(
        "topology {id}: the copy of {file} hashes to {actual}, not to the leader's {expected}; not installed"
    )]
    ReplicaChecksum { id: TopologyId, file: CodeFile, expected: String, actual: String },
    #[error("code store I/O at {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

impl CodeStoreError {
    /// Whether the request was at fault (as opposed to the server's disk).
    pub fn is_client_error(&self) -> bool {
        !matches!(self, CodeStoreError::Io { .. })
    }
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> CodeStoreError + '_ {
    move |source| CodeStoreError::Io { path: path.to_owned(), source }
}

type Result<T, E = CodeStoreError> = std::result::Result<T, E>;

#[derive(Debug)]
enum Stage {
    Receiving { file: tokio::fs::File, hasher: Sha256 },
    Finished { sha256: String },
}

#[derive(Debug)]
struct Pending {
    size: u64,
    received: u64,
    last_activity: Instant,
    stage: Stage,
}

/// Each upload sits behind its own async lock so chunks of one upload are written one at a
/// time (a second concurrent chunk then sees the first's offset) while the map lock is only
/// held for lookups, never across a write.
type Slot = Arc<tokio::sync::Mutex<Option<Pending>>>;

/// An upload in the map: its slot and the client that began it (`None`: nimbus itself).
#[derive(Debug, Clone)]
struct Entry {
    slot: Slot,
    client: Option<IpAddr>,
}

/// Nimbus's code directory; cheap to clone (clones share the pending uploads).
#[derive(Debug, Clone)]
pub struct CodeStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    limits: CodeStoreLimits,
    uploads: Mutex<HashMap<UploadId, Entry>>,
}

impl CodeStore {
    /// Opens the code store under `dir` (nimbus's local dir), creating `inbox/` and
    /// `stormdist/`. Leftovers in `inbox/` belong to uploads of a previous run, which no client
    /// can continue: they are removed.
    pub async fn open(dir: impl Into<PathBuf>, limits: CodeStoreLimits) -> Result<Self> {
        let dir = dir.into();
        let inbox = dir.join(INBOX);
        match tokio::fs::remove_dir_all(&inbox).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_at(&inbox)(e)),
        }
        files::create_private_dir_all_async(&dir).await.map_err(io_at(&dir))?;
        files::create_private_dir_all_async(&inbox).await.map_err(io_at(&inbox))?;
        let stormdist = dir.join(STORMDIST);
        files::create_private_dir_all_async(&stormdist).await.map_err(io_at(&stormdist))?;
        remember_stored_secrets(&stormdist).await;
        Ok(CodeStore { inner: Arc::new(Inner { dir, limits, uploads: Mutex::new(HashMap::new()) }) })
    }

    /// The limits in force.
    pub fn limits(&self) -> CodeStoreLimits {
        self.inner.limits
    }

    /// `<nimbus dir>/stormdist/<id>`: the assignment's `master_code_dir`.
    pub fn topology_dir(&self, id: &TopologyId) -> PathBuf {
        // A TopologyId is a validated single path segment (no '/', '.', '..').
        self.inner.dir.join(STORMDIST).join(id.as_str())
    }

    fn part_path(&self, id: UploadId) -> PathBuf {
        self.inner.dir.join(INBOX).join(format!("{id}.part"))
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<UploadId, Entry>> {
        // The map holds no invariant a panicking holder could break half-way.
        self.inner.uploads.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn slot(&self, id: UploadId) -> Result<Slot> {
        self.map().get(&id).map(|e| e.slot.clone()).ok_or(CodeStoreError::UnknownUpload { id })
    }

    /// Begins an upload of `size` bytes (by nimbus itself: no client bound applies).
    pub async fn begin(&self, size: u64) -> Result<UploadId> {
        self.begin_for(size, None).await
    }

    /// Begins an upload of `size` bytes for `client`, within its share of the slots.
    pub async fn begin_for(&self, size: u64, client: Option<IpAddr>) -> Result<UploadId> {
        let max = self.inner.limits.max_upload_bytes;
        if size > max {
            return Err(CodeStoreError::TooLarge { size, max });
        }
        self.expire().await;
        let id = UploadId::generate();
        let slot: Slot = Arc::new(tokio::sync::Mutex::new(None));
        // Reserve the id (and the pending count) before touching the disk, holding the slot's
        // lock so no chunk can see it half-made.
        let mut guard = slot.clone().lock_owned().await;
        {
            let mut map = self.map();
            let max_pending = self.inner.limits.max_pending_uploads;
            if let Some(client) = client {
                let max = self.inner.limits.max_pending_uploads_per_client;
                if map.values().filter(|e| e.client == Some(client)).count() >= max {
                    return Err(CodeStoreError::TooManyUploadsFromClient { client, max });
                }
            }
            if map.len() >= max_pending {
                return Err(CodeStoreError::TooManyUploads { max: max_pending });
            }
            map.insert(id, Entry { slot, client });
        }
        let path = self.part_path(id);
        let mut options = tokio::fs::OpenOptions::new();
        options.write(true).create_new(true).mode(files::FILE_MODE);
        match options.open(&path).await {
            Ok(file) => {
                *guard = Some(Pending {
                    size,
                    received: 0,
                    last_activity: Instant::now(),
                    stage: Stage::Receiving { file, hasher: Sha256::new() },
                });
                Ok(id)
            }
            Err(e) => {
                self.map().remove(&id);
                Err(io_at(&path)(e))
            }
        }
    }

    /// Appends `bytes` at `offset`, which must equal the bytes received so far. Returns the
    /// bytes received after this chunk.
    pub async fn chunk(&self, id: UploadId, offset: u64, bytes: &[u8]) -> Result<u64> {
        let slot = self.slot(id)?;
        let mut guard = slot.lock().await;
        let pending = guard.as_mut().ok_or(CodeStoreError::UnknownUpload { id })?;
        let (received, size) = (pending.received, pending.size);
        let Stage::Receiving { file, hasher } = &mut pending.stage else {
            return Err(CodeStoreError::AlreadyFinished { id });
        };
        if offset != received {
            return Err(CodeStoreError::WrongOffset { id, offset, received });
        }
        let len = bytes.len() as u64;
        if offset.saturating_add(len) > size {
            return Err(CodeStoreError::PastDeclaredSize { id, offset, len, size });
        }
        if let Err(e) = file.write_all(bytes).await {
            // A partial write leaves the file out of step with `received`: the upload is lost.
            drop(guard);
            self.discard(id).await;
            return Err(io_at(&self.part_path(id))(e));
        }
        hasher.update(bytes);
        pending.received += len;
        pending.last_activity = Instant::now();
        Ok(pending.received)
    }

    /// Completes an upload: all declared bytes must have arrived and hash to `sha256_hex`.
    /// A mismatch discards the upload.
    pub async fn finish(&self, id: UploadId, sha256_hex: &str) -> Result<Upload> {
        let expected = parse_sha256(sha256_hex)?;
        let slot = self.slot(id)?;
        let mut guard = slot.lock().await;
        let pending = guard.as_mut().ok_or(CodeStoreError::UnknownUpload { id })?;
        if pending.received != pending.size {
            return Err(CodeStoreError::Incomplete { id, received: pending.received, size: pending.size });
        }
        let Stage::Receiving { file, hasher } = &mut pending.stage else {
            return Err(CodeStoreError::AlreadyFinished { id });
        };
        let path = self.part_path(id);
        if let Err(e) = flush_and_sync(file).await {
            drop(guard);
            self.discard(id).await;
            return Err(io_at(&path)(e));
        }
        let actual = hex::encode(std::mem::take(hasher).finalize());
        if actual != expected {
            drop(guard);
            self.discard(id).await;
            return Err(CodeStoreError::ChecksumMismatch { id, expected, actual });
        }
        pending.stage = Stage::Finished { sha256: actual.clone() };
        pending.last_activity = Instant::now();
        Ok(Upload { id, size: pending.size, sha256: actual })
    }

    /// The contents of a finished upload, for nimbus to read (the topology file at submit);
    /// refused with [`CodeStoreError::TooLarge`] above `max` bytes.
    pub async fn read_finished(&self, id: UploadId, max: u64) -> Result<Vec<u8>> {
        let slot = self.slot(id)?;
        let guard = slot.lock().await;
        match guard.as_ref() {
            None => return Err(CodeStoreError::UnknownUpload { id }),
            Some(Pending { stage: Stage::Receiving { .. }, .. }) => {
                return Err(CodeStoreError::NotFinished { id });
            }
            Some(Pending { size, .. }) if *size > max => {
                return Err(CodeStoreError::TooLarge { size: *size, max });
            }
            Some(_) => {}
        }
        let path = self.part_path(id);
        tokio::fs::read(&path).await.map_err(io_at(&path))
    }

    /// Moves a finished upload into `stormdist/<topology>/<file>` (one rename, so a reader sees
    /// the old file or the whole new one) and records its checksum beside it. Only
    /// `upload.id` is used: size and checksum are the ones the store verified itself.
    pub async fn install(&self, upload: &Upload, topology: &TopologyId, file: CodeFile) -> Result<PathBuf> {
        self.install_id(upload.id, topology, file).await
    }

    /// [`CodeStore::install`] by upload id (what a submit request names).
    pub async fn install_id(&self, id: UploadId, topology: &TopologyId, file: CodeFile) -> Result<PathBuf> {
        let slot = self.slot(id)?;
        let mut guard = slot.lock().await;
        let sha256 = match guard.as_ref().map(|p| &p.stage) {
            None => return Err(CodeStoreError::UnknownUpload { id }),
            Some(Stage::Receiving { .. }) => return Err(CodeStoreError::NotFinished { id }),
            Some(Stage::Finished { sha256 }) => sha256.clone(),
        };
        let dir = self.topology_dir(topology);
        files::create_private_dir_all_async(&dir).await.map_err(io_at(&dir))?;
        // The checksum goes first: a reader that finds the file always finds its checksum
        // (a stale one only if the file is being replaced, which a download then detects).
        let sum_path = dir.join(format!("{}.sha256", file.file_name()));
        let sum_tmp = dir.join(format!(".{}.sha256.tmp", file.file_name()));
        write_synced(&sum_tmp, sha256.as_bytes()).await?;
        tokio::fs::rename(&sum_tmp, &sum_path).await.map_err(io_at(&sum_path))?;
        let target = dir.join(file.file_name());
        let part = self.part_path(id);
        tokio::fs::rename(&part, &target).await.map_err(io_at(&target))?;
        *guard = None;
        drop(guard);
        self.map().remove(&id);
        Ok(target)
    }

    /// Creates the topology's secret (`CodeFile::Secret`): 32 random bytes, mode 0600, with
    /// its checksum like every code file, served only through the authenticated code API.
    pub async fn install_secret(&self, topology: &TopologyId) -> Result<PathBuf> {
        let secret: [u8; 32] = rand::random();
        let file = CodeFile::Secret;
        let dir = self.topology_dir(topology);
        files::create_private_dir_all_async(&dir).await.map_err(io_at(&dir))?;
        let sum_path = dir.join(format!("{}.sha256", file.file_name()));
        let sum_tmp = dir.join(format!(".{}.sha256.tmp", file.file_name()));
        write_synced(&sum_tmp, sha256_hex(&secret).as_bytes()).await?;
        tokio::fs::rename(&sum_tmp, &sum_path).await.map_err(io_at(&sum_path))?;
        let tmp = dir.join(format!(".{}.tmp", file.file_name()));
        let mut out = tokio::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(files::FILE_MODE)
            .open(&tmp)
            .await
            .map_err(io_at(&tmp))?;
        out.write_all(&secret).await.map_err(io_at(&tmp))?;
        flush_and_sync(&mut out).await.map_err(io_at(&tmp))?;
        let target = dir.join(file.file_name());
        tokio::fs::rename(&tmp, &target).await.map_err(io_at(&target))?;
        Ok(target)
    }

    /// Installs a code file copied from another nimbus (code replication): `bytes` must hash
    /// to `sha256_hex`, the checksum the other nimbus recorded, or nothing is installed. Written
    /// to a temp file and renamed, like an upload; the secret gets mode 0600.
    pub async fn install_replica(
        &self,
        topology: &TopologyId,
        file: CodeFile,
        bytes: &[u8],
        sha256_hex: &str,
    ) -> Result<PathBuf> {
        let expected = parse_sha256(sha256_hex)?;
        let actual = self::sha256_hex(bytes);
        if actual != expected {
            return Err(CodeStoreError::ReplicaChecksum { id: topology.clone(), file, expected, actual });
        }
        let dir = self.topology_dir(topology);
        tokio::fs::create_dir_all(&dir).await.map_err(io_at(&dir))?;
        let sum_path = dir.join(format!("{}.sha256", file.file_name()));
        let sum_tmp = dir.join(format!(".{}.sha256.tmp", file.file_name()));
        write_synced(&sum_tmp, actual.as_bytes()).await?;
        tokio::fs::rename(&sum_tmp, &sum_path).await.map_err(io_at(&sum_path))?;
        let tmp = dir.join(format!(".{}.tmp", file.file_name()));
        let mode = if file == CodeFile::Secret { 0o600 } else { 0o644 };
        let mut out = tokio::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .await
            .map_err(io_at(&tmp))?;
        out.write_all(bytes).await.map_err(io_at(&tmp))?;
        flush_and_sync(&mut out).await.map_err(io_at(&tmp))?;
        let target = dir.join(file.file_name());
        tokio::fs::rename(&tmp, &target).await.map_err(io_at(&target))?;
        Ok(target)
    }

    /// Whether this store holds topology `id`'s definition (installed last by a replica, so
    /// its presence means the whole code is here).
    pub async fn holds(&self, id: &TopologyId) -> bool {
        let dir = self.topology_dir(id);
        let file = CodeFile::Topology.file_name();
        tokio::fs::try_exists(dir.join(file)).await.unwrap_or(false)
            && tokio::fs::try_exists(dir.join(format!("{file}.sha256"))).await.unwrap_or(false)
    }

    /// Opens an installed code file for download.
    pub async fn open_code(&self, topology: &TopologyId, file: CodeFile) -> Result<CodeFileReader> {
        let dir = self.topology_dir(topology);
        let path = dir.join(file.file_name());
        let no_code = || CodeStoreError::NoCode { id: topology.clone(), file };
        let handle = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(no_code()),
            Err(e) => return Err(io_at(&path)(e)),
        };
        let size = handle.metadata().await.map_err(io_at(&path))?.len();
        let sum_path = dir.join(format!("{}.sha256", file.file_name()));
        let sha256 = match tokio::fs::read_to_string(&sum_path).await {
            Ok(s) => s.trim().to_owned(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(no_code()),
            Err(e) => return Err(io_at(&sum_path)(e)),
        };
        // Supervisors check downloads against it: a damaged checksum file must not be served.
        if parse_sha256(&sha256).is_err() {
            let damaged = io::Error::new(io::ErrorKind::InvalidData, "not a SHA-256 in hex");
            return Err(io_at(&sum_path)(damaged));
        }
        Ok(CodeFileReader { file: handle, size, sha256 })
    }

    /// Removes a topology's code dir; a dir already gone is not an error.
    pub async fn remove(&self, topology: &TopologyId) -> Result<()> {
        let dir = self.topology_dir(topology);
        match tokio::fs::remove_dir_all(&dir).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_at(&dir)(e)),
        }
    }

    /// Topologies with a code dir, for cleaning up after topologies gone from ZooKeeper.
    /// Entries whose name is not a topology id are not ours and are left alone.
    pub async fn topologies(&self) -> Result<Vec<TopologyId>> {
        let dir = self.inner.dir.join(STORMDIST);
        let mut entries = tokio::fs::read_dir(&dir).await.map_err(io_at(&dir))?;
        let mut ids = Vec::new();
        while let Some(entry) = entries.next_entry().await.map_err(io_at(&dir))? {
            if let Some(id) = entry.file_name().to_str().and_then(|n| n.parse().ok()) {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    /// Uploads in progress or waiting for install.
    pub fn pending_uploads(&self) -> usize {
        self.map().len()
    }

    /// Discards uploads idle for longer than the expiration; returns how many went. Uploads
    /// busy with a chunk right now are active by definition and skipped.
    pub async fn expire(&self) -> usize {
        let now = Instant::now();
        let CodeStoreLimits { upload_expiration, upload_stall_timeout, .. } = self.inner.limits;
        let slots: Vec<(UploadId, Slot)> = self.map().iter().map(|(id, e)| (*id, e.slot.clone())).collect();
        let mut expired = 0;
        for (id, slot) in slots {
            let idle = match slot.try_lock() {
                Ok(guard) => guard.as_ref().and_then(|p| {
                    let limit = match p.stage {
                        Stage::Receiving { .. } => upload_stall_timeout.min(upload_expiration),
                        Stage::Finished { .. } => upload_expiration,
                    };
                    let idle = now.saturating_duration_since(p.last_activity);
                    (idle >= limit).then_some(idle)
                }),
                Err(_) => None,
            };
            if let Some(idle) = idle {
                tracing::info!(upload = %id, "discarding an upload without progress for {idle:?}");
                self.discard(id).await;
                expired += 1;
            }
        }
        expired
    }

    async fn discard(&self, id: UploadId) {
        self.map().remove(&id);
        let path = self.part_path(id);
        match tokio::fs::remove_file(&path).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            // Leftovers in inbox/ are removed at the next start; nothing else refers to them.
            Err(e) => tracing::warn!(path = %path.display(), "cannot remove a discarded upload: {e}"),
        }
    }
}

fn parse_sha256(value: &str) -> Result<String> {
    if value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(value.to_ascii_lowercase())
    } else {
        Err(CodeStoreError::InvalidChecksum { value: value.chars().take(80).collect() })
    }
}

async fn flush_and_sync(file: &mut tokio::fs::File) -> io::Result<()> {
    file.flush().await?;
    file.sync_all().await
}

async fn write_synced(path: &Path, data: &[u8]) -> Result<()> {
    let mut file = files::private_file_async().open(path).await.map_err(io_at(path))?;
    file.write_all(data).await.map_err(io_at(path))?;
    flush_and_sync(&mut file).await.map_err(io_at(path))
}

/// Makes the secret params of every stored topology known to this process (`secrets`), so a
/// restarted nimbus hides them in its answers and logs as the one that took the submit did.
async fn remember_stored_secrets(stormdist: &Path) {
    let Ok(mut entries) = tokio::fs::read_dir(stormdist).await else { return };
    while let Ok(Some(entry)) = entries.next_entry().await {
        let file = entry.path().join(CodeFile::Topology.file_name());
        if let Ok(text) = tokio::fs::read_to_string(&file).await {
            secrets::remember(&Redactor::from_flux(&text));
        }
    }
}

/// SHA-256 of `bytes` in lowercase hex, as [`CodeStore::finish`] expects it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests;
