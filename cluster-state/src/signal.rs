//! How a Squall process is asked to stop: SIGTERM (systemd, `kill`, a supervisor stopping its
//! worker) or SIGINT (Ctrl-C). Daemons take a shutdown token; this turns the signals into a
//! cancellation of it, without a task of its own.

use std::future::Future;

use tokio_util::sync::CancellationToken;

/// Resolves on the first SIGINT or SIGTERM after it is first polled (the handlers are
/// installed then). Where the SIGTERM handler cannot be installed, Ctrl-C alone stops.
pub async fn terminate_requested() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(e) => {
            tracing::warn!("cannot listen for SIGTERM ({e}); only Ctrl-C stops this process");
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Runs `run` to completion, cancelling `shutdown` when [`terminate_requested`] resolves first
/// (and then still waiting for `run`, which is expected to stop on `shutdown`).
pub async fn run_until_signal<F: Future>(shutdown: CancellationToken, run: F) -> F::Output {
    let run = std::pin::pin!(run);
    let mut run = run;
    tokio::select! {
        output = run.as_mut() => return output,
        () = terminate_requested() => {
            tracing::info!("shutdown requested");
            shutdown.cancel();
        }
    }
    run.await
}
