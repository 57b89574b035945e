//! The Rust mirrors in `kernels::ffi` against `include/ccl_device.h`: struct layouts against
//! what the C compiler computed from the same header (src/layout.c), the probing frame
//! against probe's `ProbingFrame<8>` (1184 bytes), function signatures against the header
//! text.

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

/// Normalises a C parameter/return type to the Rust spelling used in `ffi`.
fn c_to_rust(c: &str) -> String {
    let t = c.split_whitespace().collect::<Vec<_>>().join(" ");
    let t = t.replace(" *", "*");
    let m = match t.as_str() {
        "void" => "()",
        "int32_t" => "i32",
        "uint32_t" => "u32",
        "uint64_t" => "u64",
        "uint64_t*" => "*mut u64",
        "size_t" => "usize",
        "float*" => "*mut f32",
        "double*" => "*mut f64",
        "int32_t*" => "*mut i32",
        "void*" => "*mut c_void",
        "const void*" => "*const c_void",
        "void**" => "*mut *mut c_void",
        "const char*" => "*const c_char",
        "ccl_dev_result_t" => "ccl_dev_result_t",
        "ccl_stream_t" => "ccl_stream_t",
        "ccl_stream_t*" => "*mut ccl_stream_t",
        "ccl_event_t" => "ccl_event_t",
        "ccl_event_t*" => "*mut ccl_event_t",
        "ccl_host_fn_t" => "ccl_host_fn_t",
        "ccl_ipc_handle_t*" => "*mut ccl_ipc_handle_t",
        "const ccl_ipc_handle_t*" => "*const ccl_ipc_handle_t",
        "const ccl_dev_plan_t*" => "*const ccl_dev_plan_t",
        "ccl_dev_ptr_info_t*" => "*mut ccl_dev_ptr_info_t",
        other => panic!("header type `{other}` has no mapping in this test"),
    };
    m.to_string()
}

/// Function prototypes of ccl_device.h: (name, [param types], return type).
fn header_prototypes() -> Vec<(String, Vec<String>, String)> {
    prototypes_of(include_str!("../include/ccl_device.h"))
}

/// Function prototypes of a C header's text: (name, [param types], return type).
fn prototypes_of(h: &str) -> Vec<(String, Vec<String>, String)> {
    // Drop comments, preprocessor lines and typedefs; keep `ret name(params);` declarations.
    let mut text = String::new();
    let mut rest = h;
    while let Some(i) = rest.find("/*") {
        text.push_str(&rest[..i]);
        let j = rest[i..].find("*/").expect("unterminated comment") + i + 2;
        rest = &rest[j..];
    }
    text.push_str(rest);
    let body: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    for decl in body.split(';') {
        let d = decl.split_whitespace().collect::<Vec<_>>().join(" ");
        let d = d.trim_start_matches("} ").trim();
        if d.starts_with("typedef") || d.contains('{') || d.contains('}') || !d.contains('(') {
            continue;
        }
        let open = d.find('(').unwrap();
        let close = d.rfind(')').unwrap();
        let head = &d[..open];
        let (ret, name) = head.rsplit_once([' ', '*']).unwrap();
        let ret = if head[..head.len() - name.len()].ends_with('*') {
            format!("{ret}*")
        } else {
            ret.to_string()
        };
        let params: Vec<String> = d[open + 1..close]
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty() && *p != "void")
            .map(|p| {
                // Drop the parameter name: the last identifier.
                let cut = p.rfind([' ', '*']).unwrap();
                p[..=cut].trim().to_string()
            })
            .collect();
        out.push((name.to_string(), params, ret));
    }
    out
}

#[test]
fn every_header_function_is_bound_with_the_same_signature() {
    let header = header_prototypes();
    assert!(
        header.len() >= 30,
        "parsed only {} prototypes",
        header.len()
    );
    let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let rust: BTreeMap<&str, (Vec<String>, String)> = SIGNATURES
        .iter()
        .map(|(n, a, r)| (*n, (a.iter().map(|x| norm(x)).collect(), norm(r))))
        .collect();
    for (name, params, ret) in &header {
        let Some((rargs, rret)) = rust.get(name.as_str()) else {
            panic!("{name} is in the header but not bound in kernels::ffi");
        };
        let want: Vec<String> = params.iter().map(|p| c_to_rust(p)).collect();
        assert_eq!(rargs, &want, "{name}: parameter types");
        assert_eq!(rret, &c_to_rust(ret), "{name}: return type");
    }
    assert_eq!(
        header.len(),
        rust.len(),
        "kernels::ffi binds functions the header lacks"
    );
}

#[test]
fn every_ccl_sim_function_is_bound_with_the_same_signature() {
    // The first prototype follows `extern "C" {` (ccl_device.h has typedefs before it).
    let text = include_str!("../include/ccl_sim.h").replace("extern \"C\" {", ";");
    let header = prototypes_of(&text);
    let norm = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let rust: BTreeMap<&str, (Vec<String>, String)> = kernels::ffi::SIM_SIGNATURES
        .iter()
        .map(|(n, a, r)| (*n, (a.iter().map(|x| norm(x)).collect(), norm(r))))
        .collect();
    assert!(header.len() >= 7, "parsed only {} prototypes", header.len());
    for (name, params, ret) in &header {
        let Some((rargs, rret)) = rust.get(name.as_str()) else {
            panic!("{name} is in ccl_sim.h but not in kernels::ffi::SIM_SIGNATURES");
        };
        let want: Vec<String> = params.iter().map(|p| c_to_rust(p)).collect();
        assert_eq!(rargs, &want, "{name}: parameter types");
        assert_eq!(rret, &c_to_rust(ret), "{name}: return type");
    }
    assert_eq!(
        header.len(),
        rust.len(),
        "SIM_SIGNATURES lists functions ccl_sim.h lacks"
    );
}

#[test]
fn constants_match_the_header() {
    let h = include_str!("../include/ccl_device.h");
    let defines: BTreeMap<&str, i64> = h
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            (w.next()? == "#define").then_some(())?;
            let name = w.next()?;
            let v = w.next()?.parse::<i64>().ok()?;
            Some((name, v))
        })
        .collect();
    let rust: &[(&str, i64)] = &[
        ("CCL_DEV_OK", CCL_DEV_OK.into()),
        ("CCL_DEV_NO_DEVICE", CCL_DEV_NO_DEVICE.into()),
        ("CCL_DEV_RUNTIME_ERROR", CCL_DEV_RUNTIME_ERROR.into()),
        ("CCL_DEV_INVALID", CCL_DEV_INVALID.into()),
        ("CCL_DEV_UNSUPPORTED", CCL_DEV_UNSUPPORTED.into()),
        ("CCL_DEV_NOT_READY", CCL_DEV_NOT_READY.into()),
        ("CCL_FRAME_BLOCKS", CCL_FRAME_BLOCKS as i64),
        ("CCL_FRAME_HEADER_BYTES", CCL_FRAME_HEADER_BYTES as i64),
        ("CCL_PAPER_CHANNELS", CCL_PAPER_CHANNELS as i64),
        ("CCL_STEP_SEND", CCL_STEP_SEND.into()),
        ("CCL_STEP_RECV", CCL_STEP_RECV.into()),
        (
            "CCL_STEP_RECV_REDUCE_SEND",
            CCL_STEP_RECV_REDUCE_SEND.into(),
        ),
        (
            "CCL_STEP_RECV_REDUCE_COPY_SEND",
            CCL_STEP_RECV_REDUCE_COPY_SEND.into(),
        ),
        ("CCL_STEP_RECV_COPY_SEND", CCL_STEP_RECV_COPY_SEND.into()),
        (
            "CCL_STEP_RECV_REDUCE_COPY",
            CCL_STEP_RECV_REDUCE_COPY.into(),
        ),
        ("CCL_LOCAL_COPY", CCL_LOCAL_COPY.into()),
        ("CCL_LOCAL_REDUCE", CCL_LOCAL_REDUCE.into()),
        ("CCL_OP_SUM", CCL_OP_SUM.into()),
        ("CCL_OP_PROD", CCL_OP_PROD.into()),
        ("CCL_OP_MAX", CCL_OP_MAX.into()),
        ("CCL_OP_MIN", CCL_OP_MIN.into()),
        ("CCL_OP_PREMUL", CCL_OP_PREMUL.into()),
        ("CCL_PROTO_SIMPLE", CCL_PROTO_SIMPLE.into()),
        ("CCL_PROTO_LL", CCL_PROTO_LL.into()),
        ("CCL_MAX_BUFS", CCL_MAX_BUFS as i64),
        (
            "CCL_MAX_LANES_PER_CHANNEL",
            CCL_MAX_LANES_PER_CHANNEL as i64,
        ),
        ("CCL_MAX_CHANNELS", CCL_MAX_CHANNELS as i64),
        ("CCL_GATE_WORD", CCL_GATE_WORD as i64),
        ("CCL_IPC_HANDLE_BYTES", CCL_IPC_HANDLE_BYTES as i64),
        ("CCL_PTR_HOST", CCL_PTR_HOST.into()),
        ("CCL_PTR_DEVICE", CCL_PTR_DEVICE.into()),
        ("CCL_PTR_MANAGED", CCL_PTR_MANAGED.into()),
        ("CCL_PTR_HOST_PINNED", CCL_PTR_HOST_PINNED.into()),
    ];
    for (name, v) in rust {
        assert_eq!(defines.get(name), Some(v), "{name}");
    }
    // ncclDataType_t values of the header match ccl-core's (0..=11 in NCCL's order).
    let dts = [
        "CCL_DT_INT8",
        "CCL_DT_UINT8",
        "CCL_DT_INT32",
        "CCL_DT_UINT32",
        "CCL_DT_INT64",
        "CCL_DT_UINT64",
        "CCL_DT_FLOAT16",
        "CCL_DT_FLOAT32",
        "CCL_DT_FLOAT64",
        "CCL_DT_BFLOAT16",
        "CCL_DT_FLOAT8E4M3",
        "CCL_DT_FLOAT8E5M2",
    ];
    for (i, d) in dts.iter().enumerate() {
        assert_eq!(defines.get(d), Some(&(i as i64)), "{d}");
    }
    assert_eq!(defines.get("CCL_DT_COUNT"), Some(&12));
}
