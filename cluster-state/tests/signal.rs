//! The stop signals, in a test binary of their own: once tokio handles SIGTERM, it does so for
//! the rest of the process.

use std::time::Duration;

use cluster_state::signal::run_until_signal;
use rustix::process::{Signal, getpid, kill_process};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn sigterm_cancels_the_token_and_the_run_still_finishes() {
    let shutdown = CancellationToken::new();
    let stopping = shutdown.clone();
    let run = run_until_signal(shutdown.clone(), async move {
        stopping.cancelled().await;
        "stopped cleanly"
    });
    let mut run = std::pin::pin!(run);
    // The first poll installs the handlers.
    assert!(futures::poll!(run.as_mut()).is_pending());
    kill_process(getpid(), Signal::TERM).unwrap();
    let output = tokio::time::timeout(Duration::from_secs(10), run).await.expect("the run stops on SIGTERM");
    assert_eq!(output, "stopped cleanly");
    assert!(shutdown.is_cancelled());
}

#[tokio::test]
async fn a_run_that_ends_first_returns_its_output() {
    let shutdown = CancellationToken::new();
    assert_eq!(run_until_signal(shutdown.clone(), async { 7 }).await, 7);
    assert!(!shutdown.is_cancelled());
}
