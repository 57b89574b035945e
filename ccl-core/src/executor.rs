//! The host "kernel": the executor of a communicator runs its operations, progressing all
//! lanes (channels x links) of the current operation in one non-blocking loop over the
//! shared-memory FIFOs, updating the probe as it goes. Every communicator has a worker
//! thread; a batch that involves several communicators (a group) is submitted to all their
//! workers before any is waited for, so they run concurrently. A batch that involves only
//! one communicator (an operation outside a group, or a group on one communicator) runs
//! the same executor inline on the calling thread, which saves two thread hand-offs per
//! operation. The executor state sits behind a mutex, so operations of one communicator
//! never overlap whichever thread runs them.
//!
//! Waiting: the worker reads its doorbell, polls every lane, and when nothing progressed
//! snoozes on the doorbell (spin, yield, then timed futex parks of at most
//! `Backoff::MAX_PARK` = 5 ms). Peers ring our doorbell when they commit into or release
//! from a FIFO we use; `Comm::abort` rings it too. While idle in an operation the worker
//! checks the abort flag on every wake-up (so an abort ends a blocked operation within a few
//! milliseconds) and the liveness of the peers' processes every `CCLD_PEER_CHECK_MS`
//! (default 200 ms): a dead peer fails the operation with
//! `Remote("rank N (pid P) exited")` within `CCLD_PEER_CHECK_MS + 5 ms`.

use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccl_optype::CollKind;
use probe::{Frame, OpLog};

use crate::bootstrap::Bootstrap;
use crate::channel::Transport;
use crate::error::with_context;
use crate::error::{CclError, Result};
use crate::hostalgo::{HostAlgo, HostProto, Selection};
use crate::op::{plan_for, CollOp, RedSpec, ScalarArg, WorkItem};
use crate::reduce::Reducer;
use crate::schedule::Tuning;
use crate::schedule::{self, Lane, LinkKind, LocalKind, Plan, StepKind};
use crate::transport::shm::Backoff;
use crate::types::{DataType, RedOpKind};

/// Completion of a submitted job, waited on by `group_end`.
#[derive(Debug, Default)]
pub(crate) struct Completion {
    /// `(finished, result not yet taken)`.
    state: Mutex<(bool, Option<Result<()>>)>,
    cv: Condvar,
}

impl Completion {
    /// Records the result (the first one wins).
    fn set(&self, r: Result<()>) {
        let mut g = self.state.lock();
        if !g.0 {
            *g = (true, Some(r));
            self.cv.notify_all();
        }
    }

    /// Blocks until the job finished.
    pub(crate) fn wait(&self) -> Result<()> {
        let mut g = self.state.lock();
        loop {
            if g.0 {
                return g.1.take().unwrap_or(Ok(()));
            }
            self.cv.wait(&mut g);
        }
    }
}

/// A batch of work for one communicator. A job dropped without a result (its worker died)
/// completes with an internal error, so `group_end` never waits forever.
#[derive(Debug)]
pub(crate) struct Job {
    pub items: Vec<WorkItem>,
    pub done: Arc<Completion>,
}

impl Drop for Job {
    fn drop(&mut self) {
        self.done.set(Err(CclError::Internal(
            "the communicator's worker stopped before running this operation".into(),
        )));
    }
}

/// State shared between a communicator and its worker.
#[derive(Debug)]
pub(crate) struct Shared {
    pub rank: usize,
    pub nranks: usize,
    pub comm_id: u64,
    pub tuning: Tuning,
    pub abort: Arc<AtomicBool>,
    pub frame: Arc<Frame>,
    pub op_log: Arc<OpLog>,
    pub probe_on: bool,
    /// Operations started so far (the next operation's counter).
    pub op_counter: Arc<AtomicU64>,
    /// Faults to inject (`CCLD_INJECT`), `None` in normal runs.
    pub inject: Option<Arc<crate::inject::Injection>>,
    /// Registration with the diagnostic thread (`None` when probing or the thread is off);
    /// dropped with the worker, which unregisters the rank.
    pub source: Option<Arc<probe::Source>>,
}

/// Monotonic nanoseconds since the first call in this process (the probe's clock, so that
/// the diagnostic thread can age in-flight operations).
pub(crate) fn now_ns() -> u64 {
    probe::now_ns()
}

#[path = "executor_mem.rs"]
mod mem;

/// Executor state of one communicator (its FIFOs, scratch space, broken flag).
#[derive(Debug)]
pub(crate) struct Worker {
    shared: Shared,
    boot: Arc<Bootstrap>,
    t: Transport,
    broken: Option<CclError>,
    scratch: Vec<u8>,
    /// An injected h2 fault made this rank issue a different operation: it issues no more.
    diverged: bool,
    /// Collective and per-pair p2p sequence numbers (the descriptors' `seq`).
    seqs: crate::desc::SeqState,
    /// Why the current operation failed, for the probe (set where the error arises).
    failure: Option<probe::Failure>,
    /// How long a waiting operation spins before yielding ([`spin_budget`]); no spinning
    /// while a peer last ran on this rank's CPU ([`Worker::spin_now`]).
    spin: Duration,
    /// How long a waiting operation that does not spin yields before it sleeps
    /// ([`yield_budget`]).
    yield_for: Duration,
    /// `NCCL_ALGO` / `NCCL_PROTO` ([`crate::hostalgo`]).
    sel: Selection,
    /// This rank's Tree steps ([`crate::tree::steps`]), computed once.
    tree_steps: Vec<crate::tree::TreeStep>,
    /// Messages this rank sends and receives in one pass of `tree_steps`.
    tree_msgs: (u64, u64),
    /// Second scratch buffer (Tree merges with the partial of a lower rank first).
    scratch2: Vec<u8>,
    /// The reducer of the last built-in reduction run, with its data type and operator:
    /// a loop of identical calls builds it once ([`Worker::reducer`]).
    last_reducer: Option<(DataType, RedOpKind, Reducer)>,
    /// The wire-time counters of the Tree's inbound messages, by sending peer, over
    /// sockets (looked up at the first probed Tree operation; empty without socket peers),
    /// and their values at the current operation's start (`executor_tree.rs`).
    tree_wire: Option<Vec<(u32, Arc<AtomicU64>)>>,
    tree_wire_start: Vec<u64>,
    /// The current operation's inbound wire time by sending peer, for its completion
    /// record ([`probe::Source::op_done_wire`]); cleared at its end.
    peer_wire: Vec<probe::PeerWire>,
    /// A Tree operation's start, until its first message is sent
    /// ([`Worker::start_pending`]).
    pending: Option<PendingStart>,
    /// The current operation's counter, start time and frame block
    /// ([`Worker::begin_item`]).
    cur: OpStart,
    /// Whether the current operation's end is read from the clock (`Source::start_op`).
    probe_timed: bool,
    /// Messages to peers on other hosts sent from the operation's buffers, not yet written
    /// (`executor_byref.rs`).
    byref: ByRef,
}

/// The state of one lane being run.
struct LaneRun<'p> {
    lane: &'p Lane,
    pos: usize,
    /// Steps this lane runs (the lane's length, or less under injected faults).
    end: usize,
    /// Steps after which the lane stalls forever (injected H3).
    stall_at: Option<usize>,
    /// Why the lane could not run its next step in the last pass.
    wait: Wait,
}

impl LaneRun<'_> {
    /// The peer this lane is blocked on, if it is.
    fn waits_on(&self) -> Option<usize> {
        match self.wait {
            Wait::None => None,
            Wait::Upstream => self.lane.recv_from,
            Wait::Downstream => self.lane.send_to,
        }
    }
}

/// Per-channel send throttle of an injected S2/S3 fault.
struct Throttle {
    gap: Duration,
    link: Option<usize>,
    next: Vec<Option<Instant>>,
}

/// Everything a step needs besides the FIFOs.
struct OpCtx<'a> {
    bufs: &'a [usize],
    unit: usize,
    red: Option<&'a Reducer>,
    block: Option<usize>,
    frame: &'a Frame,
    /// Descriptor words by buffer index ([`crate::desc::descriptors`]).
    descs: &'a [[u64; crate::transport::shm::FifoLayout::DESC_WORDS]],
    /// Whether descriptors are sent and checked (always, except in the cost benchmark).
    check: bool,
}

/// How long an injected not-entered rank sleeps between abort checks.
const NOT_ENTERED_POLL: Duration = Duration::from_millis(10);

fn is_fatal(e: &CclError) -> bool {
    !matches!(
        e,
        CclError::InvalidArgument(_) | CclError::InvalidUsage(_) | CclError::InProgress
    )
}

impl Worker {
    fn run_job(&mut self, items: &[WorkItem]) -> Result<()> {
        let r = self.run_items(items);
        // A failed operation may have left messages sent by reference unwritten: the
        // proxy must not read the user's buffers once the error is returned.
        self.byref.revoke(&self.t);
        // Whatever the job's waits drove of the socket proxy, its thread takes over: at
        // once after a failure, else when the lease runs out (or at once where bytes are
        // left to write), so that a loop of small operations does not wake it per job.
        if r.is_ok() {
            self.t.settle_sockets();
        } else {
            self.t.release_sockets();
        }
        r
    }

    fn run_items(&mut self, items: &[WorkItem]) -> Result<()> {
        for item in items {
            if let Some(e) = &self.broken {
                return Err(with_context(
                    e.clone(),
                    &format!("{}: communicator is broken", item.label()),
                ));
            }
            if let Err(e) = self.run_item(item) {
                let e = with_context(e, &item.label());
                if is_fatal(&e) || crate::desc::breaks_comm(&e) {
                    self.broken = Some(e.clone());
                }
                return Err(e);
            }
        }
        Ok(())
    }

    fn run_item(&mut self, item: &WorkItem) -> Result<()> {
        let sh = &self.shared;
        // Injected faults act on ring schedules: operations of a run with CCLD_INJECT keep
        // to Ring/Simple.
        let (algo, proto) = host_choice(
            item,
            sh.nranks,
            &sh.tuning,
            &self.sel,
            sh.inject.is_some(),
            self.t.uses_sockets(),
        );
        // Probing can be paused at run time (`Comm::set_probing`): decided once per operation.
        let probing = sh.probe_on && sh.frame.is_measuring();
        match (algo, item) {
            (
                HostAlgo::Tree,
                WorkItem::Coll(
                    c @ CollOp {
                        red: Some(spec), ..
                    },
                ),
            ) => self.run_tree_item(item, c, spec, proto, probing),
            _ => self.run_plan_item(item, algo, probing),
        }
    }

    /// A Tree AllReduce. Its start (descriptor published, operation counted and timed,
    /// probe started, call logged: [`Worker::begin_item`]) waits until its first message
    /// is on its way ([`Worker::start_pending`]), so that this bookkeeping overlaps the
    /// partner's receiving the message instead of delaying it. No fault is injected into
    /// Tree operations (a run with `CCLD_INJECT` keeps to Ring).
    fn run_tree_item(
        &mut self,
        item: &WorkItem,
        c: &CollOp,
        spec: &RedSpec,
        proto: HostProto,
        probing: bool,
    ) -> Result<()> {
        let (descs, seq) = self.seqs.descriptors(item);
        let desc = descs
            .first()
            .copied()
            .ok_or_else(|| CclError::Internal("no descriptor".into()))?;
        self.failure = None;
        let red = self.reducer(spec, c.dtype)?;
        self.pending = Some(PendingStart {
            seq,
            desc,
            proto,
            probing,
        });
        let r = self.check_poison().and_then(|()| {
            self.run_tree(&tree_exec::TreeOp {
                item,
                proto,
                red: &red,
                sendbuf: c.sendbuf,
                recvbuf: c.recvbuf,
                bytes: c.count * c.dtype.size(),
                elem: c.dtype.size(),
                desc,
                check: crate::desc::check_on(),
                probing,
            })
        });
        self.finish_item(item, r, false)
    }

    /// Every other operation (Ring schedules, p2p groups): started before its first step.
    fn run_plan_item(&mut self, item: &WorkItem, algo: HostAlgo, probing: bool) -> Result<()> {
        let sh = &self.shared;
        let plan = if algo == HostAlgo::Tree {
            Plan::stepless()
        } else {
            let mut plan = plan_for(item, sh.rank, sh.nranks, &sh.tuning)?;
            crate::desc::add_descriptor_only_steps(&mut plan, item, sh.rank, sh.nranks);
            plan
        };
        let (descs, seq_id) = self.seqs.descriptors(item);
        publish_current(
            &self.t.current,
            match item {
                WorkItem::Coll(_) => descs.first().copied(),
                WorkItem::P2p(_) => None,
            },
        );
        self.failure = None;
        // Buffers by index, staging AlltoAll input that overlaps its output.
        let mut staged: Option<Vec<u8>> = None;
        let bufs: smallvec::SmallVec<[usize; 2]> = match item {
            WorkItem::Coll(c) => {
                let mut send = c.sendbuf;
                if c.kind == CollKind::AlltoAll {
                    let total = c.count * c.dtype.size() * sh.nranks;
                    if mem::overlap(c.sendbuf, c.recvbuf, total) {
                        // SAFETY: sendbuf is valid for `total` bytes (enqueue contract).
                        let v = unsafe { mem::src(c.sendbuf, 0, total) }.to_vec();
                        send = v.as_ptr() as usize;
                        staged = Some(v);
                    }
                }
                smallvec::smallvec![send, c.recvbuf]
            }
            WorkItem::P2p(calls) => calls.iter().map(|c| c.buf).collect(),
        };
        let reducer = match item {
            WorkItem::Coll(CollOp {
                red: Some(spec),
                dtype,
                ..
            }) => Some(self.reducer(spec, *dtype)?),
            _ => None,
        };
        let sh = &self.shared;
        let fault = match &sh.inject {
            Some(inj) => inj.for_op(sh.rank, sh.nranks, sh.op_counter.load(Ordering::Acquire)),
            None => crate::inject::OpFault::default(),
        };
        if fault.not_enter || self.diverged {
            tracing::warn!(target: "nccl::COLL", rank = sh.rank,
                "CCLD_INJECT: not entering {} (blocked until abort)", item.label());
            while !sh.abort.load(Ordering::Acquire) {
                std::thread::sleep(NOT_ENTERED_POLL);
            }
            return Err(CclError::Aborted(format!(
                "rank {}: ncclCommAbort called while the operation was held back (CCLD_INJECT h1)",
                sh.rank
            )));
        }
        if let Some(d) = fault.delay {
            std::thread::sleep(d);
        }
        self.begin_item(item, &seq_id, probing, None, &plan, fault.halve);
        let OpStart { block, t_start, .. } = self.cur;
        let peers: smallvec::SmallVec<[usize; 8]> = plan
            .lanes
            .iter()
            .filter(|l| l.link == LinkKind::P2p)
            .flat_map(|l| l.recv_from.into_iter().chain(l.send_to))
            .collect();
        let r = self
            .t
            .ensure_p2p(&self.boot, &peers, &self.shared.abort)
            .and_then(|()| match algo {
                HostAlgo::Tree => Err(CclError::Internal(
                    "Tree algorithm for an operation other than AllReduce".into(),
                )),
                HostAlgo::Ring => self.run_plan(
                    &plan,
                    &bufs,
                    &descs,
                    reducer.as_ref(),
                    block,
                    &fault,
                    t_start,
                ),
            });
        drop(staged);
        self.finish_item(item, r, fault.halve)
    }

    /// The reducer of `spec` over `dtype`: a built-in operator repeated from the previous
    /// operation comes from the one-entry cache inline, the rest is built out of line.
    #[inline]
    fn reducer(&mut self, spec: &RedSpec, dtype: DataType) -> Result<Reducer> {
        match (spec, self.last_reducer) {
            (RedSpec::Builtin(k), Some((d, o, r))) if d == dtype && o == *k => Ok(r),
            _ => self.new_reducer(spec, dtype),
        }
    }

    /// [`Worker::reducer`] when the cache does not hold it: a built-in operator's reducer
    /// is built and cached, a PreMulSum's built with its scalar as it is now.
    #[inline(never)]
    fn new_reducer(&mut self, spec: &RedSpec, dtype: DataType) -> Result<Reducer> {
        let n = self.shared.nranks;
        match spec {
            RedSpec::Builtin(k) => {
                let r = Reducer::new(dtype, *k, None, n)?;
                self.last_reducer = Some((dtype, *k, r));
                Ok(r)
            }
            RedSpec::PreMul(ScalarArg::HostImmediate(v)) => {
                Reducer::new(dtype, RedOpKind::PreMulSum, Some(v), n)
            }
            RedSpec::PreMul(ScalarArg::Device(addr)) => {
                // Host backend: the "device" scalar is host memory, read at execution time.
                // SAFETY: the caller of ncclRedOpCreatePreMulSum guarantees the scalar stays
                // valid while operations using the op run; addr is non-null (validated).
                let v = unsafe { mem::read_bytes(*addr, dtype.size()) };
                Reducer::new(dtype, RedOpKind::PreMulSum, Some(&v), n)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn run_plan(
        &mut self,
        plan: &Plan,
        bufs: &[usize],
        descs: &[[u64; crate::transport::shm::FifoLayout::DESC_WORDS]],
        red: Option<&Reducer>,
        block: Option<usize>,
        fault: &crate::inject::OpFault,
        t_start: u64,
    ) -> Result<()> {
        let frame = Arc::clone(&self.shared.frame);
        let ctx = OpCtx {
            bufs,
            unit: plan.unit,
            red,
            block,
            frame: &frame,
            descs,
            check: crate::desc::check_on(),
        };
        self.check_poison()?;
        for l in &plan.local {
            self.run_local(&ctx, l)?;
        }
        let mut lanes: Vec<LaneRun<'_>> = plan
            .lanes
            .iter()
            .filter(|l| !l.steps.is_empty())
            .map(|lane| {
                let len = lane.steps.len();
                LaneRun {
                    lane,
                    pos: 0,
                    end: if fault.halve { len.div_ceil(2) } else { len },
                    stall_at: fault
                        .stall
                        .is_some_and(|c| c.is_none_or(|c| c == lane.channel))
                        .then_some(0),
                    wait: Wait::None,
                }
            })
            .collect();
        let mut throttle = fault.throttle.map(|(gap, link)| Throttle {
            gap,
            link,
            next: vec![None; plan.n_channels.max(1)],
        });
        // While `Some`, this executor announced on its doorbell that it may sleep (the value
        // read when announcing): producers ring only then (`ring_if_waiting`), so every
        // path out of the loop must withdraw it.
        let bell = Arc::clone(&self.t.bell);
        let mut announced: Option<u32> = None;
        let wire = block.map(|_| self.ring_wire_marks(plan));
        let r = self.run_lanes(
            &ctx,
            &mut lanes,
            throttle.as_mut(),
            block,
            &frame,
            t_start,
            &bell,
            &mut announced,
        );
        if announced.is_some() {
            bell.unannounce();
        }
        if let (Some(b), Some(marks)) = (block, wire) {
            for (ch, counter, start) in marks {
                let ns = counter.load(Ordering::Relaxed).saturating_sub(start);
                frame.add_wire(b, ch, ns);
            }
        }
        r
    }

    /// Per ring channel of `plan` whose messages come from a peer over sockets: the
    /// channel, its wire-time counter and the counter's value now. The growth until the
    /// operation ends is charged to the channel ([`probe::Frame::add_wire`]); messages of
    /// a neighbouring operation that overlap it blur that by at most one message.
    fn ring_wire_marks(&self, plan: &Plan) -> Vec<(usize, Arc<AtomicU64>, u64)> {
        if !self.t.uses_sockets() {
            return Vec::new();
        }
        let mut marks: Vec<(usize, Arc<AtomicU64>, u64)> = Vec::new();
        for l in plan.lanes.iter().filter(|l| l.link == LinkKind::Ring) {
            let Some(prev) = l.recv_from else { continue };
            if marks.iter().any(|m| m.0 == l.channel) {
                continue;
            }
            if let Some(c) = self.t.ring_wire(prev, l.channel) {
                let v = c.load(Ordering::Relaxed);
                marks.push((l.channel, c, v));
            }
        }
        marks
    }

    /// The progress loop of [`Worker::run_plan`].
    #[allow(clippy::too_many_arguments)]
    fn run_lanes(
        &mut self,
        ctx: &OpCtx<'_>,
        lanes: &mut Vec<LaneRun<'_>>,
        mut throttle: Option<&mut Throttle>,
        block: Option<usize>,
        frame: &Frame,
        t_start: u64,
        bell: &crate::transport::shm::Doorbell,
        announced: &mut Option<u32>,
    ) -> Result<()> {
        let mut backoff = self.backoff();
        let mut spin_checked = false;
        let mut episode = WaitEpisode::default();
        let mut peer_check = PeerCheck::new(t_start, self.shared.tuning.peer_check);
        let mut driver = self.socket_driver(if self.t.uses_sockets() {
            largest_message(lanes, ctx.unit)
        } else {
            usize::MAX
        });
        // An operation ends once its lanes are done and the messages it sent by reference
        // are written (the caller may reuse the buffers then).
        while !lanes.is_empty() || !self.byref.is_empty() {
            let mut progressed = false;
            for lr in lanes.iter_mut() {
                while let Some(step) = lr.lane.steps[..lr.end].get(lr.pos) {
                    if lr.stall_at == Some(lr.pos) {
                        lr.wait = Wait::Upstream;
                        break;
                    }
                    lr.wait = self.try_step(ctx, lr.lane, step, throttle.as_deref_mut())?;
                    if lr.wait != Wait::None {
                        break;
                    }
                    lr.pos += 1;
                    progressed = true;
                }
            }
            if progressed {
                // A wait episode (if any) ended: charge it to the channels that waited.
                if let Some(b) = block {
                    episode.charge(frame, b);
                }
            }
            lanes.retain(|lr| lr.pos < lr.end);
            if !self.byref.is_empty() && self.byref.retire() {
                progressed = true;
            }
            if lanes.is_empty() && self.byref.is_empty() {
                break;
            }
            if self.shared.abort.load(Ordering::Acquire) {
                return Err(CclError::Aborted(format!(
                    "rank {}: ncclCommAbort called while the operation was in flight",
                    self.shared.rank
                )));
            }
            if progressed {
                if announced.take().is_some() {
                    bell.unannounce();
                }
                backoff.reset();
                peer_check.progressed();
                driver.progressed();
                continue;
            }
            self.check_poison()?;
            let now = now_ns();
            let waited_on = lanes.iter().filter_map(LaneRun::waits_on);
            let ref_peer = self.byref.oldest_peer();
            if self.check_peers(&mut peer_check, now, waited_on.chain(ref_peer))? {
                continue;
            }
            if !self.byref.is_empty() {
                self.byref.check_broken(now)?;
            }
            if block.is_some() {
                episode.snoozing(now, lanes.iter().map(|lr| (lr.lane.channel, lr.wait)));
            }
            if !spin_checked {
                // First wait of the operation: no spinning if a peer shares our CPU.
                spin_checked = true;
                if self.peer_on_my_cpu() {
                    backoff = Backoff::with_yield(self.yield_for);
                }
            }
            match announced.take() {
                // Announced and re-polled without progress: sleep until rung (or timeout).
                Some(seen) => {
                    bell.wait_announced(seen, backoff.park_duration());
                    bell.unannounce();
                    backoff.pause();
                }
                // Announce, then poll once more before sleeping (no lost wake-up: a
                // producer that committed before seeing the announcement is seen by
                // that poll). The socket proxy's thread polls the sockets meanwhile.
                None if backoff.is_parking() => {
                    self.t.release_sockets();
                    *announced = Some(bell.announce());
                }
                // Before spinning or yielding, move what the sockets hold.
                None if driver.drive(&self.t) => {}
                None => backoff.pause(),
            }
        }
        Ok(())
    }

    /// See [`crate::desc::on_mismatch`]; records the probe's failure.
    fn inconsistent(&mut self, m: &crate::desc::Mismatch) -> CclError {
        let (e, f) = crate::desc::on_mismatch(
            &self.t,
            self.shared.rank,
            self.shared.comm_id,
            self.seqs.collectives(),
            m,
        );
        self.failure = Some(f);
        e
    }

    /// Fails with `ncclRemoteError` once a peer poisoned this rank ([`crate::desc::poisoned`]):
    /// cause PEER_FAILED (with a WARN line) after an inconsistent call, PEER_LOST naming
    /// the lost peer after another rank found it gone.
    #[inline]
    fn check_poison(&mut self) -> Result<()> {
        match crate::desc::poisoned(&self.t.poison, self.seqs.collectives()) {
            None => Ok(()),
            Some(p) => self.poisoned(p),
        }
    }

    /// [`Worker::check_poison`]'s error for poison `p` (out of line: a healthy
    /// communicator's operations never take it).
    #[cold]
    #[inline(never)]
    fn poisoned(&mut self, p: crate::desc::Poison) -> Result<()> {
        let rank = self.shared.rank;
        match p {
            crate::desc::Poison::Inconsistent { by, at } => {
                let e = crate::desc::inconsistent_poison_error(by, at, rank);
                tracing::warn!(target: "nccl::COLL", rank, "{e}");
                self.failure = Some(probe::Failure::cause(probe::FailureCause::PeerFailed));
                Err(e)
            }
            crate::desc::Poison::PeerLost { lost, .. } => {
                // This rank may not see the loss yet (its connection to the peer still
                // drains, or it has none).
                let detail = self
                    .t
                    .peer_gone(lost)
                    .unwrap_or_else(|| crate::desc::LOST_ELSEWHERE.to_string());
                Err(self.peer_lost(lost, detail))
            }
        }
    }

    /// When due ([`PeerCheck`]), whether a peer in `waited_on` (those the operation is
    /// blocked on) is gone: its process exited (same host) or its socket transport
    /// connection was lost ([`Transport::peer_gone`]). Peers the operation does not wait on
    /// are not checked: one that finished its part and exited fails nothing.
    ///
    /// A first sighting returns `Ok(true)`: poll once more, so that what the peer
    /// committed before it went is used first. A second one without progress in between
    /// fails with `Remote` (cause PEER_LOST, with the peer's rank, pid and host for the
    /// probe) and poisons the other ranks with the loss, so that every rank names it.
    fn check_peers(
        &mut self,
        check: &mut PeerCheck,
        now_ns: u64,
        waited_on: impl IntoIterator<Item = usize>,
    ) -> Result<bool> {
        if now_ns < check.next && !check.suspect {
            return Ok(false);
        }
        check.next = now_ns.saturating_add(check.every);
        let me = self.t.rank;
        let gone = waited_on
            .into_iter()
            .filter(|&r| r != me)
            .find_map(|r| self.t.peer_gone(r).map(|d| (r, d)));
        match gone {
            None => {
                check.suspect = false;
                Ok(false)
            }
            Some(_) if !check.suspect => {
                check.suspect = true;
                Ok(true)
            }
            Some((r, detail)) => {
                let v = crate::desc::peer_lost_poison_value(r, self.seqs.collectives());
                crate::desc::poison_peers(&self.t, v);
                Err(self.peer_lost(r, detail))
            }
        }
    }

    /// The error (`Remote`) and probe failure (cause PEER_LOST) of an operation that lost
    /// peer `r` (its pid and host from the bootstrap; `detail`: how it was lost).
    fn peer_lost(&mut self, r: usize, detail: String) -> CclError {
        let pid = self.t.pids.get(r).copied().unwrap_or(0);
        let host = self.boot.peer_host(r).to_string();
        let e = CclError::Remote(format!("rank {r} (pid {pid}, host {host}): {detail}"));
        self.failure = Some(probe::Failure {
            cause: probe::FailureCause::PeerLost,
            peer_lost: Some(probe::PeerLost {
                rank: u32::try_from(r).unwrap_or(u32::MAX),
                pid,
                host,
                detail,
            }),
            mismatch: None,
        });
        e
    }

    fn run_local(&mut self, ctx: &OpCtx<'_>, l: &schedule::LocalStep) -> Result<()> {
        let nb = l.count * ctx.unit;
        let src = ctx.bufs[l.src_buf] + l.src_off * ctx.unit;
        let dst = ctx.bufs[l.dst_buf] + l.dst_off * ctx.unit;
        match (l.kind, ctx.red) {
            (LocalKind::Copy, _) => {
                // SAFETY: both ranges lie inside the operation's buffers (schedule bounds,
                // enqueue contract); memmove handles the in-place cases.
                unsafe { mem::copy(src, dst, nb) };
            }
            (LocalKind::Reduce, Some(r)) => {
                if mem::overlap(src, dst, nb) {
                    self.scratch.resize(nb, 0);
                    // SAFETY: [src, src + nb) lies inside the operation's buffers (schedule
                    // bounds, enqueue contract); the scratch is ours.
                    r.load(&mut self.scratch[..nb], unsafe { mem::src(src, 0, nb) });
                    // SAFETY: dst range valid; the src slice above is no longer used.
                    unsafe { mem::dst(dst, 0, nb) }.copy_from_slice(&self.scratch[..nb]);
                } else {
                    // SAFETY: disjoint valid ranges (checked just above).
                    let (d, s) = unsafe { (mem::dst(dst, 0, nb), mem::src(src, 0, nb)) };
                    r.load(d, s);
                }
                if r.needs_finish() {
                    // SAFETY: dst range valid, no other live reference.
                    r.finish(unsafe { mem::dst(dst, 0, nb) });
                }
            }
            (LocalKind::Reduce, None) => {
                return Err(CclError::Internal(
                    "local reduction without a reducer".into(),
                ))
            }
        }
        Ok(())
    }

    /// Runs one step if its inbound message is there and its outbound slot is free.
    fn try_step(
        &mut self,
        ctx: &OpCtx<'_>,
        lane: &Lane,
        step: &schedule::Step,
        throttle: Option<&mut Throttle>,
    ) -> Result<Wait> {
        let t = &mut self.t;
        let ch = lane.channel;
        if let Some(th) = throttle {
            if step.kind.sends() && th.link.is_none_or(|p| lane.send_to == Some(p)) {
                let now = Instant::now();
                if let Some(slot) = th.next.get_mut(ch) {
                    if slot.is_some_and(|n| now < n) {
                        return Ok(Wait::Downstream);
                    }
                    // The gap starts now; a later send of this channel waits for it.
                    *slot = Some(now + th.gap);
                }
            }
        }
        let nb = step.count * ctx.unit;
        let links = match lane.link {
            LinkKind::Ring => &mut t.ring,
            LinkKind::P2p => {
                let peer = lane
                    .send_to
                    .or(lane.recv_from)
                    .ok_or_else(|| CclError::Internal("p2p lane without a peer".into()))?;
                t.p2p
                    .get_mut(&peer)
                    .ok_or_else(|| CclError::Internal(format!("no p2p link to rank {peer}")))?
            }
        };
        let missing = || CclError::Internal(format!("channel {ch}: link missing"));
        let src_addr = ctx.bufs[step.src_buf] + step.src_off * ctx.unit;
        let dst_addr = ctx.bufs[step.dst_buf] + step.dst_off * ctx.unit;
        if step.kind == StepKind::Send {
            // Unscaled, the message is the source's bytes: to a remote peer it may leave
            // from the source itself.
            let by_ref = self
                .byref
                .table(&links.tx_refs, ch, nb)
                .filter(|_| ctx.red.is_none_or(|r| r.prescale().is_none()));
            let tx = links.tx.get_mut(ch).ok_or_else(missing)?;
            let seq = tx.committed();
            let Some(slot) = tx.try_reserve() else {
                return Ok(Wait::Downstream);
            };
            let slot = slot.get_mut(..nb).ok_or_else(missing)?;
            if let Some(refs) = by_ref {
                self.byref.post(refs, seq, lane.send_to, src_addr, nb);
            } else if nb > 0 {
                // SAFETY: src range inside the send buffer (schedule bounds, enqueue
                // contract); the slot is FIFO memory, disjoint from user buffers.
                let s = unsafe { mem::src(src_addr, 0, nb) };
                match ctx.red {
                    Some(r) => r.load(slot, s),
                    None => slot.copy_from_slice(s),
                }
            }
            commit(tx, ctx, nb, step.src_buf)?;
            ring_bell(&t.peer_bells, lane.send_to);
            if let (Some(b), true) = (ctx.block, nb > 0) {
                ctx.frame.add_send(b, ch, 1);
            }
            return Ok(Wait::None);
        }
        let (rxs, txs, refs_tab) = (&mut links.rx, &mut links.tx, &links.tx_refs);
        let rx = rxs.get_mut(ch).ok_or_else(missing)?;
        let peeked = if ctx.check {
            rx.try_peek_with_desc()?
        } else {
            rx.try_peek_checked()?.map(|s| (s, [0; 3]))
        };
        let Some((inb, got)) = peeked else {
            return Ok(Wait::Upstream);
        };
        if ctx.check {
            let want = desc_of(ctx, step.dst_buf)?;
            if got != want {
                let m = crate::desc::Mismatch {
                    peer: lane.recv_from.unwrap_or(usize::MAX),
                    channel: ch,
                    local: crate::desc::OpDesc::decode(want)
                        .ok_or_else(|| CclError::Internal("bad local descriptor".into()))?,
                    remote: crate::desc::OpDesc::decode(got),
                };
                return Err(self.inconsistent(&m));
            }
        }
        if inb.len() != nb {
            return Err(CclError::Remote(format!(
                "channel {ch}: message of {} bytes from rank {}, expected {nb} (mismatched operations?)",
                inb.len(),
                lane.recv_from.map_or(-1, |r| r as i64)
            )));
        }
        // The destination may hold the bytes of a message sent by reference and not yet
        // written (an in-place operation's source): wait for the kernel to have them.
        let writes_dst = !matches!(step.kind, StepKind::RecvReduceSend);
        if writes_dst && !self.byref.is_empty() && self.byref.blocks(dst_addr, nb) {
            return Ok(Wait::Downstream);
        }
        let sends = step.kind.sends();
        let mut out: Option<&mut [u8]> = None;
        // Where the outgoing message is taken from when it goes by reference: the bytes
        // this step leaves in the destination (a forwarded copy, or a reduced chunk that
        // does not overwrite its own source).
        let mut by_ref = None;
        let mut seq = 0;
        if sends {
            let dst_is_message = match step.kind {
                StepKind::RecvCopySend => true,
                StepKind::RecvReduceCopySend => !mem::overlap(src_addr, dst_addr, nb),
                _ => false,
            };
            if dst_is_message {
                by_ref = self.byref.table(refs_tab, ch, nb);
            }
            let tx = txs.get_mut(ch).ok_or_else(missing)?;
            seq = tx.committed();
            match tx.try_reserve() {
                None => return Ok(Wait::Downstream),
                Some(slot) => {
                    out = Some(slot.get_mut(..nb).ok_or_else(missing)?);
                }
            }
        }
        let red = || {
            ctx.red
                .ok_or_else(|| CclError::Internal("reduction step without a reducer".into()))
        };
        match (step.kind, out) {
            (StepKind::Recv, _) if nb == 0 => {}
            (StepKind::Recv, _) => {
                // SAFETY: dst range inside the receive buffer; FIFO memory is disjoint.
                unsafe { mem::dst(dst_addr, 0, nb) }.copy_from_slice(inb);
            }
            (StepKind::RecvCopySend, Some(o)) => {
                if by_ref.is_none() {
                    o.copy_from_slice(inb);
                }
                // SAFETY: as for Recv.
                unsafe { mem::dst(dst_addr, 0, nb) }.copy_from_slice(inb);
            }
            (StepKind::RecvReduceCopySend, Some(_)) if by_ref.is_some() => {
                let r = red()?;
                // SAFETY: disjoint ranges (checked when `by_ref` was chosen), src inside
                // the send buffer, dst inside the receive buffer; no other live reference.
                let (d, s) = unsafe { (mem::dst(dst_addr, 0, nb), mem::src(src_addr, 0, nb)) };
                r.combine(d, inb, s);
                if r.needs_finish() {
                    r.finish(d);
                }
            }
            (StepKind::RecvReduceSend, Some(o)) => {
                // SAFETY: src range inside the send buffer, only read here.
                red()?.combine(o, inb, unsafe { mem::src(src_addr, 0, nb) });
            }
            (StepKind::RecvReduceCopySend, Some(o)) => {
                let r = red()?;
                // SAFETY: src range inside the send buffer; the slice dies before `dst`
                // below is created (in-place operations alias the two).
                r.combine(o, inb, unsafe { mem::src(src_addr, 0, nb) });
                if r.needs_finish() {
                    r.finish(o);
                }
                // SAFETY: dst range inside the receive buffer; no other live reference.
                unsafe { mem::dst(dst_addr, 0, nb) }.copy_from_slice(o);
            }
            (StepKind::RecvReduceCopy, _) => {
                let r = red()?;
                if mem::overlap(src_addr, dst_addr, nb) {
                    self.scratch.resize(nb, 0);
                    // SAFETY: src range valid; the scratch is ours.
                    r.combine(&mut self.scratch[..nb], inb, unsafe {
                        mem::src(src_addr, 0, nb)
                    });
                    // SAFETY: dst range valid; the src slice is dead.
                    unsafe { mem::dst(dst_addr, 0, nb) }.copy_from_slice(&self.scratch[..nb]);
                } else {
                    // SAFETY: disjoint valid ranges (checked above).
                    let (d, s) = unsafe { (mem::dst(dst_addr, 0, nb), mem::src(src_addr, 0, nb)) };
                    r.combine(d, inb, s);
                }
                if r.needs_finish() {
                    // SAFETY: dst range valid; no other live reference.
                    r.finish(unsafe { mem::dst(dst_addr, 0, nb) });
                }
            }
            (k, _) => {
                return Err(CclError::Internal(format!(
                    "step {k:?} without its outbound slot"
                )))
            }
        }
        rx.release();
        ring_bell(&t.peer_bells, lane.recv_from);
        if let (Some(b), true) = (ctx.block, nb > 0) {
            ctx.frame.add_recv(b, ch, 1);
        }
        if sends {
            if let Some(refs) = by_ref {
                self.byref.post(refs, seq, lane.send_to, dst_addr, nb);
            }
            let tx = txs.get_mut(ch).ok_or_else(missing)?;
            commit(tx, ctx, nb, step.src_buf)?;
            ring_bell(&t.peer_bells, lane.send_to);
            if let Some(b) = ctx.block {
                ctx.frame.add_send(b, ch, 1);
            }
        }
        Ok(Wait::None)
    }
}

/// Publishes a reserved slot of `nb` bytes with the descriptor of buffer `buf`.
fn commit(
    tx: &mut crate::transport::shm::FifoSender,
    ctx: &OpCtx<'_>,
    nb: usize,
    buf: usize,
) -> Result<()> {
    if ctx.check {
        tx.commit_with_desc(nb, desc_of(ctx, buf)?);
    } else {
        tx.commit(nb);
    }
    Ok(())
}

/// The descriptor words of buffer `buf` of the operation.
fn desc_of(
    ctx: &OpCtx<'_>,
    buf: usize,
) -> Result<[u64; crate::transport::shm::FifoLayout::DESC_WORDS]> {
    ctx.descs
        .get(buf)
        .copied()
        .ok_or_else(|| CclError::Internal(format!("no descriptor for buffer {buf}")))
}

/// The largest message (bytes) a step of `lanes` sends or receives.
fn largest_message(lanes: &[LaneRun<'_>], unit: usize) -> usize {
    lanes
        .iter()
        .flat_map(|lr| lr.lane.steps.iter())
        .map(|s| s.count * unit)
        .max()
        .unwrap_or(0)
}

fn ring_bell(bells: &[Option<crate::transport::shm::Doorbell>], peer: Option<usize>) {
    if let Some(Some(b)) = peer.and_then(|p| bells.get(p)) {
        b.ring_if_waiting();
    }
}

#[path = "executor_byref.rs"]
mod byref;

#[path = "executor_tree.rs"]
mod tree_exec;

#[path = "executor_wait.rs"]
mod wait;

#[path = "executor_probe.rs"]
mod probe_path;

#[path = "executor_handle.rs"]
mod handle;

pub(crate) use crate::label::OpPlace;
use crate::op::{call_logged, log_call};
use byref::ByRef;
pub(crate) use handle::{run_inline, WorkerHandle};
use probe_path::{OpStart, PendingStart};
use tree_exec::tree_counts;
pub(crate) use tree_exec::{expected_counts, host_choice};
pub(crate) use wait::read_current;
use wait::{publish_current, PeerCheck, Wait, WaitEpisode};

#[cfg(test)]
#[path = "executor_tests.rs"]
mod tests;
