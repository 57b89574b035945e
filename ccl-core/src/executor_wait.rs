//! Waiting in the host executor: the spin budget (`CCLD_SPIN_US`), the CPU check that
//! turns spinning off while a peer shares this rank's CPU, and the current-collective
//! words each rank publishes (descriptor and CPU).

use std::sync::atomic::Ordering;
use std::time::Duration;

use probe::Frame;

use super::Worker;
use crate::error::Result;
use crate::transport::shm::Backoff;

/// `CCLD_SPIN_US`: how long (microseconds) an executor waiting for a peer spins before it
/// yields and then sleeps. Default: [`DEFAULT_SPIN_US`] when each rank has a core of its
/// own ([`default_spin_us`]), 0 otherwise (oversubscribed: a spinning rank takes the core
/// its peer needs, so it yields at once, for [`ENV_YIELD_US`]).
pub(crate) const ENV_SPIN_US: &ccl_params::Param = &ccl_params::CCLD_SPIN_US;

/// `CCLD_YIELD_US`: how long an executor that does not spin (no spin budget, or a peer on
/// its CPU) yields its core between polls before it sleeps on its doorbell.
pub(crate) const ENV_YIELD_US: &ccl_params::Param = &ccl_params::CCLD_YIELD_US;

/// Default of [`ENV_YIELD_US`]. Measured on the 2-core development VM (small AllReduce,
/// ranks as processes, alternating runs, docs/performance.md): 8 B at 4 ranks median 17.2
/// -> 7.2 us, 8 ranks 42-54 -> 22-37 us per operation, against sleeping after 8 yields.
pub(crate) const DEFAULT_YIELD_US: u64 = 1000;

/// Default of [`ENV_SPIN_US`] on a communicator whose ranks fit the cores.
pub(crate) const DEFAULT_SPIN_US: u64 = 200;

impl Worker {
    /// The back-off of a new wait: spin for the spin budget when there is one, else
    /// yield for the yield budget.
    pub(super) fn backoff(&self) -> Backoff {
        if self.spin.is_zero() {
            Backoff::with_yield(self.yield_for)
        } else {
            Backoff::with_spin(self.spin)
        }
    }

    /// The socket driver of an operation whose largest message has `message_bytes`
    /// ([`SocketDriver::new`]). One that does not drive hands the sockets back at once: a
    /// lease left by an earlier job ([`crate::channel::Transport::settle_sockets`]) would
    /// otherwise keep the proxy thread asleep while this operation waits on it.
    pub(super) fn socket_driver(&self, message_bytes: usize) -> SocketDriver {
        let d = SocketDriver::new(message_bytes);
        if !d.on {
            self.t.release_sockets();
        }
        d
    }

    /// Whether a peer published (at the start of its current operation) the CPU this rank
    /// runs on: then the peer can only run when this rank gives the CPU up, and spinning
    /// would delay it by the whole spin budget.
    pub(super) fn peer_on_my_cpu(&self) -> bool {
        // SAFETY: sched_getcpu takes no arguments and only reads per-thread state.
        let me = unsafe { libc::sched_getcpu() };
        if me < 0 {
            return false;
        }
        self.t
            .peer_current
            .iter()
            .flatten()
            .any(|w| w[3].get().load(Ordering::Relaxed) == me as u64 + 1)
    }
}

/// The spin budget of a rank whose machine runs `ranks_here` ranks of its communicator
/// (itself included), with a socket proxy thread each (`proxy`) or not.
pub(super) fn spin_budget(ranks_here: usize, proxy: bool) -> Result<Duration> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let us = crate::env::u64_or(ENV_SPIN_US, default_spin_us(ranks_here, proxy, cores))?;
    Ok(Duration::from_micros(us.min(10_000_000)))
}

/// The yield budget (`CCLD_YIELD_US`, at most 10 s).
pub(super) fn yield_budget() -> Result<Duration> {
    let us = crate::env::u64_or(ENV_YIELD_US, DEFAULT_YIELD_US)?;
    Ok(Duration::from_micros(us.min(10_000_000)))
}

/// Default of `CCLD_SPIN_US` (pure): [`DEFAULT_SPIN_US`] when the threads of this machine
/// that wait for each other (its `ranks_here` ranks of the communicator, and their socket
/// proxies) fit the `cores` this process may run on, or when the process is bound to one
/// CPU and has no proxy thread: a launcher that binds ranks to cores (`ccl-run`, `mpirun
/// --bind-to core`, srun's `--cpu-bind`) gives each rank a core of its own, and a peer
/// bound to the same CPU still turns spinning off at the first wait of every operation
/// (`peer_on_my_cpu`). 0 otherwise. Ranks on other machines do not count: they spin on
/// their own cores.
pub(super) fn default_spin_us(ranks_here: usize, proxy: bool, cores: usize) -> u64 {
    let busy = ranks_here * if proxy { 2 } else { 1 };
    if busy <= cores || (cores == 1 && !proxy) {
        DEFAULT_SPIN_US
    } else {
        0
    }
}

/// Publishes the descriptor of the collective this rank starts (`None`: not a
/// collective) in its current-collective words ([`crate::transport::current`]), and the
/// CPU it runs on. See [`read_current`].
pub(super) fn publish_current(
    w: &[crate::transport::shm::SharedWord; 4],
    d: Option<[u64; crate::transport::shm::FifoLayout::DESC_WORDS]>,
) {
    // SAFETY: sched_getcpu takes no arguments and only reads per-thread state.
    let cpu = unsafe { libc::sched_getcpu() };
    // Word 3: the CPU this rank runs on, plus one (0: unknown), for `peer_on_my_cpu`.
    w[3].get()
        .store(u64::try_from(cpu).map_or(0, |c| c + 1), Ordering::Relaxed);
    let d = d.unwrap_or([u64::MAX, 0, 0]);
    crate::transport::current::store(w, [d[0].wrapping_add(1), d[1], d[2]]);
}

/// A peer's published current-collective descriptor, `None` while it is being rewritten
/// or when the peer runs no collective.
pub(crate) fn read_current(
    w: &[crate::transport::shm::SharedWord; 4],
) -> Option<[u64; crate::transport::shm::FifoLayout::DESC_WORDS]> {
    crate::transport::current::load(w).map(|[s, a, b]| [s.wrapping_sub(1), a, b])
}

/// A waiting executor's share of the socket work ([`crate::channel::Transport::drive_sockets`]).
/// For an operation of messages up to [`SocketDriver::MAX_MESSAGE`] (every message with
/// the default `NCCL_BUFFSIZE`) it runs the socket proxy's rounds itself while they move
/// something: a message is sent and seen without waking a second thread. After a number
/// of fruitless rounds in a row ([`SocketDriver::IDLE`], or [`SocketDriver::IDLE_LARGE`]
/// for messages from [`SocketDriver::LARGE_MESSAGE`]) it hands the sockets back to the
/// proxy thread (which then sleeps in `poll` on them and rings this rank's doorbell) until
/// the wait makes progress again, so that a long wait for a peer without a CPU costs the
/// same yields as without sockets. Operations of larger messages (a larger `NCCL_BUFFSIZE`)
/// leave the sockets to the proxy thread, which sends and receives one message while the
/// executor copies or reduces the next. Measured on the 2-core machine over veth
/// (docs/perf-net.md, 2026-12-06): driving messages of up to 128 KiB instead of 64 KiB
/// took 0.64-0.81x the time from 128 KiB to 16 MiB with 2 hosts, and was neutral with 4
/// hosts and with 2 hosts x 2 ranks (when the proxy's hand-back woke its thread at every
/// job's end, driving large transfers had been neutral with 2 hosts and 0.8-0.9x with 4).
pub(super) struct SocketDriver {
    /// Whether this operation's waits drive the sockets at all.
    on: bool,
    /// Fruitless rounds in a row before the hand-back ([`SocketDriver::IDLE`] or
    /// [`SocketDriver::IDLE_LARGE`]).
    idle: u32,
    fruitless: u32,
}

impl SocketDriver {
    /// Fruitless rounds before the executor stops driving, for an operation of small
    /// messages (the proxy thread's own idle budget, `IDLE_YIELDS` in the proxy).
    pub(super) const IDLE: u32 = 64;
    /// The same for an operation whose largest message has [`SocketDriver::LARGE_MESSAGE`]
    /// bytes or more. Such a wait is for the rest of a message already on its way: handing
    /// back after 64 rounds (a few hundred microseconds of polls and yields) woke the
    /// proxy thread at nearly every wait of a 1 MiB AllReduce, a second busy thread on a
    /// CPU the partner needed. With 512 (in effect: drive until the yield budget ends and
    /// the executor parks, which hands back too) a 2-host x 1-rank AllReduce took 0.78x
    /// the time at 1 MiB (22 of 30 paired rounds faster; 0.79x, 33 of 40, with 512 for
    /// every size, which gave 0.88x at 256 KiB and 0.94x at 4 MiB), and 0.89x at 1 MiB
    /// with 4 hosts (12 of 20); at 2 hosts x 2 ranks only 22 of 54 rounds were faster, a
    /// possible small cost there (docs/perf-net.md, 2026-12-07).
    pub(super) const IDLE_LARGE: u32 = 512;
    /// The smallest message that counts as large for [`SocketDriver::IDLE_LARGE`]. Below
    /// it (latency-bound operations, whose waits are for a peer to get a CPU) the budget
    /// stays [`SocketDriver::IDLE`]: 512 there was neutral at 2 hosts and 1.07x the time
    /// at 8 B with 4 hosts.
    pub(super) const LARGE_MESSAGE: usize = 64 << 10;
    /// The largest message of an operation whose waits drive the sockets: one FIFO slot
    /// of the default `NCCL_BUFFSIZE` (1 MiB in 8 slots).
    pub(super) const MAX_MESSAGE: usize = 128 << 10;

    /// The driver of an operation whose largest message has `message_bytes` (pure;
    /// `usize::MAX` for a communicator without sockets).
    pub(super) fn new(message_bytes: usize) -> SocketDriver {
        SocketDriver {
            on: message_bytes <= Self::MAX_MESSAGE,
            idle: if message_bytes >= Self::LARGE_MESSAGE {
                Self::IDLE_LARGE
            } else {
                Self::IDLE
            },
            fruitless: 0,
        }
    }

    /// Runs one proxy round on this thread, unless this wait does not drive; whether it
    /// moved anything (then the caller polls again at once).
    pub(super) fn drive(&mut self, t: &crate::channel::Transport) -> bool {
        self.step(|| t.drive_sockets(), || t.release_sockets())
    }

    /// [`SocketDriver::drive`] with the round and the hand-back as arguments (pure logic).
    fn step(&mut self, round: impl FnOnce() -> bool, hand_back: impl FnOnce()) -> bool {
        if !self.on || self.fruitless >= self.idle {
            return false;
        }
        if round() {
            self.fruitless = 0;
            return true;
        }
        self.fruitless += 1;
        if self.fruitless == self.idle {
            hand_back();
        }
        false
    }

    /// The wait made progress: drive again at its next poll (if this operation drives).
    pub(super) fn progressed(&mut self) {
        self.fruitless = 0;
    }

    /// Puts what this rank just committed on a remote link onto the sockets at once (one
    /// proxy round on this thread), if this operation drives and has not handed the
    /// sockets back. While a drive's lease runs, the proxy thread sleeps on its eventfd
    /// and a commit does not wake it: without this, a message committed when the
    /// partner's message was already there would leave only after this rank reduced that
    /// one, at the job's end ([`crate::channel::Transport::settle_sockets`]).
    pub(super) fn flush(&mut self, t: &crate::channel::Transport) {
        self.step_flush(|| t.drive_sockets());
    }

    /// [`SocketDriver::flush`] with the round as an argument (pure logic).
    fn step_flush(&mut self, round: impl FnOnce() -> bool) {
        if self.on && self.fruitless < self.idle && round() {
            self.fruitless = 0;
        }
    }
}

/// Outcome of one attempt to run a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wait {
    /// The step ran.
    None,
    /// No inbound message yet: waiting for the upstream peer.
    Upstream,
    /// No free outbound slot (or the link is throttled): waiting for the downstream peer.
    Downstream,
}

/// Wait-time accounting of one operation (frame extension slots). A wait episode runs from
/// the first snooze after progress to the next progress; it is timed from its SECOND snooze
/// on (none for the one-spin waits of a streaming ring: what the diagnosis needs are the
/// long waits behind a slow peer) and charged, when progress resumes, to the channels of
/// the lanes blocked at the last snooze, by wait reason. One clock read per episode: its
/// start is the time the executor read for its peer check just before the snooze.
#[derive(Default)]
pub(super) struct WaitEpisode {
    snoozes: u32,
    /// [`super::now_ns`] clock.
    since: Option<u64>,
    blocked: Vec<(usize, Wait)>,
}

impl WaitEpisode {
    /// Called before each snooze at `now` with the lanes' (channel, wait reason).
    pub(super) fn snoozing(&mut self, now: u64, lanes: impl Iterator<Item = (usize, Wait)>) {
        self.snoozes += 1;
        if self.snoozes == 2 {
            self.since = Some(now);
        }
        if self.snoozes >= 2 {
            self.blocked.clear();
            self.blocked.extend(lanes.filter(|(_, w)| *w != Wait::None));
        }
    }

    /// Progress resumed: adds the episode's time to the frame's wait slots of `block`.
    pub(super) fn charge(&mut self, frame: &Frame, block: usize) {
        self.snoozes = 0;
        let Some(t0) = self.since.take() else { return };
        let ns = super::now_ns().saturating_sub(t0);
        for &(ch, w) in &self.blocked {
            match w {
                Wait::Upstream => frame.add_wait_upstream(block, ch, ns),
                Wait::Downstream => frame.add_wait_downstream(block, ch, ns),
                Wait::None => {}
            }
        }
    }
}

/// When an executor waiting without progress next checks its peers
/// ([`Worker::check_peers`]).
pub(super) struct PeerCheck {
    /// Due time, [`super::now_ns`] clock.
    pub(super) next: u64,
    pub(super) every: u64,
    /// A peer was seen gone at the last check; the next pass without progress checks
    /// again at once.
    pub(super) suspect: bool,
}

impl PeerCheck {
    /// Checks every `every` from `start_ns` ([`super::now_ns`] clock).
    pub(super) fn new(start_ns: u64, every: Duration) -> PeerCheck {
        let every = u64::try_from(every.as_nanos()).unwrap_or(u64::MAX);
        PeerCheck {
            next: start_ns.saturating_add(every),
            every,
            suspect: false,
        }
    }

    /// Checks every `every` once armed ([`PeerCheck::arm`]): for an operation whose start
    /// time is read later (a Tree operation's deferred start).
    pub(super) fn unarmed(every: Duration) -> PeerCheck {
        let mut c = PeerCheck::new(0, every);
        c.next = u64::MAX;
        c
    }

    /// Arms an unarmed check with the operation's start time (no effect once armed).
    pub(super) fn arm(&mut self, start_ns: u64) {
        if self.next == u64::MAX {
            self.next = start_ns.saturating_add(self.every);
        }
    }

    /// The operation moved on: a peer seen gone may have left its last messages.
    pub(super) fn progressed(&mut self) {
        self.suspect = false;
    }
}

#[cfg(test)]
mod tests {
    use super::{default_spin_us, PeerCheck, SocketDriver, DEFAULT_SPIN_US};
    use std::cell::Cell;

    /// Calls `step` `n` times with a round that reports `moved`; (rounds run, hand-backs).
    fn steps(d: &mut SocketDriver, n: u32, moved: bool) -> (u32, u32) {
        let (rounds, backs) = (Cell::new(0), Cell::new(0));
        for _ in 0..n {
            let before = rounds.get();
            let r = d.step(
                || {
                    rounds.set(rounds.get() + 1);
                    moved
                },
                || backs.set(backs.get() + 1),
            );
            let ran = rounds.get() > before;
            assert_eq!(
                r,
                ran && moved,
                "a step reports whether its round moved anything"
            );
        }
        (rounds.get(), backs.get())
    }

    #[test]
    fn an_unarmed_peer_check_is_never_due_until_armed_with_the_start_time() {
        let every = std::time::Duration::from_millis(200);
        let mut c = PeerCheck::unarmed(every);
        assert_eq!(c.next, u64::MAX, "not due at any time before it is armed");
        c.arm(1_000);
        assert_eq!(c.next, 1_000 + 200_000_000);
        // Armed once: a later arm (the same operation) keeps the first start.
        c.arm(5_000);
        assert_eq!(c.next, 1_000 + 200_000_000);
        assert_eq!(c.next, PeerCheck::new(1_000, every).next);
    }

    #[test]
    fn a_waiting_executor_drives_small_messages_until_idle_and_hands_back_once() {
        let mut d = SocketDriver::new(SocketDriver::LARGE_MESSAGE - 1);
        // Productive rounds never stop it.
        assert_eq!(steps(&mut d, 500, true), (500, 0));
        // IDLE fruitless rounds in a row: the last hands the sockets back, then no rounds.
        assert_eq!(
            steps(&mut d, SocketDriver::IDLE - 1, false),
            (SocketDriver::IDLE - 1, 0)
        );
        assert_eq!(steps(&mut d, 1, false), (1, 1));
        assert_eq!(steps(&mut d, 100, false), (0, 0));
        // Progress of the wait: it drives again, and counts afresh.
        d.progressed();
        assert_eq!(
            steps(&mut d, SocketDriver::IDLE, false),
            (SocketDriver::IDLE, 1)
        );
    }

    #[test]
    fn a_flush_runs_a_round_only_while_the_operation_drives() {
        let flushes = |d: &mut SocketDriver, moved: bool| {
            let ran = Cell::new(false);
            d.step_flush(|| {
                ran.set(true);
                moved
            });
            ran.get()
        };
        let mut d = SocketDriver::new(SocketDriver::LARGE_MESSAGE - 1);
        assert!(flushes(&mut d, false));
        // A flush that moved something counts as progress: IDLE more rounds before the
        // hand-back.
        steps(&mut d, SocketDriver::IDLE - 1, false);
        assert!(flushes(&mut d, true));
        assert_eq!(steps(&mut d, SocketDriver::IDLE - 1, false).1, 0);
        // Handed back: the proxy thread has the sockets, a flush leaves them alone.
        assert_eq!(steps(&mut d, 1, false).1, 1);
        assert!(!flushes(&mut d, true));
        // Large messages never drive, nor flush.
        let mut big = SocketDriver::new(SocketDriver::MAX_MESSAGE + 1);
        assert!(!flushes(&mut big, true));
    }

    #[test]
    fn large_messages_that_drive_hand_back_after_the_larger_budget() {
        // The budget is chosen by the operation's largest message, at LARGE_MESSAGE.
        for (bytes, idle) in [
            (SocketDriver::LARGE_MESSAGE - 1, SocketDriver::IDLE),
            (SocketDriver::LARGE_MESSAGE, SocketDriver::IDLE_LARGE),
            (SocketDriver::MAX_MESSAGE, SocketDriver::IDLE_LARGE),
        ] {
            let mut d = SocketDriver::new(bytes);
            assert_eq!(steps(&mut d, idle - 1, false), (idle - 1, 0), "{bytes} B");
            assert_eq!(steps(&mut d, 1, false), (1, 1), "{bytes} B: hands back");
            assert_eq!(
                steps(&mut d, 10, false),
                (0, 0),
                "{bytes} B: then no rounds"
            );
        }
    }

    #[test]
    fn operations_of_large_messages_leave_the_sockets_to_the_proxy_thread() {
        let mut d = SocketDriver::new(SocketDriver::MAX_MESSAGE + 1);
        assert_eq!(steps(&mut d, 100, true), (0, 0));
        d.progressed();
        assert_eq!(steps(&mut d, 100, true), (0, 0));
    }

    #[test]
    fn ranks_spin_when_each_has_a_core_bound_or_not() {
        // Unbound: the ranks (and proxies) must fit the process's cores.
        assert_eq!(default_spin_us(2, false, 2), DEFAULT_SPIN_US);
        assert_eq!(default_spin_us(4, false, 2), 0);
        assert_eq!(default_spin_us(2, true, 2), 0);
        assert_eq!(default_spin_us(2, true, 4), DEFAULT_SPIN_US);
        // Bound to one CPU by a launcher: a core of its own, unless a proxy shares it.
        assert_eq!(default_spin_us(8, false, 1), DEFAULT_SPIN_US);
        assert_eq!(default_spin_us(8, true, 1), 0);
        // 8 ranks with proxies on each 64-core machine of a 16-machine job: the count is
        // this machine's ranks (`Bootstrap::ranks_on_this_machine`), not the job's 128.
        assert_eq!(default_spin_us(8, true, 64), DEFAULT_SPIN_US);
        assert_eq!(default_spin_us(33, true, 64), 0);
    }
}
