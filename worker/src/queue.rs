//! The queues between a worker's threads: crossbeam channels whose receiver waits without
//! spinning.
//!
//! crossbeam's blocking receive spins and then calls `sched_yield` up to eight times before
//! it parks (twice over: once in the channel, once in its waiting context). An executor that
//! keeps up with its input finds its queue empty after every batch, so at partial load most
//! of its waits went through that loop: at half load a word count's threads made ~45,000
//! `sched_yield` calls a second each and spent a third of their CPU in them, on a machine
//! whose other threads needed the core. Here the receiver parks at once and the sender that
//! fills its queue unparks it (a [`Bell`]); the data still goes through the crossbeam
//! channel, and a full bounded queue still blocks its sender there (backpressure).
//!
//! Every sender rings the bell after a send and when it is dropped (so a receiver waiting on
//! a queue whose last sender went away sees it disconnected at once).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering, fence};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvTimeoutError, SendError, TryRecvError, TrySendError};

/// How a queue's receiver is woken: it says it is about to park, the sender that sees that
/// unparks it.
#[derive(Debug, Default)]
struct Bell {
    /// The receiver is parked, or about to park.
    waiting: AtomicBool,
    /// The thread that waits (set before `waiting`).
    thread: Mutex<Option<Thread>>,
    /// [`waiter_id`] of the thread in `thread` (0: none yet). The waiting thread checks it
    /// instead of taking the lock before each wait: a sender that rings holds the lock through
    /// its unpark (a system call), and a spout woken by acks from two bolts waited on that
    /// lock ~5% of its time at half load.
    owner: AtomicU64,
    /// When a ring last unparked the receiver ([`mono_ns`]), until the receiver runs again; 0
    /// while it runs or waits unwoken. A woken thread that has not run for a while waits for a
    /// core: what it was woken for may be run by a thread that has one (`BoltCell::help`). A
    /// hint only: a ring that raced the receiver's last look (it found the value and did not
    /// park) leaves it set until the receiver's next receive, and whoever acts on it takes the
    /// executor's lock first.
    woken_at: AtomicU64,
}

/// Nanoseconds on the monotonic clock since the first call in this process, at least 1 (0
/// means "not woken" in [`Bell::woken_at`]). Read only on a ring that unparks (a system call
/// anyway) and by a thread deciding whether to help.
fn mono_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    (epoch.elapsed().as_nanos() as u64).max(1)
}

/// This thread's id as a queue's waiter: unique in the process, never 0.
fn waiter_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    ID.with(|id| *id)
}

impl Bell {
    /// The receiver runs: it is no longer a woken thread waiting for a core.
    #[inline]
    fn running(&self) {
        if self.woken_at.load(Ordering::Relaxed) != 0 {
            self.woken_at.store(0, Ordering::Relaxed);
        }
    }

    /// Wakes the receiver if it waits. Called after a value was put in the channel: the fence
    /// pairs with the receiver's (one of the two sees the other's write), so a receiver that
    /// found the channel empty is either unparked here or finds the value when it looks again.
    fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) && self.waiting.swap(false, Ordering::AcqRel) {
            let thread = self.thread.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(t) = thread.as_ref() {
                self.woken_at.store(mono_ns(), Ordering::Relaxed);
                t.unpark();
            }
        }
    }
}

/// The sending side of a queue (cloned for every sender).
#[derive(Debug)]
pub(crate) struct QueueSender<T> {
    tx: crossbeam_channel::Sender<T>,
    bell: Arc<Bell>,
}

impl<T> Clone for QueueSender<T> {
    fn clone(&self) -> Self {
        QueueSender { tx: self.tx.clone(), bell: self.bell.clone() }
    }
}

impl<T> Drop for QueueSender<T> {
    fn drop(&mut self) {
        // The channel's sender goes first (the channel disconnects if it was the last), then
        // the receiver is woken to see that. The stand-in is a channel of its own.
        drop(std::mem::replace(&mut self.tx, crossbeam_channel::bounded(0).0));
        self.bell.ring();
    }
}

impl<T> QueueSender<T> {
    pub(crate) fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        self.tx.try_send(value)?;
        self.bell.ring();
        Ok(())
    }

    /// Blocks while a bounded queue is full.
    pub(crate) fn send(&self, value: T) -> Result<(), SendError<T>> {
        self.tx.send(value)?;
        self.bell.ring();
        Ok(())
    }

    pub(crate) fn len(&self) -> usize {
        self.tx.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.tx.is_empty()
    }

    pub(crate) fn same_channel(&self, other: &Self) -> bool {
        self.tx.same_channel(&other.tx)
    }

    /// What tells this queue from others in the process, the same on both of its sides
    /// ([`QueueReceiver::key`]) and never 0.
    #[inline]
    pub(crate) fn key(&self) -> usize {
        Arc::as_ptr(&self.bell) as usize
    }

    pub(crate) fn capacity(&self) -> Option<usize> {
        self.tx.capacity()
    }
}

/// The receiving side of a queue: one thread receives from it at a time.
#[derive(Debug)]
pub(crate) struct QueueReceiver<T> {
    rx: crossbeam_channel::Receiver<T>,
    bell: Arc<Bell>,
}

impl<T> QueueReceiver<T> {
    /// [`QueueSender::key`] of this queue's senders.
    pub(crate) fn key(&self) -> usize {
        Arc::as_ptr(&self.bell) as usize
    }

    pub(crate) fn try_recv(&self) -> Result<T, TryRecvError> {
        self.rx.try_recv()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }

    /// Whether a sender woke this queue's receiver at least `for_at_least` ago and it has not
    /// run since: its thread waits in a run queue for a core.
    pub(crate) fn woken_waiting(&self, for_at_least: Duration) -> bool {
        let at = self.bell.woken_at.load(Ordering::Relaxed);
        at != 0 && mono_ns().saturating_sub(at) >= for_at_least.as_nanos() as u64
    }

    /// For tests: says `thread` waits on this queue, as a receiver about to park does, so that
    /// the next send unparks it (a thread blocked elsewhere stays blocked: woken, not running).
    #[cfg(test)]
    pub(crate) fn pretend_waiting(&self, thread: Thread) {
        *self.bell.thread.lock().unwrap_or_else(PoisonError::into_inner) = Some(thread);
        self.bell.owner.store(u64::MAX, Ordering::Relaxed);
        self.bell.waiting.store(true, Ordering::SeqCst);
    }

    /// How many values are queued now.
    pub(crate) fn len(&self) -> usize {
        self.rx.len()
    }

    /// The values queued now, without waiting.
    #[cfg(test)]
    pub(crate) fn try_iter(&self) -> crossbeam_channel::TryIter<'_, T> {
        self.rx.try_iter()
    }

    /// Waits up to `timeout` for a value, parked (no spinning, no yielding) until a sender
    /// rings.
    pub(crate) fn recv_timeout(&self, timeout: Duration) -> Result<T, RecvTimeoutError> {
        match self.rx.try_recv() {
            Ok(v) => {
                // Running without a wait (a stamp left by a ring that raced its last look is
                // stale now).
                self.bell.running();
                return Ok(v);
            }
            Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) => {}
        }
        match self.park_until(timeout, || match self.rx.try_recv() {
            Err(TryRecvError::Empty) => None,
            got => Some(got),
        }) {
            Some(Ok(v)) => Ok(v),
            Some(Err(_)) => Err(RecvTimeoutError::Disconnected),
            None => Err(RecvTimeoutError::Timeout),
        }
    }

    /// Waits up to `timeout` until the queue holds a value, parked like [`Self::recv_timeout`],
    /// without taking it: the caller takes values while it holds the lock that orders them
    /// (a bolt executor's cell, `BoltCell`). True when a value is there, false at the timeout
    /// (a queue whose senders are gone stays empty: its receiver's owner is told to stop by
    /// other means, and takes the disconnection from `try_recv`).
    pub(crate) fn wait_timeout(&self, timeout: Duration) -> bool {
        if !self.rx.is_empty() {
            self.bell.running();
            return true;
        }
        self.park_until(timeout, || (!self.rx.is_empty()).then_some(())).is_some()
    }

    /// Parks this thread until `look` finds something (`Some`) or `timeout` passes (`None`):
    /// it says it waits before each look, so a sender's ring after the look unparks it.
    fn park_until<R>(&self, timeout: Duration, look: impl Fn() -> Option<R>) -> Option<R> {
        let deadline = Instant::now() + timeout;
        let me = waiter_id();
        if self.bell.owner.load(Ordering::Relaxed) != me {
            // A first wait, or the receiver moved to another thread: say which thread to wake.
            *self.bell.thread.lock().unwrap_or_else(PoisonError::into_inner) = Some(std::thread::current());
            self.bell.owner.store(me, Ordering::Relaxed);
        }
        loop {
            self.bell.waiting.store(true, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            let found = look();
            let now = Instant::now();
            if found.is_some() || now >= deadline {
                self.bell.waiting.store(false, Ordering::Relaxed);
                self.bell.running();
                return found;
            }
            std::thread::park_timeout(deadline - now);
            self.bell.running();
        }
    }

    /// The channel itself, for `crossbeam_channel::Select` (whose wait spins as crossbeam's
    /// does; senders wake it through the channel).
    pub(crate) fn channel(&self) -> &crossbeam_channel::Receiver<T> {
        &self.rx
    }
}

/// A queue holding at most `capacity` values.
pub(crate) fn bounded<T>(capacity: usize) -> (QueueSender<T>, QueueReceiver<T>) {
    wrap(crossbeam_channel::bounded(capacity))
}

/// A queue without a bound.
pub(crate) fn unbounded<T>() -> (QueueSender<T>, QueueReceiver<T>) {
    wrap(crossbeam_channel::unbounded())
}

fn wrap<T>(
    (tx, rx): (crossbeam_channel::Sender<T>, crossbeam_channel::Receiver<T>),
) -> (QueueSender<T>, QueueReceiver<T>) {
    let bell = Arc::new(Bell::default());
    (QueueSender { tx, bell: bell.clone() }, QueueReceiver { rx, bell })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receiver parked on an empty queue is woken by a send from another thread, every
    /// time: 20,000 values handed one at a time to a thread that finds the queue empty
    /// before nearly every one, none lost or waited out (a lost wake-up would cost the
    /// receive its 10 s timeout and fail it).
    #[test]
    fn a_parked_receiver_is_woken_by_every_send() {
        let (tx, rx) = bounded::<u32>(1);
        let (back_tx, back_rx) = unbounded::<u32>();
        let n = 20_000;
        let echo = std::thread::spawn(move || {
            for _ in 0..n {
                let v = rx.recv_timeout(Duration::from_secs(10)).expect("woken by the send");
                back_tx.send(v).expect("the test waits");
            }
        });
        for i in 0..n {
            tx.send(i).expect("the echo thread receives");
            // Ping-pong: the echo thread is parked again (or about to) before the next send.
            assert_eq!(back_rx.recv_timeout(Duration::from_secs(10)), Ok(i));
        }
        echo.join().expect("echo thread");
    }

    /// `wait_timeout` takes nothing: it times out on an empty queue, returns at once when a
    /// value is there, and a parked waiter is woken by every send (2,000 values handed one at
    /// a time; a lost wake-up would cost its 10 s timeout and fail it).
    #[test]
    fn a_waiter_is_woken_by_every_send_and_leaves_the_value() {
        let (tx, rx) = bounded::<u32>(1);
        let t = Instant::now();
        assert!(!rx.wait_timeout(Duration::from_millis(30)));
        assert!(t.elapsed() >= Duration::from_millis(30));
        tx.send(7).expect("room");
        assert!(rx.wait_timeout(Duration::from_secs(10)));
        assert!(rx.wait_timeout(Duration::from_secs(10)), "the value is still there");
        assert_eq!(rx.try_recv(), Ok(7));
        let (back_tx, back_rx) = unbounded::<u32>();
        let n = 2_000;
        let echo = std::thread::spawn(move || {
            for _ in 0..n {
                assert!(rx.wait_timeout(Duration::from_secs(10)), "woken by the send");
                back_tx.send(rx.try_recv().expect("the value waited for")).expect("the test waits");
            }
        });
        for i in 0..n {
            tx.send(i).expect("the echo thread takes");
            assert_eq!(back_rx.recv_timeout(Duration::from_secs(10)), Ok(i));
        }
        echo.join().expect("echo thread");
    }

    /// A receiver that moves to another thread is woken there: the bell wakes the thread
    /// that waits now, not the one that waited first (a lost wake-up would cost the receive
    /// its 10 s timeout, and fail it).
    #[test]
    fn a_receiver_moved_to_another_thread_is_woken_there() {
        let (tx, mut rx) = bounded::<u32>(1);
        for i in 0..20 {
            let waiter = std::thread::spawn(move || {
                let t = Instant::now();
                assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(i));
                assert!(t.elapsed() < Duration::from_secs(5), "woken by the send, not the timeout");
                rx
            });
            // The send comes once the new thread says it waits.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !tx.bell.waiting.load(Ordering::Relaxed) && Instant::now() < deadline {
                std::thread::yield_now();
            }
            tx.send(i).expect("the waiter receives");
            rx = waiter.join().expect("waiter");
        }
    }

    /// A ring that unparks the receiver marks it woken until it runs: seen after the wake-up
    /// (not before), and not once the receiver waited again; a send while nobody waits marks
    /// nothing.
    #[test]
    fn a_receiver_woken_and_not_yet_running_is_seen_waiting() {
        let (tx, rx) = bounded::<u32>(4);
        tx.send(1).expect("room");
        assert!(!rx.woken_waiting(Duration::ZERO), "nobody waited: no wake-up");
        assert_eq!(rx.try_recv(), Ok(1));
        // This thread says it waits (and does not park: it stands for one woken, not running).
        rx.pretend_waiting(std::thread::current());
        assert!(!rx.woken_waiting(Duration::ZERO));
        tx.send(2).expect("room");
        assert!(rx.woken_waiting(Duration::ZERO));
        assert!(!rx.woken_waiting(Duration::from_secs(3600)), "woken just now");
        assert_eq!(rx.try_recv(), Ok(2));
        // The receiver waits again (it ran): no longer a woken thread without a core.
        assert!(!rx.wait_timeout(Duration::from_millis(5)));
        assert!(!rx.woken_waiting(Duration::ZERO));
    }

    /// A receive on an empty queue times out after its timeout, and one whose last sender
    /// is gone reports the disconnection, also while it waits.
    #[test]
    fn timeouts_and_disconnection() {
        let (tx, rx) = unbounded::<u32>();
        let t = Instant::now();
        assert_eq!(rx.recv_timeout(Duration::from_millis(30)), Err(RecvTimeoutError::Timeout));
        assert!(t.elapsed() >= Duration::from_millis(30));
        let clone = tx.clone();
        drop(tx);
        // The new thread starts after the receiver parked, most of the time (either order
        // must work).
        let dropper = std::thread::spawn(move || drop(clone));
        let t = Instant::now();
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Err(RecvTimeoutError::Disconnected));
        assert!(t.elapsed() < Duration::from_secs(5), "woken by the last sender's drop, not the timeout");
        dropper.join().expect("dropper");
    }
}
