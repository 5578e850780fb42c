//! Log capture for tests that run Squall's code in-process.
//!
//! `cargo test` shows a test's output only when it fails; [`capture`] sends the `tracing` events
//! of the code under test there (threads spawned by the test inherit its capture), so a flaky
//! failure in CI comes with the log that explains it. `RUST_LOG` picks the level (default info).

/// Installs a `tracing` subscriber writing through the test harness's capture; a no-op when one
/// is already installed (another test of the same binary did it).
pub fn capture() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_test_writer().try_init();
}
