//! The cluster config file: one YAML file for every process of a cluster, with Storm's key names
//! (`storm.zookeeper.servers`, `nimbus.task.timeout.secs`, `supervisor.slots.ports`, ...).
//!
//! Each daemon reads the keys it knows (nimbus's from [`nimbus::NimbusConfig`], a supervisor's
//! from [`supervisor::daemon::SupervisorConfig`]) and the clients read the addresses. A key that
//! no part of Squall knows is an error naming it (a typo must not silently run on the default),
//! and a value of the wrong type names its key too.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use cluster_state::coord::{Ensemble, Security, ZkAuth};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_yaml_ng::{Mapping, Value};

/// Keys no daemon struct holds: where ZooKeeper is (Storm's two keys).
const ZOOKEEPER_SERVERS: &str = "storm.zookeeper.servers";
const ZOOKEEPER_PORT: &str = "storm.zookeeper.port";
/// Storm's ZooKeeper credentials: every process authenticates with them (`coord::Security`).
const ZOOKEEPER_AUTH_SCHEME: &str = "storm.zookeeper.auth.scheme";
const ZOOKEEPER_AUTH_PAYLOAD: &str = "storm.zookeeper.auth.payload";
/// Keys the clients read (they are also nimbus's or a supervisor's).
const NIMBUS_ADDRESS: &str = "nimbus.http.address";
const NIMBUS_TOKEN: &str = "nimbus.http.token";
/// Keys whose values are secrets: no message ever shows their value.
const SECRET_KEYS: [&str; 2] = [NIMBUS_TOKEN, ZOOKEEPER_AUTH_PAYLOAD];

fn is_secret(key: &str) -> bool {
    SECRET_KEYS.contains(&key)
}

/// A `-c KEY=VALUE` as messages show it: a secret's value hidden.
fn shown(assignment: &str) -> String {
    match assignment.split_once('=') {
        Some((key, _)) if is_secret(key.trim()) => format!("{key}=<hidden>"),
        _ => assignment.to_owned(),
    }
}

/// A loaded, key-checked cluster config.
#[derive(Debug, Clone, Default)]
pub struct ClusterConfig {
    file: Option<PathBuf>,
    map: Mapping,
}

/// Every key of `T`, from its default serialized with the same names it deserializes with.
fn keys_of<T: Serialize + Default>() -> BTreeSet<String> {
    match serde_yaml_ng::to_value(T::default()) {
        Ok(Value::Mapping(m)) => m.keys().filter_map(|k| k.as_str().map(str::to_owned)).collect(),
        _ => BTreeSet::new(),
    }
}

fn known_keys() -> BTreeSet<String> {
    let mut keys = keys_of::<nimbus::NimbusConfig>();
    keys.extend(keys_of::<supervisor::daemon::SupervisorConfig>());
    keys.extend(
        [ZOOKEEPER_SERVERS, ZOOKEEPER_PORT, ZOOKEEPER_AUTH_SCHEME, ZOOKEEPER_AUTH_PAYLOAD].map(str::to_owned),
    );
    keys
}

impl ClusterConfig {
    /// Reads `path` (no file: every default). Unknown keys are refused, naming them.
    pub fn load(path: Option<&Path>) -> Result<ClusterConfig, String> {
        let Some(path) = path else { return Ok(ClusterConfig::default()) };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
        Self::parse(&text, Some(path))
    }

    /// Parses config text (`file` only names it in errors).
    pub fn parse(text: &str, file: Option<&Path>) -> Result<ClusterConfig, String> {
        let name = file.map_or_else(|| "config".to_owned(), |f| format!("config file {}", f.display()));
        let map = match serde_yaml_ng::from_str::<Value>(text).map_err(|e| format!("{name}: {e}"))? {
            Value::Null => Mapping::new(),
            Value::Mapping(m) => m,
            _ => return Err(format!("{name}: a mapping of Storm keys (`key: value` lines) is required")),
        };
        let known = known_keys();
        for key in map.keys() {
            let Some(key) = key.as_str() else {
                return Err(format!("{name}: keys must be strings, found {key:?}"));
            };
            if !known.contains(key) {
                let near: Vec<&String> =
                    known.iter().filter(|k| k.split('.').next() == key.split('.').next()).collect();
                let hint = if near.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (known keys like it: {})",
                        near.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
                    )
                };
                return Err(format!("{name}: unknown key {key:?}{hint}"));
            }
        }
        // An empty token would run nimbus without authentication (or leave a client without
        // its token) although a token was meant: `key:`, `key: ~`, `key: ""`, `-c key=`.
        if let Some(token) = map.get(NIMBUS_TOKEN)
            && (token.is_null() || token.as_str().is_some_and(str::is_empty))
        {
            return Err(format!(
                "{name}: {NIMBUS_TOKEN} is empty; set a token, or remove the key to run without one"
            ));
        }
        Ok(ClusterConfig { file: file.map(Path::to_owned), map })
    }

    /// Applies a `KEY=VALUE` override (Storm's `-c key=value`; the value is YAML, so
    /// `supervisor.slots.ports=[6700,6701]` works), checked like a key of the file.
    pub fn set(&mut self, assignment: &str) -> Result<(), String> {
        let shown = shown(assignment);
        let (key, value) =
            assignment.split_once('=').ok_or_else(|| format!("-c {shown:?}: KEY=VALUE is expected"))?;
        let value: Value = serde_yaml_ng::from_str(value).map_err(|e| {
            // YAML errors quote the text they stopped at.
            let e = if is_secret(key) {
                "its value is not shown, it is a secret".to_owned()
            } else {
                e.to_string()
            };
            format!("-c {shown:?}: the value is not YAML: {e}")
        })?;
        let mut one = Mapping::new();
        one.insert(Value::String(key.to_owned()), value.clone());
        let text = serde_yaml_ng::to_string(&one).map_err(|e| format!("-c {shown:?}: {e}"))?;
        Self::parse(&text, None).map_err(|e| format!("-c {shown:?}: {e}"))?;
        self.map.insert(Value::String(key.to_owned()), value);
        Ok(())
    }

    fn name(&self) -> String {
        self.file.as_ref().map_or_else(|| "config".to_owned(), |f| format!("config file {}", f.display()))
    }

    /// The keys of `T`, deserialized (defaults for the missing ones).
    fn section<T: Serialize + DeserializeOwned + Default>(&self) -> Result<T, String> {
        let keys = keys_of::<T>();
        let sub: Mapping = self
            .map
            .iter()
            .filter(|(k, _)| k.as_str().is_some_and(|k| keys.contains(k)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        serde_yaml_ng::from_value(Value::Mapping(sub.clone())).map_err(|e| {
            // A value's error does not carry its key: find the key by trying them one at a time.
            let culprit = sub.iter().find_map(|(k, v)| {
                let one: Mapping = [(k.clone(), v.clone())].into_iter().collect();
                let err = serde_yaml_ng::from_value::<T>(Value::Mapping(one)).err()?;
                let key = k.as_str().unwrap_or("?");
                // serde's type errors quote the value: never a secret's.
                if is_secret(key) {
                    return Some(format!("{key}: must be a string (the value is not shown, it is a secret)"));
                }
                Some(format!("{key}: {err}"))
            });
            format!("{}: {}", self.name(), culprit.unwrap_or_else(|| e.to_string()))
        })
    }

    pub fn nimbus(&self) -> Result<nimbus::NimbusConfig, String> {
        self.section()
    }

    pub fn supervisor(&self) -> Result<supervisor::daemon::SupervisorConfig, String> {
        self.section()
    }

    fn string(&self, key: &str) -> Result<Option<String>, String> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("{}: {key} must be a string", self.name())),
        }
    }

    /// The ZooKeeper connect string from `storm.zookeeper.servers` and `storm.zookeeper.port`
    /// (Storm's default port 2181), if the servers are set.
    pub fn zookeeper(&self) -> Result<Option<String>, String> {
        let bad = || format!("{}: {ZOOKEEPER_SERVERS} must be a list of host names", self.name());
        let servers: Vec<String> = match self.map.get(ZOOKEEPER_SERVERS) {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Sequence(list)) => list
                .iter()
                .map(|v| v.as_str().map(str::to_owned).ok_or_else(bad))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(bad()),
        };
        if servers.is_empty() || servers.iter().any(|s| s.is_empty() || s.contains([',', '/', ' '])) {
            return Err(bad());
        }
        let port = match self.map.get(ZOOKEEPER_PORT) {
            None | Some(Value::Null) => 2181,
            Some(v) => v
                .as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("{}: {ZOOKEEPER_PORT} must be a port number", self.name()))?,
        };
        Ok(Some(servers.iter().map(|s| format!("{s}:{port}")).collect::<Vec<_>>().join(",")))
    }

    /// The ZooKeeper credentials: `storm.zookeeper.auth.scheme` (default `digest`) and
    /// `storm.zookeeper.auth.payload` (`user:password`), else the environment's
    /// `SQUALL_ZOOKEEPER_AUTH` (`digest:user:password`), else none. Errors name the key, never the
    /// payload.
    pub fn zookeeper_auth(&self) -> Result<Option<ZkAuth>, String> {
        let scheme = self.string(ZOOKEEPER_AUTH_SCHEME)?;
        let payload = match self.map.get(ZOOKEEPER_AUTH_PAYLOAD) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                return Err(format!(
                    "{}: {ZOOKEEPER_AUTH_PAYLOAD} must be a string (the value is not shown, it is a secret)",
                    self.name()
                ));
            }
        };
        match (scheme, payload) {
            (None, None) => ZkAuth::from_env(),
            (Some(_), None) => Err(format!(
                "{}: {ZOOKEEPER_AUTH_SCHEME} is set but {ZOOKEEPER_AUTH_PAYLOAD} is not",
                self.name()
            )),
            (scheme, Some(payload)) => {
                let scheme = scheme.unwrap_or_else(|| "digest".to_owned());
                ZkAuth::new(&scheme, &payload).map(Some).map_err(|e| {
                    let key = if scheme == "digest" { ZOOKEEPER_AUTH_PAYLOAD } else { ZOOKEEPER_AUTH_SCHEME };
                    format!("{}: {key}: {e}", self.name())
                })
            }
        }
    }

    /// The coordination ensemble at `connect`, with the credentials and the ACL policy for
    /// nodes under `storm_root`. Without credentials, says once that ZooKeeper is open.
    pub fn ensemble(&self, connect: String, storm_root: &str) -> Result<Ensemble, String> {
        let auth = self.zookeeper_auth()?;
        if auth.is_none() {
            tracing::warn!(
                "no ZooKeeper credentials ({ZOOKEEPER_AUTH_PAYLOAD}): every node Squall creates is readable \
                 and writable by anyone who reaches ZooKeeper (SECURITY.md)"
            );
        }
        Ok(Ensemble::zookeeper(connect).with_security(Security::new(auth, storm_root)))
    }

    /// Where clients and supervisors reach nimbus (`nimbus.http.address`).
    pub fn nimbus_address(&self) -> Result<String, String> {
        Ok(self
            .string(NIMBUS_ADDRESS)?
            .unwrap_or_else(|| supervisor::daemon::SupervisorConfig::default().nimbus_address))
    }

    /// Every nimbus clients may call: `nimbus.seeds` (Storm's list of `host:port`), else
    /// `nimbus.http.address`.
    pub fn nimbus_seeds(&self) -> Result<Vec<String>, String> {
        let seeds = self.nimbus()?.seeds;
        if seeds.is_empty() {
            return Ok(vec![self.nimbus_address()?]);
        }
        if let Some(bad) = seeds.iter().find(|s| nimbus::daemon::parse_host_port(s).is_none()) {
            return Err(format!("{}: nimbus.seeds: {bad:?} is not host:port", self.name()));
        }
        Ok(seeds)
    }

    /// The token for mutating calls (`nimbus.http.token`).
    pub fn nimbus_token(&self) -> Result<Option<String>, String> {
        self.string(NIMBUS_TOKEN)
    }

    /// TLS towards nimbus (`nimbus.http.tls.ca`, `.client.cert`, `.client.key`), read from its
    /// files; `None`: plain HTTP.
    pub fn nimbus_tls(&self) -> Result<Option<cluster_state::tls::ClientTls>, String> {
        use cluster_state::tls;
        let path = |key| self.string(key).map(|v| v.map(PathBuf::from));
        let (ca, cert, key) =
            (path(tls::NIMBUS_CA)?, path(tls::NIMBUS_CLIENT_CERT)?, path(tls::NIMBUS_CLIENT_KEY)?);
        tls::nimbus_client(ca.as_deref(), cert.as_deref(), key.as_deref())
            .map_err(|e| format!("{}: {e}", self.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_file_feeds_every_process() {
        let config = ClusterConfig::parse(
            "storm.zookeeper.servers: [zk1, zk2]\nstorm.zookeeper.port: 2182\nstorm.local.dir: /var/squall\n\
             nimbus.task.timeout.secs: 10\nsupervisor.slots.ports: [6700]\nnimbus.http.address: n:8080\n",
            None,
        )
        .unwrap();
        assert_eq!(config.zookeeper().unwrap().as_deref(), Some("zk1:2182,zk2:2182"));
        let nimbus = config.nimbus().unwrap();
        assert_eq!((nimbus.task_timeout_secs, nimbus.local_dir.to_str()), (10, Some("/var/squall")));
        let supervisor = config.supervisor().unwrap();
        assert_eq!(
            (supervisor.slots_ports, supervisor.local_dir.to_str()),
            (vec![6700], Some("/var/squall"))
        );
        assert_eq!(config.nimbus_address().unwrap(), "n:8080");
        assert_eq!(ClusterConfig::parse("", None).unwrap().zookeeper().unwrap(), None);
    }

    #[test]
    fn zookeeper_credentials_are_checked_and_never_echoed() {
        let config = ClusterConfig::parse("storm.zookeeper.auth.payload: \"squall:pw-77\"\n", None).unwrap();
        let auth = config.zookeeper_auth().unwrap().unwrap();
        assert_eq!((auth.scheme(), auth.user()), ("digest", "squall"));
        for (text, key) in [
            (
                "storm.zookeeper.auth.scheme: sasl\nstorm.zookeeper.auth.payload: u:pw-77\n",
                "storm.zookeeper.auth.scheme",
            ),
            ("storm.zookeeper.auth.payload: pw-77\n", "storm.zookeeper.auth.payload"),
            ("storm.zookeeper.auth.payload: [pw-77]\n", "storm.zookeeper.auth.payload"),
            ("storm.zookeeper.auth.scheme: digest\n", "storm.zookeeper.auth.payload"),
        ] {
            let err = ClusterConfig::parse(text, None).unwrap().zookeeper_auth().unwrap_err();
            assert!(err.contains(key) && !err.contains("pw-77"), "{text}: {err}");
        }
        let mut config = ClusterConfig::default();
        let err = config.set("storm.zookeeper.auth.payload=[pw-77").unwrap_err();
        assert!(!err.contains("pw-77"), "{err}");
    }

    #[test]
    fn bad_files_name_the_key() {
        let cases = [
            ("nimbus.monitor.freq: 2", "unknown key \"nimbus.monitor.freq\" (known keys like it: nimbus."),
            ("topology.workers: 2", "unknown key \"topology.workers\""),
            ("- a\n- b", "a mapping of Storm keys"),
            ("storm.zookeeper.servers: zk1", "storm.zookeeper.servers must be a list"),
            (
                "storm.zookeeper.servers: [zk1]\nstorm.zookeeper.port: 0",
                "storm.zookeeper.port must be a port",
            ),
        ];
        for (text, expected) in cases {
            let err = ClusterConfig::parse(text, Some(Path::new("c.yaml")))
                .and_then(|c| c.zookeeper().map(|_| ()))
                .unwrap_err();
            assert!(err.contains(expected) && err.contains("c.yaml"), "{text}: {err}");
        }
        let mut config = ClusterConfig::parse("supervisor.slots.ports: [1]", None).unwrap();
        config.set("supervisor.slots.ports=[6700, 6701]").unwrap();
        assert_eq!(config.supervisor().unwrap().slots_ports, vec![6700, 6701]);
        assert!(config.set("supervisor.slot.ports=[1]").unwrap_err().contains("unknown key"));
        assert!(config.set("nimbus.task.timeout.secs").unwrap_err().contains("KEY=VALUE"));
        let typed = ClusterConfig::parse("supervisor.slots.ports: many", None).unwrap();
        let err = typed.supervisor().unwrap_err();
        assert!(err.contains("supervisor.slots.ports"), "{err}");
    }
}
