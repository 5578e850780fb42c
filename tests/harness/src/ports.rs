//! Loopback ports for the servers a test starts (ZooKeeper, supervisors' worker slots, brokers).
//!
//! A port probed free is free only until someone binds it, and a test that asks for several
//! (a cluster of supervisors with four slots each) must not get one twice. Two things made that
//! happen with a plain `bind(0)` probe: the kernel hands a just-released port out again, and
//! the ports it picks are the same ephemeral range it takes the source ports of outgoing
//! connections from (every ZooKeeper and Kafka client of a running test). So [`free_port`]
//! picks below the ephemeral range, never gives a port twice in one test process, and still
//! checks that the port binds.

use std::collections::BTreeSet;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

/// Ports handed out by this process so far.
static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// The lowest port ever picked: below it are the well-known and registered services.
const LOWEST: u16 = 20_000;

/// Probes tried before giving up.
const TRIES: u32 = 2_000;

/// A loopback port that was free a moment ago, below the kernel's ephemeral range, and not
/// handed out before by this process. Panics (a broken test environment) when none is found.
pub fn free_port() -> u16 {
    try_free_port().unwrap_or_else(|e| panic!("cannot find a free loopback port: {e}"))
}

/// [`free_port`], with the failure as an error.
pub(crate) fn try_free_port() -> io::Result<u16> {
    let high = ephemeral_low().max(LOWEST + 1_000);
    let mut given = GIVEN.lock().unwrap_or_else(PoisonError::into_inner);
    let mut state = seed();
    let mut last = None;
    for _ in 0..TRIES {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let port = LOWEST + (state % u64::from(high - LOWEST)) as u16;
        if given.contains(&port) {
            continue;
        }
        match TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
            Ok(_) => {
                given.insert(port);
                return Ok(port);
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other(format!("all {TRIES} ports probed were handed out already"))))
}

/// The low end of `net.ipv4.ip_local_port_range` (Linux's default 32768 when unreadable).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A per-process, per-call seed: two test processes probing at once start apart.
fn seed() -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    (nanos ^ u64::from(std::process::id()).rotate_left(32)) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_never_handed_out_twice_and_stay_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..200).map(|_| free_port()).collect();
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port handed out twice");
        let high = ephemeral_low().max(LOWEST + 1_000);
        assert!(ports.iter().all(|p| (LOWEST..high).contains(p)), "{ports:?} outside {LOWEST}..{high}");
        for port in &ports[..5] {
            TcpListener::bind((Ipv4Addr::LOCALHOST, *port)).expect("a handed-out port binds");
        }
    }
}
