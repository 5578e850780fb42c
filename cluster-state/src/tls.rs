//! TLS for Squall's HTTP (nimbus's API, supervisors' and workers' `/metrics`) with rustls: a server's
//! certificate and key, optionally a client CA (mutual TLS: a client without a certificate
//! that chains to it is refused in the handshake), and a client's CA to verify the server
//! with, optionally its own certificate and key.
//!
//! Every file is named by its config key ([`TlsFile`]) so a bad one is an error naming both
//! the key and the path. PEM only. The crypto provider is `ring`, passed explicitly, so no
//! process-wide default provider is needed.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::TcpStream;

pub use tokio_rustls::TlsAcceptor;
pub use tokio_rustls::client::TlsStream as ClientStream;

/// The keys of a client of nimbus's API (the CLI, supervisors, nimbus copying code from
/// another nimbus): the CA nimbus's certificate must chain to, and the client's own
/// certificate and key for a nimbus that requires one.
pub const NIMBUS_CA: &str = "nimbus.http.tls.ca";
pub const NIMBUS_CLIENT_CERT: &str = "nimbus.http.tls.client.cert";
pub const NIMBUS_CLIENT_KEY: &str = "nimbus.http.tls.client.key";
/// The keys of nimbus's API as a server.
pub const NIMBUS_CERT: &str = "nimbus.http.tls.cert";
pub const NIMBUS_KEY: &str = "nimbus.http.tls.key";
pub const NIMBUS_CLIENT_CA: &str = "nimbus.http.tls.client.ca";

/// The keys of a supervisor's `/metrics` as a server.
pub const SUPERVISOR_METRICS_CERT: &str = "supervisor.metrics.tls.cert";
pub const SUPERVISOR_METRICS_KEY: &str = "supervisor.metrics.tls.key";
pub const SUPERVISOR_METRICS_CLIENT_CA: &str = "supervisor.metrics.tls.client.ca";
/// The keys of workers' `/metrics` (the supervisor passes them on in the worker's launch).
pub const WORKER_METRICS_CERT: &str = "worker.metrics.tls.cert";
pub const WORKER_METRICS_KEY: &str = "worker.metrics.tls.key";
pub const WORKER_METRICS_CLIENT_CA: &str = "worker.metrics.tls.client.ca";

/// A server's TLS from its three settings under `keys` (cert, key, client CA); `None`: plain.
pub fn server(
    keys: [&'static str; 3],
    cert: Option<&Path>,
    key: Option<&Path>,
    client_ca: Option<&Path>,
) -> Result<Option<ServerTls>, TlsError> {
    ServerTls::from_settings(
        TlsFile::from_setting(keys[0], cert),
        TlsFile::from_setting(keys[1], key),
        TlsFile::from_setting(keys[2], client_ca),
        keys,
    )
}

/// A client of nimbus's API from its three settings (`None`: plain HTTP).
pub fn nimbus_client(
    ca: Option<&Path>,
    cert: Option<&Path>,
    key: Option<&Path>,
) -> Result<Option<ClientTls>, TlsError> {
    ClientTls::from_settings(
        TlsFile::from_setting(NIMBUS_CA, ca),
        TlsFile::from_setting(NIMBUS_CLIENT_CERT, cert),
        TlsFile::from_setting(NIMBUS_CLIENT_KEY, key),
        [NIMBUS_CA, NIMBUS_CLIENT_CERT, NIMBUS_CLIENT_KEY],
    )
}

/// A file a config key names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFile {
    /// The config key, e.g. `nimbus.http.tls.cert`.
    pub key: &'static str,
    pub path: PathBuf,
}

impl TlsFile {
    pub fn new(key: &'static str, path: impl Into<PathBuf>) -> Self {
        TlsFile { key, path: path.into() }
    }

    /// `Some` when the key is set.
    pub fn from_setting(key: &'static str, path: Option<&Path>) -> Option<Self> {
        path.map(|p| TlsFile::new(key, p))
    }

    fn read(&self) -> Result<Vec<u8>, TlsError> {
        std::fs::read(&self.path).map_err(|source| TlsError::Unreadable {
            key: self.key,
            path: self.path.clone(),
            source,
        })
    }

    fn invalid(&self, reason: impl Into<String>) -> TlsError {
        TlsError::Invalid { key: self.key, path: self.path.clone(), reason: reason.into() }
    }

    fn certificates(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let pem = self.read()?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.invalid(format!("not PEM certificates: {e}")))?;
        if certs.is_empty() {
            return Err(self.invalid("holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
        }
        Ok(certs)
    }

    fn private_key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        let pem = self.read()?;
        PrivateKeyDer::from_pem_slice(&pem)
            .map_err(|e| self.invalid(format!("holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}")))
    }

    fn roots(&self) -> Result<RootCertStore, TlsError> {
        let mut roots = RootCertStore::empty();
        for cert in self.certificates()? {
            roots.add(cert).map_err(|e| self.invalid(format!("not a usable CA certificate: {e}")))?;
        }
        Ok(roots)
    }
}

/// A TLS setting that cannot be used. Not retryable: the config or the files must change.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("config key {key}: cannot read {}: {source}", path.display())]
    Unreadable { key: &'static str, path: PathBuf, source: io::Error },
    #[error("config key {key}: {}: {reason}", path.display())]
    Invalid { key: &'static str, path: PathBuf, reason: String },
    /// A key set without the one it needs (a certificate without its private key).
    #[error("config key {key} is set but {missing} is not: set both or neither")]
    Incomplete { key: &'static str, missing: &'static str },
    /// The certificate and key do not go together, or rustls refused the combination.
    #[error("config keys {keys}: {reason}")]
    Rejected { keys: String, reason: String },
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server's TLS: certificate chain, private key, and the CA clients must present a
/// certificate from (mutual TLS) when set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTls {
    pub cert: TlsFile,
    pub key: TlsFile,
    pub client_ca: Option<TlsFile>,
}

impl ServerTls {
    /// From optional settings: `None` when neither cert nor key is set (plain HTTP); an error
    /// when one is set without the other, or a client CA without them.
    pub fn from_settings(
        cert: Option<TlsFile>,
        key: Option<TlsFile>,
        client_ca: Option<TlsFile>,
        keys: [&'static str; 3],
    ) -> Result<Option<ServerTls>, TlsError> {
        match (cert, key) {
            (Some(cert), Some(key)) => Ok(Some(ServerTls { cert, key, client_ca })),
            (Some(_), None) => Err(TlsError::Incomplete { key: keys[0], missing: keys[1] }),
            (None, Some(_)) => Err(TlsError::Incomplete { key: keys[1], missing: keys[0] }),
            (None, None) if client_ca.is_some() => {
                Err(TlsError::Incomplete { key: keys[2], missing: keys[0] })
            }
            (None, None) => Ok(None),
        }
    }

    /// Reads the files and builds the acceptor (HTTP/1.1 only, as the servers speak).
    pub fn acceptor(&self) -> Result<TlsAcceptor, TlsError> {
        let chain = self.cert.certificates()?;
        let key = self.key.private_key()?;
        let builder =
            ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| TlsError::Rejected { keys: self.cert.key.to_owned(), reason: e.to_string() })?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(ca.roots()?), provider())
                    .build()
                    .map_err(|e| ca.invalid(format!("cannot verify clients with it: {e}")))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| TlsError::Rejected {
            keys: format!("{} / {}", self.cert.key, self.key.key),
            reason: format!("the certificate and key do not make a server identity: {e}"),
        })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// A client's TLS: the CA the server's certificate must chain to, and the client's own
/// certificate and key for a server that asks for one (mutual TLS).
#[derive(Clone)]
pub struct ClientTls {
    connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl ClientTls {
    /// From optional settings: `None` when no CA is set (plain HTTP); an error when a client
    /// certificate or key is set without the other, or without a CA.
    pub fn from_settings(
        ca: Option<TlsFile>,
        cert: Option<TlsFile>,
        key: Option<TlsFile>,
        keys: [&'static str; 3],
    ) -> Result<Option<ClientTls>, TlsError> {
        let Some(ca) = ca else {
            return match (cert, key) {
                (None, None) => Ok(None),
                (Some(cert), _) => Err(TlsError::Incomplete { key: cert.key, missing: keys[0] }),
                (None, Some(key)) => Err(TlsError::Incomplete { key: key.key, missing: keys[0] }),
            };
        };
        let identity = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(_), None) => return Err(TlsError::Incomplete { key: keys[1], missing: keys[2] }),
            (None, Some(_)) => return Err(TlsError::Incomplete { key: keys[2], missing: keys[1] }),
        };
        ClientTls::load(&ca, identity.as_ref().map(|(c, k)| (c, k))).map(Some)
    }

    /// Reads the files and builds the connector.
    pub fn load(ca: &TlsFile, identity: Option<(&TlsFile, &TlsFile)>) -> Result<ClientTls, TlsError> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Rejected { keys: ca.key.to_owned(), reason: e.to_string() })?
            .with_root_certificates(ca.roots()?);
        let mut config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(cert.certificates()?, key.private_key()?)
                .map_err(|e| TlsError::Rejected {
                    keys: format!("{} / {}", cert.key, key.key),
                    reason: format!("the certificate and key do not make a client identity: {e}"),
                })?,
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(ClientTls { connector: tokio_rustls::TlsConnector::from(Arc::new(config)) })
    }

    /// Runs the handshake over `tcp` to the server at `address` (`host:port`): the server's
    /// certificate must chain to the CA and name `host` (a DNS name or an IP address).
    pub async fn connect(&self, address: &str, tcp: TcpStream) -> io::Result<ClientStream<TcpStream>> {
        let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_owned()).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{host:?} is not a TLS server name: {e}"))
        })?;
        self.connector.connect(name, tcp).await
    }
}

/// The TLS failure in `error`'s chain of sources (an untrusted certificate, a server that
/// refused ours, a peer that does not speak TLS), if the error is one: a configuration problem
/// on one side, not a server that is down.
pub fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        if let Some(io) = e.downcast_ref::<io::Error>()
            && let Some(tls) = io.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            return Some(tls.to_string());
        }
        next = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_key_and_the_path() {
        let missing = TlsFile::new("nimbus.http.tls.cert", "/nonexistent/cert.pem");
        let key = TlsFile::new("nimbus.http.tls.key", "/nonexistent/key.pem");
        let error = ServerTls { cert: missing, key, client_ca: None }.acceptor().err().unwrap().to_string();
        assert!(error.contains("nimbus.http.tls.cert") && error.contains("/nonexistent/cert.pem"), "{error}");

        let dir = tempfile::tempdir().unwrap();
        let garbage = dir.path().join("ca.pem");
        std::fs::write(&garbage, "not a certificate").unwrap();
        let error =
            ClientTls::load(&TlsFile::new("nimbus.http.tls.ca", &garbage), None).err().unwrap().to_string();
        assert!(error.contains("nimbus.http.tls.ca") && error.contains("no PEM certificate"), "{error}");
    }

    #[test]
    fn half_settings_are_refused_naming_what_is_missing() {
        let keys = ["a.cert", "a.key", "a.client.ca"];
        let file = |k| Some(TlsFile::new(k, "/x"));
        assert!(ServerTls::from_settings(None, None, None, keys).unwrap().is_none());
        let error = ServerTls::from_settings(file("a.cert"), None, None, keys).unwrap_err().to_string();
        assert!(error.contains("a.cert is set but a.key is not"), "{error}");
        let error = ServerTls::from_settings(None, None, file("a.client.ca"), keys).unwrap_err().to_string();
        assert!(error.contains("a.client.ca is set but a.cert"), "{error}");

        let keys = ["c.ca", "c.client.cert", "c.client.key"];
        assert!(ClientTls::from_settings(None, None, None, keys).unwrap().is_none());
        let error =
            ClientTls::from_settings(None, file("c.client.cert"), None, keys).err().unwrap().to_string();
        assert!(error.contains("c.client.cert is set but c.ca is not"), "{error}");
        let error = ClientTls::from_settings(file("c.ca"), file("c.client.cert"), None, keys).err().unwrap();
        assert!(error.to_string().contains("c.client.cert is set but c.client.key"), "{error}");
    }
}
