//! [`WatchedDir`]: one session's copy of a directory of znodes, kept current by watches.
//!
//! A reader that looks at a whole directory every few seconds (nimbus's monitor pass over
//! `/storm/supervisors`, `/storm/storms` and `/storm/assignments`) costs one read per child per
//! look when it re-reads everything: at 2,000 supervisors and 200 topologies, 2,400 round trips
//! and megabytes of decoding every pass. The copy here reads a child when it appears and again
//! only when its data watch fires (a change or a deletion); the children watch on the directory
//! tells it of new and removed children. A refresh with nothing changed reads nothing.
//!
//! Semantics (the coordination client's, see the module docs of [`crate::coord`]): watches
//! survive a disconnect and end with the session, so a copy belongs to one session; a new
//! session starts a new copy, which reads everything again. A watch may fire between a read and
//! the next refresh: the copy can be behind the server by what changed since, never by more,
//! so a writer that decides on it writes with a compare-and-set of the version it holds (and
//! may record its own successful writes with [`WatchedDir::wrote`], so its next decision
//! does not wait for the watch).
//!
//! Garbage (a child whose name does not parse as `K` or whose data does not decode as `V`) is
//! left out and reported by [`WatchedDir::garbage`], logged once per read of it.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};

use super::{Error, Result, Session, Watch, join};
use crate::znode::ZnodeData;

type Fired = Pin<Box<dyn Future<Output = String> + Send>>;

/// A decoded child and the version it was read (or written) at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned<V> {
    pub value: V,
    pub version: i32,
}

/// One session's copy of the children of a directory; see the module docs.
pub struct WatchedDir<K, V> {
    dir: String,
    /// The children that parse and decode, by key.
    entries: BTreeMap<K, Versioned<V>>,
    /// Children left out, by name: the reason (and the version, when the data was read).
    garbage: BTreeMap<String, (String, Option<i32>)>,
    /// Child names at the last listing.
    listed: BTreeSet<String>,
    /// Listed children to read (new, or their data watch fired, or their last read failed).
    stale: BTreeSet<String>,
    /// The children watch; `None` when it fired (or was never set): list again.
    children: Option<Watch>,
    /// One data watch per child read, resolving to its name.
    data: FuturesUnordered<Fired>,
    /// Nodes read over the copy's life (the cost a refresh saves shows here).
    reads: u64,
}

impl<K, V> std::fmt::Debug for WatchedDir<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedDir")
            .field("dir", &self.dir)
            .field("entries", &self.entries.len())
            .field("garbage", &self.garbage.len())
            .field("stale", &self.stale.len())
            .field("reads", &self.reads)
            .finish_non_exhaustive()
    }
}

impl<K, V> WatchedDir<K, V>
where
    K: FromStr + Ord + Clone,
    K::Err: std::fmt::Display,
    V: ZnodeData,
{
    /// An empty copy of `dir`; the first [`WatchedDir::refresh`] reads it all.
    pub fn new(dir: impl Into<String>) -> Self {
        WatchedDir {
            dir: dir.into(),
            entries: BTreeMap::new(),
            garbage: BTreeMap::new(),
            listed: BTreeSet::new(),
            stale: BTreeSet::new(),
            children: None,
            data: FuturesUnordered::new(),
            reads: 0,
        }
    }

    /// The children that decode, as of the last refresh (and the writes recorded since).
    pub fn entries(&self) -> &BTreeMap<K, Versioned<V>> {
        &self.entries
    }

    /// Children left out: their path, why, and their version when their data was read.
    pub fn garbage(&self) -> impl Iterator<Item = (String, &str, Option<i32>)> + '_ {
        self.garbage
            .iter()
            .map(|(name, (reason, version))| (join(&self.dir, name), reason.as_str(), *version))
    }

    /// Nodes read since the copy was made (listings not counted).
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// Records that this session wrote `value` to child `key`, now at `version`: the copy holds
    /// it at once (the data watch, which fires too, reads it once more).
    pub fn wrote(&mut self, key: K, value: V, version: i32) {
        self.entries.insert(key, Versioned { value, version });
    }

    /// Takes every watch that fired since the last call into account, without waiting.
    fn take_fired(&mut self) {
        if self.children.as_mut().is_some_and(|watch| watch.now_or_never().is_some()) {
            self.children = None;
        }
        while let Some(Some(name)) = self.data.next().now_or_never() {
            self.stale.insert(name);
        }
    }

    /// Reads what changed since the last refresh: the listing when its watch fired, and every
    /// new or changed child (each read leaving a data watch), concurrently. Returns how many
    /// children it read. On an error of the session the copy keeps what it had; what failed is
    /// read at the next call.
    pub async fn refresh(&mut self, session: &Session) -> Result<usize> {
        self.take_fired();
        if self.children.is_none() {
            // Not created yet: the watch fires when it appears.
            let (names, watch) = session.children_watch_or_absent(&self.dir).await?;
            self.children = Some(watch);
            let listed: BTreeSet<String> = names.into_iter().collect();
            for name in listed.difference(&self.listed) {
                self.stale.insert(name.clone());
            }
            let keys: BTreeSet<K> = listed.iter().filter_map(|name| name.parse().ok()).collect();
            self.entries.retain(|key, _| keys.contains(key));
            self.garbage.retain(|name, _| listed.contains(name));
            self.listed = listed;
        }
        self.stale.retain(|name| self.listed.contains(name));
        let stale: Vec<String> = self.stale.iter().cloned().collect();
        let dir = self.dir.as_str();
        let reads = futures::future::join_all(stale.iter().map(|name| async move {
            match name.parse::<K>() {
                Ok(key) => (name, Ok(key), Some(session.get_watch(&join(dir, name)).await)),
                Err(e) => (name, Err(e.to_string()), None),
            }
        }))
        .await;
        let mut failed = None;
        let mut read = 0;
        for (name, key, got) in reads {
            let key = match key {
                Ok(key) => key,
                Err(reason) => {
                    tracing::warn!(path = %join(&self.dir, name), %reason, "skipping a znode whose name is not an id");
                    self.garbage.insert(name.clone(), (reason, None));
                    self.stale.remove(name);
                    continue;
                }
            };
            let path = join(&self.dir, name);
            match got {
                Some(Ok((data, stat, watch))) => {
                    read += 1;
                    let fired = name.clone();
                    self.data.push(Box::pin(async move {
                        watch.await;
                        fired
                    }));
                    match V::decode(&path, &data) {
                        Ok(value) => {
                            self.garbage.remove(name);
                            self.entries.insert(key, Versioned { value, version: stat.version });
                        }
                        Err(e) => {
                            tracing::warn!(%path, reason = %e.reason, "skipping a znode that does not decode");
                            self.entries.remove(&key);
                            self.garbage.insert(name.clone(), (e.reason, Some(stat.version)));
                        }
                    }
                    self.stale.remove(name);
                }
                // Deleted since listed: the children watch brings the new listing.
                Some(Err(Error::NoNode { .. })) => {
                    self.entries.remove(&key);
                    self.garbage.remove(name);
                    self.stale.remove(name);
                }
                Some(Err(e)) => failed = Some(e),
                None => {}
            }
        }
        self.reads += read as u64;
        match failed {
            Some(e) => Err(e),
            None => Ok(read),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coord::{CreateMode, Ensemble, SessionOptions};
    use crate::ids::Partition;
    use crate::znode::OffsetData;

    async fn settle(dir: &mut WatchedDir<Partition, OffsetData>, session: &Session) -> usize {
        // Watches are delivered asynchronously: refresh until a refresh reads nothing (bounded).
        let mut total = 0;
        for _ in 0..50 {
            tokio::task::yield_now().await;
            let read = dir.refresh(session).await.unwrap();
            total += read;
            if read == 0 && dir.stale.is_empty() {
                break;
            }
        }
        total
    }

    fn offsets(dir: &WatchedDir<Partition, OffsetData>) -> Vec<(i32, i64, i32)> {
        dir.entries().iter().map(|(p, e)| (p.get(), e.value.get(), e.version)).collect()
    }

    #[tokio::test]
    async fn reads_only_what_changed_and_follows_creates_changes_deletes_and_garbage() {
        let session = Ensemble::in_memory().connect(&SessionOptions::default()).await.unwrap();
        let mut dir = WatchedDir::<Partition, OffsetData>::new("/o");
        assert_eq!(dir.refresh(&session).await.unwrap(), 0, "absent: nothing to read");
        let persistent = CreateMode::Persistent.with_parents();
        for p in 0..3 {
            session.create(&format!("/o/{p}"), p.to_string().as_bytes(), persistent).await.unwrap();
        }
        assert_eq!(settle(&mut dir, &session).await, 3);
        assert_eq!(offsets(&dir), [(0, 0, 0), (1, 1, 0), (2, 2, 0)]);
        assert_eq!(dir.refresh(&session).await.unwrap(), 0, "nothing changed, nothing read");

        session.set("/o/1", b"42", None).await.unwrap();
        assert_eq!(settle(&mut dir, &session).await, 1, "one change, one read");
        assert_eq!(offsets(&dir)[1], (1, 42, 1));

        session.delete("/o/0", None).await.unwrap();
        session.create("/o/x", b"7", persistent).await.unwrap();
        session.set("/o/2", b"not a number", None).await.unwrap();
        settle(&mut dir, &session).await;
        assert_eq!(offsets(&dir), [(1, 42, 1)]);
        let garbage: Vec<(String, Option<i32>)> = dir.garbage().map(|(path, _, v)| (path, v)).collect();
        assert_eq!(garbage, [("/o/2".to_owned(), Some(1)), ("/o/x".to_owned(), None)]);

        // A write recorded by the writer is seen before its watch fires.
        let stat = session.set("/o/1", b"43", Some(1)).await.unwrap();
        dir.wrote(Partition::new(1).unwrap(), OffsetData::new(43).unwrap(), stat.version);
        assert_eq!(offsets(&dir), [(1, 43, 2)]);
        session.set("/o/2", b"5", None).await.unwrap();
        settle(&mut dir, &session).await;
        assert_eq!(offsets(&dir), [(1, 43, 2), (2, 5, 2)]);
        assert_eq!(dir.garbage().count(), 1);
    }
}
