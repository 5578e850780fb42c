//! Committed offsets at `/consumers/[group]/offsets/[topic]/[partition]` (plain decimal,
//! persistent): read one, commit many in one transaction, never rewrite an unchanged one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cluster_state::coord::{self, CreateMode, Op};
use cluster_state::ids::{GroupId, Topic};
use cluster_state::paths::KafkaPaths;
use cluster_state::znode::{OffsetData, ZnodeData};
use futures::future::join_all;

use crate::assign::TopicPartition;
use crate::config::OffsetReset;
use crate::error::{Error, Result};
use crate::metrics::RegistryMetrics;
use crate::zk::Zk;

/// Where the caller should start consuming a partition it was assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartPosition {
    /// At this committed offset (the next message to consume).
    Committed(i64),
    /// No usable committed offset: follow `auto.offset.reset`.
    Reset(OffsetReset),
}

/// What a commit did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommitReport {
    /// Offsets written (created or changed).
    pub written: usize,
    /// Offsets skipped because the node already held them.
    pub unchanged: usize,
}

/// The state of an offset node as this process last saw or wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Known {
    Absent,
    /// Present; `None` when it held garbage.
    Present(Option<i64>),
}

/// Reads and commits a group's offsets through the member's current session. Cheap to clone.
#[derive(Debug, Clone)]
pub struct OffsetStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    group: GroupId,
    consumer: String,
    paths: KafkaPaths,
    reset: OffsetReset,
    reset_on_corrupt: bool,
    metrics: RegistryMetrics,
    /// The member's session; `None` while it has none (replacing an expired one, or stopped).
    session: Mutex<Option<Zk>>,
    known: Mutex<HashMap<TopicPartition, Known>>,
    /// Topics whose offsets directory is known to exist.
    topic_dirs: Mutex<BTreeSet<Topic>>,
    /// The member has stopped for good.
    stopped: AtomicBool,
}

impl OffsetStore {
    pub(crate) fn new(
        group: GroupId,
        consumer: String,
        paths: KafkaPaths,
        reset: OffsetReset,
        reset_on_corrupt: bool,
        metrics: RegistryMetrics,
    ) -> Self {
        let inner = Inner {
            group,
            consumer,
            paths,
            reset,
            reset_on_corrupt,
            metrics,
            session: Mutex::new(None),
            known: Mutex::new(HashMap::new()),
            topic_dirs: Mutex::new(BTreeSet::new()),
            stopped: AtomicBool::new(false),
        };
        OffsetStore { inner: Arc::new(inner) }
    }

    pub(crate) fn set_session(&self, zk: Option<Zk>) {
        *self.inner.session.lock().unwrap_or_else(PoisonError::into_inner) = zk;
    }

    /// The member stopped: calls fail with [`Error::Stopped`] from now on.
    pub(crate) fn stop(&self) {
        self.inner.stopped.store(true, Ordering::Relaxed);
        self.set_session(None);
    }

    /// Drops what we know of these partitions' offsets: once another member may have committed
    /// them, "unchanged" must be judged against a fresh read.
    pub(crate) fn forget<'a>(&self, partitions: impl IntoIterator<Item = &'a TopicPartition>) {
        let mut known = self.inner.known.lock().unwrap_or_else(PoisonError::into_inner);
        for tp in partitions {
            known.remove(tp);
        }
    }

    fn zk(&self) -> Result<Zk> {
        if self.inner.stopped.load(Ordering::Relaxed) {
            return Err(Error::Stopped {
                group: self.inner.group.clone(),
                consumer: self.inner.consumer.clone(),
            });
        }
        let session = self.inner.session.lock().unwrap_or_else(PoisonError::into_inner).clone();
        // Between sessions (replacing an expired one): retryable.
        session.ok_or_else(|| Error::Coordination {
            group: self.inner.group.clone(),
            source: coord::Error::ConnectionLoss { path: None },
        })
    }

    fn remember(&self, tp: &TopicPartition, state: Known) {
        self.inner.known.lock().unwrap_or_else(PoisonError::into_inner).insert(tp.clone(), state);
    }

    fn corrupt(&self, tp: &TopicPartition, path: String, reason: String) -> Error {
        let inner = &self.inner;
        let partition = tp.partition.to_string();
        inner
            .metrics
            .offset_errors
            .with_label_values(&[inner.group.as_str(), tp.topic.as_str(), &partition])
            .inc();
        tracing::error!(group = %inner.group, consumer = %inner.consumer, %path, %reason, "committed offset is garbage");
        Error::CorruptOffset {
            group: inner.group.clone(),
            topic: tp.topic.clone(),
            partition: tp.partition,
            path,
            reason,
        }
    }

    /// The committed offset of `tp`, `None` if nothing was committed. Garbage is
    /// [`Error::CorruptOffset`] (counted in `squall_consumer_offset_errors_total`).
    pub async fn committed(&self, tp: &TopicPartition) -> Result<Option<i64>> {
        let path = self.inner.paths.offset(&self.inner.group, &tp.topic, tp.partition);
        match self.zk()?.read::<OffsetData>(&path).await {
            Ok((offset, _)) => {
                self.remember(tp, Known::Present(Some(offset.get())));
                Ok(Some(offset.get()))
            }
            Err(coord::Error::NoNode { .. }) => {
                self.remember(tp, Known::Absent);
                Ok(None)
            }
            Err(coord::Error::Decode(e)) => {
                self.remember(tp, Known::Present(None));
                Err(self.corrupt(tp, path, e.reason))
            }
            Err(e) => Err(Error::coord(&self.inner.group)(e)),
        }
    }

    /// Where to start `tp`: its committed offset, else `auto.offset.reset`. A garbage offset
    /// follows `auto.offset.reset` only if `reset_on_corrupt_offset` is set; it is counted and
    /// logged either way.
    pub async fn start_position(&self, tp: &TopicPartition) -> Result<StartPosition> {
        match self.committed(tp).await {
            Ok(Some(offset)) => Ok(StartPosition::Committed(offset)),
            Ok(None) => Ok(StartPosition::Reset(self.inner.reset)),
            Err(Error::CorruptOffset { .. }) if self.inner.reset_on_corrupt => {
                Ok(StartPosition::Reset(self.inner.reset))
            }
            Err(e) => Err(e),
        }
    }

    /// Commits `offsets` (the next offset to consume, per partition) in one transaction,
    /// skipping those the node already holds.
    pub async fn commit(&self, offsets: &BTreeMap<TopicPartition, i64>) -> Result<CommitReport> {
        let group = &self.inner.group;
        if let Some((tp, &offset)) = offsets.iter().find(|(_, o)| **o < 0) {
            return Err(Error::NegativeOffset {
                group: group.clone(),
                topic: tp.topic.clone(),
                partition: tp.partition,
                offset,
            });
        }
        let zk = self.zk()?;
        // Two rounds: a node created or deleted by someone else since we looked makes the first
        // transaction fail; then we look again.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let states = self.states(&zk, offsets.keys()).await?;
            let changed: Vec<(&TopicPartition, i64, Known)> = offsets
                .iter()
                .filter(|(tp, o)| states.get(*tp) != Some(&Known::Present(Some(**o))))
                .map(|(tp, &o)| (tp, o, states.get(tp).copied().unwrap_or(Known::Absent)))
                .collect();
            let unchanged = offsets.len() - changed.len();
            let new_topics: BTreeSet<&Topic> =
                changed.iter().filter(|(_, _, k)| *k == Known::Absent).map(|(tp, _, _)| &tp.topic).collect();
            for topic in new_topics {
                self.ensure_topic_dir(&zk, topic).await?;
            }
            let ops: Vec<Op> = changed
                .iter()
                .map(|(tp, offset, known)| {
                    let path = self.inner.paths.offset(group, &tp.topic, tp.partition);
                    let data = offset.to_string().into_bytes();
                    match known {
                        Known::Absent => Op::Create { path, data, mode: CreateMode::Persistent },
                        Known::Present(_) => Op::SetData { path, data, version: None },
                    }
                })
                .collect();
            match zk.multi(&ops).await {
                Ok(_) => {
                    for (tp, offset, _) in &changed {
                        self.remember(tp, Known::Present(Some(*offset)));
                        self.inner
                            .metrics
                            .offset_commits
                            .with_label_values(&[group.as_str(), tp.topic.as_str()])
                            .inc();
                    }
                    return Ok(CommitReport { written: changed.len(), unchanged });
                }
                Err(coord::Error::MultiFailed { source, index })
                    if attempt < 2
                        && matches!(
                            *source,
                            coord::Error::NodeExists { .. } | coord::Error::NoNode { .. }
                        ) =>
                {
                    tracing::debug!(%group, index, error = %source, "offset node changed under us; looking again");
                    self.forget(changed.iter().map(|(tp, _, _)| *tp));
                    self.inner.topic_dirs.lock().unwrap_or_else(PoisonError::into_inner).clear();
                }
                Err(e) => return Err(Error::coord(group)(e)),
            }
        }
    }

    /// What we know of each partition's offset node, reading those we know nothing of.
    async fn states<'a>(
        &self,
        zk: &Zk,
        partitions: impl Iterator<Item = &'a TopicPartition>,
    ) -> Result<HashMap<TopicPartition, Known>> {
        let mut states = HashMap::new();
        let mut unknown = Vec::new();
        {
            let known = self.inner.known.lock().unwrap_or_else(PoisonError::into_inner);
            for tp in partitions {
                match known.get(tp) {
                    Some(state) => drop(states.insert(tp.clone(), *state)),
                    None => unknown.push(tp),
                }
            }
        }
        let group = &self.inner.group;
        let reads = unknown.iter().map(|tp| {
            let path = self.inner.paths.offset(group, &tp.topic, tp.partition);
            async move { (tp, zk.get(&path).await) }
        });
        for (tp, read) in join_all(reads).await {
            let state = match read {
                // Garbage is overwritten by a commit, so it only needs to be "present".
                Ok((bytes, _)) => Known::Present(OffsetData::decode("", &bytes).ok().map(OffsetData::get)),
                Err(coord::Error::NoNode { .. }) => Known::Absent,
                Err(e) => return Err(Error::coord(group)(e)),
            };
            self.remember(tp, state);
            states.insert((*tp).clone(), state);
        }
        Ok(states)
    }

    async fn ensure_topic_dir(&self, zk: &Zk, topic: &Topic) -> Result<()> {
        if self.inner.topic_dirs.lock().unwrap_or_else(PoisonError::into_inner).contains(topic) {
            return Ok(());
        }
        let path = self.inner.paths.offsets_topic(&self.inner.group, topic);
        zk.ensure_path(&path).await.map_err(Error::coord(&self.inner.group))?;
        self.inner.topic_dirs.lock().unwrap_or_else(PoisonError::into_inner).insert(topic.clone());
        Ok(())
    }
}
