//! The real ZooKeeper backend, through `zookeeper-client`.
//!
//! Thin by design: each call maps to one request and its error to ours, naming the path.
//! What `zookeeper-client` does for us and we rely on: requests go out in call order, watches
//! are re-registered after a reconnect (ZOOKEEPER-43 auto reset), one-shot watches end with a
//! session event when the session expires or closes, and dropping the last `Client` of a
//! non-detached session sends `CloseSession`.

use std::time::Duration;

use zookeeper_client as zk;

use super::{
    CreateMode, Credentials, Error, NodeAcl, Op, OpResult, Result, Security, SessionCredentials, SessionId,
    SessionOptions, SessionState, Stat, Watch, WatchEvent,
};

/// Creator all, anyone read: the Kafka registry with auth (see `security.rs`).
static WORLD_READABLE: [zk::Acl; 2] = [
    zk::Acl::new_const(zk::Permission::ALL, "auth", ""),
    zk::Acl::new_const(zk::Permission::READ, "world", "anyone"),
];

fn acls(acl: NodeAcl) -> zk::Acls<'static> {
    match acl {
        NodeAcl::Open => zk::Acls::anyone_all(),
        NodeAcl::Private => zk::Acls::creator_all(),
        NodeAcl::WorldReadable => zk::Acls::new(&WORLD_READABLE),
    }
}

pub(super) struct ZkSession {
    client: zk::Client,
    connect_string: String,
    detached: bool,
    security: Security,
}

impl std::fmt::Debug for ZkSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZkSession").field("id", &self.id()).finish_non_exhaustive()
    }
}

/// Maps a `zookeeper-client` error to ours, naming the path it concerns.
fn map_err(path: &str, expected_version: Option<i32>) -> impl FnOnce(zk::Error) -> Error + '_ {
    move |e| {
        let path_owned = path.to_owned();
        match e {
            zk::Error::NoNode => Error::NoNode { path: path_owned },
            zk::Error::NodeExists => Error::NodeExists { path: path_owned },
            zk::Error::BadVersion => {
                Error::BadVersion { path: path_owned, expected: expected_version.unwrap_or(-1) }
            }
            zk::Error::NotEmpty => Error::NotEmpty { path: path_owned },
            zk::Error::NoChildrenForEphemerals => Error::NoChildrenForEphemerals { path: path_owned },
            zk::Error::ConnectionLoss | zk::Error::Timeout => {
                Error::ConnectionLoss { path: Some(path_owned) }
            }
            zk::Error::SessionExpired => Error::SessionExpired { path: Some(path_owned) },
            zk::Error::ClientClosed => Error::SessionClosed,
            zk::Error::NoAuth => Error::NoAuth { path: path_owned },
            zk::Error::InvalidAcl => Error::InvalidAcl {
                path: path_owned,
                reason: "the server refused it (is the session authenticated?)".into(),
            },
            other => Error::Backend { path: Some(path_owned), message: other.to_string() },
        }
    }
}

pub(super) fn map_state(state: zk::SessionState) -> SessionState {
    match state {
        zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly => SessionState::Connected,
        zk::SessionState::Disconnected => SessionState::Disconnected,
        zk::SessionState::Expired => SessionState::Expired,
        zk::SessionState::Closed => SessionState::Closed,
        zk::SessionState::AuthFailed => SessionState::AuthFailed,
    }
}

fn map_stat(stat: &zk::Stat) -> Stat {
    Stat {
        czxid: stat.czxid,
        mzxid: stat.mzxid,
        pzxid: stat.pzxid,
        ctime_ms: stat.ctime,
        mtime_ms: stat.mtime,
        version: stat.version,
        cversion: stat.cversion,
        ephemeral_owner: (stat.ephemeral_owner != 0).then_some(SessionId(stat.ephemeral_owner)),
        data_length: stat.data_length,
        num_children: stat.num_children,
    }
}

fn zk_mode(mode: CreateMode) -> zk::CreateMode {
    match mode {
        CreateMode::Persistent => zk::CreateMode::Persistent,
        CreateMode::Ephemeral => zk::CreateMode::Ephemeral,
        CreateMode::PersistentSequential => zk::CreateMode::PersistentSequential,
        CreateMode::EphemeralSequential => zk::CreateMode::EphemeralSequential,
    }
}

fn watch(watcher: zk::OneshotWatcher) -> Watch {
    Watch::new(async move {
        let event = watcher.changed().await;
        let path = event.path;
        match event.event_type {
            zk::EventType::NodeCreated => WatchEvent::NodeCreated { path },
            zk::EventType::NodeDeleted => WatchEvent::NodeDeleted { path },
            zk::EventType::NodeDataChanged => WatchEvent::NodeDataChanged { path },
            zk::EventType::NodeChildrenChanged => WatchEvent::NodeChildrenChanged { path },
            zk::EventType::Session => WatchEvent::SessionEnded { state: map_state(event.session_state) },
        }
    })
}

/// Waits until a client's session reaches a terminal state, at most `timeout`.
async fn wait_terminal(mut states: zk::StateWatcher, timeout: Duration) {
    let terminal = async {
        while !states.state().is_terminated() {
            states.changed().await;
        }
    };
    // Past the timeout the server ends the session on its own; nothing more to wait for.
    let _ = tokio::time::timeout(timeout, terminal).await;
}

impl ZkSession {
    pub(super) async fn connect(
        connect_string: &str,
        options: &SessionOptions,
        resume: Option<zk::SessionInfo>,
        security: &Security,
    ) -> Result<Self> {
        let mut connector = zk::Client::connector().with_session_timeout(options.session_timeout);
        if let Some(auth) = &security.auth {
            // Sent before any request, and again after every reconnect, by zookeeper-client.
            connector = connector.with_auth(auth.scheme(), auth.payload().as_bytes());
        }
        if options.detached {
            connector = connector.with_detached();
        }
        if let Some(info) = resume {
            connector = connector.with_session(info);
        }
        let timeout = ConnectTimeout(connect_string, options.connect_timeout);
        let client = tokio::time::timeout(options.connect_timeout, connector.connect(connect_string))
            .await
            .map_err(|_| timeout.error())?
            .map_err(|e| match e {
                zk::Error::Timeout | zk::Error::NoHosts | zk::Error::ConnectionLoss => timeout.error(),
                zk::Error::SessionExpired => Error::SessionExpired { path: None },
                zk::Error::AuthFailed => Error::Backend {
                    path: None,
                    message: format!(
                        "ZooKeeper at {connect_string} refused the credentials (storm.zookeeper.auth.*)"
                    ),
                },
                other => {
                    Error::Backend { path: None, message: format!("connecting to {connect_string}: {other}") }
                }
            })?;
        Ok(ZkSession {
            client,
            connect_string: connect_string.to_owned(),
            detached: options.detached,
            security: security.clone(),
        })
    }

    pub(super) fn id(&self) -> SessionId {
        SessionId(self.client.session_id().0)
    }

    pub(super) fn credentials(&self) -> SessionCredentials {
        SessionCredentials(Credentials::ZooKeeper(self.client.session().clone()))
    }

    pub(super) fn session_timeout(&self) -> Duration {
        self.client.session_timeout()
    }

    pub(super) fn state(&self) -> SessionState {
        map_state(self.client.state())
    }

    pub(super) fn state_watcher(&self) -> zk::StateWatcher {
        self.client.state_watcher()
    }

    /// Fails fast unless connected. zookeeper-client would queue a request made while
    /// disconnected until the reconnect; callers must instead learn at once that they cannot act
    /// (the in-memory backend behaves the same way).
    fn ready(&self, path: &str) -> Result<()> {
        match self.state() {
            SessionState::Connected => Ok(()),
            SessionState::Disconnected => Err(Error::ConnectionLoss { path: Some(path.to_owned()) }),
            SessionState::Expired => Err(Error::SessionExpired { path: Some(path.to_owned()) }),
            SessionState::Closed | SessionState::AuthFailed => Err(Error::SessionClosed),
        }
    }

    pub(super) async fn create_node(&self, path: &str, data: &[u8], mode: CreateMode) -> Result<String> {
        self.ready(path)?;
        let options = zk_mode(mode).with_acls(acls(self.security.acl_for(path)));
        let (_, sequence) = self.client.create(path, data, &options).await.map_err(map_err(path, None))?;
        Ok(if mode.is_sequential() { format!("{path}{sequence}") } else { path.to_owned() })
    }

    pub(super) async fn get(&self, path: &str) -> Result<(Vec<u8>, Stat)> {
        self.ready(path)?;
        let (data, stat) = self.client.get_data(path).await.map_err(map_err(path, None))?;
        Ok((data, map_stat(&stat)))
    }

    pub(super) async fn get_watch(&self, path: &str) -> Result<(Vec<u8>, Stat, Watch)> {
        self.ready(path)?;
        let (data, stat, watcher) =
            self.client.get_and_watch_data(path).await.map_err(map_err(path, None))?;
        Ok((data, map_stat(&stat), watch(watcher)))
    }

    pub(super) async fn set(&self, path: &str, data: &[u8], version: Option<i32>) -> Result<Stat> {
        self.ready(path)?;
        let stat = self.client.set_data(path, data, version).await.map_err(map_err(path, version))?;
        Ok(map_stat(&stat))
    }

    pub(super) async fn delete(&self, path: &str, version: Option<i32>) -> Result<()> {
        self.ready(path)?;
        self.client.delete(path, version).await.map_err(map_err(path, version))
    }

    pub(super) async fn children(&self, path: &str) -> Result<Vec<String>> {
        self.ready(path)?;
        self.client.list_children(path).await.map_err(map_err(path, None))
    }

    pub(super) async fn children_watch(&self, path: &str) -> Result<(Vec<String>, Watch)> {
        self.ready(path)?;
        let (children, watcher) =
            self.client.list_and_watch_children(path).await.map_err(map_err(path, None))?;
        Ok((children, watch(watcher)))
    }

    pub(super) async fn exists(&self, path: &str) -> Result<Option<Stat>> {
        self.ready(path)?;
        let stat = self.client.check_stat(path).await.map_err(map_err(path, None))?;
        Ok(stat.as_ref().map(map_stat))
    }

    pub(super) async fn exists_watch(&self, path: &str) -> Result<(Option<Stat>, Watch)> {
        self.ready(path)?;
        let (stat, watcher) = self.client.check_and_watch_stat(path).await.map_err(map_err(path, None))?;
        Ok((stat.as_ref().map(map_stat), watch(watcher)))
    }

    pub(super) async fn multi(&self, ops: &[Op]) -> Result<Vec<OpResult>> {
        self.ready(ops.first().map(Op::path).unwrap_or("/"))?;
        let mut writer = self.client.new_multi_writer();
        for (index, op) in ops.iter().enumerate() {
            let added = match op {
                Op::Create { path, data, mode } => writer.add_create(
                    path,
                    data,
                    &zk_mode(*mode).with_acls(acls(self.security.acl_for(path))),
                ),
                Op::SetData { path, data, version } => writer.add_set_data(path, data, *version),
                Op::Delete { path, version } => writer.add_delete(path, *version),
                Op::Check { path, version } => writer.add_check_version(path, *version),
            };
            added.map_err(|e| Error::MultiFailed { index, source: Box::new(map_err(op.path(), None)(e)) })?;
        }
        let results = writer.commit().await.map_err(|e| match e {
            zk::MultiWriteError::OperationFailed { index, source } => {
                let (path, version) = match ops.get(index) {
                    Some(Op::SetData { path, version, .. } | Op::Delete { path, version }) => {
                        (path.as_str(), *version)
                    }
                    Some(Op::Check { path, version }) => (path.as_str(), Some(*version)),
                    Some(op) => (op.path(), None),
                    None => ("/", None),
                };
                Error::MultiFailed { index, source: Box::new(map_err(path, version)(source)) }
            }
            zk::MultiWriteError::RequestFailed { source } => {
                map_err(ops.first().map(Op::path).unwrap_or("/"), None)(source)
            }
        })?;
        results
            .into_iter()
            .map(|r| match r {
                zk::MultiWriteResult::Create { path, .. } => Ok(OpResult::Created { path }),
                zk::MultiWriteResult::SetData { stat } => Ok(OpResult::DataSet { stat: map_stat(&stat) }),
                zk::MultiWriteResult::Delete => Ok(OpResult::Deleted),
                zk::MultiWriteResult::Check => Ok(OpResult::Checked),
                other => {
                    Err(Error::Backend { path: None, message: format!("unexpected multi result {other:?}") })
                }
            })
            .collect()
    }

    /// Closes the session and waits (up to the session timeout) until the server confirmed it,
    /// so the session's ephemerals are gone when this returns.
    pub(super) async fn close(self) -> Result<()> {
        if self.detached {
            // Dropping a detached client leaves its session alive: re-attach undetached, close that.
            let info = self.client.session().clone();
            drop(self.client);
            let options = SessionOptions::default();
            let undetached =
                Box::pin(Self::connect(&self.connect_string, &options, Some(info), &self.security)).await?;
            return Box::pin(undetached.close()).await;
        }
        let states = self.client.state_watcher();
        let timeout = self.client.session_timeout();
        // Dropping the last client of the session makes zookeeper-client send CloseSession.
        drop(self.client);
        wait_terminal(states, timeout).await;
        Ok(())
    }
}

/// Builds the connect-timeout error for one attempt.
struct ConnectTimeout<'a>(&'a str, Duration);

impl ConnectTimeout<'_> {
    fn error(&self) -> Error {
        Error::ConnectTimeout { target: self.0.to_owned(), timeout_ms: self.1.as_millis() as u64 }
    }
}
