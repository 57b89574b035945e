//! Hand-written mirror of `include/ccl_device.h` (checked against it by the tests).

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_void};

/// `ccl_dev_result_t`.
pub type ccl_dev_result_t = i32;
/// Success.
pub const CCL_DEV_OK: i32 = 0;
/// No driver or no device.
pub const CCL_DEV_NO_DEVICE: i32 = 1;
/// A runtime call failed.
pub const CCL_DEV_RUNTIME_ERROR: i32 = 2;
/// Invalid argument.
pub const CCL_DEV_INVALID: i32 = 3;
/// Not available in this build.
pub const CCL_DEV_UNSUPPORTED: i32 = 4;
/// Work still pending (stream query).
pub const CCL_DEV_NOT_READY: i32 = 5;

/// Blocks of a probing frame.
pub const CCL_FRAME_BLOCKS: usize = 8;
/// Header bytes of a probing frame.
pub const CCL_FRAME_HEADER_BYTES: usize = 32;
/// Channels of the paper's frame.
pub const CCL_PAPER_CHANNELS: usize = 8;

/// Step kinds (`ccl_core::schedule::StepKind`).
pub const CCL_STEP_SEND: u32 = 0;
/// Recv.
pub const CCL_STEP_RECV: u32 = 1;
/// RecvReduceSend.
pub const CCL_STEP_RECV_REDUCE_SEND: u32 = 2;
/// RecvReduceCopySend.
pub const CCL_STEP_RECV_REDUCE_COPY_SEND: u32 = 3;
/// RecvCopySend.
pub const CCL_STEP_RECV_COPY_SEND: u32 = 4;
/// RecvReduceCopy.
pub const CCL_STEP_RECV_REDUCE_COPY: u32 = 5;
/// Local copy.
pub const CCL_LOCAL_COPY: u32 = 0;
/// Local single-rank reduction.
pub const CCL_LOCAL_REDUCE: u32 = 1;
/// Element operations.
pub const CCL_OP_SUM: u32 = 0;
/// Prod.
pub const CCL_OP_PROD: u32 = 1;
/// Max.
pub const CCL_OP_MAX: u32 = 2;
/// Min.
pub const CCL_OP_MIN: u32 = 3;
/// Pre-multiplied sum.
pub const CCL_OP_PREMUL: u32 = 4;
/// Simple protocol.
pub const CCL_PROTO_SIMPLE: u32 = 0;
/// LL protocol: 16-byte lines {data, flag, data, flag}.
pub const CCL_PROTO_LL: u32 = 1;
/// Most payload bytes of one LL message (`CCL_LL_MAX_CHUNK`).
pub const CCL_LL_MAX_CHUNK: usize = 16384;

/// `CCL_LL_CHUNK(slot_bytes)`: payload bytes of one LL message in a slot of `slot_bytes`
/// (half the slot, at most `CCL_LL_MAX_CHUNK`, a multiple of 8).
pub const fn ll_chunk(slot_bytes: u64) -> u64 {
    let half = slot_bytes / 2;
    let c = if half < CCL_LL_MAX_CHUNK as u64 {
        half
    } else {
        CCL_LL_MAX_CHUNK as u64
    };
    c / 8 * 8
}
/// Buffers per plan.
pub const CCL_MAX_BUFS: usize = 64;
/// Lanes per channel.
pub const CCL_MAX_LANES_PER_CHANNEL: usize = 64;
/// Channels.
pub const CCL_MAX_CHANNELS: usize = 32;
/// IPC handle bytes.
pub const CCL_IPC_HANDLE_BYTES: usize = 64;

/// `ccl_trace_id_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ccl_trace_id_t {
    pub comm_id: u64,
    pub op_counter: u32,
    pub extension: u32,
}

/// `ccl_frame_header_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ccl_frame_header_t {
    pub op_counter: u64,
    pub mode: u32,
    pub kernel_index: u32,
    pub n_channels: u32,
    pub reserved: [u32; 3],
}

/// `ccl_channel_counts_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ccl_channel_counts_t {
    pub send_count: u64,
    pub recv_count: u64,
}

/// `ccl_frame_block8_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ccl_frame_block8_t {
    pub trace: ccl_trace_id_t,
    pub channels: [ccl_channel_counts_t; CCL_PAPER_CHANNELS],
}

/// `ccl_probing_frame8_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ccl_probing_frame8_t {
    pub header: ccl_frame_header_t,
    pub blocks: [ccl_frame_block8_t; CCL_FRAME_BLOCKS],
}

/// `CCL_FRAME_BLOCK_BYTES(cap)`.
pub const fn frame_block_bytes(cap: u64) -> u64 {
    16 + 16 * cap
}
/// `CCL_FRAME_BYTES(cap)`.
pub const fn frame_bytes(cap: u64) -> u64 {
    CCL_FRAME_HEADER_BYTES as u64 + CCL_FRAME_BLOCKS as u64 * frame_block_bytes(cap)
}
/// `CCL_FRAME_SEND_OFFSET(cap, b, ch)`.
pub const fn frame_send_offset(cap: u64, block: u64, ch: u64) -> u64 {
    CCL_FRAME_HEADER_BYTES as u64 + block * frame_block_bytes(cap) + 16 + 16 * ch
}

/// `CCL_FRAME_EXT_WORDS`: extension words per block and channel (probe's
/// `EXT_WORDS_PER_CHANNEL`).
pub const CCL_FRAME_EXT_WORDS: u64 = 4;
/// `CCL_FRAME_TOTAL_BYTES(cap)`: base frame plus extension slots.
pub const fn frame_total_bytes(cap: u64) -> u64 {
    frame_bytes(cap) + CCL_FRAME_BLOCKS as u64 * cap * 8 * CCL_FRAME_EXT_WORDS
}
/// `CCL_FRAME_WAIT_OFFSET(cap, b, ch)`: channel `ch`'s upstream wait (ns) in block `b`; the
/// downstream wait follows at +8.
pub const fn frame_wait_offset(cap: u64, block: u64, ch: u64) -> u64 {
    frame_bytes(cap) + (block * cap + ch) * 8 * CCL_FRAME_EXT_WORDS
}

/// `ccl_dev_step_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ccl_dev_step_t {
    pub kind: u32,
    pub src_buf: u32,
    pub dst_buf: u32,
    pub reserved: u32,
    pub src_off: u64,
    pub dst_off: u64,
    pub count: u64,
}

/// `ccl_dev_conn_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ccl_dev_conn_t {
    pub slots: *mut c_void,
    pub tail: *mut u64,
    pub head: *mut u64,
    pub slot_bytes: u64,
    pub nslots: u32,
    pub ll_sync: u32,
    /// Descriptor words per slot (`CCL_DESC_WORDS` each), null: no descriptors.
    pub descs: *mut u64,
}

/// `ccl_dev_lane_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ccl_dev_lane_t {
    pub channel: u32,
    pub first_step: u32,
    pub n_steps: u32,
    pub conn_in: i32,
    pub conn_out: i32,
    pub flags: u32,
}

/// `CCL_LANE_THROTTLED`: the lane's sends obey `ccl_dev_plan_t.throttle_gap_ns`.
pub const CCL_LANE_THROTTLED: u32 = 1;
/// `CCL_STALL_NONE`: no channel stalls.
pub const CCL_STALL_NONE: u32 = 0xffff_ffff;
/// `CCL_STALL_ALL`: every channel stalls.
pub const CCL_STALL_ALL: u32 = 0xffff_fffe;

/// `ccl_dev_local_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ccl_dev_local_t {
    pub kind: u32,
    pub src_buf: u32,
    pub dst_buf: u32,
    pub reserved: u32,
    pub src_off: u64,
    pub dst_off: u64,
    pub count: u64,
}

/// `ccl_dev_plan_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ccl_dev_plan_t {
    pub n_channels: u32,
    pub n_lanes: u32,
    pub n_locals: u32,
    pub n_steps: u32,
    pub n_conns: u32,
    pub unit: u32,
    pub dtype: u32,
    pub op: u32,
    pub reduce: u32,
    pub avg_divisor: u32,
    pub scalar_bits: u64,
    pub scalar_dev: *const c_void,
    pub steps: *const ccl_dev_step_t,
    pub lanes: *const ccl_dev_lane_t,
    pub locals: *const ccl_dev_local_t,
    pub conns: *const ccl_dev_conn_t,
    pub bufs: [*mut c_void; CCL_MAX_BUFS],
    pub frame: *mut u64,
    pub frame_capacity: u32,
    pub frame_block: u32,
    pub proto: u32,
    pub reserved: u32,
    pub abort_flag: *const u32,
    /// Completion words (one per block), see ccl_device.h.
    pub done: *mut u32,
    pub throttle_gap_ns: u64,
    pub stall_channel: u32,
    pub stall_after: u32,
    /// The check area (`CCL_CHECK_BYTES` of mapped memory), null: no descriptor check.
    pub check: *mut u64,
    pub rank: u32,
    /// The start gate (`CCL_GATE_WORD`), see ccl_device.h.
    pub start_gate: u32,
    /// The descriptor of each buffer index.
    pub desc: [[u64; CCL_DESC_WORDS]; CCL_MAX_BUFS],
}

impl ccl_dev_plan_t {
    /// A plan with nothing to do: one channel, 4-byte units, Simple, no arrays, buffers,
    /// frame, abort flag, check or fault (a base for plans built field by field).
    pub fn idle() -> Self {
        ccl_dev_plan_t {
            n_channels: 1,
            n_lanes: 0,
            n_locals: 0,
            n_steps: 0,
            n_conns: 0,
            unit: 4,
            dtype: 0,
            op: 0,
            reduce: 0,
            avg_divisor: 0,
            scalar_bits: 0,
            scalar_dev: std::ptr::null(),
            steps: std::ptr::null(),
            lanes: std::ptr::null(),
            locals: std::ptr::null(),
            conns: std::ptr::null(),
            bufs: [std::ptr::null_mut(); CCL_MAX_BUFS],
            frame: std::ptr::null_mut(),
            frame_capacity: 0,
            frame_block: 0,
            proto: CCL_PROTO_SIMPLE,
            reserved: 0,
            abort_flag: std::ptr::null(),
            done: std::ptr::null_mut(),
            throttle_gap_ns: 0,
            stall_channel: CCL_STALL_NONE,
            stall_after: 0,
            check: std::ptr::null_mut(),
            rank: 0,
            start_gate: 0,
            desc: [[0; CCL_DESC_WORDS]; CCL_MAX_BUFS],
        }
    }
}

/// `CCL_DESC_WORDS`: words of one message descriptor.
pub const CCL_DESC_WORDS: usize = 3;
/// `CCL_DESC_POISON_MARK`: top byte of descriptor word 1 in a poison message.
pub const CCL_DESC_POISON_MARK: u64 = 0xBD;
/// `CCL_GATE_WORD`: the start gate's 32-bit word index in the abort flag's memory.
pub const CCL_GATE_WORD: usize = 2;
/// `CCL_CHECK_RECORD_OFFSET(c)`: byte offset of channel `c`'s mismatch record.
pub const fn ccl_check_record_offset(c: usize) -> usize {
    64 + 64 * c
}
/// `CCL_CHECK_BYTES`: size of the check area.
pub const CCL_CHECK_BYTES: usize = ccl_check_record_offset(CCL_MAX_CHANNELS);

/// `ccl_ipc_handle_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ccl_ipc_handle_t {
    pub bytes: [u8; CCL_IPC_HANDLE_BYTES],
}

/// `CCL_PTR_*`: kinds of memory in [`ccl_dev_ptr_info_t`].
pub const CCL_PTR_HOST: i32 = 0;
/// Device memory.
pub const CCL_PTR_DEVICE: i32 = 1;
/// Managed (unified) memory.
pub const CCL_PTR_MANAGED: i32 = 2;
/// Pinned host memory.
pub const CCL_PTR_HOST_PINNED: i32 = 3;

/// `ccl_dev_ptr_info_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ccl_dev_ptr_info_t {
    pub kind: i32,
    pub device: i32,
    pub device_ptr: *mut c_void,
}

/// `ccl_stream_t` (a cudaStream_t / hipStream_t).
pub type ccl_stream_t = *mut c_void;
/// `ccl_event_t`.
pub type ccl_event_t = *mut c_void;
/// `ccl_host_fn_t`.
pub type ccl_host_fn_t = Option<unsafe extern "C" fn(user: *mut c_void)>;

/// Declares the ABI functions once: the `extern "C"` block (linked only when the kernels
/// were built) and [`SIGNATURES`], the same declarations as text for the header test.
macro_rules! abi {
    ($( fn $name:ident ( $( $arg:ident : $ty:ty ),* ) -> $ret:ty ; )*) => {
        #[cfg(ccl_cuda)]
        extern "C" {
            $( pub fn $name ( $( $arg : $ty ),* ) -> $ret ; )*
        }
        // Without the kernels every function exists as a stub that does nothing and
        // returns CCL_DEV_UNSUPPORTED (an empty string for ccl_dev_last_error), so callers
        // compile the same way in both builds.
        $(
            #[cfg(not(ccl_cuda))]
            #[allow(unused_variables, clippy::missing_safety_doc, clippy::too_many_arguments)]
            pub unsafe fn $name ( $( $arg : $ty ),* ) -> $ret {
                <$ret as Stub>::stub()
            }
        )*
        /// (name, [argument types], return type) of every ABI function, as Rust text.
        pub const SIGNATURES: &[(&str, &[&str], &str)] = &[
            $( (stringify!($name), &[ $( stringify!($ty) ),* ], stringify!($ret)) ),*
        ];
    };
}

/// Return value of a stub (kernels not built).
#[cfg_attr(ccl_cuda, allow(dead_code))]
trait Stub {
    fn stub() -> Self;
}
impl Stub for i32 {
    fn stub() -> i32 {
        CCL_DEV_UNSUPPORTED
    }
}
impl Stub for *const c_char {
    fn stub() -> *const c_char {
        c"".as_ptr()
    }
}

abi! {
    fn ccl_dev_built() -> i32;
    fn ccl_dev_platform() -> i32;
    fn ccl_dev_last_error() -> *const c_char;
    fn ccl_dev_device_count(count: *mut i32) -> ccl_dev_result_t;
    fn ccl_dev_get_device(device: *mut i32) -> ccl_dev_result_t;
    fn ccl_dev_set_device(device: i32) -> ccl_dev_result_t;
    fn ccl_dev_pointer_info(p: *const c_void, info: *mut ccl_dev_ptr_info_t) -> ccl_dev_result_t;
    fn ccl_dev_can_access_peer(device: i32, peer: i32, can: *mut i32) -> ccl_dev_result_t;
    fn ccl_dev_host_alloc_mapped(bytes: usize, host: *mut *mut c_void, dev: *mut *mut c_void) -> ccl_dev_result_t;
    fn ccl_dev_host_free(host: *mut c_void) -> ccl_dev_result_t;
    fn ccl_dev_malloc(bytes: usize, dev: *mut *mut c_void) -> ccl_dev_result_t;
    fn ccl_dev_free(dev: *mut c_void) -> ccl_dev_result_t;
    fn ccl_dev_memset(dev: *mut c_void, value: i32, bytes: usize) -> ccl_dev_result_t;
    fn ccl_dev_memcpy(dst: *mut c_void, src: *const c_void, bytes: usize) -> ccl_dev_result_t;
    fn ccl_dev_memcpy_async(dst: *mut c_void, src: *const c_void, bytes: usize, s: ccl_stream_t) -> ccl_dev_result_t;
    fn ccl_dev_enable_peer_access(peer_device: i32) -> ccl_dev_result_t;
    fn ccl_dev_ipc_get_mem_handle(dev: *mut c_void, handle: *mut ccl_ipc_handle_t) -> ccl_dev_result_t;
    fn ccl_dev_ipc_open_mem_handle(handle: *const ccl_ipc_handle_t, dev: *mut *mut c_void) -> ccl_dev_result_t;
    fn ccl_dev_ipc_close_mem_handle(dev: *mut c_void) -> ccl_dev_result_t;
    fn ccl_dev_host_register(host: *mut c_void, bytes: usize, dev_out: *mut *mut c_void) -> ccl_dev_result_t;
    fn ccl_dev_host_unregister(host: *mut c_void) -> ccl_dev_result_t;
    fn ccl_dev_stream_create(s: *mut ccl_stream_t) -> ccl_dev_result_t;
    fn ccl_dev_stream_destroy(s: ccl_stream_t) -> ccl_dev_result_t;
    fn ccl_dev_stream_synchronize(s: ccl_stream_t) -> ccl_dev_result_t;
    fn ccl_dev_stream_query(s: ccl_stream_t) -> ccl_dev_result_t;
    fn ccl_dev_event_create(e: *mut ccl_event_t) -> ccl_dev_result_t;
    fn ccl_dev_event_create_untimed(e: *mut ccl_event_t) -> ccl_dev_result_t;
    fn ccl_dev_event_destroy(e: ccl_event_t) -> ccl_dev_result_t;
    fn ccl_dev_event_query(e: ccl_event_t) -> ccl_dev_result_t;
    fn ccl_dev_event_record(e: ccl_event_t, s: ccl_stream_t) -> ccl_dev_result_t;
    fn ccl_dev_stream_wait_event(s: ccl_stream_t, e: ccl_event_t) -> ccl_dev_result_t;
    fn ccl_dev_event_elapsed_ms(start: ccl_event_t, end: ccl_event_t, ms: *mut f32) -> ccl_dev_result_t;
    fn ccl_dev_launch_host_fn(s: ccl_stream_t, func: ccl_host_fn_t, user: *mut c_void) -> ccl_dev_result_t;
    fn ccl_dev_preload(num_regs: *mut i32) -> ccl_dev_result_t;
    fn ccl_dev_launch_plan(plan: *const ccl_dev_plan_t, s: ccl_stream_t) -> ccl_dev_result_t;
    fn ccl_dev_host_elem(dtype: u32, op: u32, avg_divisor: u32, scalar_bits: u64, has_in: i32, in_bits: u64, local_bits: u64, do_finish: i32, out: *mut u64) -> ccl_dev_result_t;
    fn ccl_dev_copy_bandwidth(bytes: usize, iters: i32, gbps: *mut f64) -> ccl_dev_result_t;
}

// The C layout probe (src/layout.c), always built.
extern "C" {
    /// Entries in the layout table.
    pub fn ccl_layout_count() -> usize;
    /// Name of entry `i` (NULL past the end).
    pub fn ccl_layout_name(i: usize) -> *const c_char;
    /// Value of entry `i`.
    pub fn ccl_layout_value(i: usize) -> u64;
}

/// The C compiler's layout table: ("sizeof T" / "offsetof T f" / macro text, value).
pub fn c_layout() -> Vec<(String, u64)> {
    // SAFETY: ccl_layout_count has no preconditions.
    let n = unsafe { ccl_layout_count() };
    (0..n)
        .filter_map(|i| {
            // SAFETY: i < count, so the name is a valid static NUL-terminated string.
            let p = unsafe { ccl_layout_name(i) };
            if p.is_null() {
                return None;
            }
            // SAFETY: non-null static string (see above).
            let name = unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned();
            // SAFETY: no preconditions.
            Some((name, unsafe { ccl_layout_value(i) }))
        })
        .collect()
}

// The kernel source compiled for the host CPU (src/host_kernel.cpp, include/ccl_sim.h),
// always built.
extern "C" {
    /// Runs `plan`'s kernel on the CPU until every block finished (see ccl_sim.h).
    pub fn ccl_sim_launch_plan(plan: *const ccl_dev_plan_t) -> ccl_dev_result_t;
    /// Threads per block of the host build (`CCL_THREADS`).
    pub fn ccl_sim_threads() -> u32;
    /// 1 when the host build is instrumented with ThreadSanitizer.
    pub fn ccl_sim_tsan() -> i32;
    /// ThreadSanitizer release annotation on `addr` (no-op without TSan).
    pub fn ccl_sim_hb_release(addr: *const c_void);
    /// ThreadSanitizer acquire annotation on `addr` (no-op without TSan).
    pub fn ccl_sim_hb_acquire(addr: *const c_void);
    /// Message of the last failing `ccl_sim_*` call on this thread; never NULL.
    pub fn ccl_sim_last_error() -> *const c_char;
    /// `ccl_dev_host_elem` of the host build.
    pub fn ccl_sim_host_elem(
        dtype: u32,
        op: u32,
        avg_divisor: u32,
        scalar_bits: u64,
        has_in: i32,
        in_bits: u64,
        local_bits: u64,
        do_finish: i32,
        out: *mut u64,
    ) -> ccl_dev_result_t;
}

/// (name, [argument types], return type) of every `ccl_sim.h` function, for the header
/// test.
pub const SIM_SIGNATURES: &[(&str, &[&str], &str)] = &[
    (
        "ccl_sim_launch_plan",
        &["*const ccl_dev_plan_t"],
        "ccl_dev_result_t",
    ),
    ("ccl_sim_threads", &[], "u32"),
    ("ccl_sim_tsan", &[], "i32"),
    ("ccl_sim_hb_release", &["*const c_void"], "()"),
    ("ccl_sim_hb_acquire", &["*const c_void"], "()"),
    ("ccl_sim_last_error", &[], "*const c_char"),
    (
        "ccl_sim_host_elem",
        &[
            "u32", "u32", "u32", "u64", "i32", "u64", "u64", "i32", "*mut u64",
        ],
        "ccl_dev_result_t",
    ),
];
