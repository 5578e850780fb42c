//! Waiting in tests without sleeping as synchronisation: poll a condition until it holds or a
//! deadline passes, naming what was awaited when it does not.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `cond` every 10 ms until it holds (true) or `within` passes (false).
pub fn wait_until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Polls the async `check` every 50 ms until it gives a value, which it returns; fails the
/// test with "timed out after .. waiting for `what`" once `within` passes.
#[allow(clippy::panic)]
pub async fn eventually<T, F: Future<Output = Option<T>>>(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
