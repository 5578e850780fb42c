//! A topology's runtime log levels (Storm's `set_log_level`), at
//! `/storm/logconfigs/<topology-id>` (persistent, written by the leader nimbus, read and watched
//! by the topology's workers; removed with the topology).
//!
//! ```json
//! {"version":1,"named_logger_level":{"worker::builtin":{"target_log_level":"DEBUG",
//!  "reset_log_level_timeout_epoch_ms":1700000030000},"ROOT":{"target_log_level":"WARN"}}}
//! ```
//! (one line in the znode). Storm's names: a logger's level holds until the epoch (nimbus's
//! clock at the request plus the timeout; workers compare it with theirs), for ever without
//! one. `ROOT` is the default level; any other name is a `tracing` target (a module path such
//! as `kafka_spout::spout`), which covers its submodules.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{DecodeError, JsonObject, ZnodeData, decode_json};

/// A level, in Storm's (log4j's) upper-case names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
    Off,
}

impl LogLevel {
    /// As Storm writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLevel::Trace => "TRACE",
            LogLevel::Debug => "DEBUG",
            LogLevel::Info => "INFO",
            LogLevel::Warn => "WARN",
            LogLevel::Error => "ERROR",
            LogLevel::Off => "OFF",
        }
    }
}

impl fmt::Display for LogLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LogLevel {
    type Err = String;
    /// Any case.
    fn from_str(s: &str) -> Result<Self, String> {
        [LogLevel::Trace, LogLevel::Debug, LogLevel::Info, LogLevel::Warn, LogLevel::Error, LogLevel::Off]
            .into_iter()
            .find(|l| l.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!(
                    "log level {:?}: one of TRACE, DEBUG, INFO, WARN, ERROR, OFF",
                    s.chars().take(40).collect::<String>()
                )
            })
    }
}

/// A logger: `ROOT` (the default level) or a `tracing` target, 1 to 200 ASCII letters, digits,
/// `_` and `:` (module paths; nothing that could end a filter directive).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LoggerName(String);

impl LoggerName {
    /// Storm's name of the default logger.
    pub const ROOT: &'static str = "ROOT";

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LoggerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for LoggerName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let ok = !s.is_empty()
            && s.len() <= 200
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':');
        if ok {
            Ok(LoggerName(s.to_owned()))
        } else {
            Err(format!(
                "logger {:?}: ROOT or a module path (1 to 200 ASCII letters, digits, '_' and ':')",
                s.chars().take(80).collect::<String>()
            ))
        }
    }
}

impl TryFrom<String> for LoggerName {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<LoggerName> for String {
    fn from(name: LoggerName) -> String {
        name.0
    }
}

/// One logger's level and when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggerLevel {
    pub target_log_level: LogLevel,
    /// Milliseconds since the epoch after which the level no longer applies; `None`: for ever.
    #[serde(default)]
    pub reset_log_level_timeout_epoch_ms: Option<u64>,
}

/// The log levels set on a topology.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct LogConfig {
    pub named_logger_level: BTreeMap<LoggerName, LoggerLevel>,
}

impl LogConfig {
    /// The `tracing` filter directives in force at `now_ms` (`debug` for ROOT,
    /// `target=debug` for the others) and the next moment one of them ends, when the filter
    /// must be rebuilt.
    pub fn directives(&self, now_ms: u64) -> (Vec<String>, Option<u64>) {
        let mut directives = Vec::new();
        let mut next_reset: Option<u64> = None;
        for (name, level) in &self.named_logger_level {
            if let Some(reset) = level.reset_log_level_timeout_epoch_ms {
                if reset <= now_ms {
                    continue;
                }
                next_reset = Some(next_reset.map_or(reset, |n| n.min(reset)));
            }
            let value = level.target_log_level.as_str().to_ascii_lowercase();
            if name.as_str() == LoggerName::ROOT {
                directives.insert(0, value);
            } else {
                directives.push(format!("{name}={value}"));
            }
        }
        (directives, next_reset)
    }

    /// Drops the levels that ended before `now_ms`.
    pub fn without_expired(mut self, now_ms: u64) -> Self {
        self.named_logger_level.retain(|_, l| l.reset_log_level_timeout_epoch_ms.is_none_or(|r| r > now_ms));
        self
    }
}

impl ZnodeData for LogConfig {
    const FORMAT: &'static str = "log-config v1 JSON";

    fn encode(&self) -> Vec<u8> {
        let loggers = self.named_logger_level.iter().fold(JsonObject::new(), |object, (name, level)| {
            let mut entry = JsonObject::new().field("target_log_level", level.target_log_level.as_str());
            if let Some(reset) = level.reset_log_level_timeout_epoch_ms {
                entry = entry.field("reset_log_level_timeout_epoch_ms", reset);
            }
            object.raw(name.as_str(), &entry.finish())
        });
        JsonObject::versioned(1).raw("named_logger_level", &loggers.finish()).finish().into_bytes()
    }

    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError> {
        decode_json::<Self>(path, bytes, 1..=1).map(|(_, config)| config)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_format_is_storms_and_round_trips() {
        let mut config = LogConfig::default();
        config.named_logger_level.insert(
            "worker::builtin".parse().unwrap(),
            LoggerLevel {
                target_log_level: LogLevel::Debug,
                reset_log_level_timeout_epoch_ms: Some(1_700_000_030_000),
            },
        );
        config.named_logger_level.insert(
            "ROOT".parse().unwrap(),
            LoggerLevel { target_log_level: LogLevel::Warn, reset_log_level_timeout_epoch_ms: None },
        );
        let bytes = config.encode();
        assert_eq!(
            String::from_utf8(bytes.clone()).unwrap(),
            r#"{"version":1,"named_logger_level":{"ROOT":{"target_log_level":"WARN"},"worker::builtin":{"target_log_level":"DEBUG","reset_log_level_timeout_epoch_ms":1700000030000}}}"#
        );
        assert_eq!(LogConfig::decode("/p", &bytes).unwrap(), config);
        let (directives, next) = config.directives(1_700_000_000_000);
        assert_eq!(directives, ["warn", "worker::builtin=debug"]);
        assert_eq!(next, Some(1_700_000_030_000));
        let (directives, next) = config.directives(1_700_000_030_000);
        assert_eq!((directives, next), (vec!["warn".to_owned()], None));
        assert_eq!(config.clone().without_expired(1_700_000_030_000).named_logger_level.len(), 1);
        for bad in [
            &b"{\"version\":1,\"named_logger_level\":{\"a=b\":{\"target_log_level\":\"DEBUG\"}}}"[..],
            b"{\"version\":1,\"named_logger_level\":{\"a\":{\"target_log_level\":\"LOUD\"}}}",
            b"garbage",
        ] {
            assert!(
                LogConfig::decode("/storm/logconfigs/x", bad)
                    .unwrap_err()
                    .to_string()
                    .contains("/storm/logconfigs/x")
            );
        }
        assert!("x,y".parse::<LoggerName>().is_err());
        assert_eq!("debug".parse::<LogLevel>(), Ok(LogLevel::Debug));
    }
}
