//! The kernels' element arithmetic (compiled from ccl_kernels.cu for the host CPU and
//! called through `ccl_dev_host_elem`) against ccl-core's `Reducer`, for all 12 dtypes and
//! every reduction: exhaustive over all pairs for 1-byte types, random plus special values
//! otherwise. The nvcc build's host instances run only when the kernels were built (CI
//! sets CCLD_EXPECT_CUDA=1, whose test fails if they were not); the host build of the
//! kernel source (`kernels::sim`, software __half / bf16 / fp8) runs everywhere.

use kernels::ffi as k;

use super::lower::red_params;
use crate::reduce::{element_to_f64, Reducer};
use crate::types::{DataType, RedOpKind};

/// One element through some build of the kernels' arithmetic.
type ElemFn<'a> = &'a dyn Fn(&super::lower::RedParams, Option<u64>, u64, bool) -> u64;

/// The C signature of `ccl_dev_host_elem`.
type RawElemFn = unsafe extern "C" fn(u32, u32, u32, u64, i32, u64, u64, i32, *mut u64) -> i32;

fn cuda_elem(p: &super::lower::RedParams, inc: Option<u64>, local: u64, finish: bool) -> u64 {
    let mut out = 0u64;
    // SAFETY: `out` is a valid out-pointer; the function has no other preconditions.
    let code = unsafe {
        k::ccl_dev_host_elem(
            p.dtype,
            p.op,
            p.avg_divisor,
            p.scalar_bits,
            i32::from(inc.is_some()),
            inc.unwrap_or(0),
            local,
            i32::from(finish),
            &mut out,
        )
    };
    assert_eq!(code, k::CCL_DEV_OK);
    out
}

fn bytes(v: u64, n: usize) -> Vec<u8> {
    v.to_le_bytes()[..n].to_vec()
}

fn from_bytes(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(a)
}

/// Equal bits, or both NaN (NaN payloads may differ). Max/Min of +0 and -0 must agree
/// too: both sides answer +0 for Max and -0 for Min.
fn same(dt: DataType, a: u64, b: u64) -> bool {
    if a == b {
        return true;
    }
    let n = dt.size();
    let (x, y) = (
        element_to_f64(dt, &bytes(a, n)),
        element_to_f64(dt, &bytes(b, n)),
    );
    dt.is_float() && x.is_nan() && y.is_nan()
}

fn values(dt: DataType) -> Vec<u64> {
    let n = dt.size();
    if n == 1 {
        return (0..256).collect();
    }
    let mut v: Vec<u64> = Vec::new();
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mask = if n == 8 {
        u64::MAX
    } else {
        (1u64 << (8 * n)) - 1
    };
    for _ in 0..300 {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        v.push((s >> 7) & mask);
    }
    // Small integers / ordinary floats, specials.
    let fl = |x: f64| -> u64 {
        match dt {
            DataType::Float32 => u64::from((x as f32).to_bits()),
            DataType::Float64 => x.to_bits(),
            DataType::Float16 => u64::from(crate::reduce::f32_to_f16_bits(x as f32)),
            DataType::Bfloat16 => u64::from(crate::reduce::f32_to_bf16_bits(x as f32)),
            _ => (x as i64 as u64) & mask,
        }
    };
    for x in [
        0.0, -0.0, 1.0, -1.0, 0.5, 3.0, -7.25, 1e30, -1e30, 65504.0, 1e-6,
    ] {
        v.push(fl(x));
    }
    if dt.is_float() {
        for x in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            v.push(fl(x));
        }
    }
    v
}

#[test]
fn kernel_element_arithmetic_matches_the_reducer_for_every_dtype_and_op() {
    if !kernels::cuda_built() {
        eprintln!("kernels not built (no nvcc): nothing to compare");
        return;
    }
    compare_with_reducer(&cuda_elem);
}

#[test]
fn host_sim_element_arithmetic_matches_the_reducer_for_every_dtype_and_op() {
    // The kernel source compiled for the CPU (kernels::sim, always built): the CUDA path
    // of the element code with the software __half / bf16 / fp8 types of ccl_host_sim.h.
    let elem = |p: &super::lower::RedParams, inc: Option<u64>, local: u64, finish: bool| {
        kernels::sim::host_elem(
            p.dtype,
            p.op,
            p.avg_divisor,
            p.scalar_bits,
            inc,
            local,
            finish,
        )
        .expect("ccl_sim_host_elem")
    };
    compare_with_reducer(&elem);
}

#[test]
fn host_sim_element_code_rejects_bad_arguments() {
    // 12 = CCL_DT_COUNT: one past the last dtype.
    let e = kernels::sim::host_elem(12, 0, 0, 0, None, 0, false).unwrap_err();
    assert!(
        matches!(e, kernels::DevError::Invalid(ref m) if m.contains("bad arguments")),
        "{e:?}"
    );
}

#[test]
fn hip_build_element_arithmetic_matches_the_reducer() {
    // The HIP build (scripts/gpu/build-rocm.sh) uses its own bit-exact bf16/fp8 encoders;
    // its ccl_dev_host_elem runs on the host without an AMD GPU. Skipped when the library
    // has not been built.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/rocm/librccl.so.1\0");
    if !std::path::Path::new(path.trim_end_matches('\0')).is_file() {
        eprintln!("target/rocm/librccl.so.1 not built: skipped");
        return;
    }
    // SAFETY: path is NUL-terminated; dlopen has no other preconditions. The handle is
    // never closed (the library stays loaded for the rest of the test process).
    let h = unsafe { libc::dlopen(path.as_ptr().cast(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "dlopen of librccl.so.1 failed");
    // SAFETY: h is a valid handle and the name is NUL-terminated.
    let sym = unsafe { libc::dlsym(h, c"ccl_dev_host_elem".as_ptr()) };
    assert!(!sym.is_null(), "librccl.so.1 lacks ccl_dev_host_elem");
    // SAFETY: the symbol is the function declared in ccl_device.h with this signature (the
    // ABI test checks the Rust spelling of that declaration).
    let f: RawElemFn = unsafe { std::mem::transmute::<*mut libc::c_void, RawElemFn>(sym) };
    let elem = |p: &super::lower::RedParams, inc: Option<u64>, local: u64, finish: bool| {
        let mut out = 0u64;
        // SAFETY: valid out-pointer; no other preconditions.
        let code = unsafe {
            f(
                p.dtype,
                p.op,
                p.avg_divisor,
                p.scalar_bits,
                i32::from(inc.is_some()),
                inc.unwrap_or(0),
                local,
                i32::from(finish),
                &mut out,
            )
        };
        assert_eq!(code, k::CCL_DEV_OK);
        out
    };
    compare_with_reducer(&elem);
}

fn compare_with_reducer(host_elem: ElemFn<'_>) {
    let n_ranks = 3;
    for dt in DataType::ALL {
        let es = dt.size();
        let vals = values(dt);
        let scalar_val = match dt {
            DataType::Float16 => u64::from(crate::reduce::f32_to_f16_bits(0.3)),
            DataType::Bfloat16 => u64::from(crate::reduce::f32_to_bf16_bits(0.3)),
            DataType::Float32 => u64::from(0.3f32.to_bits()),
            DataType::Float64 => 0.3f64.to_bits(),
            DataType::Float8e4m3 => u64::from(crate::reduce::f32_to_e4m3(0.3)),
            DataType::Float8e5m2 => u64::from(crate::reduce::f32_to_e5m2(0.3)),
            _ => 3,
        };
        let scalar = bytes(scalar_val, es);
        for op in [
            RedOpKind::Sum,
            RedOpKind::Prod,
            RedOpKind::Max,
            RedOpKind::Min,
            RedOpKind::Avg,
            RedOpKind::PreMulSum,
        ] {
            let s = (op == RedOpKind::PreMulSum).then_some(&scalar[..]);
            let r = Reducer::new(dt, op, s, n_ranks).unwrap();
            let p = red_params(&r, n_ranks).unwrap();
            for &b in &vals {
                let mut d = vec![0u8; es];
                r.load(&mut d, &bytes(b, es));
                let want = from_bytes(&d);
                let got = host_elem(&p, None, b, false);
                assert!(
                    same(dt, got, want),
                    "{dt:?} {op:?} load {b:#x}: kernel {got:#x}, reducer {want:#x}"
                );
                for &a in &vals {
                    let mut d = vec![0u8; es];
                    r.combine(&mut d, &bytes(a, es), &bytes(b, es));
                    let want = from_bytes(&d);
                    let got = host_elem(&p, Some(a), b, false);
                    assert!(
                        same(dt, got, want),
                        "{dt:?} {op:?} {a:#x} op {b:#x}: kernel {got:#x}, reducer {want:#x}"
                    );
                    if r.needs_finish() {
                        r.finish(&mut d);
                        let want = from_bytes(&d);
                        let got = host_elem(&p, Some(a), b, true);
                        assert_eq!(got, want, "{dt:?} {op:?} finish {a:#x} {b:#x}");
                    }
                }
            }
        }
    }
}
