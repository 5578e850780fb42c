//! TLS for the transport (`topology.transport.tls: true`): mutual TLS 1.3 in which every
//! worker of a topology presents the topology's key and accepts only peers presenting it.
//!
//! The key is an Ed25519 key derived from the topology's secret (HMAC-SHA256 of the secret
//! with a fixed label, as the seed), so it reaches exactly the processes that hold the secret,
//! through the same authenticated code download, and needs no file, no certificate authority
//! and no distribution of its own. Peers present it as an RFC 7250 raw public key (no
//! certificate: there is nothing in one that a pinned key needs), and each side checks that
//! the peer's key is the topology's, byte for byte, before the handshake signature is checked
//! against it. The HMAC handshake (`auth.rs`) then runs inside the TLS session as before: it
//! names the topology, and it makes the sender wait for the receiver's answer (under TLS 1.3
//! a client finishes its handshake before the server has judged the client's key, so without
//! it a refused sender would only notice on its next write).
//!
//! Sockets stay blocking and owned by their threads; [`PeerStream`] is the one type senders
//! and receivers read and write, plain or TLS.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Instant;

use hmac::{Hmac, KeyInit, Mac};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{AlwaysResolvesClientRawPublicKeys, Resumption};
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls13_signature_with_raw_key};
use rustls::pki_types::{CertificateDer, PrivatePkcs8KeyDer, ServerName, SubjectPublicKeyInfoDer, UnixTime};
use rustls::server::AlwaysResolvesServerRawPublicKeys;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError, ClientConfig, ClientConnection, ConnectionCommon, DigitallySignedStruct,
    DistinguishedName, ServerConfig, ServerConnection, SideData, SignatureScheme, StreamOwned,
};
use sha2::Sha256;

use super::auth::TopologySecret;
use crate::error::{Error, Result};

/// The label the topology's TLS key is derived under (a new version of the derivation takes
/// a new label).
const KEY_LABEL: &[u8] = b"squall worker transport tls ed25519 v1";
/// PKCS#8 v1 (RFC 8410) of an Ed25519 private key: this prefix, then the 32-byte seed.
const ED25519_PKCS8_PREFIX: [u8; 16] =
    [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
/// The name a sender gives in its hello; peers are recognised by key, never by name.
const SERVER_NAME: &str = "squall-worker";

/// A topology's TLS identity: what its workers present and the one key they accept.
#[derive(Clone)]
pub struct TransportTls {
    client: Arc<ClientConfig>,
    server: Arc<ServerConfig>,
}

impl std::fmt::Debug for TransportTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TransportTls(..)")
    }
}

fn tls_error(reason: impl std::fmt::Display) -> Error {
    Error::Tls { reason: reason.to_string() }
}

impl TransportTls {
    /// The identity of the topology whose secret is `secret` (the same in every worker).
    pub fn for_topology(secret: &TopologySecret) -> Result<Self> {
        TransportTls::build(secret, secret)
    }

    /// Presents the key of `presents` and accepts only the key of `accepts`: a worker's
    /// identity when both are the topology's secret; an impostor's in tests.
    pub(super) fn build(presents: &TopologySecret, accepts: &TopologySecret) -> Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (key, spki) = derive_key(presents)?;
        let (_, accepted) = derive_key(accepts)?;
        let identity = Arc::new(CertifiedKey::new(vec![CertificateDer::from(spki)], key));
        let pinned =
            Arc::new(PinnedKey { spki: accepted, algorithms: provider.signature_verification_algorithms });

        let mut client = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_error)?
            .dangerous()
            .with_custom_certificate_verifier(pinned.clone())
            .with_client_cert_resolver(Arc::new(AlwaysResolvesClientRawPublicKeys::new(identity.clone())));
        // Connections are long-lived and re-established rarely: no session tickets to keep.
        client.resumption = Resumption::disabled();
        let mut server = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls_error)?
            .with_client_cert_verifier(pinned)
            .with_cert_resolver(Arc::new(AlwaysResolvesServerRawPublicKeys::new(identity)));
        server.send_tls13_tickets = 0;
        Ok(TransportTls { client: Arc::new(client), server: Arc::new(server) })
    }
}

/// The topology's Ed25519 key: its seed is HMAC-SHA256(secret, [`KEY_LABEL`]). Returns the
/// signing key and the public key's SubjectPublicKeyInfo (what peers present and pin).
fn derive_key(secret: &TopologySecret) -> Result<(Arc<dyn rustls::sign::SigningKey>, Vec<u8>)> {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes()).map_err(tls_error)?;
    mac.update(KEY_LABEL);
    let seed = mac.finalize().into_bytes();
    let mut pkcs8 = ED25519_PKCS8_PREFIX.to_vec();
    pkcs8.extend_from_slice(&seed);
    let key = rustls::crypto::ring::sign::any_eddsa_type(&PrivatePkcs8KeyDer::from(pkcs8))
        .map_err(|e| tls_error(format!("cannot make the topology's key: {e}")))?;
    let spki =
        key.public_key().ok_or_else(|| tls_error("the topology's key has no public key"))?.as_ref().to_vec();
    Ok((key, spki))
}

impl TransportTls {
    /// The receiving side's acceptor, for the gatekeeper's runtime.
    pub(super) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.server.clone())
    }
}

/// Accepts exactly one key, the topology's, from either side of a connection.
#[derive(Debug)]
struct PinnedKey {
    spki: Vec<u8>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl PinnedKey {
    /// The presented key is the pinned one, alone (no chain).
    fn check(
        &self,
        presented: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
    ) -> std::result::Result<(), rustls::Error> {
        if intermediates.is_empty() && presented.as_ref() == self.spki.as_slice() {
            Ok(())
        } else {
            Err(Self::refused())
        }
    }

    fn refused() -> rustls::Error {
        rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure)
    }

    fn signature(
        &self,
        message: &[u8],
        key: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        // `key` passed `check` already; verified against our copy all the same.
        if key.as_ref() != self.spki.as_slice() {
            return Err(Self::refused());
        }
        let spki = SubjectPublicKeyInfoDer::from(self.spki.as_slice());
        verify_tls13_signature_with_raw_key(message, &spki, dss, &self.algorithms)
    }
}

/// What the server and the client verifier share: TLS 1.3 signatures checked against the
/// pinned key, Ed25519 only, raw public keys only.
macro_rules! pinned_signatures {
    () => {
        fn verify_tls12_signature(
            &self,
            _message: &[u8],
            _cert: &CertificateDer<'_>,
            _dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            // Only TLS 1.3 is configured, where raw public keys are.
            Err(rustls::Error::General("TLS 1.2 is not used between workers".into()))
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            self.signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            vec![SignatureScheme::ED25519]
        }

        fn requires_raw_public_keys(&self) -> bool {
            true
        }
    };
}

impl ServerCertVerifier for PinnedKey {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        self.check(end_entity, intermediates).map(|()| ServerCertVerified::assertion())
    }

    pinned_signatures!();
}

impl ClientCertVerifier for PinnedKey {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> std::result::Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity, intermediates).map(|()| ClientCertVerified::assertion())
    }

    pinned_signatures!();
}

/// A connection between two workers, plain TCP or TLS: what the handshake, the senders and
/// the receivers read and write.
#[derive(Debug)]
pub struct PeerStream(Inner);

#[derive(Debug)]
enum Inner {
    Plain(TcpStream),
    Client(Box<StreamOwned<ClientConnection, TcpStream>>),
    Server(Box<StreamOwned<ServerConnection, TcpStream>>),
}

impl PeerStream {
    /// A plain TCP connection.
    pub(crate) fn plain(tcp: TcpStream) -> Self {
        PeerStream(Inner::Plain(tcp))
    }

    /// A receiver's connection whose TLS handshake (and maybe more) `session` has done on
    /// the gatekeeper's runtime.
    pub(crate) fn server(session: ServerConnection, tcp: TcpStream) -> Self {
        PeerStream(Inner::Server(Box::new(StreamOwned::new(session, tcp))))
    }

    /// The socket underneath, for timeouts and for shutting it down from another thread.
    pub fn tcp(&self) -> &TcpStream {
        match &self.0 {
            Inner::Plain(s) => s,
            Inner::Client(s) => &s.sock,
            Inner::Server(s) => &s.sock,
        }
    }

    /// Whether the connection is TLS.
    pub fn is_tls(&self) -> bool {
        !matches!(self.0, Inner::Plain(_))
    }

    /// Ends the stream cleanly (a TLS close_notify); errors are of no interest, the socket is
    /// dropped next.
    pub(crate) fn close(&mut self) {
        match &mut self.0 {
            Inner::Plain(_) => {}
            Inner::Client(s) => {
                s.conn.send_close_notify();
                let _ = s.conn.complete_io(&mut s.sock);
            }
            Inner::Server(s) => {
                s.conn.send_close_notify();
                let _ = s.conn.complete_io(&mut s.sock);
            }
        }
    }
}

impl Read for PeerStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.0 {
            Inner::Plain(s) => s.read(buf),
            Inner::Client(s) => s.read(buf),
            Inner::Server(s) => s.read(buf),
        }
    }
}

impl Write for PeerStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.0 {
            Inner::Plain(s) => s.write(buf),
            Inner::Client(s) => s.write(buf),
            Inner::Server(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.0 {
            Inner::Plain(s) => s.flush(),
            Inner::Client(s) => s.flush(),
            Inner::Server(s) => s.flush(),
        }
    }
}

/// The sender's TLS handshake over `tcp`, finished before `deadline`.
pub(super) fn connect(
    tcp: TcpStream,
    tls: &TransportTls,
    deadline: Instant,
    peer: &str,
) -> Result<PeerStream> {
    let name = ServerName::try_from(SERVER_NAME).map_err(tls_error)?;
    let mut conn = ClientConnection::new(tls.client.clone(), name).map_err(tls_error)?;
    let mut tcp = tcp;
    handshake(&mut conn, &mut tcp, deadline, peer)?;
    Ok(PeerStream(Inner::Client(Box::new(StreamOwned::new(conn, tcp)))))
}

/// Drives a handshake on a blocking socket, each read and write bounded by what is left until
/// `deadline` (a peer trickling bytes cannot stretch it). A refused peer gets rustls's alert.
fn handshake<S: SideData>(
    conn: &mut ConnectionCommon<S>,
    tcp: &mut TcpStream,
    deadline: Instant,
    peer: &str,
) -> Result<()> {
    let refused = |reason: String| Error::Handshake { peer: peer.to_owned(), reason };
    while conn.is_handshaking() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(refused(format!("no TLS handshake within {:?}", super::auth::HANDSHAKE_TIMEOUT)));
        }
        tcp.set_read_timeout(Some(left)).map_err(|e| Error::io(format!("read from {peer}"), e))?;
        tcp.set_write_timeout(Some(left)).map_err(|e| Error::io(format!("write to {peer}"), e))?;
        match conn.complete_io(tcp) {
            Ok((0, 0)) if conn.is_handshaking() => {
                return Err(refused("connection closed during the TLS handshake".into()));
            }
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(refused(format!("TLS: {e}"))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_makes_the_same_key_every_time_and_another_secret_another() {
        let secret = TopologySecret::generate();
        let spki = |s: &TopologySecret| derive_key(s).unwrap().1;
        let again = TopologySecret::from_bytes(secret.as_bytes()).unwrap();
        assert_eq!(spki(&secret), spki(&again), "every worker of a topology derives one key");
        assert_ne!(spki(&secret), spki(&TopologySecret::generate()));
        // An Ed25519 SubjectPublicKeyInfo: 12 bytes of algorithm, then the 32-byte key.
        assert_eq!(spki(&secret).len(), 44);
        assert_eq!(format!("{:?}", TransportTls::for_topology(&secret).unwrap()), "TransportTls(..)");
    }
}
