//! Lowering of a pure [`Plan`] into the flat, `#[repr(C)]` arrays of the kernels' ABI
//! (`ccl_dev_step_t` / `ccl_dev_lane_t` / `ccl_dev_local_t`), plus the list of connections
//! the lanes use, which the runtime maps to FIFO memory (same device, peer device, or a
//! CUDA IPC mapping) before building the `ccl_dev_plan_t`. Pure: no device calls.

use std::collections::HashMap;

use kernels::ffi::{
    ccl_dev_lane_t, ccl_dev_local_t, ccl_dev_step_t, CCL_LANE_THROTTLED, CCL_LOCAL_COPY,
    CCL_LOCAL_REDUCE, CCL_MAX_BUFS, CCL_MAX_CHANNELS, CCL_MAX_LANES_PER_CHANNEL, CCL_OP_MAX,
    CCL_OP_MIN, CCL_OP_PREMUL, CCL_OP_PROD, CCL_OP_SUM, CCL_STALL_ALL, CCL_STALL_NONE,
    CCL_STEP_RECV, CCL_STEP_RECV_COPY_SEND, CCL_STEP_RECV_REDUCE_COPY,
    CCL_STEP_RECV_REDUCE_COPY_SEND, CCL_STEP_RECV_REDUCE_SEND, CCL_STEP_SEND,
};

use crate::error::{CclError, Result};
use crate::reduce::Reducer;
use crate::schedule::{LinkKind, LocalKind, Plan, StepKind};
use crate::types::RedOpKind;

/// Direction of a connection end, seen from this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConnDir {
    /// Messages come in from `peer`.
    In,
    /// Messages go out to `peer`.
    Out,
}

/// A connection end a lane uses: rank `peer`, channel, link set and direction. Rank r's
/// `Out` key (peer t, channel c, link l) is the same FIFO as rank t's `In` key (peer r,
/// channel c, link l).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnKey {
    /// Ring or per-peer connections.
    pub link: LinkKind,
    /// The other rank.
    pub peer: usize,
    /// Channel.
    pub channel: usize,
    /// Direction.
    pub dir: ConnDir,
}

/// The ABI arrays of one rank's operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoweredPlan {
    /// Grid size (one thread block per channel).
    pub n_channels: u32,
    /// Bytes per unit.
    pub unit: u32,
    /// Every lane's steps, lane after lane.
    pub steps: Vec<ccl_dev_step_t>,
    /// Lanes (conn indices point into `conns`).
    pub lanes: Vec<ccl_dev_lane_t>,
    /// Local steps.
    pub locals: Vec<ccl_dev_local_t>,
    /// Connections, by index.
    pub conns: Vec<ConnKey>,
}

impl LoweredPlan {
    /// Per-channel (sends, receives) the kernel will count: what the probe frame shows
    /// when the operation completed.
    pub fn counts_per_channel(&self) -> Vec<(u64, u64)> {
        let mut v = vec![(0u64, 0u64); self.n_channels as usize];
        for l in &self.lanes {
            let first = l.first_step as usize;
            for s in &self.steps[first..first + l.n_steps as usize] {
                let c = &mut v[l.channel as usize];
                c.0 += u64::from(step_sends(s.kind));
                c.1 += u64::from(s.kind != CCL_STEP_SEND);
            }
        }
        v
    }
}

fn step_code(k: StepKind) -> u32 {
    match k {
        StepKind::Send => CCL_STEP_SEND,
        StepKind::Recv => CCL_STEP_RECV,
        StepKind::RecvReduceSend => CCL_STEP_RECV_REDUCE_SEND,
        StepKind::RecvReduceCopySend => CCL_STEP_RECV_REDUCE_COPY_SEND,
        StepKind::RecvCopySend => CCL_STEP_RECV_COPY_SEND,
        StepKind::RecvReduceCopy => CCL_STEP_RECV_REDUCE_COPY,
    }
}

fn step_sends(code: u32) -> bool {
    matches!(
        code,
        CCL_STEP_SEND
            | CCL_STEP_RECV_REDUCE_SEND
            | CCL_STEP_RECV_REDUCE_COPY_SEND
            | CCL_STEP_RECV_COPY_SEND
    )
}

fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| CclError::Internal(format!("device plan: {what} {v} too large")))
}

/// Lowers `plan` (whose buffers are indices below `n_bufs`) into the kernels' arrays.
/// Errors name the limit a plan exceeds (channels, lanes per channel, buffers).
pub fn lower(plan: &Plan, n_bufs: usize) -> Result<LoweredPlan> {
    let bad = |m: String| Err(CclError::Internal(format!("device plan: {m}")));
    if plan.n_channels == 0 || plan.n_channels > CCL_MAX_CHANNELS {
        return bad(format!(
            "{} channels (1..={CCL_MAX_CHANNELS})",
            plan.n_channels
        ));
    }
    if plan.unit == 0 || plan.unit > 8 {
        return bad(format!("unit of {} bytes", plan.unit));
    }
    if n_bufs > CCL_MAX_BUFS {
        return Err(CclError::usage(format!(
            "the device backend runs at most {CCL_MAX_BUFS} buffers per operation \
             (a group of {n_bufs} p2p calls on one communicator)"
        )));
    }
    let buf = |b: usize| -> Result<u32> {
        if b >= n_bufs {
            return Err(CclError::Internal(format!(
                "device plan: buffer {b} of {n_bufs}"
            )));
        }
        u32_of(b, "buffer")
    };
    let mut out = LoweredPlan {
        n_channels: u32_of(plan.n_channels, "channels")?,
        unit: u32_of(plan.unit, "unit")?,
        steps: Vec::with_capacity(plan.total_steps()),
        lanes: Vec::with_capacity(plan.lanes.len()),
        locals: Vec::with_capacity(plan.local.len()),
        conns: Vec::new(),
    };
    let mut conn_index: HashMap<ConnKey, usize> = HashMap::new();
    let mut per_channel = vec![0usize; plan.n_channels];
    let mut conn = |key: ConnKey, conns: &mut Vec<ConnKey>| -> Result<i32> {
        if conn_index.contains_key(&key) {
            return Err(CclError::Internal(format!(
                "device plan: two lanes share connection {key:?}"
            )));
        }
        conn_index.insert(key, conns.len());
        conns.push(key);
        i32::try_from(conns.len() - 1)
            .map_err(|_| CclError::Internal("device plan: too many connections".into()))
    };
    for lane in &plan.lanes {
        if lane.steps.is_empty() {
            continue;
        }
        let ch = lane.channel;
        if ch >= plan.n_channels {
            return bad(format!("lane on channel {ch} of {}", plan.n_channels));
        }
        per_channel[ch] += 1;
        if per_channel[ch] > CCL_MAX_LANES_PER_CHANNEL {
            return Err(CclError::usage(format!(
                "the device backend runs at most {CCL_MAX_LANES_PER_CHANNEL} lanes per channel \
                 (too many peers in one p2p group)"
            )));
        }
        let recvs = lane.steps.iter().any(|s| s.kind.recvs());
        let sends = lane.steps.iter().any(|s| s.kind.sends());
        let conn_in = match (recvs, lane.recv_from) {
            (false, _) => -1,
            (true, Some(peer)) => conn(
                ConnKey {
                    link: lane.link,
                    peer,
                    channel: ch,
                    dir: ConnDir::In,
                },
                &mut out.conns,
            )?,
            (true, None) => return bad(format!("receiving lane on channel {ch} without a peer")),
        };
        let conn_out = match (sends, lane.send_to) {
            (false, _) => -1,
            (true, Some(peer)) => conn(
                ConnKey {
                    link: lane.link,
                    peer,
                    channel: ch,
                    dir: ConnDir::Out,
                },
                &mut out.conns,
            )?,
            (true, None) => return bad(format!("sending lane on channel {ch} without a peer")),
        };
        let first_step = u32_of(out.steps.len(), "step index")?;
        for s in &lane.steps {
            out.steps.push(ccl_dev_step_t {
                kind: step_code(s.kind),
                src_buf: buf(s.src_buf)?,
                dst_buf: buf(s.dst_buf)?,
                reserved: 0,
                src_off: s.src_off as u64,
                dst_off: s.dst_off as u64,
                count: s.count as u64,
            });
        }
        out.lanes.push(ccl_dev_lane_t {
            channel: u32_of(ch, "channel")?,
            first_step,
            n_steps: u32_of(lane.steps.len(), "steps")?,
            conn_in,
            conn_out,
            flags: 0,
        });
    }
    for l in &plan.local {
        out.locals.push(ccl_dev_local_t {
            kind: match l.kind {
                LocalKind::Copy => CCL_LOCAL_COPY,
                LocalKind::Reduce => CCL_LOCAL_REDUCE,
            },
            src_buf: buf(l.src_buf)?,
            dst_buf: buf(l.dst_buf)?,
            reserved: 0,
            src_off: l.src_off as u64,
            dst_off: l.dst_off as u64,
            count: l.count as u64,
        });
    }
    u32_of(out.steps.len(), "steps")?;
    Ok(out)
}

/// The fault fields of `ccl_dev_plan_t` (`CCLD_INJECT`, see [`apply_fault`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultFields {
    /// `throttle_gap_ns` (0: no throttle).
    pub throttle_gap_ns: u64,
    /// `stall_channel` (`CCL_STALL_NONE`, `CCL_STALL_ALL` or a channel).
    pub stall_channel: u32,
    /// `stall_after`: steps each stalled lane runs before it stops.
    pub stall_after: u32,
}

/// Applies an operation's injected throttle and stall to a lowered plan, with the host
/// executor's rules: a throttle marks every lane that sends to the throttled peer (or every
/// sending lane when no peer is named) `CCL_LANE_THROTTLED` and sets the gap; a stall stops
/// the lanes of one channel (or of all) before their first step (a channel the plan does
/// not use never stalls, as on the host). Halving is not a plan field: see [`halved`].
pub fn apply_fault(lp: &mut LoweredPlan, fault: &crate::inject::OpFault) -> FaultFields {
    let mut f = FaultFields {
        throttle_gap_ns: 0,
        stall_channel: CCL_STALL_NONE,
        stall_after: 0,
    };
    if let Some((gap, link)) = fault.throttle {
        // At least 1 ns (a zero gap would mean "no throttle"); clamped to u64.
        f.throttle_gap_ns = u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX).max(1);
        for l in &mut lp.lanes {
            let peer = usize::try_from(l.conn_out)
                .ok()
                .and_then(|i| lp.conns.get(i))
                .map(|k| k.peer);
            if peer.is_some_and(|p| link.is_none_or(|t| t == p)) {
                l.flags |= CCL_LANE_THROTTLED;
            }
        }
    }
    match fault.stall {
        Some(None) => f.stall_channel = CCL_STALL_ALL,
        Some(Some(c)) if c < lp.n_channels as usize => f.stall_channel = c as u32,
        _ => {}
    }
    f
}

/// An injected h2 fault's plan: every lane keeps the first half of its steps (rounded up),
/// as the host executor runs it; local steps stay.
pub fn halved(plan: &Plan) -> Plan {
    let mut p = plan.clone();
    for l in &mut p.lanes {
        let n = l.steps.len().div_ceil(2);
        l.steps.truncate(n);
    }
    p
}

/// The reduction fields of `ccl_dev_plan_t` for a reducer: the kernel's element operation,
/// the integer-Avg divisor and the pre-multiplication scalar bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedParams {
    /// `dtype` field (ncclDataType_t).
    pub dtype: u32,
    /// `op` field (CCL_OP_*).
    pub op: u32,
    /// `avg_divisor` field (0: none).
    pub avg_divisor: u32,
    /// `scalar_bits` field (little-endian dtype bits of the prescale).
    pub scalar_bits: u64,
}

/// Maps a [`Reducer`] (the host backend's semantics) to the kernel's parameters: the same
/// prescale (PreMulSum scalar, float Avg's `1/n` rounded to the type) and the same integer
/// Avg division by `nranks`.
pub fn red_params(r: &Reducer, nranks: usize) -> Result<RedParams> {
    let mut scalar_bits = 0u64;
    let op = match r.prescale() {
        Some(bytes) => {
            let mut b = [0u8; 8];
            b[..bytes.len()].copy_from_slice(bytes);
            scalar_bits = u64::from_le_bytes(b);
            CCL_OP_PREMUL
        }
        None => match r.op() {
            RedOpKind::Sum | RedOpKind::Avg => CCL_OP_SUM,
            RedOpKind::Prod => CCL_OP_PROD,
            RedOpKind::Max => CCL_OP_MAX,
            RedOpKind::Min => CCL_OP_MIN,
            RedOpKind::PreMulSum => {
                return Err(CclError::Internal(
                    "PreMulSum reducer without a scalar".into(),
                ))
            }
        },
    };
    let avg_divisor = if r.needs_finish() {
        u32::try_from(nranks).map_err(|_| CclError::arg(format!("{nranks} ranks")))?
    } else {
        0
    };
    Ok(RedParams {
        dtype: r.dtype() as u32,
        op,
        avg_divisor,
        scalar_bits,
    })
}

/// One byte copy between device addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteCopy {
    /// Source address.
    pub src: usize,
    /// Destination address.
    pub dst: usize,
    /// Bytes.
    pub bytes: usize,
}

/// The byte copies that do what `lp` does when it only moves bytes, so that the runtime
/// can enqueue them as `cudaMemcpyAsync` instead of launching the kernel (a one-rank
/// communicator: NVIDIA's NCCL copies too). That holds when `lp` has no lanes and each
/// local step is a copy, or a reduction whose element function returns its input unchanged:
/// the kernel's own rule (`elem` in ccl_kernel_body.h): no pre-multiplication and no
/// average divisor. `red` is the reduction's parameters (None: no reduction). In-place
/// steps (source == destination) need no copy. `bufs` are the buffers' device addresses.
/// None when a step needs the kernel.
pub fn byte_copies(
    lp: &LoweredPlan,
    bufs: &[usize],
    red: Option<&RedParams>,
) -> Option<Vec<ByteCopy>> {
    if !lp.lanes.is_empty() {
        return None;
    }
    let identity = red.is_none_or(|r| r.op != CCL_OP_PREMUL && r.avg_divisor == 0);
    let unit = lp.unit as usize;
    let mut v = Vec::with_capacity(lp.locals.len());
    for l in &lp.locals {
        if !(l.kind == CCL_LOCAL_COPY || (l.kind == CCL_LOCAL_REDUCE && identity)) {
            return None;
        }
        let at = |buf: u32, off: u64| -> Option<usize> {
            let base = *bufs.get(buf as usize)?;
            base.checked_add(usize::try_from(off).ok()?.checked_mul(unit)?)
        };
        let (src, dst) = (at(l.src_buf, l.src_off)?, at(l.dst_buf, l.dst_off)?);
        let bytes = usize::try_from(l.count).ok()?.checked_mul(unit)?;
        if src != dst && bytes > 0 {
            v.push(ByteCopy { src, dst, bytes });
        }
    }
    Some(v)
}

#[cfg(test)]
pub(crate) mod tests;
