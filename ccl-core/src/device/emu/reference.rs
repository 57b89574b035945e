//! The Rust re-implementation of the kernel's rules (`CCLD_EMU_KERNEL=rust`): a second,
//! independent implementation of the protocol the kernel source implements (see the
//! module documentation of [`super`]); the default is the kernel source itself
//! ([`crate::device::emu_kernel`]).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kernels::ffi::{
    ccl_dev_conn_t, ccl_dev_lane_t, ccl_dev_local_t, ccl_dev_plan_t, ccl_dev_step_t,
    frame_send_offset, frame_wait_offset, CCL_LANE_THROTTLED, CCL_LOCAL_COPY, CCL_LOCAL_REDUCE,
    CCL_MAX_BUFS, CCL_MAX_CHANNELS, CCL_MAX_LANES_PER_CHANNEL, CCL_OP_MAX, CCL_OP_MIN,
    CCL_OP_PREMUL, CCL_OP_PROD, CCL_OP_SUM, CCL_PROTO_LL, CCL_PROTO_SIMPLE, CCL_STALL_ALL,
    CCL_STALL_NONE, CCL_STEP_RECV, CCL_STEP_RECV_COPY_SEND, CCL_STEP_RECV_REDUCE_COPY,
    CCL_STEP_RECV_REDUCE_COPY_SEND, CCL_STEP_RECV_REDUCE_SEND, CCL_STEP_SEND,
};

use crate::error::{CclError, Result};
use crate::reduce::Reducer;
use crate::types::{DataType, RedOpKind};

fn step_sends(kind: u32) -> bool {
    matches!(
        kind,
        CCL_STEP_SEND
            | CCL_STEP_RECV_REDUCE_SEND
            | CCL_STEP_RECV_REDUCE_COPY_SEND
            | CCL_STEP_RECV_COPY_SEND
    )
}

/// The reducer a plan's reduction fields describe (the inverse of `red_params`).
fn plan_reducer(p: &ccl_dev_plan_t) -> Result<Option<Reducer>> {
    if p.reduce == 0 {
        return Ok(None);
    }
    let bad = |m: String| Err(CclError::arg(format!("emulated kernel: {m}")));
    let dt = DataType::from_raw(p.dtype as i32)
        .map_err(|_| CclError::arg(format!("emulated kernel: dtype {}", p.dtype)))?;
    let r = match p.op {
        CCL_OP_PREMUL => {
            let mut s = [0u8; 8];
            if p.scalar_dev.is_null() {
                s = p.scalar_bits.to_le_bytes();
            } else {
                // SAFETY: the launch contract: scalar_dev holds one element of dtype.
                let v = unsafe { std::slice::from_raw_parts(p.scalar_dev.cast::<u8>(), dt.size()) };
                s[..dt.size()].copy_from_slice(v);
            }
            Reducer::new(dt, RedOpKind::PreMulSum, Some(&s[..dt.size()]), 1)?
        }
        CCL_OP_SUM if p.avg_divisor != 0 => {
            if dt.is_float() {
                return bad("avg_divisor on a float type".into());
            }
            Reducer::new(dt, RedOpKind::Avg, None, p.avg_divisor as usize)?
        }
        CCL_OP_SUM => Reducer::new(dt, RedOpKind::Sum, None, 1)?,
        CCL_OP_PROD => Reducer::new(dt, RedOpKind::Prod, None, 1)?,
        CCL_OP_MAX => Reducer::new(dt, RedOpKind::Max, None, 1)?,
        CCL_OP_MIN => Reducer::new(dt, RedOpKind::Min, None, 1)?,
        op => return bad(format!("op {op}")),
    };
    Ok(Some(r))
}

/// # Safety
/// `a .. a + n` must be readable and not written while the slice lives.
unsafe fn raw_bytes<'a>(a: usize, n: usize) -> &'a [u8] {
    // SAFETY: forwarded to the caller.
    unsafe { std::slice::from_raw_parts(a as *const u8, n) }
}

/// # Safety
/// `a .. a + n` must be writable and not accessed otherwise while the slice lives.
unsafe fn raw_bytes_mut<'a>(a: usize, n: usize) -> &'a mut [u8] {
    // SAFETY: forwarded to the caller.
    unsafe { std::slice::from_raw_parts_mut(a as *mut u8, n) }
}

/// A launched plan: validated, arrays copied, ready to run on a stream thread.
pub(super) struct Kernel {
    n_channels: usize,
    unit: usize,
    red: Option<Reducer>,
    steps: Vec<ccl_dev_step_t>,
    lanes: Vec<ccl_dev_lane_t>,
    locals: Vec<ccl_dev_local_t>,
    conns: Vec<Conn>,
    bufs: [usize; CCL_MAX_BUFS],
    /// Frame (device address = host address here), its capacity and the op's block.
    frame: usize,
    frame_capacity: u64,
    frame_block: u64,
    abort: usize,
    /// `start_gate` (waited for only with a frame and an abort flag).
    start_gate: u32,
    /// Completion words (`done`, one per channel; 0: none).
    done: usize,
    /// LL protocol (`CCL_PROTO_LL`): flag lines instead of data + `tail`.
    pub(super) ll: bool,
    /// Injected throttle: minimum gap between two sends of throttled lanes of a channel.
    throttle_gap: Option<Duration>,
    /// Injected stall: (channel or every channel, steps each stalled lane runs first).
    stall: Option<(Option<usize>, u32)>,
}

/// Why a lane could not run its next step (the kernel's wait accounting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Blocked {
    No,
    /// Inbound message not there (or the lane is stalled): waiting upstream.
    Up,
    /// No free outbound slot, LL scrub not acknowledged, or throttled: waiting downstream.
    Down,
}

#[derive(Clone, Copy)]
struct Conn {
    slots: usize,
    tail: usize,
    head: usize,
    slot_bytes: usize,
    nslots: u64,
    /// LL scrub sequence number (`ccl_dev_conn_t.ll_sync`, 0 = none).
    ll_sync: u32,
}

/// Reads `n` elements of an ABI array.
///
/// # Safety
/// `p` must point to `n` readable `T` (or `n == 0`).
unsafe fn read_array<T: Copy>(p: *const T, n: u32, what: &str) -> Result<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if p.is_null() {
        return Err(CclError::arg(format!(
            "emulated kernel: {what} is NULL with {n} entries"
        )));
    }
    // SAFETY: forwarded to the caller.
    Ok(unsafe { std::slice::from_raw_parts(p, n as usize) }.to_vec())
}

impl Kernel {
    /// Validates `p` (like `ccl_dev_launch_plan` does on the host) and copies its arrays.
    ///
    /// # Safety
    /// The plan's arrays must be readable now.
    pub(super) unsafe fn capture(p: &ccl_dev_plan_t) -> Result<Kernel> {
        let bad = |m: String| Err(CclError::arg(format!("emulated kernel: {m}")));
        if p.proto != CCL_PROTO_SIMPLE && p.proto != CCL_PROTO_LL {
            return bad(format!(
                "protocol {} (Simple and LL are implemented)",
                p.proto
            ));
        }
        let ll = p.proto == CCL_PROTO_LL;
        if p.n_channels == 0 || p.n_channels as usize > CCL_MAX_CHANNELS {
            return bad(format!("{} channels", p.n_channels));
        }
        if p.unit == 0 || p.unit > 8 {
            return bad(format!("unit {}", p.unit));
        }
        // SAFETY: the caller guarantees the arrays are readable.
        let (steps, lanes, locals, conns) = unsafe {
            (
                read_array(p.steps, p.n_steps, "steps")?,
                read_array(p.lanes, p.n_lanes, "lanes")?,
                read_array(p.locals, p.n_locals, "locals")?,
                read_array::<ccl_dev_conn_t>(p.conns, p.n_conns, "conns")?,
            )
        };
        let conns: Vec<Conn> = conns
            .iter()
            .map(|c| Conn {
                slots: c.slots as usize,
                tail: c.tail as usize,
                head: c.head as usize,
                slot_bytes: c.slot_bytes as usize,
                nslots: u64::from(c.nslots),
                ll_sync: c.ll_sync,
            })
            .collect();
        for (i, c) in conns.iter().enumerate() {
            if c.slots == 0 || c.tail == 0 || c.head == 0 || c.nslots == 0 || c.slot_bytes == 0 {
                return bad(format!("connection {i} is incomplete"));
            }
            if c.tail % 8 != 0 || c.head % 8 != 0 {
                return bad(format!("connection {i}: unaligned counters"));
            }
            if ll && (c.slots % 16 != 0 || c.slot_bytes % 16 != 0 || c.slot_bytes < 16) {
                return bad(format!("connection {i}: LL slots must be 16-byte lines"));
            }
        }
        let unit = p.unit as usize;
        let buf_ok = |b: u32, bytes: usize| -> bool {
            (b as usize) < CCL_MAX_BUFS && (bytes == 0 || !p.bufs[b as usize].is_null())
        };
        let mut per_channel = [0usize; CCL_MAX_CHANNELS];
        for (li, l) in lanes.iter().enumerate() {
            if l.channel >= p.n_channels {
                return bad(format!("lane {li} on channel {}", l.channel));
            }
            per_channel[l.channel as usize] += 1;
            if per_channel[l.channel as usize] > CCL_MAX_LANES_PER_CHANNEL {
                return bad(format!(
                    "more than {CCL_MAX_LANES_PER_CHANNEL} lanes on a channel"
                ));
            }
            let end = u64::from(l.first_step) + u64::from(l.n_steps);
            if end > u64::from(p.n_steps) {
                return bad(format!("lane {li}: steps beyond the step array"));
            }
            let conn = |c: i32| -> Option<Option<&Conn>> {
                if c < 0 {
                    Some(None)
                } else {
                    conns.get(c as usize).map(Some)
                }
            };
            let (Some(cin), Some(cout)) = (conn(l.conn_in), conn(l.conn_out)) else {
                return bad(format!("lane {li}: connection index out of range"));
            };
            for s in &steps[l.first_step as usize..end as usize] {
                let nb = (s.count as usize).saturating_mul(unit);
                // (count 0: a descriptor-only message of a zero-count operation)
                if s.kind > CCL_STEP_RECV_REDUCE_COPY {
                    return bad(format!("lane {li}: step kind {} count {}", s.kind, s.count));
                }
                let recvs = s.kind != CCL_STEP_SEND;
                let sends = step_sends(s.kind);
                let cap = |c: &Conn| {
                    if ll {
                        ll_chunk_bytes(c.slot_bytes)
                    } else {
                        c.slot_bytes
                    }
                };
                if recvs && cin.is_none_or(|c| nb > cap(c)) {
                    return bad(format!("lane {li}: receive without a fitting connection"));
                }
                if sends && cout.is_none_or(|c| nb > cap(c)) {
                    return bad(format!("lane {li}: send without a fitting connection"));
                }
                if !buf_ok(s.src_buf, nb) || !buf_ok(s.dst_buf, nb) {
                    return bad(format!("lane {li}: buffer index or NULL buffer"));
                }
            }
        }
        for l in &locals {
            let nb = (l.count as usize).saturating_mul(unit);
            if l.kind > CCL_LOCAL_REDUCE || !buf_ok(l.src_buf, nb) || !buf_ok(l.dst_buf, nb) {
                return bad("malformed local step".into());
            }
        }
        let red = plan_reducer(p)?;
        let needs_red = steps.iter().any(|s| {
            matches!(
                s.kind,
                CCL_STEP_RECV_REDUCE_SEND
                    | CCL_STEP_RECV_REDUCE_COPY_SEND
                    | CCL_STEP_RECV_REDUCE_COPY
            )
        }) || locals.iter().any(|l| l.kind == CCL_LOCAL_REDUCE);
        if needs_red && red.is_none() {
            return bad("reduction steps in a plan with reduce = 0".into());
        }
        if !(p.frame as usize).is_multiple_of(8)
            || !(p.abort_flag as usize).is_multiple_of(4)
            || !(p.done as usize).is_multiple_of(4)
        {
            return bad("unaligned frame or abort flag".into());
        }
        let stall = match p.stall_channel {
            CCL_STALL_NONE => None,
            CCL_STALL_ALL => Some((None, p.stall_after)),
            c if c < p.n_channels => Some((Some(c as usize), p.stall_after)),
            c => return bad(format!("stall_channel {c} of {} channels", p.n_channels)),
        };
        if lanes.iter().any(|l| l.flags & !CCL_LANE_THROTTLED != 0) {
            return bad("unknown lane flags".into());
        }
        let mut bufs = [0usize; CCL_MAX_BUFS];
        for (d, s) in bufs.iter_mut().zip(p.bufs.iter()) {
            *d = *s as usize;
        }
        Ok(Kernel {
            n_channels: p.n_channels as usize,
            unit,
            red,
            steps,
            lanes,
            locals,
            conns,
            bufs,
            frame: p.frame as usize,
            frame_capacity: u64::from(p.frame_capacity),
            frame_block: u64::from(p.frame_block),
            abort: p.abort_flag as usize,
            start_gate: p.start_gate,
            done: p.done as usize,
            ll,
            throttle_gap: (p.throttle_gap_ns > 0).then(|| Duration::from_nanos(p.throttle_gap_ns)),
            stall,
        })
    }

    pub(super) fn run(self) {
        self.run_blocks();
        // Every block's completion word, however it ended (ccl_device.h, `done`).
        if self.done != 0 {
            for ch in 0..self.n_channels {
                // SAFETY: `done` holds one 4-byte aligned word per channel of mapped memory
                // that the launch contract keeps valid until the kernel finished.
                unsafe { AtomicU32::from_ptr((self.done as *mut u32).add(ch)) }
                    .store(self.start_gate, Ordering::Release);
            }
        }
    }

    fn run_blocks(&self) {
        // The start gate (ccl_device.h): the host opens it once it prepared the frame block.
        while !self.gate_open() && !self.aborted() {
            std::thread::sleep(Duration::from_micros(20));
        }
        if self.aborted() {
            // An aborted communicator's kernel touches nothing (its peers may have freed
            // the FIFOs it would read).
            return;
        }
        let mut scratch = Vec::new();
        for l in &self.locals {
            self.local(l, &mut scratch);
        }
        let me = self;
        std::thread::scope(|sc| {
            for ch in 0..me.n_channels {
                let lanes: Vec<usize> = (0..me.lanes.len())
                    .filter(|&i| me.lanes[i].channel as usize == ch)
                    .collect();
                if lanes.is_empty() {
                    continue;
                }
                sc.spawn(move || me.channel(ch, &lanes));
            }
        });
    }

    fn gate_open(&self) -> bool {
        if self.frame == 0 || self.abort == 0 {
            return true;
        }
        let gate = self.abort + 4 * kernels::ffi::CCL_GATE_WORD;
        // SAFETY: the gate word lies in the abort flag's mapped memory (at least one cache
        // line), valid until the kernel finished (launch contract), 4-byte aligned.
        let g = unsafe { AtomicU32::from_ptr(gate as *mut u32) }.load(Ordering::Acquire);
        g.wrapping_sub(self.start_gate) as i32 >= 0
    }

    fn aborted(&self) -> bool {
        if self.abort == 0 {
            return false;
        }
        // SAFETY: the abort flag is mapped memory valid until the kernel finished (launch
        // contract), 4-byte aligned (checked), only accessed atomically by the runtime.
        unsafe { AtomicU32::from_ptr(self.abort as *mut u32) }.load(Ordering::Acquire) != 0
    }

    fn counter(addr: usize) -> &'static AtomicU64 {
        // SAFETY: conn counters are 8-byte aligned (checked at capture) emulated device
        // memory that the runtime keeps alive while any kernel of the communicator runs,
        // and every agent accesses them atomically.
        unsafe { AtomicU64::from_ptr(addr as *mut u64) }
    }

    fn store_counts(&self, ch: usize, send: u64, recv: u64) {
        if self.frame == 0 || ch as u64 >= self.frame_capacity {
            return;
        }
        let off = frame_send_offset(self.frame_capacity, self.frame_block, ch as u64) as usize;
        // SAFETY: the frame is mapped memory of frame_bytes(capacity) bytes at least, alive
        // until the kernel finished, 8-aligned; the host reads these words atomically.
        let (s, r) = unsafe {
            (
                AtomicU64::from_ptr((self.frame + off) as *mut u64),
                AtomicU64::from_ptr((self.frame + off + 8) as *mut u64),
            )
        };
        s.store(send, Ordering::Release);
        r.store(recv, Ordering::Release);
    }

    /// Stores the channel's cumulative wait times (ns) into the frame's extension slots.
    fn store_waits(&self, ch: usize, up: u64, down: u64) {
        if self.frame == 0 || ch as u64 >= self.frame_capacity {
            return;
        }
        let off = frame_wait_offset(self.frame_capacity, self.frame_block, ch as u64) as usize;
        // SAFETY: the frame is mapped memory of CCL_FRAME_TOTAL_BYTES(capacity) bytes (the
        // ABI's contract for `frame`), alive until the kernel finished, 8-aligned; the host
        // reads these words atomically.
        let (u, d) = unsafe {
            (
                AtomicU64::from_ptr((self.frame + off) as *mut u64),
                AtomicU64::from_ptr((self.frame + off + 8) as *mut u64),
            )
        };
        u.store(up, Ordering::Release);
        d.store(down, Ordering::Release);
    }

    /// One channel ("thread block"): its lanes round-robin until all finished or abort.
    fn channel(&self, ch: usize, lane_ids: &[usize]) {
        struct Run {
            lane: usize,
            pos: u32,
            consumed: u64,
            posted: u64,
            /// LL: the receiver acknowledged the scrub of conn_out (or none was needed).
            synced: bool,
            /// Steps after which the lane stops (injected stall), if any.
            stall_at: Option<u32>,
            /// Why the lane's next step could not run in the last pass.
            wait: Blocked,
        }
        let stalled = self
            .stall
            .and_then(|(c, after)| c.is_none_or(|c| c == ch).then_some(after));
        let mut runs: Vec<Run> = lane_ids
            .iter()
            .map(|&i| {
                let l = &self.lanes[i];
                let start = |c: i32, head: bool| -> u64 {
                    if c < 0 {
                        return 0;
                    }
                    let k = self.conns[c as usize];
                    Self::counter(if head { k.head } else { k.tail }).load(Ordering::Acquire)
                };
                Run {
                    lane: i,
                    pos: 0,
                    consumed: start(l.conn_in, true),
                    posted: start(l.conn_out, false),
                    synced: !self.ll
                        || l.conn_out < 0
                        || self.conns[l.conn_out as usize].ll_sync == 0,
                    stall_at: stalled,
                    wait: Blocked::No,
                }
            })
            .collect();
        if self.ll {
            // Inbound FIFOs that may hold stale non-LL bytes: zero their LL lines, then
            // tell the sender (who waits for it before its first LL message).
            for r in &runs {
                let l = &self.lanes[r.lane];
                if l.conn_in >= 0 && self.conns[l.conn_in as usize].ll_sync != 0 {
                    ll_scrub(&self.conns[l.conn_in as usize]);
                }
            }
        }
        let (mut sends, mut recvs) = (0u64, 0u64);
        let mut idle = 0u32;
        let mut scratch = Vec::new();
        let (mut ll_in, mut ll_out) = (Vec::new(), Vec::new());
        // Wait accounting: cumulative ns per reason, the current episode's start (from
        // its second idle pass) and the reasons seen at its last idle pass.
        let (mut wait_up, mut wait_down) = (0u64, 0u64);
        let mut since: Option<Instant> = None;
        let (mut blocked_up, mut blocked_down) = (false, false);
        // Injected throttle: when the channel's next throttled send may start.
        let mut next_send: Option<Instant> = None;
        while !runs.is_empty() {
            let mut progressed = false;
            for r in runs.iter_mut() {
                let l = self.lanes[r.lane];
                r.wait = Blocked::No;
                while r.pos < l.n_steps {
                    if r.stall_at.is_some_and(|k| r.pos >= k) {
                        r.wait = Blocked::Up;
                        break;
                    }
                    let st = self.steps[(l.first_step + r.pos) as usize];
                    let rcv = st.kind != CCL_STEP_SEND;
                    let snd = step_sends(st.kind);
                    let cin = (l.conn_in >= 0).then(|| self.conns[l.conn_in as usize]);
                    let cout = (l.conn_out >= 0).then(|| self.conns[l.conn_out as usize]);
                    if let (true, Some(c)) = (rcv, cin) {
                        if self.ll && st.count > 0 {
                            // The first line of the slot carries this message's flags (a
                            // descriptor-only message, count 0, has none: its tail, below).
                            let slot = c.slots + ((r.consumed % c.nslots) as usize) * c.slot_bytes;
                            if !ll_line_ready(slot, ll_flag(r.consumed + 1)) {
                                r.wait = Blocked::Up;
                                break;
                            }
                        } else if Self::counter(c.tail).load(Ordering::Acquire) <= r.consumed {
                            r.wait = Blocked::Up;
                            break;
                        }
                    }
                    let throttled =
                        snd && l.flags & CCL_LANE_THROTTLED != 0 && self.throttle_gap.is_some();
                    if let (true, Some(c)) = (snd, cout) {
                        let head = Self::counter(c.head).load(Ordering::Acquire);
                        if r.posted - head >= c.nslots {
                            r.wait = Blocked::Down;
                            break;
                        }
                        if !r.synced {
                            if ll_sync_word(&c).load(Ordering::Acquire) != u64::from(c.ll_sync) {
                                r.wait = Blocked::Down;
                                break;
                            }
                            r.synced = true;
                        }
                        if throttled && next_send.is_some_and(|n| Instant::now() < n) {
                            r.wait = Blocked::Down;
                            break;
                        }
                    }
                    if let (true, Some(gap)) = (throttled, self.throttle_gap) {
                        // The gap starts now; the channel's next throttled send waits for it.
                        next_send = Some(Instant::now() + gap);
                    }
                    let nb = st.count as usize * self.unit;
                    let mut inb = cin
                        .filter(|_| rcv)
                        .map(|c| c.slots + ((r.consumed % c.nslots) as usize) * c.slot_bytes);
                    let mut out = cout
                        .filter(|_| snd)
                        .map(|c| c.slots + ((r.posted % c.nslots) as usize) * c.slot_bytes);
                    let ll_slot_out = out;
                    if self.ll {
                        if let Some(slot) = inb {
                            if !self.ll_recv(slot, nb, ll_flag(r.consumed + 1), &mut ll_in) {
                                return; // aborted
                            }
                            inb = Some(ll_in.as_ptr() as usize);
                        }
                        if out.is_some() {
                            ll_out.clear();
                            ll_out.resize(nb.div_ceil(8) * 8, 0);
                            out = Some(ll_out.as_mut_ptr() as usize);
                        }
                    }
                    self.step(&st, inb, out, &mut scratch);
                    if let (true, Some(slot)) = (self.ll, ll_slot_out) {
                        ll_pack(slot, &ll_out, ll_flag(r.posted + 1));
                    }
                    // The probe counts data messages, not descriptor-only ones (count 0).
                    let counted = u64::from(st.count != 0);
                    if let (true, Some(c)) = (rcv, cin) {
                        r.consumed += 1;
                        Self::counter(c.head).store(r.consumed, Ordering::Release);
                        recvs += counted;
                    }
                    if let (true, Some(c)) = (snd, cout) {
                        r.posted += 1;
                        Self::counter(c.tail).store(r.posted, Ordering::Release);
                        sends += counted;
                    }
                    self.store_counts(ch, sends, recvs);
                    r.pos += 1;
                    progressed = true;
                }
            }
            if progressed {
                // A wait episode ended: charge it to the reasons of its last idle pass.
                if let Some(t0) = since.take() {
                    let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    if blocked_up {
                        wait_up = wait_up.saturating_add(ns);
                    }
                    if blocked_down {
                        wait_down = wait_down.saturating_add(ns);
                    }
                    self.store_waits(ch, wait_up, wait_down);
                }
            }
            runs.retain(|r| r.pos < self.lanes[r.lane].n_steps);
            if progressed {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            if idle == 2 {
                since = Some(Instant::now());
            }
            if idle >= 2 {
                blocked_up = runs.iter().any(|r| r.wait == Blocked::Up);
                blocked_down = runs.iter().any(|r| r.wait == Blocked::Down);
            }
            if idle.is_multiple_of(64) && self.aborted() {
                return;
            }
            backoff(idle);
        }
    }

    /// LL receive of one message of `nb` payload bytes from the slot at `slot`: waits for
    /// every line's two flags to equal `flag`, unpacks the payload into `out` (padded to
    /// whole lines). False when the wait ended on abort.
    fn ll_recv(&self, slot: usize, nb: usize, flag: u32, out: &mut Vec<u8>) -> bool {
        let lines = nb.div_ceil(8);
        out.clear();
        out.reserve(lines * 8);
        for i in 0..lines {
            let mut idle = 0u32;
            let (lo, hi) = loop {
                let (lo, hi) = ll_load_line(slot + 16 * i);
                if (lo >> 32) as u32 == flag && (hi >> 32) as u32 == flag {
                    break (lo, hi);
                }
                idle = idle.saturating_add(1);
                if idle.is_multiple_of(64) && self.aborted() {
                    return false;
                }
                backoff(idle);
            };
            out.extend_from_slice(&(lo as u32).to_le_bytes());
            out.extend_from_slice(&(hi as u32).to_le_bytes());
        }
        true
    }

    /// Executes one step (readiness checked by the caller). `inb` / `out`: the inbound and
    /// outbound slot addresses, when the step receives / sends.
    fn step(
        &self,
        st: &ccl_dev_step_t,
        inb: Option<usize>,
        out: Option<usize>,
        scratch: &mut Vec<u8>,
    ) {
        let nb = st.count as usize * self.unit;
        let src = self.bufs[st.src_buf as usize] + st.src_off as usize * self.unit;
        let dst = self.bufs[st.dst_buf as usize] + st.dst_off as usize * self.unit;
        // The plan addresses only ranges inside the operation's buffers (schedule bounds;
        // the runtime's enqueue contract) and FIFO slots of slot_bytes >= nb (checked at
        // capture); lanes write disjoint ranges; a slot is owned by this lane between the
        // readiness check and the counter store. Slices made here never overlap each other
        // while alive (slots vs user buffers; in-place reductions go through `scratch`).
        let rd = |a: usize| {
            // SAFETY: the plan addresses only ranges inside the operation's buffers or FIFO
            // slots of at least `nb` bytes (bounds checked at capture), so `a .. a + nb` is
            // readable for this step.
            unsafe { raw_bytes(a, nb) }
        };
        let wr = |a: usize| {
            // SAFETY: as for `rd`, `a .. a + nb` is inside a buffer or slot; lanes write
            // disjoint ranges and a slot belongs to this lane until its counter store, so no
            // other slice of it is alive.
            unsafe { raw_bytes_mut(a, nb) }
        };
        let red = self.red.as_ref();
        match (st.kind, inb, out) {
            (CCL_STEP_SEND, _, Some(o)) => match red {
                Some(r) => r.load(wr(o), rd(src)),
                None => wr(o).copy_from_slice(rd(src)),
            },
            (CCL_STEP_RECV, Some(i), _) => {
                // SAFETY: `i` is an inbound slot of at least `nb` bytes owned by this lane,
                // `dst .. dst + nb` is inside the operation's output buffer; a FIFO slot and a
                // user buffer never overlap.
                unsafe { std::ptr::copy_nonoverlapping(i as *const u8, dst as *mut u8, nb) };
            }
            (CCL_STEP_RECV_COPY_SEND, Some(i), Some(o)) => {
                wr(o).copy_from_slice(rd(i));
                wr(dst).copy_from_slice(rd(i));
            }
            (CCL_STEP_RECV_REDUCE_SEND, Some(i), Some(o)) => {
                if let Some(r) = red {
                    r.combine(wr(o), rd(i), rd(src));
                }
            }
            (CCL_STEP_RECV_REDUCE_COPY_SEND, Some(i), Some(o)) => {
                if let Some(r) = red {
                    r.combine(wr(o), rd(i), rd(src));
                    if r.needs_finish() {
                        r.finish(wr(o));
                    }
                    wr(dst).copy_from_slice(rd(o));
                }
            }
            (CCL_STEP_RECV_REDUCE_COPY, Some(i), _) => {
                if let Some(r) = red {
                    scratch.resize(nb, 0);
                    r.combine(&mut scratch[..nb], rd(i), rd(src));
                    if r.needs_finish() {
                        r.finish(&mut scratch[..nb]);
                    }
                    wr(dst).copy_from_slice(&scratch[..nb]);
                }
            }
            // Unreachable after capture's checks (kinds, connections).
            _ => tracing::error!(target: "nccl::COLL", "emulated kernel: malformed step {st:?}"),
        }
    }

    fn local(&self, l: &ccl_dev_local_t, scratch: &mut Vec<u8>) {
        let nb = l.count as usize * self.unit;
        let src = self.bufs[l.src_buf as usize] + l.src_off as usize * self.unit;
        let dst = self.bufs[l.dst_buf as usize] + l.dst_off as usize * self.unit;
        if nb == 0 {
            return;
        }
        match (l.kind, self.red.as_ref()) {
            (CCL_LOCAL_COPY, _) => {
                if src != dst {
                    // SAFETY: ranges inside the operation's buffers (as for steps); memmove.
                    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, nb) };
                }
            }
            (_, Some(r)) => {
                scratch.resize(nb, 0);
                // SAFETY: `src .. src + nb` is inside the operation's buffers (as for steps);
                // the source slice dies before the destination is written.
                r.load(&mut scratch[..nb], unsafe {
                    std::slice::from_raw_parts(src as *const u8, nb)
                });
                if r.needs_finish() {
                    r.finish(&mut scratch[..nb]);
                }
                // SAFETY: `dst .. dst + nb` is inside the operation's buffers; `scratch` is
                // this kernel's own vector, so the two never overlap.
                unsafe { std::ptr::copy_nonoverlapping(scratch.as_ptr(), dst as *mut u8, nb) };
            }
            (_, None) => {}
        }
    }
}

/// Spin, then yield, then sleep: the emulator's idle wait (`idle` = attempts so far).
fn backoff(idle: u32) {
    if idle < 64 {
        std::hint::spin_loop();
    } else if idle < 256 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Payload bytes of one LL message in a slot of `slot_bytes` (the kernel's rule; the
/// runtime plans LL operations with chunks of this size).
pub fn ll_chunk_bytes(slot_bytes: usize) -> usize {
    crate::proto::ll_chunk_bytes(slot_bytes)
}

/// The flag of message `m` (1-based count of messages sent on the connection): its low
/// 32 bits. 0 never appears before 2^32 messages (FIFO memory starts zeroed or scrubbed).
pub fn ll_flag(m: u64) -> u32 {
    m as u32
}

/// Packs `payload` into LL lines `{data0, flag, data1, flag}` (little-endian u32 each),
/// 8 payload bytes per 16-byte line, the last line zero-padded. Pure (for tests and the
/// emulator's packing).
pub fn ll_lines(payload: &[u8], flag: u32) -> Vec<[u64; 2]> {
    payload
        .chunks(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            let d0 = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            let d1 = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
            [
                u64::from(d0) | (u64::from(flag) << 32),
                u64::from(d1) | (u64::from(flag) << 32),
            ]
        })
        .collect()
}

/// The payload of LL lines whose flags all equal `flag` (`None` if one differs), `nb`
/// bytes. Pure inverse of [`ll_lines`].
pub fn ll_unlines(lines: &[[u64; 2]], flag: u32, nb: usize) -> Option<Vec<u8>> {
    let mut v = Vec::with_capacity(lines.len() * 8);
    for [lo, hi] in lines {
        if (lo >> 32) as u32 != flag || (hi >> 32) as u32 != flag {
            return None;
        }
        v.extend_from_slice(&(*lo as u32).to_le_bytes());
        v.extend_from_slice(&(*hi as u32).to_le_bytes());
    }
    (v.len() >= nb).then(|| {
        v.truncate(nb);
        v
    })
}

fn ll_word(addr: usize) -> &'static AtomicU64 {
    // SAFETY: LL lines live in FIFO slots (16-byte aligned, checked at capture) of emulated
    // device memory the runtime keeps alive while any kernel of the communicator runs;
    // while a connection runs LL every agent accesses its lines with 8-byte atomics.
    unsafe { AtomicU64::from_ptr(addr as *mut u64) }
}

/// Both 8-byte halves of the line at `addr` (Acquire: the data of a half is valid when
/// its flag matches, they are one atomic word).
fn ll_load_line(addr: usize) -> (u64, u64) {
    (
        ll_word(addr).load(Ordering::Acquire),
        ll_word(addr + 8).load(Ordering::Acquire),
    )
}

/// The readiness peek: the first line of the slot carries `flag` in both halves.
fn ll_line_ready(slot: usize, flag: u32) -> bool {
    let (lo, hi) = ll_load_line(slot);
    (lo >> 32) as u32 == flag && (hi >> 32) as u32 == flag
}

/// Stores `payload` as LL lines with `flag` into the slot at `slot` (Release per word).
fn ll_pack(slot: usize, payload: &[u8], flag: u32) {
    for (i, [lo, hi]) in ll_lines(payload, flag).into_iter().enumerate() {
        ll_word(slot + 16 * i).store(lo, Ordering::Release);
        ll_word(slot + 16 * i + 8).store(hi, Ordering::Release);
    }
}

/// The LL scrub word of a connection: the 8 bytes after `head` (receiver-written).
fn ll_sync_word(c: &Conn) -> &'static AtomicU64 {
    // SAFETY: the connection's header holds head and, right after it, the scrub word
    // (ABI: `ccl_dev_conn_t.ll_sync`), 8-aligned (head is, checked at capture), alive as
    // the counters are, accessed atomically by every agent.
    unsafe { AtomicU64::from_ptr((c.head + 8) as *mut u64) }
}

/// Zeroes the LL lines of every slot of `c` (the part an LL message can use), then
/// publishes the scrub (`ll_sync`) for the sender.
fn ll_scrub(c: &Conn) {
    let used = 2 * ll_chunk_bytes(c.slot_bytes);
    for k in 0..c.nslots as usize {
        let base = c.slots + k * c.slot_bytes;
        for off in (0..used).step_by(8) {
            ll_word(base + off).store(0, Ordering::Relaxed);
        }
    }
    ll_sync_word(c).store(u64::from(c.ll_sync), Ordering::Release);
}
