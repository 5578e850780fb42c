//! Writing `/assignments/<id>`: a compare-and-set of what the monitor pass read.
//!
//! The pass decides on a snapshot; between its read and its write a kill may remove the
//! topology (assignment first, base last) or a transition may change its base. So each write
//! is one multi: check `/storms/<id>` at the version read, then set the assignment at the
//! version read, or create it if it was absent; and, on a nimbus that won an election, check
//! that its election node still exists (the leader fence, `crate::leader`). A conflict is not an error of the pass: the
//! next pass re-reads and decides again. An assignment larger than a znode may safely hold is
//! never sent (ZooKeeper drops the connection of a request above `jute.maxbuffer`).

use cluster_state::coord::{self, CreateMode, Op, OpResult, Session};
use cluster_state::ids::TopologyId;
use cluster_state::paths::StormPaths;
use cluster_state::znode::{Assignment, ZnodeData};

use crate::leader::Leadership;
use crate::limits::MAX_ASSIGNMENT_BYTES;

/// Why one topology's assignment was not written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignmentWriteError {
    /// Larger than a znode may safely be (see [`crate::limits`]); never sent.
    #[error("its assignment would take {bytes} bytes, above the {max} bytes a znode may safely hold")]
    TooLarge { bytes: usize, max: usize },
    /// `/storms/<id>` or `/assignments/<id>` changed (or went) since the pass read them.
    #[error("its base record or assignment changed since it was read; decided again at the next pass")]
    Conflict,
    /// ZooKeeper refused the write for another reason.
    #[error("writing its assignment failed: {0}")]
    Failed(String),
    /// Over one of nimbus's limits, so not scheduled at all.
    #[error("not scheduled: {0}")]
    OverLimit(String),
}

impl AssignmentWriteError {
    /// The metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            AssignmentWriteError::TooLarge { .. } => "too_large",
            AssignmentWriteError::Conflict => "conflict",
            AssignmentWriteError::Failed(_) => "error",
            AssignmentWriteError::OverLimit(_) => "over_limit",
        }
    }
}

/// Writes `assignment` to `/assignments/<id>` as a compare-and-set of what was read: only
/// while `/storms/<id>` is still at `storm_version`, and the assignment still at
/// `assignment_version` (`None`: it did not exist, and is created only if it still does not).
/// A kill that removed the topology or its assignment in between is never undone. An
/// assignment too large for a znode is not sent at all. Returns the assignment's new version.
/// Errors of the session itself (connection or session lost) are `Err`; everything about this
/// one topology is `Ok(Err)`.
pub async fn write_assignment(
    session: &Session,
    leadership: &Leadership,
    paths: &StormPaths,
    id: &TopologyId,
    storm_version: i32,
    assignment_version: Option<i32>,
    assignment: &Assignment,
) -> Result<Result<i32, AssignmentWriteError>, coord::Error> {
    let data = assignment.encode();
    if data.len() > MAX_ASSIGNMENT_BYTES {
        return Ok(Err(AssignmentWriteError::TooLarge { bytes: data.len(), max: MAX_ASSIGNMENT_BYTES }));
    }
    let path = paths.assignment(id);
    let write = match assignment_version {
        Some(version) => Op::SetData { path, data, version: Some(version) },
        None => {
            session.ensure_path(&paths.assignments_dir()).await?;
            Op::Create { path, data, mode: CreateMode::Persistent }
        }
    };
    let check = Op::Check { path: paths.storm(id), version: storm_version };
    let mut ops = vec![check, write];
    // Fenced: a deposed leader's pass writes nothing (see `crate::leader`).
    let fence = leadership.fence_op()?;
    let fenced = fence.is_some();
    ops.splice(0..0, fence);
    match session.multi(&ops).await {
        // The last op is the write: its stat, or 0 for a node just created.
        Ok(results) => Ok(Ok(match results.last() {
            Some(OpResult::DataSet { stat }) => stat.version,
            _ => 0,
        })),
        Err(coord::Error::MultiFailed { index: 0, .. }) if fenced => Err(leadership.refused(&ops[0])),
        Err(e) if e.is_retryable() || e.is_session_lost() => Err(e),
        Err(coord::Error::MultiFailed { source, .. })
            if matches!(
                *source,
                coord::Error::NoNode { .. }
                    | coord::Error::NodeExists { .. }
                    | coord::Error::BadVersion { .. }
            ) =>
        {
            Ok(Err(AssignmentWriteError::Conflict))
        }
        Err(e) => Ok(Err(AssignmentWriteError::Failed(e.to_string()))),
    }
}
