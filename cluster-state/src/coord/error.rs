//! The one error type of the coordination client.

use super::SessionId;

/// What a coordination call can fail with. Variants state the ZooKeeper fact and the path it
/// concerns; [`Error::is_retryable`] says which ones a caller may simply try again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The node (or, for a create, its parent) does not exist.
    #[error("znode {path} does not exist")]
    NoNode { path: String },
    /// A create found the node already there.
    #[error("znode {path} already exists")]
    NodeExists { path: String },
    /// A compare-and-set lost: the node's version is not the one the caller read.
    #[error("znode {path} was changed by someone else (expected version {expected}); re-read it and retry")]
    BadVersion { path: String, expected: i32 },
    /// A delete of a node that still has children.
    #[error("znode {path} still has children; delete them first")]
    NotEmpty { path: String },
    /// A create under an ephemeral parent: ZooKeeper forbids children of ephemerals.
    #[error("znode {path} cannot be created: its parent is ephemeral")]
    NoChildrenForEphemerals { path: String },
    /// A checked ephemeral create found the node held by another session, or by another holder
    /// (different data) in ours.
    #[error("znode {path} is held by session {owner} (data {data:?})")]
    HeldByOther { path: String, owner: SessionId, data: String },
    /// The node's ACL does not let this session's identities do this (ZooKeeper's `NoAuth`):
    /// a client without the cluster's credentials, or with other ones.
    #[error(
        "not allowed to access znode {path}: its ACL does not grant this session's identity (check storm.zookeeper.auth.scheme / storm.zookeeper.auth.payload)"
    )]
    NoAuth { path: String },
    /// A create asked for an ACL the server cannot apply (ZooKeeper's `InvalidACL`), e.g.
    /// creator-only on a session that is not authenticated.
    #[error("znode {path} cannot be created with the ACL asked for: {reason}")]
    InvalidAcl { path: String, reason: String },
    /// The path is not a valid ZooKeeper path.
    #[error("invalid znode path {path:?}: {reason}")]
    InvalidPath { path: String, reason: &'static str },
    /// One operation of a multi failed; nothing of the multi was applied.
    #[error("transaction rolled back: operation {index} failed: {source}")]
    MultiFailed { index: usize, source: Box<Error> },
    /// The connection is down; the session may still be alive. Retry after reconnecting.
    #[error("connection to the coordination service lost{}", at(path))]
    ConnectionLoss { path: Option<String> },
    /// No session could be established in time.
    #[error("could not connect to {target} within {timeout_ms} ms; is the server running?")]
    ConnectTimeout { target: String, timeout_ms: u64 },
    /// The session expired: its ephemerals and watches are gone. Connect a new session.
    #[error("coordination session expired{}; connect a new session", at(path))]
    SessionExpired { path: Option<String> },
    /// The session was closed by its owner.
    #[error("coordination session is closed")]
    SessionClosed,
    /// The node holds data that is not a valid payload of the expected format.
    #[error(transparent)]
    Decode(#[from] crate::znode::DecodeError),
    /// Anything else the server or the client library reported.
    #[error("coordination error{}: {message}", at(path))]
    Backend { path: Option<String>, message: String },
}

fn at(path: &Option<String>) -> String {
    path.as_ref().map(|p| format!(" at {p}")).unwrap_or_default()
}

impl Error {
    /// Whether the same call may succeed if simply repeated (after the session reconnects).
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::ConnectionLoss { .. } | Error::ConnectTimeout { .. } => true,
            Error::MultiFailed { source, .. } => source.is_retryable(),
            _ => false,
        }
    }

    /// Whether the server itself gave this answer (so the session was alive when it did):
    /// false for a lost connection, an ended session, and anything the client decided alone.
    pub fn is_server_answer(&self) -> bool {
        match self {
            Error::NoNode { .. }
            | Error::NodeExists { .. }
            | Error::BadVersion { .. }
            | Error::NotEmpty { .. }
            | Error::NoChildrenForEphemerals { .. }
            | Error::HeldByOther { .. }
            | Error::NoAuth { .. }
            | Error::InvalidAcl { .. }
            | Error::Decode(_) => true,
            Error::MultiFailed { source, .. } => source.is_server_answer(),
            Error::InvalidPath { .. }
            | Error::ConnectionLoss { .. }
            | Error::ConnectTimeout { .. }
            | Error::SessionExpired { .. }
            | Error::SessionClosed
            | Error::Backend { .. } => false,
        }
    }

    /// Whether the session behind the call is gone for good (expired or closed).
    pub fn is_session_lost(&self) -> bool {
        matches!(self, Error::SessionExpired { .. } | Error::SessionClosed)
    }

    /// The path the error is about, when it is about one.
    pub fn path(&self) -> Option<&str> {
        match self {
            Error::NoNode { path }
            | Error::NodeExists { path }
            | Error::BadVersion { path, .. }
            | Error::NotEmpty { path }
            | Error::NoChildrenForEphemerals { path }
            | Error::HeldByOther { path, .. }
            | Error::NoAuth { path }
            | Error::InvalidAcl { path, .. }
            | Error::InvalidPath { path, .. } => Some(path),
            Error::ConnectionLoss { path } | Error::SessionExpired { path } | Error::Backend { path, .. } => {
                path.as_deref()
            }
            Error::MultiFailed { source, .. } => source.path(),
            Error::Decode(e) => Some(&e.path),
            Error::ConnectTimeout { .. } | Error::SessionClosed => None,
        }
    }
}

/// Result of a coordination call.
pub type Result<T, E = Error> = std::result::Result<T, E>;
