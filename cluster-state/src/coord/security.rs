//! Who may read and write the nodes Squall creates.
//!
//! With [`ZkAuth`] configured (Storm's `storm.zookeeper.auth.scheme` / `.payload`; `digest`,
//! payload `user:password`), every session authenticates, and each node it creates gets an ACL
//! by where it is ([`Security::acl_for`]):
//!
//! - at or under the Storm root (`storm.zookeeper.root`, default `/storm`): creator-all and
//!   nothing for anyone else ([`NodeAcl::Private`]), Storm's `storm.zookeeper.topology.auth`
//!   idea applied to the whole layout: an anonymous client can neither read an assignment nor
//!   write a fake supervisor;
//! - anywhere else (the Kafka consumer registry, `/consumers/...`, and parents of the root):
//!   creator-all plus world-read ([`NodeAcl::WorldReadable`]). Burrow, kafka_exporter and
//!   Kafka's own tools read the registry anonymously; they cannot be given credentials, and the
//!   registry holds offsets and owner ids, no secrets. Writing stays with the cluster's identity.
//!
//! Without auth every node is open (`world:anyone` all), as Storm's and Kafka's are by default;
//! the daemons warn at start. Both backends apply the same ACL rules (ZooKeeper's: `READ` for
//! get and children, `WRITE` for set, `CREATE` / `DELETE` on the parent, `READ` for a multi's
//! check; `exists` is never refused), and the conformance suite holds them to it.
//!
//! Workers get the credentials from their supervisor in the environment ([`AUTH_ENV`]), never on
//! the command line (which every local user can read in `/proc`).

use std::fmt;

/// The environment variable carrying `scheme:payload` to processes a daemon starts (workers),
/// and read by the `squall` commands that take no config file.
pub const AUTH_ENV: &str = "SQUALL_ZOOKEEPER_AUTH";

/// ZooKeeper credentials. `Debug` and `Display` never show the payload.
#[derive(Clone, PartialEq, Eq)]
pub struct ZkAuth {
    scheme: String,
    payload: String,
}

impl fmt::Debug for ZkAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkAuth")
            .field("scheme", &self.scheme)
            .field("user", &self.user())
            .finish_non_exhaustive()
    }
}

impl ZkAuth {
    /// Checks the scheme (`digest`: the only one the client library speaks without SASL) and
    /// the payload (`user:password`, both non-empty). The error says what is wrong, never the
    /// payload.
    pub fn new(scheme: &str, payload: &str) -> Result<ZkAuth, String> {
        if scheme != "digest" {
            return Err(format!("scheme {scheme:?} is not supported; use \"digest\""));
        }
        match payload.split_once(':') {
            Some((user, password)) if !user.is_empty() && !password.is_empty() => {
                Ok(ZkAuth { scheme: scheme.to_owned(), payload: payload.to_owned() })
            }
            _ => Err("the digest payload must be \"user:password\", both non-empty (value not shown)".into()),
        }
    }

    /// The scheme (`digest`).
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The user part of the payload.
    pub fn user(&self) -> &str {
        self.payload.split_once(':').map_or("", |(user, _)| user)
    }

    /// The payload, as sent to the server.
    pub(crate) fn payload(&self) -> &str {
        &self.payload
    }

    /// `scheme:payload`, for [`AUTH_ENV`].
    pub fn to_env_value(&self) -> String {
        format!("{}:{}", self.scheme, self.payload)
    }

    /// Reads an [`AUTH_ENV`] value.
    pub fn from_env_value(value: &str) -> Result<ZkAuth, String> {
        let (scheme, payload) = value
            .split_once(':')
            .ok_or_else(|| format!("{AUTH_ENV} must be scheme:payload (value not shown)"))?;
        ZkAuth::new(scheme, payload).map_err(|e| format!("{AUTH_ENV}: {e}"))
    }

    /// The credentials in this process's [`AUTH_ENV`], if set.
    pub fn from_env() -> Result<Option<ZkAuth>, String> {
        match std::env::var(AUTH_ENV) {
            Ok(value) if !value.is_empty() => ZkAuth::from_env_value(&value).map(Some),
            _ => Ok(None),
        }
    }
}

/// The ACL a new node gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeAcl {
    /// `world:anyone` all (no auth configured).
    Open,
    /// Creator all, nobody else anything.
    Private,
    /// Creator all, `world:anyone` read.
    WorldReadable,
}

/// A session's credentials and the ACL policy of the nodes it creates (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Security {
    pub auth: Option<ZkAuth>,
    /// Nodes at or under this path are [`NodeAcl::Private`] (with auth).
    pub private_root: String,
}

impl Default for Security {
    /// No auth; Storm's default root.
    fn default() -> Self {
        Security { auth: None, private_root: crate::paths::StormPaths::DEFAULT_ROOT.to_owned() }
    }
}

impl Security {
    /// `auth` with nodes under `private_root` private.
    pub fn new(auth: Option<ZkAuth>, private_root: impl Into<String>) -> Self {
        Security { auth, private_root: private_root.into() }
    }

    /// The ACL of a node created at `path`.
    pub fn acl_for(&self, path: &str) -> NodeAcl {
        if self.auth.is_none() {
            return NodeAcl::Open;
        }
        let root = self.private_root.trim_end_matches('/');
        let under_root = root.is_empty()
            || path == root
            || path.strip_prefix(root).is_some_and(|rest| rest.starts_with('/'));
        if under_root { NodeAcl::Private } else { NodeAcl::WorldReadable }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn credentials_are_checked_and_never_shown() {
        let auth = ZkAuth::new("digest", "squall:pw-1234").unwrap();
        assert_eq!(auth.user(), "squall");
        assert!(!format!("{auth:?}").contains("pw-1234"));
        assert_eq!(ZkAuth::from_env_value(&auth.to_env_value()).unwrap(), auth);
        for (scheme, payload) in [("sasl", "a:b"), ("digest", "nocolon"), ("digest", ":pw"), ("digest", "u:")]
        {
            let err = ZkAuth::new(scheme, payload).unwrap_err();
            assert!(!err.contains("pw") || scheme == "sasl", "{err}");
        }
    }

    #[test]
    fn storm_nodes_are_private_and_the_rest_world_readable() {
        let open = Security::default();
        assert_eq!(open.acl_for("/storm/assignments/x"), NodeAcl::Open);
        let secure = Security::new(Some(ZkAuth::new("digest", "u:p").unwrap()), "/storm");
        for private in ["/storm", "/storm/supervisors/s", "/storm/errors/t/c/e0000000001"] {
            assert_eq!(secure.acl_for(private), NodeAcl::Private, "{private}");
        }
        for readable in
            ["/consumers", "/consumers/g/offsets/t/0", "/brokers/ids/1", "/stormy", "/kafka/consumers"]
        {
            assert_eq!(secure.acl_for(readable), NodeAcl::WorldReadable, "{readable}");
        }
        let nested = Security::new(secure.auth.clone(), "/squall/storm/");
        assert_eq!(nested.acl_for("/squall/storm/storms/x"), NodeAcl::Private);
        assert_eq!(nested.acl_for("/squall"), NodeAcl::WorldReadable);
    }
}
