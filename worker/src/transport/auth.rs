//! How the workers of a topology recognise each other: the topology's secret and the handshake
//! that opens every connection (see the module doc of `transport`).
//!
//! ```text
//! sender -> receiver   hello:     "SQL2", sender nonce (32 bytes), topology id (UTF-8)
//! receiver -> sender   challenge: receiver nonce (32 bytes),
//!                                 HMAC-SHA256(secret, sender nonce || topology id || "receiver")
//! sender -> receiver   response:  HMAC-SHA256(secret, receiver nonce || topology id || "sender")
//! ```
//!
//! Each message is a frame of at most [`HANDSHAKE_LIMIT`] bytes, and the whole exchange must
//! finish within [`HANDSHAKE_TIMEOUT`]. Both sides prove they hold the secret over a nonce the
//! other chose, so neither an answer seen on the wire nor one side's own answer (the direction
//! differs) can be replayed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::codec::write_frame;
use crate::error::{Error, Result};

/// Magic of the hello (version 2: authenticated).
const MAGIC: &[u8; 4] = b"SQL2";
/// Bytes of a topology secret and of a nonce.
pub const SECRET_BYTES: usize = 32;
const NONCE_BYTES: usize = 32;
const MAC_BYTES: usize = 32;
/// A handshake message is larger than this only if it is not one.
pub(super) const HANDSHAKE_LIMIT: usize = 1024;
/// A connection that has not completed the handshake by then is closed.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

type HmacSha256 = Hmac<Sha256>;

/// The secret a topology's workers authenticate each other with: 32 random bytes that nimbus
/// creates at submit as a code file (`cluster_state::code::CodeFile::Secret`, mode 0600) and
/// supervisors download with the rest of the code. Never printed.
#[derive(Clone)]
pub struct TopologySecret(Arc<[u8; SECRET_BYTES]>);

impl std::fmt::Debug for TopologySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TopologySecret(..)")
    }
}

impl TopologySecret {
    /// A new random secret (nimbus at submit; embedders running workers in one process).
    pub fn generate() -> Self {
        TopologySecret(Arc::new(rand::random()))
    }

    /// The secret in `bytes`, which must be exactly [`SECRET_BYTES`] long.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        <[u8; SECRET_BYTES]>::try_from(bytes).ok().map(|b| TopologySecret(Arc::new(b)))
    }

    /// The secret's bytes, for writing it to its file.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0[..]
    }

    /// Reads the secret file at `path`: exactly [`SECRET_BYTES`] bytes, readable by its owner
    /// only (like an ssh key, a secret others could read is refused rather than used).
    pub fn read(path: &Path) -> Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let err = |reason: String| Error::Secret { path: path.to_owned(), reason };
        let meta = std::fs::metadata(path).map_err(|e| {
            err(format!(
                "{e} (a topology submitted before workers authenticated each other must be resubmitted)"
            ))
        })?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(err(format!("mode {mode:o} lets others read it; it must be 600")));
        }
        let bytes = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        TopologySecret::from_bytes(&bytes)
            .ok_or_else(|| err(format!("{} bytes, a secret is {SECRET_BYTES}", bytes.len())))
    }

    /// HMAC accepts keys of any length, so this is `None` only in theory.
    /// Writes the secret to a new file at `path`, mode 0600 from its creation (what nimbus
    /// does at submit; for tests and tools that lay out a code dir themselves).
    pub fn write_new(&self, path: &Path) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let err = |e: std::io::Error| Error::Secret { path: path.to_owned(), reason: e.to_string() };
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(err)?;
        f.write_all(self.as_bytes()).map_err(err)
    }

    fn mac(&self, nonce: &[u8], topology_id: &str, direction: &[u8]) -> Option<HmacSha256> {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.0[..]).ok()?;
        mac.update(nonce);
        mac.update(topology_id.as_bytes());
        mac.update(direction);
        Some(mac)
    }

    fn sign(&self, nonce: &[u8], topology_id: &str, direction: &[u8], peer: &str) -> Result<Vec<u8>> {
        let mac =
            self.mac(nonce, topology_id, direction).ok_or_else(|| refused(peer, "HMAC key rejected"))?;
        Ok(mac.finalize().into_bytes().to_vec())
    }

    /// Constant-time check of `tag`.
    fn verify(&self, nonce: &[u8], topology_id: &str, direction: &[u8], tag: &[u8]) -> bool {
        self.mac(nonce, topology_id, direction).is_some_and(|m| m.verify_slice(tag).is_ok())
    }
}

const TO_RECEIVER: &[u8] = b"receiver";
const TO_SENDER: &[u8] = b"sender";

fn refused(peer: &str, reason: impl Into<String>) -> Error {
    Error::Handshake { peer: peer.to_owned(), reason: reason.into() }
}

/// What the handshake runs over: a plain socket, or a TLS session on one (whose timeouts are
/// the socket's).
pub(super) trait HandshakeStream: Read + Write {
    fn socket(&self) -> &TcpStream;
}

impl HandshakeStream for TcpStream {
    fn socket(&self) -> &TcpStream {
        self
    }
}

impl HandshakeStream for super::tls::PeerStream {
    fn socket(&self) -> &TcpStream {
        self.tcp()
    }
}

/// Reads one handshake frame before `deadline` (a per-read timeout would let a peer trickle a
/// byte at a time forever).
fn read_small_frame(
    s: &mut impl HandshakeStream,
    deadline: std::time::Instant,
    peer: &str,
) -> Result<Vec<u8>> {
    let mut len = [0u8; 4];
    read_exact_by(s, &mut len, deadline, peer)?;
    let mut buf = vec![0; handshake_len(len, peer)?];
    read_exact_by(s, &mut buf, deadline, peer)?;
    Ok(buf)
}

/// The length a handshake frame's header announces, refused over [`HANDSHAKE_LIMIT`].
fn handshake_len(header: [u8; 4], peer: &str) -> Result<usize> {
    let len = u32::from_be_bytes(header) as usize;
    if len > HANDSHAKE_LIMIT {
        return Err(refused(peer, format!("handshake message of {len} bytes (at most {HANDSHAKE_LIMIT})")));
    }
    Ok(len)
}

fn read_exact_by(
    s: &mut impl HandshakeStream,
    buf: &mut [u8],
    deadline: std::time::Instant,
    peer: &str,
) -> Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(refused(peer, format!("no complete handshake within {HANDSHAKE_TIMEOUT:?}")));
        }
        s.socket().set_read_timeout(Some(left)).map_err(|e| Error::io(format!("read from {peer}"), e))?;
        match s.read(&mut buf[filled..]) {
            Ok(0) => return Err(refused(peer, "connection closed during the handshake")),
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            // A TLS alert: the peer refused our key (under TLS 1.3 a sender learns it here).
            Err(e) if e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) => {
                return Err(refused(peer, format!("TLS: {e}")));
            }
            Err(e) => return Err(Error::io(format!("read from {peer}"), e)),
        }
    }
    Ok(())
}

fn write_by(
    s: &mut impl HandshakeStream,
    payload: &[u8],
    deadline: std::time::Instant,
    peer: &str,
) -> Result<()> {
    let left = deadline.saturating_duration_since(std::time::Instant::now()).max(Duration::from_millis(1));
    s.socket().set_write_timeout(Some(left)).map_err(|e| Error::io(format!("write to {peer}"), e))?;
    // A TLS session holds written bytes until flushed.
    write_frame(s, payload).and_then(|()| s.flush()).map_err(|e| match e.kind() {
        // The peer hung up mid-handshake: a refusal (a TLS receiver that refused our key
        // closes after its alert, which a TLS 1.3 sender may only meet here).
        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
            refused(peer, format!("closed the connection during the handshake ({e})"))
        }
        _ => Error::io(format!("write to {peer}"), e),
    })
}

/// The sender's side: hello, check the receiver's proof, answer its challenge, all before
/// `deadline`. Leaves the stream's timeouts as the caller sets them next.
pub(super) fn client(
    s: &mut impl HandshakeStream,
    topology_id: &str,
    secret: &TopologySecret,
    peer: &str,
    deadline: std::time::Instant,
) -> Result<()> {
    let nonce: [u8; NONCE_BYTES] = rand::random();
    let mut hello = Vec::with_capacity(MAGIC.len() + NONCE_BYTES + topology_id.len());
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&nonce);
    hello.extend_from_slice(topology_id.as_bytes());
    write_by(s, &hello, deadline, peer)?;
    let challenge = read_small_frame(s, deadline, peer)?;
    if challenge.len() != NONCE_BYTES + MAC_BYTES {
        return Err(refused(peer, format!("challenge of {} bytes", challenge.len())));
    }
    let (theirs, proof) = challenge.split_at(NONCE_BYTES);
    if !secret.verify(&nonce, topology_id, TO_RECEIVER, proof) {
        return Err(refused(
            peer,
            format!("the receiver does not hold the secret of topology {topology_id}"),
        ));
    }
    write_by(s, &secret.sign(theirs, topology_id, TO_SENDER, peer)?, deadline, peer)
}

/// The receiver's side, on the gatekeeper's runtime (see `receive.rs`): read the hello, prove
/// the secret, check the sender's answer, all within [`HANDSHAKE_TIMEOUT`].
pub(super) async fn server<S>(s: &mut S, topology_id: &str, secret: &TopologySecret, peer: &str) -> Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    tokio::time::timeout(HANDSHAKE_TIMEOUT, server_exchange(s, topology_id, secret, peer))
        .await
        .unwrap_or_else(|_| Err(refused(peer, format!("no complete handshake within {HANDSHAKE_TIMEOUT:?}"))))
}

async fn server_exchange<S>(s: &mut S, topology_id: &str, secret: &TopologySecret, peer: &str) -> Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt;
    let hello = read_small_frame_async(s, peer).await?;
    let Some(rest) = hello.strip_prefix(MAGIC) else {
        return Err(refused(peer, "not a Squall worker hello (protocol SQL2)"));
    };
    if rest.len() < NONCE_BYTES {
        return Err(refused(peer, "hello without a nonce"));
    }
    let (theirs, topology) = rest.split_at(NONCE_BYTES);
    if topology != topology_id.as_bytes() {
        return Err(refused(
            peer,
            format!(
                "hello for topology {:?}, this worker runs {topology_id}",
                String::from_utf8_lossy(topology)
            ),
        ));
    }
    let nonce: [u8; NONCE_BYTES] = rand::random();
    let mut challenge = Vec::with_capacity(4 + NONCE_BYTES + MAC_BYTES);
    challenge.extend_from_slice(&((NONCE_BYTES + MAC_BYTES) as u32).to_be_bytes());
    challenge.extend_from_slice(&nonce);
    challenge.extend_from_slice(&secret.sign(theirs, topology_id, TO_RECEIVER, peer)?);
    s.write_all(&challenge).await.map_err(|e| Error::io(format!("write to {peer}"), e))?;
    // A TLS session holds written bytes until flushed.
    s.flush().await.map_err(|e| Error::io(format!("write to {peer}"), e))?;
    let answer = read_small_frame_async(s, peer).await?;
    if !secret.verify(&nonce, topology_id, TO_SENDER, &answer) {
        return Err(refused(peer, format!("wrong answer to the challenge of topology {topology_id}")));
    }
    Ok(())
}

/// Reads one handshake frame (the caller bounds the time).
async fn read_small_frame_async<S>(s: &mut S, peer: &str) -> Result<Vec<u8>>
where
    S: tokio::io::AsyncRead + Unpin,
{
    use tokio::io::AsyncReadExt;
    let closed = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            refused(peer, "connection closed during the handshake")
        } else {
            Error::io(format!("read from {peer}"), e)
        }
    };
    let mut len = [0u8; 4];
    s.read_exact(&mut len).await.map_err(closed)?;
    let mut buf = vec![0; handshake_len(len, peer)?];
    s.read_exact(&mut buf).await.map_err(closed)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_secret_file_is_read_only_when_private_and_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topology.secret");
        let write = |bytes: &[u8], mode: u32| {
            std::fs::write(&path, bytes).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        let err = |path: &Path| TopologySecret::read(path).unwrap_err().to_string();
        let missing = err(&path);
        assert!(missing.contains("topology.secret") && missing.contains("resubmitted"), "{missing}");
        write(&[1; SECRET_BYTES], 0o644);
        assert!(err(&path).contains("mode 644"), "{}", err(&path));
        write(&[1; 7], 0o600);
        assert!(err(&path).contains("7 bytes"), "{}", err(&path));
        std::fs::remove_file(&path).unwrap();
        let written = TopologySecret::generate();
        written.write_new(&path).unwrap();
        let secret = TopologySecret::read(&path).unwrap();
        assert_eq!(secret.as_bytes(), written.as_bytes());
        assert_eq!(format!("{secret:?}"), "TopologySecret(..)", "never printed");
    }
}
