//! Spawning child processes that die with the test process.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process. `cargo test`
//! runs every test on its own short-lived thread, so forking from the test thread would kill a shared
//! server as soon as the first test using it finishes. All spawns therefore go through one dedicated
//! thread that lives as long as the process; the signal then fires exactly when the process goes away,
//! however it goes away (normal exit, panic=abort, SIGKILL).

use std::io;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::thread;

struct Request {
    command: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

/// Spawns `command` from the process-lifetime spawner thread, with the child set up to receive
/// SIGKILL when this process exits (Linux only; elsewhere the child is merely spawned).
pub(crate) fn spawn_tied_to_process(mut command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();

    tie_to_this_process(&mut command);
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<Request>();
        thread::Builder::new()
            .name("zk-harness-spawner".into())
            .spawn(move || {
                // Never returns: `SPAWNER` keeps the sending side alive for the whole process.
                for Request { mut command, reply } in incoming {
                    if let Err(mpsc::SendError(Ok(mut orphan))) = reply.send(command.spawn()) {
                        // Nobody is waiting for this child any more; do not leave it running.
                        let _ = orphan.kill();
                        let _ = orphan.wait();
                    }
                }
            })
            .expect("cannot start the ZooKeeper harness spawner thread");
        requests
    });
    let gone = || io::Error::other("the ZooKeeper harness spawner thread is gone");
    let (reply, response) = mpsc::channel();
    spawner.send(Request { command, reply }).map_err(|_| gone())?;
    response.recv().map_err(|_| gone())?
}

#[cfg(target_os = "linux")]
fn tie_to_this_process(command: &mut Command) {
    use std::os::unix::process::CommandExt;

    let parent = libc::pid_t::try_from(std::process::id()).unwrap_or(libc::pid_t::MAX);
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the forked child between fork and exec, where only async-signal-safe
    // operations are allowed. It calls prctl(2) and getppid(2) (both async-signal-safe syscalls) and
    // builds `io::Error`s from raw OS error codes, which does not allocate. It touches no locks and no
    // memory shared with the parent.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl; then the signal would never come.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn tie_to_this_process(_command: &mut Command) {}
