//! Workers as an unprivileged user (`supervisor.run.worker.as.user`): who that user is, and the
//! file permissions that let its workers read their code and write their heartbeat while every
//! directory stays closed to everyone else.
//!
//! A supervisor running as root starts each worker with that user's uid and primary gid
//! (`setgid`, supplementary groups cleared, `setuid` in the child before `exec`; no shell).
//! Before each launch, [`RunAs::prepare`]:
//! - gives the directories the worker passes through (`storm.local.dir`, its `stormdist/` and
//!   `workers/`) to the user's group with mode `0710`: the group may traverse, not list, and
//!   nobody else may enter;
//! - hands the worker's own directories (its topology's code, `workers/<worker-id>/`) to the
//!   user, recursively (they stay `0700` / `0600`).
//!
//! The supervisor (root) still reads and removes everything. Workers of every topology run as
//! the same user: this separates workers from the supervisor and other local users, not
//! topologies from each other.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The key, for errors.
pub const KEY: &str = "supervisor.run.worker.as.user";

/// Mode of the directories a worker passes through: owner all, group traverse only.
const TRAVERSE_MODE: u32 = 0o710;

/// A user workers run as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// Why the user cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RunAsError {
    #[error("{KEY}: no user {name:?} on this machine (getent passwd / /etc/passwd)")]
    NoSuchUser { name: String },
    #[error("{KEY}: {name:?} is root (uid 0); name an unprivileged user")]
    Root { name: String },
    #[error(
        "{KEY} is {name:?} but the supervisor runs as uid {uid}, not root: it cannot start workers as another user"
    )]
    NotRoot { name: String, uid: u32 },
    #[error("{KEY}: cannot look the user up: {0}")]
    Lookup(io::Error),
}

/// The `name:password:uid:gid:...` line of `name` among passwd lines.
pub fn parse_passwd(text: &str, name: &str) -> Option<WorkerUser> {
    text.lines().find_map(|line| {
        let mut fields = line.split(':');
        if fields.next()? != name {
            return None;
        }
        let _password = fields.next()?;
        let uid = fields.next()?.parse().ok()?;
        let gid = fields.next()?.parse().ok()?;
        Some(WorkerUser { name: name.to_owned(), uid, gid })
    })
}

impl WorkerUser {
    /// Looks `name` up (`getent passwd`, so NSS users are found; `/etc/passwd` when `getent` is
    /// missing), refusing root.
    pub fn lookup(name: &str) -> Result<WorkerUser, RunAsError> {
        let no_such = || RunAsError::NoSuchUser { name: name.to_owned() };
        if name.is_empty() || name.contains([':', '\n', '/']) {
            return Err(no_such());
        }
        let user = match Command::new("getent").args(["passwd", "--", name]).output() {
            Ok(out) => parse_passwd(&String::from_utf8_lossy(&out.stdout), name),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let passwd = std::fs::read_to_string("/etc/passwd").map_err(RunAsError::Lookup)?;
                parse_passwd(&passwd, name)
            }
            Err(e) => return Err(RunAsError::Lookup(e)),
        };
        let user = user.ok_or_else(no_such)?;
        if user.uid == 0 {
            return Err(RunAsError::Root { name: name.to_owned() });
        }
        Ok(user)
    }

    /// [`WorkerUser::lookup`], and a check that this process can switch to it (runs as root).
    pub fn for_supervisor(name: &str) -> Result<WorkerUser, RunAsError> {
        let user = WorkerUser::lookup(name)?;
        let uid = rustix::process::geteuid().as_raw();
        if uid != 0 {
            return Err(RunAsError::NotRoot { name: name.to_owned(), uid });
        }
        Ok(user)
    }
}

/// One worker's user and the paths it needs; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub user: WorkerUser,
    /// Directories the worker passes through: `0710`, the user's group.
    pub traverse: Vec<PathBuf>,
    /// The worker's own directories, created if missing and handed to the user recursively.
    pub owned: Vec<PathBuf>,
}

impl RunAs {
    /// Sets the permissions; the error names the path.
    pub fn prepare(&self) -> Result<(), (PathBuf, io::Error)> {
        for dir in &self.traverse {
            cluster_state::files::create_private_dir_all(dir).map_err(|e| (dir.clone(), e))?;
            std::os::unix::fs::chown(dir, None, Some(self.user.gid)).map_err(|e| (dir.clone(), e))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(TRAVERSE_MODE))
                .map_err(|e| (dir.clone(), e))?;
        }
        for dir in &self.owned {
            cluster_state::files::create_private_dir_all(dir).map_err(|e| (dir.clone(), e))?;
            self.chown_tree(dir)?;
        }
        Ok(())
    }

    fn chown_tree(&self, path: &Path) -> Result<(), (PathBuf, io::Error)> {
        // lchown: a link is changed itself, never what it points to.
        std::os::unix::fs::lchown(path, Some(self.user.uid), Some(self.user.gid))
            .map_err(|e| (path.to_path_buf(), e))?;
        if std::fs::symlink_metadata(path).map_err(|e| (path.to_path_buf(), e))?.is_dir() {
            for entry in std::fs::read_dir(path).map_err(|e| (path.to_path_buf(), e))? {
                let entry = entry.map_err(|e| (path.to_path_buf(), e))?;
                self.chown_tree(&entry.path())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_lines() {
        let text = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
                    storm:x:1001:1002::/home/storm:/bin/sh\nbroken:x:abc:1\n";
        let user = |uid, gid, name: &str| Some(WorkerUser { name: name.to_owned(), uid, gid });
        assert_eq!(parse_passwd(text, "storm"), user(1001, 1002, "storm"));
        assert_eq!(parse_passwd(text, "nobody"), user(65534, 65534, "nobody"));
        assert_eq!(parse_passwd(text, "root"), user(0, 0, "root"));
        assert_eq!(parse_passwd(text, "sto"), None, "a prefix is not a name");
        assert_eq!(parse_passwd(text, "broken"), None);
        assert_eq!(parse_passwd(text, "absent"), None);
    }

    #[test]
    fn unknown_users_and_root_are_refused_naming_the_key() {
        let error = WorkerUser::lookup("no-such-user-squall").unwrap_err().to_string();
        assert!(error.contains(KEY) && error.contains("no user \"no-such-user-squall\""), "{error}");
        let error = WorkerUser::lookup("root").unwrap_err().to_string();
        assert!(error.contains("is root"), "{error}");
        assert!(WorkerUser::lookup("a:b").is_err());
    }
}
