//! A member's view of its session: the coordination calls it makes, each counted, so the
//! benchmark and the metrics can say how many ZooKeeper requests a rebalance costs.

use std::sync::Arc;

use cluster_state::coord::{EphemeralClaim, Op, OpResult, Result, Session, Stat, Watch};
use cluster_state::znode::ZnodeData;
use prometheus::IntCounter;

#[derive(Debug, Clone)]
pub(crate) struct Zk {
    pub(crate) session: Arc<Session>,
    ops: IntCounter,
}

impl Zk {
    pub(crate) fn new(session: Session, ops: IntCounter) -> Self {
        Zk { session: Arc::new(session), ops }
    }

    fn count(&self, n: u64) -> &Session {
        self.ops.inc_by(n);
        &self.session
    }

    pub(crate) async fn children(&self, path: &str) -> Result<Vec<String>> {
        self.count(1).children(path).await
    }

    pub(crate) async fn children_watch(&self, path: &str) -> Result<(Vec<String>, Watch)> {
        self.count(1).children_watch(path).await
    }

    pub(crate) async fn get(&self, path: &str) -> Result<(Vec<u8>, Stat)> {
        self.count(1).get(path).await
    }

    pub(crate) async fn read<T: ZnodeData>(&self, path: &str) -> Result<(T, Stat)> {
        self.count(1).read(path).await
    }

    pub(crate) async fn read_watch<T: ZnodeData>(&self, path: &str) -> Result<(T, Stat, Watch)> {
        self.count(1).read_watch(path).await
    }

    pub(crate) async fn exists(&self, path: &str) -> Result<Option<Stat>> {
        self.count(1).exists(path).await
    }

    pub(crate) async fn exists_watch(&self, path: &str) -> Result<(Option<Stat>, Watch)> {
        self.count(1).exists_watch(path).await
    }

    /// One create, plus a read when the node is already there.
    pub(crate) async fn create_ephemeral_checked(&self, path: &str, data: &[u8]) -> Result<EphemeralClaim> {
        let claim = self.count(1).create_ephemeral_checked(path, data).await;
        if !matches!(claim, Ok(EphemeralClaim::Created)) {
            self.ops.inc();
        }
        claim
    }

    pub(crate) async fn delete(&self, path: &str, version: Option<i32>) -> Result<()> {
        self.count(1).delete(path, version).await
    }

    pub(crate) async fn ensure_path(&self, path: &str) -> Result<()> {
        self.count(1).ensure_path(path).await
    }

    pub(crate) async fn multi(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        self.count(u64::from(!ops.is_empty())).multi(ops).await
    }
}
