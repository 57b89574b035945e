//! Operations and groups: argument validation, `ncclGroupStart`/`ncclGroupEnd` semantics
//! (nesting, several communicators, p2p in any order), submission to executors.
//!
//! Groups are per thread (like NCCL's): a nesting depth and the operations queued since
//! the outermost `group_start`. At the outermost `group_end` the queued operations are
//! split per communicator, in issue order; for each communicator its collectives run in
//! issue order, then all its Send/Recv of the group as ONE p2p batch (all progressing
//! together, so send/recv pairs in any order cannot deadlock; one operation counter per
//! batch). With several communicators, every communicator's job is submitted to its own
//! worker thread before any is waited for, so one thread can drive all ranks of
//! `ncclCommInitAll` in one group; with one communicator the job runs on the calling
//! thread. A collective or p2p call that fails inside a group fails the whole group at its
//! outermost end ([`fail_in_group`]), as NCCL's does.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ccl_optype::CollKind;

use crate::comm::{Comm, FIRST_USER_OP};
use crate::error::{CclError, Result};
use crate::executor::{self, Completion, Job, OpPlace};
use crate::op::{is_rooted, CollOp, P2pCall, RedSpec, WorkItem};
use crate::schedule::{Dir, ExpectedCounts};
use crate::types::{DataType, RedOpKind};

/// One collective or p2p call as the C API received it (raw values, unvalidated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollArgs {
    /// Which operation (`ncclBcast` is `Broadcast` with `sendbuf == recvbuf`).
    pub kind: CollKind,
    /// Send buffer address (host pointer on the host backend).
    pub sendbuf: usize,
    /// Receive buffer address.
    pub recvbuf: usize,
    /// Element count as passed (per-rank count for AllGather/ReduceScatter/AlltoAll/...).
    pub count: usize,
    /// Raw `ncclDataType_t`.
    pub dtype: i32,
    /// Raw `ncclRedOp_t` (ignored by non-reducing operations).
    pub op: i32,
    /// Root rank for rooted collectives, peer for Send/Recv, -1 otherwise.
    pub root: i32,
    /// `cudaStream_t` as an address (ignored by the host backend).
    pub stream: usize,
}

/// A validated call waiting for its group to end.
#[derive(Debug)]
enum Valid {
    Coll(CollOp),
    P2p(P2pCall),
}

#[derive(Default)]
struct GroupState {
    depth: usize,
    /// (communicator, operation, stream).
    queued: Vec<(Arc<Comm>, Valid, usize)>,
    /// Communicators whose init was called in this group: (communicator, blocking).
    inits: Vec<(Arc<Comm>, bool)>,
    /// The latest error of a call made in this group ([`fail_in_group`]): the outermost
    /// `ncclGroupEnd` returns it and runs none of the group's operations.
    error: Option<CclError>,
}

impl Drop for GroupState {
    fn drop(&mut self) {
        // A thread that exits inside a group no longer has one open.
        if self.depth > 0 {
            OPEN_GROUPS.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

thread_local! {
    static GROUP: RefCell<GroupState> = RefCell::new(GroupState::default());
}

/// Threads of this process with a group open (depth above zero). A call made while it is
/// zero cannot be inside a group of its own thread, so it skips the thread-local lookup
/// (a `__tls_get_addr` call in a shared library, about 5 % of an 8-byte AllReduce's CPU
/// work). A thread's own increment is visible to itself, so `Relaxed` is enough: another
/// thread's groups only make a call take the slower, still exact, path.
static OPEN_GROUPS: AtomicUsize = AtomicUsize::new(0);

/// Whether this thread is inside a group.
fn in_group() -> bool {
    OPEN_GROUPS.load(Ordering::Relaxed) != 0 && group_depth() > 0
}

fn is_reduction(k: CollKind) -> bool {
    matches!(
        k,
        CollKind::AllReduce | CollKind::Reduce | CollKind::ReduceScatter
    )
}

/// Checks `args` against `comm` and returns the operation to queue.
fn validate(comm: &Comm, args: &CollArgs) -> Result<Valid> {
    comm.usable()?;
    let name = args.kind.name();
    let dtype = DataType::from_raw(args.dtype)
        .map_err(|_| CclError::arg(format!("{name}: invalid data type {}", args.dtype)))?;
    let nranks = comm.nranks() as usize;
    let rank = comm.rank() as usize;
    let count = args.count;
    let bytes = count
        .checked_mul(dtype.size())
        .filter(|b| *b <= isize::MAX as usize);
    let Some(bytes) = bytes else {
        return Err(CclError::arg(format!(
            "{name}: count {count} x {} bytes overflows",
            dtype.size()
        )));
    };
    // Bytes of the larger (per-rank x nranks) side, where there is one.
    let total = match args.kind {
        CollKind::AllGather
        | CollKind::ReduceScatter
        | CollKind::AlltoAll
        | CollKind::Gather
        | CollKind::Scatter => bytes
            .checked_mul(nranks)
            .filter(|b| *b <= isize::MAX as usize)
            .ok_or_else(|| {
                CclError::arg(format!(
                    "{name}: count {count} x {} bytes x {nranks} ranks overflows",
                    dtype.size()
                ))
            })?,
        _ => bytes,
    };
    let root_or_peer = |what: &str| -> Result<usize> {
        usize::try_from(args.root)
            .ok()
            .filter(|r| *r < nranks)
            .ok_or_else(|| {
                CclError::arg(format!(
                    "{name}: invalid {what} {} (nranks {nranks})",
                    args.root
                ))
            })
    };
    let null = |which: &str| CclError::arg(format!("{name}: {which} is null with count {count}"));
    // The operation's label is formatted from its fields and this only when a message
    // needs it (errors, logs): not on the latency path.
    let place = OpPlace {
        comm_id: comm.comm_id(),
        rank,
    };
    match args.kind {
        CollKind::Send | CollKind::Recv => {
            let peer = root_or_peer("peer")?;
            let (dir, buf, which) = if args.kind == CollKind::Send {
                (Dir::Send, args.sendbuf, "sendbuff")
            } else {
                (Dir::Recv, args.recvbuf, "recvbuff")
            };
            if bytes > 0 && buf == 0 {
                return Err(null(which));
            }
            return Ok(Valid::P2p(P2pCall {
                dir,
                peer,
                buf,
                count,
                dtype,
                place,
            }));
        }
        _ => {}
    }
    let root = if is_rooted(args.kind) {
        root_or_peer("root")?
    } else {
        0
    };
    let red = if is_reduction(args.kind) {
        Some(match RedOpKind::builtin_from_raw(args.op) {
            Some(k) => RedSpec::Builtin(k),
            None if args.op >= FIRST_USER_OP => {
                let op = comm.user_op(args.op).ok_or_else(|| {
                    CclError::arg(format!(
                        "{name}: reduction op {} is not a live PreMulSum op of this communicator",
                        args.op
                    ))
                })?;
                if op.dtype != dtype {
                    return Err(CclError::arg(format!(
                        "{name}: PreMulSum op {} was created for {}, used with {}",
                        args.op,
                        op.dtype.name(),
                        dtype.name()
                    )));
                }
                RedSpec::PreMul(op.scalar)
            }
            None => {
                return Err(CclError::arg(format!(
                    "{name}: invalid reduction op {}",
                    args.op
                )))
            }
        })
    } else {
        None
    };
    // Which buffers this rank uses.
    let is_root = rank == root;
    let (needs_send, needs_recv) = match args.kind {
        CollKind::Broadcast => (is_root, true),
        CollKind::Reduce => (true, is_root),
        CollKind::Gather => (true, is_root),
        CollKind::Scatter => (is_root, true),
        _ => (true, true),
    };
    if total > 0 {
        if needs_send && args.sendbuf == 0 {
            return Err(null("sendbuff"));
        }
        if needs_recv && args.recvbuf == 0 {
            return Err(null("recvbuff"));
        }
    }
    Ok(Valid::Coll(CollOp {
        kind: args.kind,
        dtype,
        count,
        sendbuf: args.sendbuf,
        recvbuf: args.recvbuf,
        root,
        red,
        raw_op: args.op,
        place,
    }))
}

/// Validates `args` and runs it: outside a group it returns when the result is in the
/// receive buffer; inside a group it is queued until the outermost `ncclGroupEnd`.
///
/// # Safety contract
/// The caller guarantees the buffers are valid for the sizes implied by the arguments
/// until the operation completes (as NCCL requires).
pub fn enqueue(comm: &Arc<Comm>, args: CollArgs) -> Result<()> {
    let v = match validate(comm, &args) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(target: "nccl::CALL", rank = comm.rank(), "{e}");
            comm.record_error(&e);
            comm.note_call_failed(&e.to_string());
            fail_in_group(&e);
            return Err(e);
        }
    };
    let standalone = if in_group() {
        GROUP.with(|g| {
            g.borrow_mut()
                .queued
                .push((Arc::clone(comm), v, args.stream))
        });
        None
    } else {
        Some(v)
    };
    match standalone {
        None => Ok(()),
        Some(v) if !comm.is_device() => run_host_one(comm, v),
        Some(v) => run_batch(vec![(Arc::clone(comm), v, args.stream)]),
    }
}

/// A call outside a group on the host backend (the common case): one work item, run on
/// this thread, as [`run_host_batch`] would run a batch of one, without its partitioning.
fn run_host_one(comm: &Arc<Comm>, v: Valid) -> Result<()> {
    let item = match v {
        Valid::Coll(c) => WorkItem::Coll(c),
        Valid::P2p(p) => WorkItem::P2p(vec![p]),
    };
    comm.run_inline(std::slice::from_ref(&item))
        .inspect_err(|e| after_failure(comm, e))
}

/// Inside a group, makes the group fail with `e` (a call of the group that failed before
/// it was queued: a bad argument, a communicator that is not usable): as NCCL's
/// `ncclGroupErrCheck`, the outermost `ncclGroupEnd` then returns the latest such error
/// and cancels the whole group, so that a rank never runs part of a group. Outside a group
/// it does nothing (the call's own return carries the error).
pub fn fail_in_group(e: &CclError) {
    if in_group() && !matches!(e, CclError::InProgress) {
        GROUP.with(|g| g.borrow_mut().error = Some(e.clone()));
    }
}

/// `ncclGroupStart`.
pub fn group_start() -> Result<()> {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            OPEN_GROUPS.fetch_add(1, Ordering::Relaxed);
        }
        g.depth += 1;
    });
    Ok(())
}

/// `ncclCommInitRank(Config)`: outside a group, creates the communicator at once (see
/// [`Comm::init_rank`]); inside a group, as NCCL does, the init completes at the outermost
/// `ncclGroupEnd`, so that one thread can create several ranks of one communicator (NCCL's
/// tests with `-g 2`, or several ranks on one device). The backend and device are taken
/// from the calling thread at the call; bootstrap and connection run on an init thread per
/// rank, and `ncclGroupEnd` waits for the blocking ones and returns the first init error.
/// A non-blocking communicator (`config.blocking = 0`) is not waited for: its
/// `ncclCommGetAsyncError` says `ncclInProgress` until it is ready, and `ncclGroupEnd`
/// returns `ncclInProgress` while any is still initialising.
pub fn init_rank(
    nranks: i32,
    id: crate::bootstrap::UniqueId,
    rank: i32,
    cfg: crate::comm::CommConfig,
) -> Result<Arc<Comm>> {
    if group_depth() == 0 {
        return Comm::init_rank(nranks, id, rank, cfg);
    }
    let (comm, blocking) = Comm::init_rank_in_group(nranks, id, rank, cfg)?;
    GROUP.with(|g| g.borrow_mut().inits.push((Arc::clone(&comm), blocking)));
    Ok(comm)
}

/// `ncclGroupEnd`: completes the communicator inits of the group, then launches and
/// completes everything queued since the outermost start; when a call of the group failed
/// ([`fail_in_group`]), runs nothing of it and returns that call's error.
pub fn group_end() -> Result<()> {
    let batch = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        match g.depth {
            0 => Err(CclError::usage(
                "ncclGroupEnd without a matching ncclGroupStart",
            )),
            1 => {
                g.depth = 0;
                OPEN_GROUPS.fetch_sub(1, Ordering::Relaxed);
                Ok(Some((
                    std::mem::take(&mut g.inits),
                    std::mem::take(&mut g.queued),
                    g.error.take(),
                )))
            }
            _ => {
                g.depth -= 1;
                Ok(None)
            }
        }
    })?;
    let Some((inits, ops, failed)) = batch else {
        return Ok(());
    };
    // The inits of the group already run on their own threads: waited for in any case.
    let init_result = finish_inits(&inits);
    if let Some(e) = failed {
        // A call of the group failed: none of its operations run (NCCL's groupCleanup).
        tracing::warn!(target: "nccl::CALL",
            "ncclGroupEnd: a call of the group failed ({e}); {} queued operation(s) not run",
            ops.len());
        // Each communicator whose operations did not run says why its peers may wait.
        let mut seen: Vec<&Arc<Comm>> = Vec::new();
        for (c, ..) in &ops {
            if !seen.iter().any(|s| Arc::ptr_eq(s, c)) {
                seen.push(c);
                c.note_call_failed(&format!(
                    "ncclGroupEnd cancelled its group after a call of it failed ({e})"
                ));
            }
        }
        return Err(e);
    }
    let run_result = if ops.is_empty() {
        Ok(())
    } else {
        run_batch(ops)
    };
    init_result.and(run_result)
}

/// Waits for the blocking inits of a group (all of them, even after a failure, so that no
/// init thread is left behind unobserved); the first error wins. `InProgress` when a
/// non-blocking one is still initialising.
fn finish_inits(inits: &[(Arc<Comm>, bool)]) -> Result<()> {
    let mut first_err: Option<CclError> = None;
    let mut pending = false;
    for (comm, blocking) in inits {
        if *blocking {
            if let Err(e) = comm.wait_init_result() {
                first_err.get_or_insert(e);
            }
        } else if matches!(comm.async_error(), Err(CclError::InProgress)) {
            pending = true;
        }
    }
    match first_err {
        Some(e) => Err(e),
        None if pending => Err(CclError::InProgress),
        None => Ok(()),
    }
}

/// Current group nesting depth of this thread (0 outside a group).
pub fn group_depth() -> usize {
    GROUP.with(|g| g.borrow().depth)
}

fn items_per_comm(ops: Vec<(Arc<Comm>, Valid)>) -> Vec<(Arc<Comm>, Vec<WorkItem>)> {
    let mut per: Vec<(Arc<Comm>, Vec<WorkItem>, Vec<P2pCall>)> = Vec::new();
    for (comm, v) in ops {
        let i = match per.iter().position(|(c, _, _)| Arc::ptr_eq(c, &comm)) {
            Some(i) => i,
            None => {
                per.push((comm, Vec::new(), Vec::new()));
                per.len() - 1
            }
        };
        match v {
            Valid::Coll(c) => per[i].1.push(WorkItem::Coll(c)),
            Valid::P2p(p) => per[i].2.push(p),
        }
    }
    per.into_iter()
        .map(|(c, mut items, p2p)| {
            if !p2p.is_empty() {
                items.push(WorkItem::P2p(p2p));
            }
            (c, items)
        })
        .collect()
}

fn run_batch(ops: Vec<(Arc<Comm>, Valid, usize)>) -> Result<()> {
    if !ops.iter().any(|(c, _, _)| c.is_device()) {
        // Host backend only (the common case): no partitioning.
        return run_host_batch(ops.into_iter().map(|(c, v, _)| (c, v)).collect());
    }
    let (dev, ops): (Vec<_>, Vec<_>) = ops.into_iter().partition(|(c, _, _)| c.is_device());
    let dev_result = if dev.is_empty() {
        Ok(())
    } else {
        run_device_batch(dev)
    };
    if ops.is_empty() {
        return dev_result;
    }
    let host_result = run_host_batch(ops.into_iter().map(|(c, v, _)| (c, v)).collect());
    dev_result.and(host_result)
}

/// The device backend's part of a batch: per communicator, its collectives in issue order
/// (each on its own stream), then its Send/Recv as one p2p operation (on the stream of the
/// group's first p2p call; all p2p calls of one communicator in a group must use one
/// stream). Lazy p2p connections are made in two phases over all communicators first
/// (descriptors sent, then received), so one thread can drive several ranks. Returns after
/// the enqueue, without waiting (NCCL semantics).
fn run_device_batch(ops: Vec<(Arc<Comm>, Valid, usize)>) -> Result<()> {
    type Items = Vec<(WorkItem, usize)>;
    let mut per: Vec<(Arc<Comm>, Items, Vec<P2pCall>, usize)> = Vec::new();
    for (comm, v, stream) in ops {
        let i = match per.iter().position(|(c, ..)| Arc::ptr_eq(c, &comm)) {
            Some(i) => i,
            None => {
                per.push((comm, Vec::new(), Vec::new(), stream));
                per.len() - 1
            }
        };
        match v {
            Valid::Coll(c) => per[i].1.push((WorkItem::Coll(c), stream)),
            Valid::P2p(p) => {
                if per[i].2.is_empty() {
                    per[i].3 = stream;
                } else if per[i].3 != stream {
                    let e = CclError::usage(format!(
                        "{}: the device backend runs the Send/Recv of one communicator in a \
                         group on one stream ({:#x}), not also on {stream:#x}",
                        p.label(),
                        per[i].3
                    ));
                    after_failure(&per[i].0, &e);
                    return Err(e);
                }
                per[i].2.push(p);
            }
        }
    }
    let jobs: Vec<(Arc<Comm>, Items)> = per
        .into_iter()
        .map(|(c, mut items, p2p, s)| {
            if !p2p.is_empty() {
                items.push((WorkItem::P2p(p2p), s));
            }
            (c, items)
        })
        .collect();
    let mut first_err: Option<CclError> = None;
    let fail = |comm: &Comm, e: CclError, first: &mut Option<CclError>| {
        after_failure(comm, &e);
        first.get_or_insert(e);
    };
    // Phase 1: p2p descriptors out; phase 2: in.
    let mut ok: Vec<bool> = Vec::with_capacity(jobs.len());
    for (comm, items) in &jobs {
        let r = comm.device_comm().map_or_else(
            || {
                Err(CclError::Internal(
                    "device batch on a host communicator".into(),
                ))
            },
            |d| {
                let mut peers = Vec::new();
                for (item, _) in items {
                    peers.extend(d.p2p_peers_of(item)?);
                }
                d.p2p_begin(&peers)
            },
        );
        ok.push(r.is_ok());
        if let Err(e) = r {
            fail(comm, e, &mut first_err);
        }
    }
    for (i, (comm, _)) in jobs.iter().enumerate() {
        if !ok[i] {
            continue;
        }
        if let Some(d) = comm.device_comm() {
            if let Err(e) = d.p2p_finish() {
                ok[i] = false;
                fail(comm, e, &mut first_err);
            }
        }
    }
    // Phase 3: enqueue.
    for (i, (comm, items)) in jobs.iter().enumerate() {
        if !ok[i] {
            continue;
        }
        let Some(d) = comm.device_comm() else {
            continue;
        };
        for (item, stream) in items {
            if let Err(e) = comm.usable().and_then(|()| d.enqueue(item, *stream)) {
                fail(comm, e, &mut first_err);
                break;
            }
        }
    }
    match first_err {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

fn run_host_batch(ops: Vec<(Arc<Comm>, Valid)>) -> Result<()> {
    let mut jobs = items_per_comm(ops);
    if jobs.len() == 1 {
        // One communicator: run on this thread (no hand-off to the worker thread).
        let (comm, items) = jobs.remove(0);
        return comm
            .run_inline(&items)
            .inspect_err(|e| after_failure(&comm, e));
    }
    let mut waits = Vec::with_capacity(jobs.len());
    let mut first_err: Option<CclError> = None;
    for (comm, items) in jobs {
        let done = Arc::new(Completion::default());
        match comm.submit(Job {
            items,
            done: Arc::clone(&done),
        }) {
            Ok(()) => waits.push((comm, done)),
            Err(e) => {
                comm.record_error(&e);
                first_err.get_or_insert(e);
            }
        }
    }
    for (comm, done) in waits {
        if let Err(e) = done.wait() {
            after_failure(&comm, &e);
            first_err.get_or_insert(e);
        }
    }
    match first_err {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

fn after_failure(comm: &Comm, e: &CclError) {
    tracing::warn!(target: "nccl::COLL", rank = comm.rank(), "{e}");
    comm.record_error(e);
    if !matches!(e, CclError::InvalidArgument(_) | CclError::InvalidUsage(_))
        || crate::desc::breaks_comm(e)
    {
        comm.mark_broken(e);
    }
}

/// The per-channel probe counts the schedule expects on `comm` for `ops`: either one
/// collective, or the Send/Recv calls of one group (in issue order). For tests and
/// progress reporting; validates like [`enqueue`] but runs nothing.
pub fn expected_counts(comm: &Comm, ops: &[CollArgs]) -> Result<Vec<ExpectedCounts>> {
    let mut coll = None;
    let mut p2p = Vec::new();
    for a in ops {
        match validate(comm, a)? {
            Valid::Coll(c) => {
                if coll.is_some() || ops.len() != 1 {
                    return Err(CclError::usage(
                        "expected_counts takes one collective or a list of Send/Recv",
                    ));
                }
                coll = Some(c);
            }
            Valid::P2p(p) => p2p.push(p),
        }
    }
    let item = match coll {
        Some(c) => WorkItem::Coll(c),
        None => WorkItem::P2p(p2p),
    };
    // Device communicators plan LL operations with smaller chunks.
    let tuning = match comm.device_comm() {
        Some(d) => d.plan_tuning(d.protocol_of(&item)),
        None => *comm.tuning(),
    };
    let (rank, n) = (comm.rank() as usize, comm.nranks() as usize);
    if let Some(d) = comm.device_comm() {
        // With the descriptor check, zero-count operations' descriptor-only messages too.
        return Ok(d
            .plan_of(&item, &tuning, crate::desc::check_on())?
            .expected_counts());
    }
    // Host: Ring or Tree (crate::hostalgo).
    executor::expected_counts(&item, rank, n, &tuning, comm.over_sockets())
}

/// The protocol `ops` (one collective, or the Send/Recv calls of one group) run with on a
/// device communicator (`NCCL_PROTO` and the operation's size); `None` on the host
/// backend (Simple only). Validates like [`enqueue`] but runs nothing.
pub fn protocol_of(comm: &Comm, ops: &[CollArgs]) -> Result<Option<crate::proto::Proto>> {
    let Some(d) = comm.device_comm() else {
        return Ok(None);
    };
    let mut items = Vec::new();
    let mut p2p = Vec::new();
    for a in ops {
        match validate(comm, a)? {
            Valid::Coll(c) => items.push(WorkItem::Coll(c)),
            Valid::P2p(p) => p2p.push(p),
        }
    }
    if !p2p.is_empty() {
        items.push(WorkItem::P2p(p2p));
    }
    match items.as_slice() {
        [item] => Ok(Some(d.protocol_of(item))),
        _ => Err(CclError::usage(
            "protocol_of takes one collective or a list of Send/Recv",
        )),
    }
}
