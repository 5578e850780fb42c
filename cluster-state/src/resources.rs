//! A topology's resources: the files its shell components run with (Storm's `resources/` in
//! the topology jar). `squall submit` packs a directory into a tar archive ([`pack_dir`]),
//! uploaded like the worker binary as the code file `resources.tar`
//! ([`CodeFile::Resources`](crate::code::CodeFile::Resources)); supervisors unpack it
//! ([`unpack`]) to `stormdist/<topology-id>/resources/`, the shell components' working
//! directory.
//!
//! The archive is a wire format: ustar, regular files and directories only, paths relative
//! and without `..`; owner-only modes (`0700` for executables and directories, `0600` for other
//! files, as [`crate::files`] writes everything); no times, owners or links. Anything else in an
//! archive is refused naming the entry, before or while writing under the destination only.

use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

use crate::files;

/// The directory the archive is unpacked to, beside the topology file: the shell components'
/// working directory.
pub const DIR_NAME: &str = "resources";

/// Most entries an archive may have.
pub const MAX_ENTRIES: usize = 10_000;

/// Why resources cannot be packed or unpacked.
#[derive(Debug, thiserror::Error)]
pub enum ResourcesError {
    /// A file could not be read or written.
    #[error("resources: {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    /// An entry that resources may not hold (a link, a device, a path leaving the directory).
    #[error("resources: {}: {reason}", path.display())]
    Refused { path: PathBuf, reason: String },
    /// The archive is not one.
    #[error("resources archive: {0}")]
    Archive(String),
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> ResourcesError + '_ {
    move |source| ResourcesError::Io { path: path.to_owned(), source }
}

/// Packs the files under `dir` (not `dir` itself), in name order.
pub fn pack_dir(dir: &Path) -> Result<Vec<u8>, ResourcesError> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut entries = 0usize;
    pack_into(&mut builder, dir, Path::new(""), &mut entries)?;
    builder.into_inner().map_err(io_at(dir))
}

fn pack_into(
    builder: &mut tar::Builder<Vec<u8>>,
    root: &Path,
    rel: &Path,
    entries: &mut usize,
) -> Result<(), ResourcesError> {
    let here = root.join(rel);
    let mut names: Vec<_> = std::fs::read_dir(&here)
        .map_err(io_at(&here))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(io_at(&here))?;
    names.sort();
    for name in names {
        let rel = rel.join(&name);
        let path = root.join(&rel);
        let meta = std::fs::symlink_metadata(&path).map_err(io_at(&path))?;
        *entries += 1;
        if *entries > MAX_ENTRIES {
            return Err(ResourcesError::Refused { path, reason: format!("more than {MAX_ENTRIES} entries") });
        }
        let mut header = tar::Header::new_ustar();
        header.set_mtime(0);
        if meta.is_dir() {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(files::DIR_MODE);
            header.set_size(0);
            builder.append_data(&mut header, &rel, io::empty()).map_err(io_at(&path))?;
            pack_into(builder, root, &rel, entries)?;
        } else if meta.is_file() {
            use std::os::unix::fs::PermissionsExt;
            let executable = meta.permissions().mode() & 0o111 != 0;
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(if executable { files::EXECUTABLE_MODE } else { files::FILE_MODE });
            header.set_size(meta.len());
            let file = std::fs::File::open(&path).map_err(io_at(&path))?;
            builder.append_data(&mut header, &rel, file.take(meta.len())).map_err(io_at(&path))?;
        } else {
            return Err(ResourcesError::Refused {
                path,
                reason: "only regular files and directories are packed (no links, devices or sockets)".into(),
            });
        }
    }
    Ok(())
}

/// Unpacks `archive` into `dest` (created owner-only if missing).
pub fn unpack(archive: impl Read, dest: &Path) -> Result<(), ResourcesError> {
    files::create_private_dir_all(dest).map_err(io_at(dest))?;
    let mut archive = tar::Archive::new(archive);
    let entries = archive.entries().map_err(|e| ResourcesError::Archive(e.to_string()))?;
    for (n, entry) in entries.enumerate() {
        let mut entry = entry.map_err(|e| ResourcesError::Archive(format!("entry {}: {e}", n + 1)))?;
        if n >= MAX_ENTRIES {
            return Err(ResourcesError::Archive(format!("more than {MAX_ENTRIES} entries")));
        }
        let rel =
            entry.path().map_err(|e| ResourcesError::Archive(format!("entry {}: {e}", n + 1)))?.into_owned();
        if rel.as_os_str().is_empty() || !rel.components().all(|c| matches!(c, Component::Normal(_))) {
            return Err(ResourcesError::Refused {
                path: rel,
                reason: "entry paths must be relative, without \"..\"".into(),
            });
        }
        let target = dest.join(&rel);
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            files::create_private_dir_all(&target).map_err(io_at(&target))?;
        } else if kind.is_file() {
            if let Some(parent) = target.parent() {
                files::create_private_dir_all(parent).map_err(io_at(parent))?;
            }
            let executable = entry.header().mode().is_ok_and(|m| m & 0o111 != 0);
            let mut out = files::private_file().open(&target).map_err(io_at(&target))?;
            io::copy(&mut entry, &mut out).map_err(io_at(&target))?;
            if executable {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&target, std::fs::Permissions::from_mode(files::EXECUTABLE_MODE))
                    .map_err(io_at(&target))?;
            }
        } else {
            return Err(ResourcesError::Refused {
                path: rel,
                reason: format!("entry type {kind:?}: only regular files and directories are unpacked"),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_directory_round_trips_with_owner_only_modes() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("lib/pkg")).unwrap();
        std::fs::write(src.path().join("split.py"), "print('x')\n").unwrap();
        std::fs::set_permissions(src.path().join("split.py"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::fs::write(src.path().join("lib/pkg/data.txt"), "data").unwrap();
        std::fs::write(src.path().join("requirements.txt"), "pystorm==3.1.4\n").unwrap();
        let archive = pack_dir(src.path()).unwrap();
        // Deterministic: the same directory packs to the same bytes (same checksum).
        assert_eq!(archive, pack_dir(src.path()).unwrap());

        let dest = tempfile::tempdir().unwrap();
        let out = dest.path().join("resources");
        unpack(archive.as_slice(), &out).unwrap();
        assert_eq!(std::fs::read_to_string(out.join("split.py")).unwrap(), "print('x')\n");
        assert_eq!(std::fs::read_to_string(out.join("lib/pkg/data.txt")).unwrap(), "data");
        let mode = |p: &str| std::fs::metadata(out.join(p)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode("split.py"), 0o700);
        assert_eq!(mode("requirements.txt"), 0o600);
        assert_eq!(mode("lib"), 0o700);
    }

    #[test]
    fn links_are_not_packed() {
        let src = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc/passwd", src.path().join("passwd")).unwrap();
        let err = pack_dir(src.path()).unwrap_err();
        assert!(matches!(&err, ResourcesError::Refused { path, .. } if path.ends_with("passwd")), "{err}");
    }

    fn archive_with(path: &[u8], kind: tar::EntryType) -> Vec<u8> {
        let mut header = tar::Header::new_gnu();
        // Written raw: tar's own setters refuse such paths, a hostile client would not.
        header.as_old_mut().name[..path.len()].copy_from_slice(path);
        header.set_entry_type(kind);
        header.set_size(1);
        header.set_mode(0o644);
        header.set_cksum();
        let mut b = tar::Builder::new(Vec::new());
        b.append(&header, &b"x"[..]).unwrap();
        b.into_inner().unwrap()
    }

    #[test]
    fn hostile_archives_are_refused_naming_the_entry() {
        let dest = tempfile::tempdir().unwrap();
        let out = dest.path().join("r");
        for (path, kind) in [
            (&b"../escape"[..], tar::EntryType::Regular),
            (b"/etc/evil", tar::EntryType::Regular),
            (b"a/../../evil", tar::EntryType::Regular),
            (b"link", tar::EntryType::Symlink),
            (b"dev", tar::EntryType::Char),
        ] {
            let err = unpack(archive_with(path, kind).as_slice(), &out).unwrap_err();
            assert!(
                matches!(err, ResourcesError::Refused { .. }),
                "{}: {err}",
                String::from_utf8_lossy(path)
            );
        }
        assert!(!dest.path().join("escape").exists());
        assert!(unpack(&b"not a tar archive at all, just text"[..], &out).is_err());
    }
}
