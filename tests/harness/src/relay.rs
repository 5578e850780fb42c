//! A TCP relay that can cut the link between clients and a server: network partitions on demand.
//!
//! Point a client at [`TcpRelay::addr`] instead of the server. [`TcpRelay::cut`] severs every
//! relayed connection and refuses new ones (the client sees its connection drop and cannot get
//! back) until [`TcpRelay::restore`]. The server itself keeps running, so another client that
//! connects to it directly can act meanwhile: that is how tests force a ZooKeeper session to
//! expire on the server while its owner is partitioned away (see the conformance suite).
//!
//! Plain threads and blocking sockets: the relay works whatever runtime, if any, the test uses.

use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// A loopback relay to one upstream address; see the module docs.
#[derive(Debug)]
pub struct TcpRelay {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    cut: AtomicBool,
    stopped: AtomicBool,
    /// Both sockets of every live relayed connection, so a cut can shut them down.
    links: Mutex<Vec<(TcpStream, TcpStream)>>,
}

impl Shared {
    fn sever_all(&self) {
        let links = std::mem::take(&mut *self.links.lock().unwrap_or_else(|p| p.into_inner()));
        for (client, server) in links {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
    }
}

impl TcpRelay {
    /// Starts relaying connections accepted on a free loopback port to `upstream`.
    pub fn start(upstream: SocketAddr) -> io::Result<TcpRelay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::default());
        let accept_shared = shared.clone();
        thread::Builder::new().name(format!("relay-{addr}")).spawn(move || {
            for client in listener.incoming() {
                if accept_shared.stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                if accept_shared.cut.load(Ordering::SeqCst) {
                    // Partitioned: the connection is dropped at once.
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                if let Err(e) = relay(&accept_shared, client, server) {
                    eprintln!("relay {addr}: could not relay a connection: {e}");
                }
            }
        })?;
        Ok(TcpRelay { addr, shared })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Severs every relayed connection and refuses new ones until [`TcpRelay::restore`].
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::SeqCst);
        self.shared.sever_all();
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.shared.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpRelay {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        self.shared.sever_all();
        // Wake the accept loop so it sees `stopped` and ends.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Pumps bytes both ways on two threads until either side closes.
fn relay(shared: &Shared, client: TcpStream, server: TcpStream) -> io::Result<()> {
    let (client_reader, server_writer) = (client.try_clone()?, server.try_clone()?);
    let (server_reader, client_writer) = (server.try_clone()?, client.try_clone()?);
    shared.links.lock().unwrap_or_else(|p| p.into_inner()).push((client, server));
    thread::Builder::new().name("relay-up".into()).spawn(move || pump(client_reader, server_writer))?;
    thread::Builder::new().name("relay-down".into()).spawn(move || pump(server_reader, client_writer))?;
    Ok(())
}

fn pump(mut from: TcpStream, mut to: TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
