//! Files and directories Squall writes are its own: owner-only, `0600` files and `0700`
//! directories (`0700` for an executable). Topology code, topology secrets, local state,
//! heartbeats and logs may hold credentials or the user's code; no other local user reads them.
//!
//! Every place that creates a file or a directory goes through these helpers, so the mode does
//! not depend on the process's umask; the `squall` binary also sets the umask to `077`
//! ([`restrict_umask`]) for what libraries (librdkafka, tempfiles) create on their own.

use std::fs::{DirBuilder, OpenOptions, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Mode of every file Squall writes.
pub const FILE_MODE: u32 = 0o600;
/// Mode of every directory Squall creates, and of a worker binary (owner may run it).
pub const DIR_MODE: u32 = 0o700;
/// Mode of a downloaded worker binary.
pub const EXECUTABLE_MODE: u32 = 0o700;

/// Creates `path` and its missing parents with [`DIR_MODE`], and narrows `path` itself to it
/// when it already existed (a directory made by an older version, or by hand, with `0755`).
pub fn create_private_dir_all(path: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(path)?;
    std::fs::set_permissions(path, Permissions::from_mode(DIR_MODE))
}

/// [`create_private_dir_all`] on a blocking thread, for async code.
pub async fn create_private_dir_all_async(path: &Path) -> io::Result<()> {
    let owned = path.to_path_buf();
    tokio::task::spawn_blocking(move || create_private_dir_all(&owned)).await.map_err(io::Error::other)?
}

/// Options that create (or truncate) a file with [`FILE_MODE`] for writing.
pub fn private_file() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true).mode(FILE_MODE);
    options
}

/// Options that create a file with [`FILE_MODE`] to append to (logs).
pub fn private_append() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.append(true).create(true).mode(FILE_MODE);
    options
}

/// Writes `data` to `path` (created with [`FILE_MODE`], or truncated; an existing file's mode
/// is narrowed to it).
pub fn write_private(path: &Path, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut file = private_file().open(path)?;
    file.set_permissions(Permissions::from_mode(FILE_MODE))?;
    file.write_all(data)
}

/// [`private_file`] for tokio.
pub fn private_file_async() -> tokio::fs::OpenOptions {
    tokio::fs::OpenOptions::from(private_file())
}

/// Sets the process's umask to `077`, so files that libraries create on their own are
/// owner-only too. Returns the previous umask. Called once, first thing, by `squall`.
pub fn restrict_umask() -> u32 {
    rustix::process::umask(rustix::fs::Mode::from_bits_truncate(0o077)).bits()
}

/// The permission bits of `path` (`0o777` part), for checks and tests.
pub fn mode_of(path: &Path) -> io::Result<u32> {
    Ok(std::fs::metadata(path)?.permissions().mode() & 0o777)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn dirs_and_files_are_owner_only_whatever_the_umask_allows() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b");
        create_private_dir_all(&dir).unwrap();
        assert_eq!(mode_of(&root.path().join("a")).unwrap(), DIR_MODE);
        assert_eq!(mode_of(&dir).unwrap(), DIR_MODE);
        // An existing open directory is narrowed.
        std::fs::set_permissions(&dir, Permissions::from_mode(0o755)).unwrap();
        create_private_dir_all(&dir).unwrap();
        assert_eq!(mode_of(&dir).unwrap(), DIR_MODE);
        let file = dir.join("f");
        std::fs::write(&file, b"x").unwrap();
        std::fs::set_permissions(&file, Permissions::from_mode(0o644)).unwrap();
        write_private(&file, b"secret").unwrap();
        assert_eq!(mode_of(&file).unwrap(), FILE_MODE);
        let log = dir.join("log");
        private_append().open(&log).unwrap();
        assert_eq!(mode_of(&log).unwrap(), FILE_MODE);
    }
}
