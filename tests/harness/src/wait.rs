//! Waiting in tests without sleeping as synchronisation: poll a condition until it holds or a
//! deadline passes, naming what was awaited when it does not.
//!
//! | condition                 | result on time-out            | function           |
//! |---------------------------|-------------------------------|--------------------|
//! | `FnMut() -> bool`         | `false`                       | [`wait_until`]     |
//! | `FnMut() -> bool`         | fails the test, naming `what` | [`wait_for`]       |
//! | async, `Option<T>`        | fails the test, naming `what` | [`eventually`]     |
//! | async, `bool`             | fails the test, naming `what` | [`eventually_true`] |

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

/// Polls `cond` every 10 ms until it holds; fails the test with "timed out after .. waiting
/// for `what`" once `within` passes. Blocks the thread: for synchronous tests.
#[allow(clippy::panic)]
pub fn wait_for(within: Duration, what: &str, cond: impl FnMut() -> bool) {
    if !wait_until(within, cond) {
        panic!("timed out after {within:?} waiting for {what}");
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

/// [`eventually`] for a condition that holds or not: polls the async `cond` every 50 ms until
/// it is true; fails the test naming `what` once `within` passes.
pub async fn eventually_true<F: Future<Output = bool>>(
    within: Duration,
    what: &str,
    mut cond: impl FnMut() -> F,
) {
    eventually(within, what, || {
        let holds = cond();
        async move { holds.await.then_some(()) }
    })
    .await
}
