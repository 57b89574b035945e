//! `kernels::ffi` against `include/ccl_device.h`: bindgen's struct layouts and the
//! function-like macros' `const fn`s against what the C compiler computed from the same
//! header (src/layout.c), the probing frame against probe's `ProbingFrame<8>` (1184 bytes),
//! and the committed bindings against bindgen's output.

use std::collections::BTreeMap;
use std::mem::{offset_of, size_of};

use kernels::ffi::*;

fn c_table() -> BTreeMap<String, u64> {
    c_layout().into_iter().collect()
}

macro_rules! rust_layout {
    ($m:ident; $( $t:ident { $( $f:ident ),* } )*) => {
        $(
            $m.insert(format!("sizeof {}", stringify!($t)), size_of::<$t>() as u64);
            $( $m.insert(format!("offsetof {} {}", stringify!($t), stringify!($f)), offset_of!($t, $f) as u64); )*
        )*
    };
}

#[test]
fn every_struct_of_the_header_has_the_c_compilers_layout() {
    let c = c_table();
    let mut r: BTreeMap<String, u64> = BTreeMap::new();
    rust_layout!(r;
        ccl_trace_id_t { comm_id, op_counter, extension }
        ccl_frame_header_t { op_counter, mode, kernel_index, n_channels, reserved }
        ccl_channel_counts_t { send_count, recv_count }
        ccl_frame_block8_t { trace, channels }
        ccl_probing_frame8_t { header, blocks }
        ccl_dev_step_t { kind, src_buf, dst_buf, src_off, dst_off, count }
        ccl_dev_conn_t { slots, tail, head, slot_bytes, nslots, ll_sync, descs }
        ccl_dev_lane_t { channel, first_step, n_steps, conn_in, conn_out, flags }
        ccl_dev_local_t { kind, src_buf, dst_buf, src_off, dst_off, count }
        ccl_dev_plan_t { n_channels, n_lanes, n_locals, n_steps, n_conns, unit, dtype, op,
            reduce, avg_divisor, scalar_bits, scalar_dev, steps, lanes, locals, conns, bufs,
            frame, frame_capacity, frame_block, proto, abort_flag, throttle_gap_ns,
            stall_channel, stall_after, check, rank, desc }
        ccl_ipc_handle_t { }
        ccl_dev_ptr_info_t { kind, device, device_ptr }
    );
    r.insert("CCL_FRAME_BYTES(8)".into(), frame_bytes(8));
    r.insert("CCL_FRAME_BYTES(1)".into(), frame_bytes(1));
    r.insert("CCL_FRAME_BYTES(32)".into(), frame_bytes(32));
    r.insert(
        "CCL_FRAME_SEND_OFFSET(8, 5, 3)".into(),
        frame_send_offset(8, 5, 3),
    );
    r.insert(
        "CCL_FRAME_SEND_OFFSET(32, 7, 31)".into(),
        frame_send_offset(32, 7, 31),
    );
    r.insert("CCL_FRAME_TOTAL_BYTES(8)".into(), frame_total_bytes(8));
    r.insert("CCL_FRAME_TOTAL_BYTES(32)".into(), frame_total_bytes(32));
    r.insert(
        "CCL_FRAME_WAIT_OFFSET(8, 5, 3)".into(),
        frame_wait_offset(8, 5, 3),
    );
    r.insert(
        "CCL_FRAME_WAIT_OFFSET(32, 7, 31)".into(),
        frame_wait_offset(32, 7, 31),
    );
    for s in [64, 200, 131072] {
        r.insert(format!("CCL_LL_CHUNK({s})"), ll_chunk(s));
    }
    r.insert(
        "CCL_CHECK_BYTES".into(),
        kernels::ffi::CCL_CHECK_BYTES as u64,
    );
    r.insert(
        "CCL_CHECK_RECORD_OFFSET(5)".into(),
        kernels::ffi::ccl_check_record_offset(5) as u64,
    );
    r.insert("CCL_DESC_WORDS".into(), kernels::ffi::CCL_DESC_WORDS as u64);
    assert_eq!(c.len(), 97, "layout table size changed: update this test");
    assert_eq!(r, c, "Rust mirror differs from the C layout");
}

#[test]
fn the_c_frame_is_probes_probing_frame() {
    use probe::frame::{self as pf, ChannelCounts, FrameBlock, FrameHeader, ProbingFrame, TraceId};
    let c = c_table();
    let get = |k: &str| *c.get(k).unwrap_or_else(|| panic!("missing {k}"));
    assert_eq!(get("sizeof ccl_probing_frame8_t"), 1184);
    assert_eq!(
        get("sizeof ccl_probing_frame8_t"),
        size_of::<ProbingFrame<8>>() as u64
    );
    assert_eq!(get("CCL_FRAME_BYTES(8)"), pf::frame_bytes(8) as u64);
    assert_eq!(get("CCL_FRAME_BYTES(1)"), pf::frame_bytes(1) as u64);
    assert_eq!(get("CCL_FRAME_BYTES(32)"), pf::frame_bytes(32) as u64);
    assert_eq!(get("sizeof ccl_trace_id_t"), size_of::<TraceId>() as u64);
    assert_eq!(
        get("offsetof ccl_trace_id_t op_counter"),
        offset_of!(TraceId, op_counter) as u64
    );
    assert_eq!(
        get("offsetof ccl_trace_id_t extension"),
        offset_of!(TraceId, extension) as u64
    );
    assert_eq!(
        get("sizeof ccl_frame_header_t"),
        size_of::<FrameHeader>() as u64
    );
    assert_eq!(
        get("offsetof ccl_frame_header_t mode"),
        offset_of!(FrameHeader, mode) as u64
    );
    assert_eq!(
        get("offsetof ccl_frame_header_t kernel_index"),
        offset_of!(FrameHeader, kernel_index) as u64
    );
    assert_eq!(
        get("offsetof ccl_frame_header_t n_channels"),
        offset_of!(FrameHeader, n_channels) as u64
    );
    assert_eq!(
        get("sizeof ccl_channel_counts_t"),
        size_of::<ChannelCounts>() as u64
    );
    assert_eq!(
        get("offsetof ccl_channel_counts_t recv_count"),
        offset_of!(ChannelCounts, recv_count) as u64
    );
    assert_eq!(
        get("sizeof ccl_frame_block8_t"),
        size_of::<FrameBlock<8>>() as u64
    );
    assert_eq!(
        get("offsetof ccl_frame_block8_t channels"),
        offset_of!(FrameBlock<8>, channels) as u64
    );
    assert_eq!(
        get("offsetof ccl_probing_frame8_t blocks"),
        offset_of!(ProbingFrame<8>, blocks) as u64
    );
    // The kernel's counter address for (capacity 8, block 5, channel 3) is where probe's
    // Frame keeps that SendCount: write through Frame, read the bytes at the C offset.
    let f = pf::Frame::new(8);
    let b = f.begin_op(9, 8 * 4 + 5, 8);
    f.add_send(b, 3, 77);
    f.add_recv(b, 3, 66);
    let bytes = f.to_bytes();
    let off = get("CCL_FRAME_SEND_OFFSET(8, 5, 3)") as usize;
    let rd = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
    assert_eq!(rd(off), 77);
    assert_eq!(rd(off + 8), 66);
}

#[test]
fn the_c_wait_slots_are_probes_extension_slots() {
    use probe::frame as pf;
    let c = c_table();
    let get = |k: &str| *c.get(k).unwrap_or_else(|| panic!("missing {k}"));
    assert_eq!(
        get("CCL_FRAME_TOTAL_BYTES(8)"),
        pf::Frame::total_bytes(8) as u64
    );
    assert_eq!(
        get("CCL_FRAME_TOTAL_BYTES(32)"),
        pf::Frame::total_bytes(32) as u64
    );
    assert_eq!(CCL_FRAME_EXT_WORDS, pf::EXT_WORDS_PER_CHANNEL as u64);
    // Write waits through probe's Frame, read them at the C offsets (capacity 8 and 32).
    for (cap, block, ch) in [(8usize, 5usize, 3usize), (32, 7, 31)] {
        let f = pf::Frame::new(cap);
        let b = f.begin_op(1, block as u64 + 8, cap);
        assert_eq!(b, block);
        f.add_wait_upstream(b, ch, 1234);
        f.add_wait_downstream(b, ch, 5678);
        let off = get(&format!("CCL_FRAME_WAIT_OFFSET({cap}, {block}, {ch})")) as usize;
        assert!(off + 16 <= pf::Frame::total_bytes(cap));
        let word = |o: usize| {
            // SAFETY: o is 8-aligned and inside the frame's total bytes (asserted above);
            // the frame's words are AtomicU64 and stay alive while `f` does.
            unsafe { std::sync::atomic::AtomicU64::from_ptr((f.as_ptr() as *mut u64).add(o / 8)) }
        };
        use std::sync::atomic::Ordering::SeqCst;
        assert_eq!(
            word(off).load(SeqCst),
            1234,
            "upstream wait of ({cap}, {block}, {ch})"
        );
        assert_eq!(
            word(off + 8).load(SeqCst),
            5678,
            "downstream of ({cap}, {block}, {ch})"
        );
        // The other way: a kernel-style absolute store at the C offset reads back through
        // Frame::waits.
        word(off).store(99, SeqCst);
        assert_eq!(f.waits(b, ch).upstream_ns, 99);
    }
}

/// The committed bindings (`src/ccl_device_sys.rs`, what a build without libclang uses) are
/// bindgen's output for the current headers, and a machine with libclang builds them with
/// bindgen (CI has it: hipcc's clang). Regenerate with `scripts/regen-bindings.sh`.
#[test]
fn the_committed_bindings_are_bindgens_output() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/ccl_device_sys.rs"));
    let committed = include_str!("../src/ccl_device_sys.rs");
    if kernels::ffi::BINDINGS_SOURCE != "bindgen" {
        let found = libclang_here();
        assert!(
            found.is_none(),
            "libclang is installed ({found:?}) but build.rs used the committed bindings"
        );
        eprintln!("skipped: no libclang on this machine; the build used the committed bindings");
        return;
    }
    assert!(
        generated == committed,
        "src/ccl_device_sys.rs is not bindgen's output for the current headers: run \
         scripts/regen-bindings.sh and commit the result"
    );
}

/// A libclang shared library where clang-sys looks on Debian (`LIBCLANG_PATH`, the LLVM
/// directories, the multiarch library directory).
fn libclang_here() -> Option<std::path::PathBuf> {
    let mut dirs: Vec<std::path::PathBuf> = std::env::var_os("LIBCLANG_PATH")
        .map(|p| vec![p.into()])
        .unwrap_or_default();
    if let Ok(rd) = std::fs::read_dir("/usr/lib") {
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with("llvm-") {
                dirs.push(e.path().join("lib"));
            }
        }
    }
    dirs.push("/usr/lib/x86_64-linux-gnu".into());
    dirs.into_iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|rd| rd.flatten())
        .map(|e| e.path())
        .find(|p| {
            let n = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            n.starts_with("libclang") && !n.starts_with("libclang-cpp") && n.contains(".so")
        })
}

/// ncclDataType_t values of the header match NCCL's order (0..=11), which ccl-core's
/// `DataType` uses.
#[test]
fn the_headers_datatypes_are_nccls() {
    let dts = [
        CCL_DT_INT8,
        CCL_DT_UINT8,
        CCL_DT_INT32,
        CCL_DT_UINT32,
        CCL_DT_INT64,
        CCL_DT_UINT64,
        CCL_DT_FLOAT16,
        CCL_DT_FLOAT32,
        CCL_DT_FLOAT64,
        CCL_DT_BFLOAT16,
        CCL_DT_FLOAT8E4M3,
        CCL_DT_FLOAT8E5M2,
    ];
    for (i, d) in dts.iter().enumerate() {
        assert_eq!(*d, i as u32);
    }
    assert_eq!(CCL_DT_COUNT, 12);
}
