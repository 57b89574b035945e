//! Element-wise reduction arithmetic on raw (possibly unaligned) little-endian byte slices,
//! for all twelve NCCL data types and all NCCL reduction operators.
//!
//! Semantics (NCCL's, on the device):
//!
//! * `Sum`, `Prod`, `Max`, `Min` on every type. Integers wrap on overflow (two's complement,
//!   like CUDA). Floating `Max`/`Min` follow C `fmax`/`fmin`: a NaN operand is ignored when
//!   the other is a number (NaN only if both are NaN); which zero `max(-0, +0)` returns is
//!   unspecified, as for `fmaxf`.
//! * `PreMulSum(s)`: every rank's input is multiplied by `s` (in the type's arithmetic,
//!   rounded to the type) before being summed; integer products wrap.
//! * `Avg` on floating types: `PreMulSum` with `s = 1/nranks` computed as
//!   `float(1.0 / nranks)` rounded to the type (`1.0 / nranks` in f64 for `Float64`), exactly
//!   as NCCL's `hostToDevRedOp` does. On integer types: wrapping sum, then one division by
//!   `nranks` truncating toward zero, applied by [`Reducer::finish`] to the fully reduced
//!   buffer.
//! * `Float16`, `Bfloat16`, `Float8e4m3`, `Float8e5m2`: each binary operation is computed
//!   in f32 and rounded once to the type, round to nearest even. For these formats f32 has
//!   at least 2p+2 bits, so the result is the correctly rounded result of the operation.
//!   (NCCL's fp8 path goes through half precision; by the same argument that gives the same
//!   results.) FP8 results saturate to the largest finite value (CUDA `__NV_SATFINITE`),
//!   infinities included; NaN stays NaN. See [`convert`] for the exact NaN encodings.
//!
//! A reduction of `k` contributions is `load` (first contribution) followed by `k-1`
//! `combine`/`combine_inplace` calls (each applies the pre-multiplication to its local
//! input), partial results are merged with `merge_inplace`, and `finish` is applied once.
//!
//! Slices passed to one call must have equal lengths, a multiple of the element size
//! (checked with `debug_assert!`; in release builds the shortest slice bounds the work and
//! a trailing partial element is left untouched). They may be unaligned. No `unsafe`.

pub mod convert;
mod kinds;
mod lanes;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod lanes_tests;

pub use convert::{
    bf16_bits_to_f32, e4m3_to_f32, e5m2_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_e4m3,
    f32_to_e5m2, f32_to_f16_bits, E4M3_MAX, E5M2_MAX,
};

use crate::error::{CclError, Result};
use crate::types::{DataType, RedOpKind};
use kinds::Kind;

/// The operation actually performed on elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Sum,
    Prod,
    Max,
    Min,
    /// `pre(x) = x * scalar`, then sum.
    PreMul,
}

/// An element-wise reduction for one (data type, operator) pair, ready to run over byte
/// slices. Cheap to build (no allocation), `Copy`, `Send`, `Sync`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reducer {
    dtype: DataType,
    kind: RedOpKind,
    op: Op,
    /// The pre-multiplication scalar as `dtype` bytes (little-endian), for `Op::PreMul`.
    scalar: [u8; 8],
    /// Divisor of integer Avg (0 when there is no final division).
    divisor: u32,
}

/// Runs `$body` with `$k` bound to the marker type of `$dtype`.
macro_rules! with_kind {
    ($dtype:expr, $k:ident => $body:expr) => {
        match $dtype {
            DataType::Int8 => {
                type $k = kinds::I8;
                $body
            }
            DataType::Uint8 => {
                type $k = kinds::U8;
                $body
            }
            DataType::Int32 => {
                type $k = kinds::I32;
                $body
            }
            DataType::Uint32 => {
                type $k = kinds::U32;
                $body
            }
            DataType::Int64 => {
                type $k = kinds::I64;
                $body
            }
            DataType::Uint64 => {
                type $k = kinds::U64;
                $body
            }
            DataType::Float16 => {
                type $k = kinds::F16;
                $body
            }
            DataType::Float32 => {
                type $k = kinds::F32;
                $body
            }
            DataType::Float64 => {
                type $k = kinds::F64;
                $body
            }
            DataType::Bfloat16 => {
                type $k = kinds::BF16;
                $body
            }
            DataType::Float8e4m3 => {
                type $k = kinds::E4M3;
                $body
            }
            DataType::Float8e5m2 => {
                type $k = kinds::E5M2;
                $body
            }
        }
    };
}

/// Runs `$body` with `$k` bound to the marker type of `$dtype` and evaluates to `true`
/// when `$dtype` is one of the small floating formats with a block path; `false` (and
/// nothing run) otherwise.
macro_rules! with_lane_kind {
    ($dtype:expr, $k:ident => $body:expr) => {
        match $dtype {
            DataType::Float16 => {
                type $k = kinds::F16;
                $body;
                true
            }
            DataType::Bfloat16 => {
                type $k = kinds::BF16;
                $body;
                true
            }
            DataType::Float8e4m3 => {
                type $k = kinds::E4M3;
                $body;
                true
            }
            DataType::Float8e5m2 => {
                type $k = kinds::E5M2;
                $body;
                true
            }
            _ => false,
        }
    };
}

// ---- generic loops (monomorphised per kind and operation) ----

#[inline(always)]
fn map1<K: Kind>(dst: &mut [u8], src: &[u8], f: impl Fn(K::A) -> K::A) {
    for (d, s) in dst.chunks_exact_mut(K::N).zip(src.chunks_exact(K::N)) {
        K::put(f(K::get(s)), d);
    }
}

#[inline(always)]
fn update1<K: Kind>(buf: &mut [u8], f: impl Fn(K::A) -> K::A) {
    for d in buf.chunks_exact_mut(K::N) {
        K::put(f(K::get(d)), d);
    }
}

#[inline(always)]
fn map2<K: Kind>(dst: &mut [u8], a: &[u8], b: &[u8], f: impl Fn(K::A, K::A) -> K::A) {
    for ((d, x), y) in dst
        .chunks_exact_mut(K::N)
        .zip(a.chunks_exact(K::N))
        .zip(b.chunks_exact(K::N))
    {
        K::put(f(K::get(x), K::get(y)), d);
    }
}

#[inline(always)]
fn update2<K: Kind>(acc: &mut [u8], b: &[u8], f: impl Fn(K::A, K::A) -> K::A) {
    for (d, y) in acc.chunks_exact_mut(K::N).zip(b.chunks_exact(K::N)) {
        K::put(f(K::get(d), K::get(y)), d);
    }
}

/// Debug check of the slice contract.
#[inline(always)]
fn check_lens(dtype: DataType, a: usize, b: usize) {
    debug_assert_eq!(a, b, "reduce: slice lengths differ");
    debug_assert_eq!(
        a % dtype.size(),
        0,
        "reduce: length not a multiple of the element size"
    );
}

impl Reducer {
    /// Builds the reduction `op` over `dtype`.
    ///
    /// `scalar`: for `PreMulSum`, the scalar as `dtype` bytes (little-endian, exactly
    /// `dtype.size()` bytes); must be `None` for every other op. `nranks`: the number of
    /// contributions, used by `Avg` (must be in `1..=i32::MAX`); ignored otherwise.
    pub fn new(
        dtype: DataType,
        op: RedOpKind,
        scalar: Option<&[u8]>,
        nranks: usize,
    ) -> Result<Reducer> {
        let mut r = Reducer {
            dtype,
            kind: op,
            op: Op::Sum,
            scalar: [0u8; 8],
            divisor: 0,
        };
        if op != RedOpKind::PreMulSum && scalar.is_some() {
            return Err(CclError::arg(format!(
                "reduction {} takes no scalar (only PreMulSum does)",
                op.name()
            )));
        }
        match op {
            RedOpKind::Sum => r.op = Op::Sum,
            RedOpKind::Prod => r.op = Op::Prod,
            RedOpKind::Max => r.op = Op::Max,
            RedOpKind::Min => r.op = Op::Min,
            RedOpKind::PreMulSum => {
                let s = scalar.ok_or_else(|| {
                    CclError::arg(format!(
                        "PreMulSum over {} needs a scalar, none given",
                        dtype.name()
                    ))
                })?;
                if s.len() != dtype.size() {
                    return Err(CclError::arg(format!(
                        "PreMulSum scalar is {} bytes, {} needs {}",
                        s.len(),
                        dtype.name(),
                        dtype.size()
                    )));
                }
                r.scalar[..s.len()].copy_from_slice(s);
                r.op = Op::PreMul;
            }
            RedOpKind::Avg => {
                let n = u32::try_from(nranks)
                    .ok()
                    .filter(|n| (1..=i32::MAX as u32).contains(n))
                    .ok_or_else(|| {
                        CclError::arg(format!(
                            "Avg needs a rank count in 1..={}, got {nranks}",
                            i32::MAX
                        ))
                    })?;
                if dtype.is_float() {
                    r.op = Op::PreMul;
                    let inv = 1.0f64 / f64::from(n);
                    let s = &mut r.scalar[..dtype.size()];
                    match dtype {
                        DataType::Float64 => s.copy_from_slice(&inv.to_le_bytes()),
                        // NCCL: float(1.0 / nRanks), then converted to the type.
                        _ => {
                            let f = inv as f32;
                            with_kind!(dtype, K => K::put(f64_as_arith::<K>(f64::from(f)), s));
                        }
                    }
                } else {
                    r.op = Op::Sum;
                    r.divisor = n;
                }
            }
        }
        Ok(r)
    }

    /// The data type.
    pub fn dtype(&self) -> DataType {
        self.dtype
    }

    /// The operator this reducer was built for.
    pub fn op(&self) -> RedOpKind {
        self.kind
    }

    /// Element size in bytes.
    pub fn elem_size(&self) -> usize {
        self.dtype.size()
    }

    /// The pre-multiplication scalar as `dtype` bytes (`PreMulSum`, or float `Avg`'s
    /// `1/nranks`), `None` when inputs enter the reduction unscaled.
    pub fn prescale(&self) -> Option<&[u8]> {
        (self.op == Op::PreMul).then(|| &self.scalar[..self.dtype.size()])
    }

    /// True when [`Reducer::finish`] must be applied to the fully reduced buffer (integer
    /// `Avg`).
    pub fn needs_finish(&self) -> bool {
        self.divisor != 0
    }

    /// `dst = pre(src)`: the first contribution entering a reduction (applies the
    /// PreMulSum / float-Avg prescale; plain copy otherwise).
    pub fn load(&self, dst: &mut [u8], src: &[u8]) {
        check_lens(self.dtype, dst.len(), src.len());
        if self.op == Op::PreMul
            && with_lane_kind!(self.dtype, K => {
                let s = K::get(&self.scalar[..K::N]);
                lanes::scale::<K>(dst, src, s)
            })
        {
            return;
        }
        self.load_scalar(dst, src)
    }

    /// [`Reducer::load`], element at a time (the reference for the block path).
    fn load_scalar(&self, dst: &mut [u8], src: &[u8]) {
        if self.op == Op::PreMul {
            with_kind!(self.dtype, K => {
                let s = K::get(&self.scalar[..K::N]);
                map1::<K>(dst, src, move |x| K::mul(x, s));
            })
        } else {
            let n = dst.len().min(src.len());
            dst[..n].copy_from_slice(&src[..n]);
        }
    }

    /// `dst = incoming OP pre(local)` (incoming already prescaled by its producer).
    pub fn combine(&self, dst: &mut [u8], incoming: &[u8], local: &[u8]) {
        check_lens(self.dtype, dst.len(), incoming.len());
        check_lens(self.dtype, dst.len(), local.len());
        if with_lane_kind!(self.dtype, K => lanes::map2::<K>(self.lane_op::<K>(true), dst, incoming, local))
        {
            return;
        }
        self.combine_scalar(dst, incoming, local)
    }

    /// [`Reducer::combine`], element at a time (the reference for the block path).
    fn combine_scalar(&self, dst: &mut [u8], incoming: &[u8], local: &[u8]) {
        with_kind!(self.dtype, K => self.combine_t::<K>(dst, incoming, local))
    }

    /// `acc = acc OP pre(local)`.
    pub fn combine_inplace(&self, acc: &mut [u8], local: &[u8]) {
        check_lens(self.dtype, acc.len(), local.len());
        if with_lane_kind!(self.dtype, K => lanes::update2::<K>(self.lane_op::<K>(true), acc, local))
        {
            return;
        }
        self.combine_inplace_scalar(acc, local)
    }

    /// [`Reducer::combine_inplace`], element at a time (the reference for the block path).
    fn combine_inplace_scalar(&self, acc: &mut [u8], local: &[u8]) {
        with_kind!(self.dtype, K => self.combine_inplace_t::<K>(acc, local))
    }

    /// `acc = acc OP incoming` (both already prescaled; used when merging partial results).
    pub fn merge_inplace(&self, acc: &mut [u8], incoming: &[u8]) {
        check_lens(self.dtype, acc.len(), incoming.len());
        if with_lane_kind!(self.dtype, K => lanes::update2::<K>(self.lane_op::<K>(false), acc, incoming))
        {
            return;
        }
        self.merge_inplace_scalar(acc, incoming)
    }

    /// [`Reducer::merge_inplace`], element at a time (the reference for the block path).
    fn merge_inplace_scalar(&self, acc: &mut [u8], incoming: &[u8]) {
        with_kind!(self.dtype, K => self.merge_inplace_t::<K>(acc, incoming))
    }

    /// `dst = a OP b` with both inputs already prescaled (out-of-place merge).
    pub fn merge(&self, dst: &mut [u8], a: &[u8], b: &[u8]) {
        check_lens(self.dtype, dst.len(), a.len());
        check_lens(self.dtype, dst.len(), b.len());
        if with_lane_kind!(self.dtype, K => lanes::map2::<K>(self.lane_op::<K>(false), dst, a, b)) {
            return;
        }
        self.merge_scalar(dst, a, b)
    }

    /// [`Reducer::merge`], element at a time (the reference for the block path).
    fn merge_scalar(&self, dst: &mut [u8], a: &[u8], b: &[u8]) {
        with_kind!(self.dtype, K => self.merge_t::<K>(dst, a, b))
    }

    /// The lane operation of the block path: with `prescale` (combine: the second input is
    /// the local one), PreMul becomes `x + round(y * s)`; without (merge), a plain add.
    #[inline(always)]
    fn lane_op<K: kinds::Kind<A = f32>>(&self, prescale: bool) -> lanes::LaneOp {
        match self.op {
            Op::Sum => lanes::LaneOp::Add,
            Op::Prod => lanes::LaneOp::Mul,
            Op::Max => lanes::LaneOp::Max,
            Op::Min => lanes::LaneOp::Min,
            Op::PreMul if prescale => lanes::LaneOp::PreMulAdd(K::get(&self.scalar[..K::N])),
            Op::PreMul => lanes::LaneOp::Add,
        }
    }

    /// Applied once to a fully reduced buffer: integer Avg divides by nranks (truncating
    /// toward zero); no-op otherwise.
    pub fn finish(&self, buf: &mut [u8]) {
        debug_assert_eq!(buf.len() % self.dtype.size(), 0);
        if self.divisor == 0 {
            return;
        }
        let n = self.divisor;
        with_kind!(self.dtype, K => update1::<K>(buf, move |x| K::div(x, n)))
    }

    #[inline(always)]
    fn combine_t<K: Kind>(&self, dst: &mut [u8], a: &[u8], b: &[u8]) {
        match self.op {
            Op::Sum => map2::<K>(dst, a, b, K::add),
            Op::Prod => map2::<K>(dst, a, b, K::mul),
            Op::Max => map2::<K>(dst, a, b, K::max),
            Op::Min => map2::<K>(dst, a, b, K::min),
            Op::PreMul => {
                let s = K::get(&self.scalar[..K::N]);
                map2::<K>(dst, a, b, move |x, y| K::add(x, K::round(K::mul(y, s))));
            }
        }
    }

    #[inline(always)]
    fn combine_inplace_t<K: Kind>(&self, acc: &mut [u8], b: &[u8]) {
        match self.op {
            Op::Sum => update2::<K>(acc, b, K::add),
            Op::Prod => update2::<K>(acc, b, K::mul),
            Op::Max => update2::<K>(acc, b, K::max),
            Op::Min => update2::<K>(acc, b, K::min),
            Op::PreMul => {
                let s = K::get(&self.scalar[..K::N]);
                update2::<K>(acc, b, move |x, y| K::add(x, K::round(K::mul(y, s))));
            }
        }
    }

    #[inline(always)]
    fn merge_inplace_t<K: Kind>(&self, acc: &mut [u8], b: &[u8]) {
        match self.op {
            Op::Sum | Op::PreMul => update2::<K>(acc, b, K::add),
            Op::Prod => update2::<K>(acc, b, K::mul),
            Op::Max => update2::<K>(acc, b, K::max),
            Op::Min => update2::<K>(acc, b, K::min),
        }
    }

    #[inline(always)]
    fn merge_t<K: Kind>(&self, dst: &mut [u8], a: &[u8], b: &[u8]) {
        match self.op {
            Op::Sum | Op::PreMul => map2::<K>(dst, a, b, K::add),
            Op::Prod => map2::<K>(dst, a, b, K::mul),
            Op::Max => map2::<K>(dst, a, b, K::max),
            Op::Min => map2::<K>(dst, a, b, K::min),
        }
    }
}

/// Converts an f64 to the arithmetic type of `K` (used to build scalars and by
/// [`f64_to_element`]).
fn f64_as_arith<K: Kind>(v: f64) -> K::A
where
    K::A: FromF64,
{
    <K::A as FromF64>::from_f64(v)
}

/// `as`-conversion from f64 into each arithmetic type.
trait FromF64 {
    fn from_f64(v: f64) -> Self;
}

macro_rules! from_f64 {
    ($($t:ty),*) => {$(
        impl FromF64 for $t {
            #[inline]
            fn from_f64(v: f64) -> $t {
                v as $t
            }
        }
    )*};
}
from_f64!(i8, u8, i32, u32, i64, u64, f32, f64);

/// Value of one element (the first `dtype.size()` bytes of `bytes`, little-endian) as f64.
/// Exact for every type except 64-bit integers beyond 2^53 (rounded to nearest).
///
/// # Panics
/// If `bytes` is shorter than one element.
pub fn element_to_f64(dtype: DataType, bytes: &[u8]) -> f64 {
    let b = &bytes[..dtype.size()];
    match dtype {
        DataType::Int8 => f64::from(kinds::I8::get(b)),
        DataType::Uint8 => f64::from(kinds::U8::get(b)),
        DataType::Int32 => f64::from(kinds::I32::get(b)),
        DataType::Uint32 => f64::from(kinds::U32::get(b)),
        DataType::Int64 => kinds::I64::get(b) as f64,
        DataType::Uint64 => kinds::U64::get(b) as f64,
        DataType::Float64 => kinds::F64::get(b),
        DataType::Float32 => f64::from(kinds::F32::get(b)),
        DataType::Float16 => f64::from(kinds::F16::get(b)),
        DataType::Bfloat16 => f64::from(kinds::BF16::get(b)),
        DataType::Float8e4m3 => f64::from(kinds::E4M3::get(b)),
        DataType::Float8e5m2 => f64::from(kinds::E5M2::get(b)),
    }
}

/// Writes `v` as one element of `dtype` into the first `dtype.size()` bytes of `out`.
/// Exact for values the type represents. Otherwise: integers use Rust's `as` (truncation
/// toward zero, saturating at the type's bounds, NaN -> 0); floats round to nearest even
/// (small formats through f32, so a value not representable in f32 is rounded twice);
/// fp8 saturates.
///
/// # Panics
/// If `out` is shorter than one element.
pub fn f64_to_element(dtype: DataType, v: f64, out: &mut [u8]) {
    let out = &mut out[..dtype.size()];
    with_kind!(dtype, K => {
        let a = f64_as_arith::<K>(match dtype {
            // small formats take their value from f32
            DataType::Float16
            | DataType::Bfloat16
            | DataType::Float8e4m3
            | DataType::Float8e5m2 => f64::from(v as f32),
            _ => v,
        });
        K::put(a, out)
    })
}
