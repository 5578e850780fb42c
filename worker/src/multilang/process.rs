//! One multilang subprocess: started without a shell in the resources dir, with a writer
//! thread (stdin), a reader thread (stdout: framed messages, parsed off the executor thread) and
//! a stderr thread (logged, its last lines kept for error messages).
//!
//! The channels are bounded both ways, so a slow subprocess slows its executor, never grows
//! memory; the executor waits on both at once (`wait_ready`), so a subprocess blocked writing
//! its output while Squall writes its input cannot deadlock them.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Select, Sender, TryRecvError, TrySendError};

use super::ShellSpec;
use super::protocol::{Context, Handshake, PidReply, ShellMsg, frame};

/// The longest line read from a subprocess; a longer one is garbage.
const MAX_LINE_BYTES: u64 = 16 << 20;
/// The largest message (lines up to `end`).
const MAX_MESSAGE_BYTES: usize = 16 << 20;
/// Messages parsed ahead of the executor.
const INCOMING_CAPACITY: usize = 1024;
/// Stderr lines kept for error messages, and their longest length.
const STDERR_TAIL_LINES: usize = 8;
const STDERR_LINE_CHARS: usize = 300;
/// How much of a garbage line an error quotes.
const QUOTE_CHARS: usize = 120;

/// What the reader thread hands over.
#[derive(Debug)]
pub(crate) enum Incoming {
    /// The handshake's answer.
    Pid(u32),
    /// A command; `line` is where it started in the subprocess's output.
    Msg(ShellMsg),
    /// Output that is not the protocol; the reader stops there.
    Garbage { line: u64, reason: String },
    /// The subprocess closed its stdout (it exited, most likely).
    Closed,
}

/// Why a subprocess is being given up.
#[derive(Debug)]
pub(crate) enum Failure {
    Spawn(String),
    Garbage {
        line: u64,
        reason: String,
    },
    Exited,
    Timeout(Duration),
    StdinClosed,
    Protocol(String),
    /// The handshake failed; how the process ended.
    Startup(Box<Failure>, String),
}

/// A running subprocess.
#[derive(Debug)]
pub(crate) struct ShellProcess {
    child: Child,
    pub(crate) pid: u32,
    to_child: Sender<Vec<u8>>,
    pub(crate) from_child: Receiver<Incoming>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    /// Keeps the pid dir until the process is gone.
    _pid_dir: tempfile::TempDir,
    pub(crate) started: Instant,
}

impl ShellProcess {
    /// Starts `spec`'s command and completes the handshake within `timeout`.
    pub(crate) fn start(
        spec: &ShellSpec,
        conf: &serde_json::Map<String, serde_json::Value>,
        context: Context<'_>,
        label: &str,
        write_queue: usize,
        timeout: Duration,
        waker: Option<Sender<()>>,
    ) -> Result<ShellProcess, Failure> {
        let (program, args) =
            spec.command.split_first().ok_or_else(|| Failure::Spawn("the command is empty".into()))?;
        // A relative program with a slash is the resources dir's (std leaves it unspecified
        // whether the parent's or the child's working directory applies).
        let program = if program.contains('/') && !program.starts_with('/') {
            spec.working_dir.join(program).into_os_string()
        } else {
            program.into()
        };
        let pid_dir = tempfile::Builder::new()
            .prefix("squall-shell-")
            .tempdir()
            .map_err(|e| Failure::Spawn(format!("cannot create its pid dir: {e}")))?;
        // No shell; the child stays in the worker's process group, so killing the worker's
        // group (the supervisor does) kills it too.
        let mut child = Command::new(&program)
            .args(args)
            .current_dir(&spec.working_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                Failure::Spawn(format!(
                    "cannot start {:?} in {}: {e}",
                    spec.command,
                    spec.working_dir.display()
                ))
            })?;
        let pid = child.id();
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Failure::Spawn("its pipes were not created".into()));
        };
        let (to_child, writer_rx) = crossbeam_channel::bounded::<Vec<u8>>(write_queue.max(1));
        let (reader_tx, from_child) = crossbeam_channel::bounded(INCOMING_CAPACITY);
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new().name(format!("{name}-{pid}")).spawn(f).map(|_| ())
        };
        let tail = stderr_tail.clone();
        let log_label = label.to_owned();
        let started = spawn("shell-out", Box::new(move || read_messages(stdout, reader_tx, waker)))
            .and_then(|()| spawn("shell-in", Box::new(move || write_messages(stdin, writer_rx))))
            .and_then(|()| spawn("shell-err", Box::new(move || read_stderr(stderr, tail, log_label))));
        let process = ShellProcess {
            child,
            pid,
            to_child,
            from_child,
            stderr_tail,
            _pid_dir: pid_dir,
            started: Instant::now(),
        };
        if let Err(e) = started {
            return Err(Failure::Spawn(format!("cannot start its I/O threads: {e}")));
        }
        match process.handshake(conf, context, label, timeout) {
            Ok(()) => Ok(process),
            Err(failure) => {
                // Why it did not answer: its exit status and last stderr lines (a Python
                // traceback, most often).
                let mut process = process;
                process.settle(Duration::from_millis(500));
                let ended = process.describe_end();
                Err(Failure::Startup(Box::new(failure), ended))
            }
        }
    }

    fn handshake(
        &self,
        conf: &serde_json::Map<String, serde_json::Value>,
        context: Context<'_>,
        label: &str,
        timeout: Duration,
    ) -> Result<(), Failure> {
        let (pid, process) = (self.pid, self);
        let pid_dir = process._pid_dir.path().to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        frame(&mut bytes, &Handshake { conf, context, pid_dir: &pid_dir })
            .map_err(|e| Failure::Protocol(format!("cannot encode the handshake: {e}")))?;
        process.send_blocking(bytes, timeout)?;
        match process.from_child.recv_timeout(timeout) {
            Ok(Incoming::Pid(reported)) => {
                tracing::debug!(component = %label, pid, reported, "shell handshake done");
                Ok(())
            }
            Ok(Incoming::Msg(m)) => {
                Err(Failure::Protocol(format!("answered the handshake with {m:?}, not its pid")))
            }
            Ok(Incoming::Garbage { line, reason }) => Err(Failure::Garbage { line, reason }),
            Ok(Incoming::Closed) | Err(RecvTimeoutError::Disconnected) => Err(Failure::Exited),
            Err(RecvTimeoutError::Timeout) => Err(Failure::Timeout(timeout)),
        }
    }

    /// Queues `bytes` for the subprocess's stdin without waiting; gives them back when the
    /// queue is full.
    pub(crate) fn try_send(&self, bytes: Vec<u8>) -> Result<Option<Vec<u8>>, Failure> {
        match self.to_child.try_send(bytes) {
            Ok(()) => Ok(None),
            Err(TrySendError::Full(b)) => Ok(Some(b)),
            Err(TrySendError::Disconnected(_)) => Err(Failure::StdinClosed),
        }
    }

    /// Queues `bytes`, waiting at most `timeout` for room (nothing else is read meanwhile: for
    /// the handshake and spout commands, written only when the subprocess waits for input).
    pub(crate) fn send_blocking(&self, bytes: Vec<u8>, timeout: Duration) -> Result<(), Failure> {
        match self.to_child.send_timeout(bytes, timeout) {
            Ok(()) => Ok(()),
            Err(crossbeam_channel::SendTimeoutError::Timeout(_)) => Err(Failure::Timeout(timeout)),
            Err(crossbeam_channel::SendTimeoutError::Disconnected(_)) => Err(Failure::StdinClosed),
        }
    }

    /// The next message if one is there.
    pub(crate) fn try_recv(&self) -> Option<Incoming> {
        match self.from_child.try_recv() {
            Ok(m) => Some(m),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(Incoming::Closed),
        }
    }

    /// Waits until there is room to write or a message to read, at most `timeout`.
    pub(crate) fn wait_ready(&self, timeout: Duration) {
        let mut sel = Select::new();
        sel.send(&self.to_child);
        sel.recv(&self.from_child);
        let _ = sel.ready_timeout(timeout);
    }

    /// How it ended, for error messages: exit status (if it exited) and its last stderr lines.
    pub(crate) fn describe_end(&mut self) -> String {
        let status = match self.child.try_wait() {
            Ok(Some(status)) => format!("; {status}"),
            _ => String::new(),
        };
        let tail = self.stderr_tail.lock().map(|t| t.iter().cloned().collect::<Vec<_>>()).unwrap_or_default();
        if tail.is_empty() { status } else { format!("{status}; last stderr: {}", tail.join(" | ")) }
    }

    /// Waits briefly for an exit (status and stderr of a process that is going away), then kills.
    pub(crate) fn settle(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills the subprocess (SIGKILL) and reaps it.
    pub(crate) fn kill(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for ShellProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

fn read_messages(stdout: ChildStdout, tx: Sender<Incoming>, waker: Option<Sender<()>>) {
    let mut reader = MessageReader::new(BufReader::with_capacity(64 << 10, stdout));
    let mut handshake = true;
    loop {
        let incoming = match reader.next() {
            Ok(None) => Incoming::Closed,
            Ok(Some((line, text))) if handshake => match serde_json::from_str::<PidReply>(&text) {
                Ok(r) => {
                    handshake = false;
                    Incoming::Pid(r.pid)
                }
                Err(e) => Incoming::Garbage {
                    line,
                    reason: format!("expected {{\"pid\": N}} ({e}): {}", quote(&text)),
                },
            },
            Ok(Some((line, text))) => match serde_json::from_str::<ShellMsg>(&text) {
                Ok(m) => Incoming::Msg(m),
                Err(e) => Incoming::Garbage {
                    line,
                    reason: format!("not a multilang command ({e}): {}", quote(&text)),
                },
            },
            Err((line, reason)) => Incoming::Garbage { line, reason },
        };
        let last = !matches!(incoming, Incoming::Pid(_) | Incoming::Msg(_));
        if tx.send(incoming).is_err() {
            return;
        }
        if let Some(w) = &waker {
            let _ = w.try_send(());
        }
        if last {
            return;
        }
    }
}

/// Storm's framing: lines up to a line `end`. Blank lines between messages are skipped.
pub(crate) struct MessageReader<R> {
    input: R,
    line_no: u64,
    buf: Vec<u8>,
}

impl<R: BufRead> MessageReader<R> {
    pub(crate) fn new(input: R) -> Self {
        MessageReader { input, line_no: 0, buf: Vec::new() }
    }

    /// The next message and the line it starts on; `Ok(None)` at the end of the output;
    /// `Err((line, reason))` for output that is not the protocol.
    pub(crate) fn next(&mut self) -> Result<Option<(u64, String)>, (u64, String)> {
        let mut msg = String::new();
        let mut first = 0;
        loop {
            self.buf.clear();
            let n = (&mut self.input)
                .take(MAX_LINE_BYTES)
                .read_until(b'\n', &mut self.buf)
                .map_err(|e| (self.line_no + 1, format!("cannot read its output: {e}")))?;
            if n == 0 {
                if msg.is_empty() {
                    return Ok(None);
                }
                return Err((
                    first,
                    format!("output ended inside a message (no \"end\" line): {}", quote(&msg)),
                ));
            }
            self.line_no += 1;
            if self.buf.last() != Some(&b'\n') && n as u64 == MAX_LINE_BYTES {
                return Err((self.line_no, format!("a line longer than {MAX_LINE_BYTES} bytes")));
            }
            let line = std::str::from_utf8(&self.buf)
                .map_err(|_| (self.line_no, "a line that is not UTF-8".to_owned()))?
                .trim_end_matches(['\n', '\r']);
            if line == "end" {
                if msg.is_empty() {
                    return Err((self.line_no, "\"end\" without a message".into()));
                }
                return Ok(Some((first, msg)));
            }
            if msg.is_empty() {
                if line.trim().is_empty() {
                    continue;
                }
                // Every message from a multilang component is a JSON object: anything else
                // (a print to stdout) is garbage at once, not a wait for an "end" that never comes.
                if !line.trim_start().starts_with('{') {
                    return Err((self.line_no, format!("expected a JSON object: {}", quote(line))));
                }
                first = self.line_no;
            } else {
                if serde_json::from_str::<serde::de::IgnoredAny>(&msg).is_ok() {
                    return Err((
                        self.line_no,
                        format!("expected \"end\" after a message, got {}", quote(line)),
                    ));
                }
                msg.push('\n');
            }
            msg.push_str(line);
            if msg.len() > MAX_MESSAGE_BYTES {
                return Err((first, format!("a message longer than {MAX_MESSAGE_BYTES} bytes")));
            }
        }
    }
}

fn write_messages(stdin: ChildStdin, rx: Receiver<Vec<u8>>) {
    let mut out = BufWriter::with_capacity(64 << 10, stdin);
    while let Ok(first) = rx.recv() {
        if out.write_all(&first).is_err() {
            return;
        }
        // Whatever else is queued goes in the same write.
        while let Ok(more) = rx.try_recv() {
            if out.write_all(&more).is_err() {
                return;
            }
        }
        if out.flush().is_err() {
            return;
        }
    }
}

fn read_stderr(stderr: std::process::ChildStderr, tail: Arc<Mutex<VecDeque<String>>>, label: String) {
    let mut input = BufReader::new(stderr);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match (&mut input).take(64 << 10).read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let line = String::from_utf8_lossy(&buf);
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        tracing::info!(target: "squall::multilang", component = %label, "stderr: {line}");
        if let Ok(mut t) = tail.lock() {
            if t.len() == STDERR_TAIL_LINES {
                t.pop_front();
            }
            t.push_back(line.chars().take(STDERR_LINE_CHARS).collect());
        }
    }
}

/// `text` quoted, cut at [`QUOTE_CHARS`].
pub(crate) fn quote(text: &str) -> String {
    let cut: String = text.chars().take(QUOTE_CHARS).collect();
    if cut.len() < text.len() { format!("{:?}...", cut) } else { format!("{cut:?}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Read = Result<Option<(u64, String)>, (u64, String)>;

    fn read_all(text: &str) -> Vec<Read> {
        let mut r = MessageReader::new(text.as_bytes());
        let mut out = Vec::new();
        for _ in 0..10 {
            let m = r.next();
            let stop = !matches!(m, Ok(Some(_)));
            out.push(m);
            if stop {
                break;
            }
        }
        out
    }

    #[test]
    fn messages_are_framed_by_end_lines() {
        let got = read_all("{\"pid\": 1}\nend\n\n{\"command\":\n\"sync\"}\nend\n");
        assert_eq!(got[0], Ok(Some((1, "{\"pid\": 1}".to_owned()))));
        assert_eq!(got[1], Ok(Some((4, "{\"command\":\n\"sync\"}".to_owned()))));
        assert_eq!(got[2], Ok(None));
    }

    #[test]
    fn garbage_names_its_line() {
        let got = read_all("{\"pid\": 1}\nend\nhello world\n");
        assert_eq!(got[1], Err((3, "expected a JSON object: \"hello world\"".to_owned())));
        let got = read_all("{\"command\":\"sync\"}\nmore\n");
        assert_eq!(got[0], Err((2, "expected \"end\" after a message, got \"more\"".to_owned())));
        let got = read_all("{\"command\":\"sync\"}\n");
        assert!(matches!(&got[0], Err((1, r)) if r.contains("no \"end\" line")), "{got:?}");
        let got = read_all("end\n");
        assert!(matches!(&got[0], Err((1, _))), "{got:?}");
    }
}
