//! The C ABI of the kernels: bindgen's bindings of `include/ccl_device.h` and
//! `include/ccl_sim.h` (types, constants and functions, generated at build time by
//! `build.rs`; where libclang is missing, the committed copy `src/ccl_device_sys.rs`, which
//! the `bindings` test keeps equal to bindgen's output), plus what bindgen cannot translate:
//! the header's function-like macros as `const fn`s (checked against the C compiler by the
//! layout test), a plan constructor, and the C layout probe (`src/layout.c`).
//!
//! Without the device kernels (no nvcc at build time) the header's `ccl_dev_*` functions are
//! C stubs that return `CCL_DEV_UNSUPPORTED` (`src/dev_stubs.c`), so the declarations are
//! the same in both builds.

use std::ffi::c_char;

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    missing_docs,
    unreachable_pub,
    dead_code,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/ccl_device_sys.rs"));
}

pub use sys::*;

/// Where this build's bindings came from: `bindgen` (generated now) or `checked-in` (the
/// committed copy, libclang missing).
pub const BINDINGS_SOURCE: &str = env!("CCL_BINDINGS_SOURCE");

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

/// `CCL_FRAME_TOTAL_BYTES(cap)`: base frame plus extension slots.
pub const fn frame_total_bytes(cap: u64) -> u64 {
    frame_bytes(cap) + CCL_FRAME_BLOCKS as u64 * cap * 8 * CCL_FRAME_EXT_WORDS
}
/// `CCL_FRAME_WAIT_OFFSET(cap, b, ch)`: channel `ch`'s upstream wait (ns) in block `b`; the
/// downstream wait follows at +8.
pub const fn frame_wait_offset(cap: u64, block: u64, ch: u64) -> u64 {
    frame_bytes(cap) + (block * cap + ch) * 8 * CCL_FRAME_EXT_WORDS
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

/// `CCL_CHECK_RECORD_OFFSET(c)`: byte offset of channel `c`'s mismatch record.
pub const fn ccl_check_record_offset(c: usize) -> usize {
    64 + 64 * c
}
/// `CCL_CHECK_BYTES`: size of the check area.
pub const CCL_CHECK_BYTES: usize = ccl_check_record_offset(CCL_MAX_CHANNELS);

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
