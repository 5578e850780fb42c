//! What is built on top of the backends' calls, the same for both: creating parents, reading
//! and decoding a payload, set-or-create, recursive delete, children of a node that may be
//! missing, and KAFKA-1387's checked ephemeral create.

use super::{
    CreateMode, EphemeralClaim, Error, Result, Session, SessionId, Stat, Watch, join, validate_path,
};
use crate::znode::ZnodeData;

impl Session {
    /// Creates `path` and its ancestors as empty persistent nodes where missing (`mkdir -p`).
    pub async fn ensure_path(&self, path: &str) -> Result<()> {
        match self.create(path, &[], CreateMode::Persistent.with_parents()).await {
            Ok(_) | Err(Error::NodeExists { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Reads a node and decodes its payload; garbage is [`Error::Decode`], naming the path.
    pub async fn read<T: ZnodeData>(&self, path: &str) -> Result<(T, Stat)> {
        let (data, stat) = self.get(path).await?;
        Ok((T::decode(path, &data)?, stat))
    }

    /// Like [`Session::read`], leaving a watch for the node's next change or deletion.
    pub async fn read_watch<T: ZnodeData>(&self, path: &str) -> Result<(T, Stat, Watch)> {
        let (data, stat, watch) = self.get_watch(path).await?;
        Ok((T::decode(path, &data)?, stat, watch))
    }

    /// Writes `data` to a persistent node whether or not it exists: sets it (any version), or
    /// creates it and its missing parents. Last writer wins, so use it only for nodes with one
    /// writer that nobody else deletes (a worker's heartbeat; not nimbus's assignment, which a
    /// kill removes: see `nimbus::assigner::write_assignment`); a node created concurrently
    /// between the set and the create is set again.
    pub async fn set_or_create(&self, path: &str, data: &[u8]) -> Result<()> {
        match self.set(path, data, None).await {
            Ok(_) => Ok(()),
            Err(Error::NoNode { .. }) => {
                match self.create(path, data, CreateMode::Persistent.with_parents()).await {
                    Ok(_) => Ok(()),
                    Err(Error::NodeExists { .. }) => self.set(path, data, None).await.map(|_| ()),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes a node and everything under it; a node already gone is not an error.
    pub async fn delete_recursive(&self, path: &str) -> Result<()> {
        validate_path(path)?;
        // Depth-first, children before parents. Nodes may appear while we walk (a worker writing
        // its heartbeat during a kill): on NotEmpty, walk the node again, a bounded number of times.
        let mut stack = vec![(path.to_owned(), false)];
        let mut retries = 0;
        while let Some((node, expanded)) = stack.pop() {
            if !expanded {
                match self.children(&node).await {
                    Ok(children) => {
                        stack.push((node.clone(), true));
                        stack.extend(children.into_iter().map(|c| (join(&node, &c), false)));
                    }
                    Err(Error::NoNode { .. }) => {}
                    Err(e) => return Err(e),
                }
                continue;
            }
            match self.delete(&node, None).await {
                Ok(()) | Err(Error::NoNode { .. }) => {}
                Err(Error::NotEmpty { .. }) if retries < 8 => {
                    retries += 1;
                    stack.push((node, false));
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Like [`Session::children`], but a node that does not exist has no children (nothing was
    /// ever written under it) rather than being an error.
    pub async fn children_or_empty(&self, path: &str) -> Result<Vec<String>> {
        match self.children(path).await {
            Ok(children) => Ok(children),
            Err(Error::NoNode { .. }) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// Creates an ephemeral node, treating an existing one as ours only when its ephemeral
    /// owner is this session *and* it holds `data`.
    ///
    /// This is the KAFKA-1387 lesson: after a connection loss the create may have gone through
    /// without our seeing the reply, so "node exists" alone says nothing about who holds it.
    /// A node held by another session (or by another holder in this one) is
    /// [`Error::HeldByOther`], naming the owner. Missing parents are created.
    pub async fn create_ephemeral_checked(&self, path: &str, data: &[u8]) -> Result<EphemeralClaim> {
        // The node may vanish between our create and our read (its owner's session ended):
        // then creating again is right. Bounded, since each round needs such a race.
        for _ in 0..8 {
            match self.create(path, data, CreateMode::Ephemeral.with_parents()).await {
                Ok(_) => return Ok(EphemeralClaim::Created),
                Err(Error::NodeExists { .. }) => {}
                Err(e) => return Err(e),
            }
            match self.get(path).await {
                Ok((existing, stat)) => {
                    let ours = stat.ephemeral_owner == Some(self.id());
                    if ours && existing == data {
                        return Ok(EphemeralClaim::AlreadyOurs);
                    }
                    return Err(Error::HeldByOther {
                        path: path.to_owned(),
                        owner: stat.ephemeral_owner.unwrap_or(SessionId(0)),
                        data: String::from_utf8_lossy(&existing).into_owned(),
                    });
                }
                Err(Error::NoNode { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(Error::Backend {
            path: Some(path.to_owned()),
            message: "node kept appearing and disappearing during a checked create".into(),
        })
    }
}
