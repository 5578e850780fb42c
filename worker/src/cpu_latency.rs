//! A worker's request for how fast idle CPUs wake (`squall.worker.cpu.latency.us`): Linux's PM
//! QoS CPU latency, the request a process holds by keeping `/dev/cpu_dma_latency` open with a
//! value written to it. The kernel keeps every CPU's idle state within the lowest value any
//! open request asks for, and drops a request when its file closes (also when the process is
//! killed), so nothing outlives the worker.
//!
//! Why a stream processor asks: at partial load its threads park between batches, and a
//! sender that wakes a parked thread pays for bringing an idle CPU out of its idle state. On
//! the 2-core Firecracker VM of issue 21, whose idle CPUs halt, one wake-up (`futex_wake`) cost
//! the waking thread 12.5 us on average (up to 0.7 ms); at 0 they poll, and it cost 1.4-1.8 us.
//! Word count at half load: median complete latency 40-43 us against 79-88 us; with a
//! neighbour process spinning 3 ms of every 33, p99 <= 1 ms in 18 of 18 runs against 13 of 18
//! (`docs/performance-log.md`, 2026-11-30). The price: idle CPUs poll instead of halting, so
//! the machine (or its host) spends power and CPU time on them while the worker runs. It is
//! the operator's call, as `tuned`'s latency profiles make it (`force_latency`), so it is off
//! unless set.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;

/// The device through which a process holds a CPU latency request.
pub const DEVICE: &str = "/dev/cpu_dma_latency";

/// A held request: idle CPUs wake within `us` microseconds while it lives.
#[derive(Debug)]
pub struct CpuLatencyRequest {
    /// Kept open: closing it ends the request.
    _file: File,
    us: u32,
}

/// Why a request could not be held.
#[derive(Debug, thiserror::Error)]
#[error(
    "could not ask for a CPU wake-up latency of {us} us through {path}: {source}; idle CPUs keep \
     the machine's setting (run the worker as a user that may write {path}, or unset \
     squall.worker.cpu.latency.us)"
)]
pub struct CpuLatencyError {
    path: String,
    us: u32,
    #[source]
    source: std::io::Error,
}

impl CpuLatencyRequest {
    /// Holds a request for `us` microseconds through [`DEVICE`].
    pub fn hold(us: u32) -> Result<Self, CpuLatencyError> {
        Self::hold_at(Path::new(DEVICE), us)
    }

    /// Holds a request through the device (or, in tests, file) at `path`: the value written as
    /// the kernel reads it, a native-endian 32-bit integer in one write.
    pub fn hold_at(path: &Path, us: u32) -> Result<Self, CpuLatencyError> {
        let error = |source| CpuLatencyError { path: path.display().to_string(), us, source };
        let value = i32::try_from(us)
            .map_err(|_| error(std::io::Error::new(std::io::ErrorKind::InvalidInput, "too large")))?;
        let mut file = OpenOptions::new().write(true).open(path).map_err(error)?;
        file.write_all(&value.to_ne_bytes()).map_err(error)?;
        Ok(CpuLatencyRequest { _file: file, us })
    }

    /// The latency asked for, in microseconds.
    pub fn us(&self) -> u32 {
        self.us
    }
}

/// The CPU wake-up latency in force now, in microseconds: the lowest request any process
/// holds, or the kernel's default when none does (what [`DEVICE`] reads).
pub fn in_force() -> std::io::Result<i32> {
    let mut current = [0u8; 4];
    File::open(DEVICE)?.read_exact(&mut current)?;
    Ok(i32::from_ne_bytes(current))
}

/// Holds the request `us` asks for (none for `None`), logging what came of it: a worker that
/// cannot hold it runs on, with the machine's setting.
pub(crate) fn hold_configured(us: Option<u32>) -> Option<CpuLatencyRequest> {
    let us = us?;
    match CpuLatencyRequest::hold(us) {
        Ok(held) => {
            tracing::info!(
                us,
                device = DEVICE,
                "holding a CPU wake-up latency request while this worker runs"
            );
            Some(held)
        }
        Err(e) => {
            tracing::warn!(error = %e, "squall.worker.cpu.latency.us not applied");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request is written as the kernel reads it (one native-endian i32) and held until
    /// dropped; a path that cannot be opened is an error that names it and says what to do.
    #[test]
    fn a_request_is_written_as_the_kernel_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cpu_dma_latency");
        std::fs::write(&path, b"").unwrap();
        let held = CpuLatencyRequest::hold_at(&path, 20).unwrap();
        assert_eq!(held.us(), 20);
        assert_eq!(std::fs::read(&path).unwrap(), 20i32.to_ne_bytes());

        let missing = dir.path().join("absent");
        let e = CpuLatencyRequest::hold_at(&missing, 0).unwrap_err().to_string();
        assert!(e.contains("absent") && e.contains("squall.worker.cpu.latency.us"), "{e}");
        let e = CpuLatencyRequest::hold_at(&path, u32::MAX).unwrap_err().to_string();
        assert!(e.contains("too large"), "{e}");
    }

    /// On a machine whose kernel offers the device to this user, the request is in force while
    /// held: the device reads the lowest request of all (at most ours). Elsewhere there is
    /// nothing to check, and the test says so.
    #[test]
    fn a_held_request_is_in_force_where_the_kernel_offers_it() {
        let held = match CpuLatencyRequest::hold(7) {
            Ok(held) => held,
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        let current = in_force().unwrap();
        assert!((0..=7).contains(&current), "the device reads {current} while 7 is held");
        drop(held);
    }
}
