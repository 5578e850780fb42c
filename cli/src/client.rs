//! A small client of nimbus's HTTP/JSON API, for the operator verbs (`submit`, `list`, `kill`,
//! ...). Errors say what to do next: nimbus unreachable names the address and the key that
//! sets it; a refusal quotes nimbus's `errorMessage` with the status.

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Upload chunk size: well under nimbus's per-chunk limit (8 MiB).
const CHUNK_BYTES: usize = 4 * 1024 * 1024;
/// Bound on one request (a chunk of a worker binary included).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// nimbus's API at `address` (`host:port`), with the token for mutating calls.
#[derive(Debug, Clone)]
pub struct NimbusClient {
    pub address: String,
    pub token: Option<String>,
}

/// A failed call, worded for the operator.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(
        "cannot reach nimbus at {address}: {reason} (is `squall nimbus` running there? set nimbus.http.address in the config file or pass --nimbus)"
    )]
    Unreachable { address: String, reason: String },
    #[error("nimbus refused {what}: {message} (HTTP {status})")]
    Refused { what: String, status: StatusCode, message: String },
    #[error("nimbus sent an answer that is not JSON for {what}: {reason}")]
    BadAnswer { what: String, reason: String },
}

impl NimbusClient {
    pub fn new(address: impl Into<String>, token: Option<String>) -> Self {
        NimbusClient { address: address.into(), token }
    }

    /// `GET path` -> JSON.
    pub async fn get(&self, path: &str) -> Result<Value, ClientError> {
        self.call(Method::GET, path, Bytes::new(), None).await
    }

    /// `POST path` with a JSON body -> JSON.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        let bytes = Bytes::from(body.to_string());
        self.call(Method::POST, path, bytes, Some("application/json")).await
    }

    /// Uploads `bytes` in chunks (begin / chunks / finish with the SHA-256); returns the upload
    /// id. `progress` gets the bytes sent so far after each chunk.
    pub async fn upload(&self, bytes: &[u8], mut progress: impl FnMut(u64)) -> Result<String, ClientError> {
        let begun = self.post("/api/v1/uploads", &json!({"size": bytes.len()})).await?;
        let id = begun["uploadId"]
            .as_str()
            .ok_or_else(|| ClientError::BadAnswer { what: "an upload".into(), reason: "no uploadId".into() })?
            .to_owned();
        let mut offset = 0usize;
        for chunk in bytes.chunks(CHUNK_BYTES) {
            let path = format!("/api/v1/uploads/{id}/chunks/{offset}");
            self.call(Method::POST, &path, Bytes::copy_from_slice(chunk), Some("application/octet-stream"))
                .await?;
            offset += chunk.len();
            progress(offset as u64);
        }
        let sha256 = hex::encode(Sha256::digest(bytes));
        self.post(&format!("/api/v1/uploads/{id}/finish"), &json!({"sha256": sha256})).await?;
        Ok(id)
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        content_type: Option<&'static str>,
    ) -> Result<Value, ClientError> {
        let what = format!("{method} {path}");
        let exchange = async {
            let unreachable =
                |reason: String| ClientError::Unreachable { address: self.address.clone(), reason };
            let stream = tokio::net::TcpStream::connect(&self.address)
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            tokio::spawn(connection);
            let mut request = Request::builder()
                .method(method)
                .uri(path)
                .header(header::HOST, self.address.as_str())
                .body(Full::new(body))
                .map_err(|e| unreachable(format!("bad request: {e}")))?;
            if let Some(kind) = content_type {
                request.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
            }
            if let Some(token) = &self.token
                && let Ok(value) = HeaderValue::from_str(&format!("Bearer {token}"))
            {
                request.headers_mut().insert(header::AUTHORIZATION, value);
            }
            let response = sender.send_request(request).await.map_err(|e| unreachable(e.to_string()))?;
            let status = response.status();
            let bytes =
                response.into_body().collect().await.map_err(|e| unreachable(e.to_string()))?.to_bytes();
            Ok::<_, ClientError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(REQUEST_TIMEOUT, exchange).await.map_err(|_| {
            ClientError::Unreachable {
                address: self.address.clone(),
                reason: format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()),
            }
        })??;
        let value: Result<Value, _> = serde_json::from_slice(&bytes);
        if !status.is_success() {
            let message = match &value {
                Ok(v) => v["errorMessage"].as_str().map(str::to_owned),
                Err(_) => None,
            }
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(300).collect());
            return Err(ClientError::Refused { what, status, message });
        }
        value.map_err(|e| ClientError::BadAnswer { what, reason: e.to_string() })
    }
}
