//! Nimbus's HTTP/JSON API as a wire format: the one process boundary that is not ZooKeeper.
//!
//! The API is shaped like Storm's UI REST API (`/api/v1/...`, camelCase keys), so scripts
//! written for Storm work; nimbus serves it, `squall`'s operator verbs and supervisors (code
//! download) call it through the `nimbus-client` crate. Everything both ends agree on is here:
//!
//! - [`routes`]: [`Route`], every resource with its method; `Route::path` builds a request's
//!   path and `Route::parse` reads it back, under [`API_PREFIX`] (the only place `/api/v1` is
//!   spelled; tests build invalid paths from it, and `cluster-state/tests/api_paths.rs` checks
//!   that no other crate spells it).
//! - [`bodies`]: the request bodies (unknown fields refused where no Storm client sends extra
//!   ones) and response bodies (unknown fields ignored, so a field can be added without breaking
//!   older clients), with Storm UI's key names.
//! - [`LogRoute`]: the supervisors' log viewer (a worker's log by topology id, port and
//!   [`crate::worker_logs::LogFile`]), served beside their `/metrics`.
//! - [`UploadId`]: the server-made id of a chunked upload.
//! - [`decode_request`] / [`decode_response`]: JSON decoding whose errors name the field at
//!   fault (`executors.split: invalid type: ...`).
//! - [`CHECKSUM_HEADER`]: the SHA-256 of a downloaded code file.
//!
//! Errors are [`ErrorBody`] with a 4xx for anything the client got wrong, a 5xx only when nimbus
//! or ZooKeeper failed. Golden tests: `cluster-state/tests/api_formats.rs`.

pub mod bodies;
pub mod routes;

use std::fmt;
use std::str::FromStr;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::ids::IdError;

pub use bodies::*;
pub use routes::{
    DEFAULT_TAIL_LINES, InvalidSegment, LogRead, LogRoute, MAX_READ_BYTES, MAX_TAIL_LINES, Route, RouteError,
    ui_templates, window_from_query,
};

/// The root of every route's path (Storm UI's). Clients build valid paths with [`Route::path`];
/// this is exported for tests that must send paths no `Route` can make (`{API_PREFIX}/topology/..`).
pub const API_PREFIX: &str = "/api/v1";

/// The header carrying a code file's SHA-256 (lowercase hex) on download.
pub const CHECKSUM_HEADER: &str = "x-checksum-sha256";

/// The server-generated id of an upload: a UUID, shown hyphenated and lowercase. Clients name
/// nothing on nimbus's disk but these, so only the canonical form is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct UploadId(Uuid);

impl UploadId {
    /// A fresh random id (nimbus makes one per upload).
    pub fn generate() -> Self {
        UploadId(Uuid::new_v4())
    }
}

impl fmt::Display for UploadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.hyphenated())
    }
}

impl FromStr for UploadId {
    type Err = IdError;
    /// Only the hyphenated form (any case) is accepted.
    fn from_str(s: &str) -> Result<Self, IdError> {
        let bad = || IdError {
            kind: "upload id",
            value: s.chars().take(80).collect(),
            rule: "must be a UUID such as 123e4567-e89b-42d3-a456-426614174000",
        };
        if s.len() != 36 {
            return Err(bad());
        }
        Uuid::try_parse(s).map(UploadId).map_err(|_| bad())
    }
}

impl TryFrom<String> for UploadId {
    type Error = IdError;
    fn try_from(s: String) -> Result<Self, IdError> {
        s.parse()
    }
}

impl From<UploadId> for String {
    fn from(id: UploadId) -> String {
        id.to_string()
    }
}

/// A JSON body that does not decode, naming the field at fault.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("a JSON object is required")]
    NotAnObject,
    #[error("not JSON: {0}")]
    NotJson(serde_json::Error),
    /// `field` is the path to the offending value (`executors.split`), `None` at the top level
    /// (a missing field names itself in `source`).
    #[error("{}{source}", field.as_ref().map(|f| format!("field {f:?}: ")).unwrap_or_default())]
    Invalid { field: Option<String>, source: serde_json::Error },
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BodyError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let source = e.into_inner();
        if source.is_syntax() || source.is_eof() || source.is_io() {
            BodyError::NotJson(source)
        } else {
            BodyError::Invalid { field: (path != ".").then_some(path), source }
        }
    })?;
    // Trailing bytes after the value are not JSON either.
    de.end().map_err(BodyError::NotJson)?;
    Ok(value)
}

/// Decodes a request body, which is always a JSON object (serde would also take a struct as
/// an array of its fields; the API never does).
pub fn decode_request<T: DeserializeOwned>(body: &[u8]) -> Result<T, BodyError> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
        return decode(body);
    }
    match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
        Ok(_) => Err(BodyError::NotAnObject),
        Err(e) => Err(BodyError::NotJson(e)),
    }
}

/// Decodes a response body.
pub fn decode_response<T: DeserializeOwned>(body: &[u8]) -> Result<T, BodyError> {
    decode(body)
}
