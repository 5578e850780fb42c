//! The payload stored at each znode, one type per path of [`crate::paths`].
//!
//! A znode is a wire format read by other processes, other Squall versions and, for Kafka's
//! registry, Kafka's own tools. Every type implements [`ZnodeData`]: `encode` is infallible
//! and deterministic (golden-tested byte for byte); `decode` never panics and turns garbage
//! (empty, non-UTF-8, truncated, wrong types, unsupported version) into a [`DecodeError`]
//! that names the path, the expected format and what is wrong.
//!
//! - [`storm`]: Squall's own JSON formats for Storm's layout. Each payload is an object whose
//!   first key is `"version"`. The version decides the format: a reader rejects versions it
//!   does not know, and *ignores unknown fields* within a version it knows, so a newer writer
//!   may add an optional field without breaking older readers (a change older readers must
//!   not ignore takes a new version number). Optional fields are written as `null`.
//! - [`kafka`]: Kafka 0.8's formats, byte-compatible: JSON for consumer, broker and topic
//!   registrations, plain text for owners and offsets. Decoding accepts any key order and
//!   whitespace, and ignores fields later Kafka versions add.
//!
//! Encoding writes JSON text directly (`JsonObject`) rather than through
//! `serde_json::to_vec`: that keeps keys in the documented order (serde_json's `Value` sorts
//! them) and leaves no fallible call on the encode path. Decoding uses serde.

pub mod kafka;
pub mod log_config;
pub mod storm;

use std::fmt;
use std::ops::RangeInclusive;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use kafka::{
    BrokerRegistration, ConsumerRegistration, OffsetData, OffsetSnapshot, OwnerData, SubscriptionPattern,
    TopicRegistration,
};
pub use log_config::{LogConfig, LogLevel, LoggerLevel, LoggerName};
pub use storm::{
    Assignment, DelayedTransition, ErrorInfo, ExecutorAssignment, ExecutorStats, LocalWorkerHeartbeat,
    MetricsScheme, NimbusSummary, NodeAssignments, StormBase, SupervisorInfo, TopologyStatus,
    WorkerHeartbeat, WorkerbeatThrottle, two_digits,
};

/// A type stored as a znode's data.
pub trait ZnodeData: Sized {
    /// Name of the wire format, used in error messages, e.g. `"storm-base v1 JSON"`.
    const FORMAT: &'static str;

    /// The bytes to store. Deterministic: equal values give equal bytes.
    fn encode(&self) -> Vec<u8>;

    /// Parses the data read from `path` (used only in the error).
    fn decode(path: &str, bytes: &[u8]) -> Result<Self, DecodeError>;
}

/// Data at a znode that is not a valid payload of the expected format.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("znode {path}: not a valid {format} payload: {reason}")]
pub struct DecodeError {
    /// The znode's path.
    pub path: String,
    /// The expected format ([`ZnodeData::FORMAT`]).
    pub format: &'static str,
    /// What is wrong with the data.
    pub reason: String,
}

impl DecodeError {
    /// An error for data at `path` that is not valid `T`.
    pub fn new<T: ZnodeData>(path: &str, reason: impl fmt::Display) -> Self {
        Self { path: path.to_owned(), format: T::FORMAT, reason: reason.to_string() }
    }
}

/// The payload as text: rejects empty and non-UTF-8 data.
fn text<'a, T: ZnodeData>(path: &str, bytes: &'a [u8]) -> Result<&'a str, DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::new::<T>(path, "empty payload"));
    }
    std::str::from_utf8(bytes).map_err(|e| DecodeError::new::<T>(path, format_args!("not UTF-8: {e}")))
}

/// Just the `version` key of a versioned JSON object.
#[derive(Deserialize)]
#[serde(expecting = "a JSON object with a \"version\" field")]
struct VersionProbe {
    version: u64,
}

/// Decodes a versioned JSON payload after checking its version is in `versions`; returns the
/// version read with the value.
fn decode_json<T: ZnodeData + DeserializeOwned>(
    path: &str,
    bytes: &[u8],
    versions: RangeInclusive<u64>,
) -> Result<(u64, T), DecodeError> {
    let text = text::<T>(path, bytes)?;
    let err = |reason: &dyn fmt::Display| DecodeError::new::<T>(path, reason);
    let VersionProbe { version } = serde_json::from_str(text).map_err(|e| err(&e))?;
    if !versions.contains(&version) {
        let (lo, hi) = (versions.start(), versions.end());
        let supported = if lo == hi { format!("version {lo}") } else { format!("versions {lo}-{hi}") };
        return Err(err(&format_args!("unsupported version {version} (this build reads {supported})")));
    }
    let value = serde_json::from_str(text).map_err(|e| err(&e))?;
    Ok((version, value))
}

/// Compact JSON object text whose keys keep the order they are written in.
#[derive(Debug)]
struct JsonObject {
    buf: String,
}

impl JsonObject {
    fn new() -> Self {
        Self { buf: String::from("{") }
    }

    /// An object that starts with `"version":<version>`.
    fn versioned(version: u64) -> Self {
        Self::new().field("version", version)
    }

    /// Appends `key` with a scalar, array or `null` value.
    fn field(self, key: &str, value: impl Into<Value>) -> Self {
        self.raw(key, &value.into().to_string())
    }

    /// Appends `key` with a value that is already JSON text.
    fn raw(mut self, key: &str, json: &str) -> Self {
        if self.buf.len() > 1 {
            self.buf.push(',');
        }
        self.buf.push_str(&Value::from(key).to_string());
        self.buf.push(':');
        self.buf.push_str(json);
        self
    }

    /// An object of `entries` in iteration order.
    fn map<K: fmt::Display, V: Into<Value>>(entries: impl IntoIterator<Item = (K, V)>) -> String {
        entries.into_iter().fold(Self::new(), |obj, (k, v)| obj.field(&k.to_string(), v)).finish()
    }

    fn finish(mut self) -> String {
        self.buf.push('}');
        self.buf
    }
}

/// A JSON array of items that are already JSON text.
fn json_array(items: impl IntoIterator<Item = String>) -> String {
    format!("[{}]", items.into_iter().collect::<Vec<_>>().join(","))
}
