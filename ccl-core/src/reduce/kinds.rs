//! One zero-sized marker type per NCCL data type, each saying how an element is read from
//! and written to little-endian bytes and how the reduction arithmetic works on it.
//!
//! The loops in [`super::kernels`] are generic over [`Kind`]; monomorphisation gives one
//! straight loop per (dtype, op) with no per-element dispatch, which LLVM vectorises for the
//! native types.

use super::convert::{
    bf16_bits_to_f32, e4m3_to_f32, e5m2_to_f32, f16_bits_to_f32, f32_to_bf16_bits, f32_to_e4m3,
    f32_to_e5m2, f32_to_f16_bits,
};

/// Storage and arithmetic of one data type.
pub(crate) trait Kind {
    /// Bytes per element.
    const N: usize;
    /// The type arithmetic is done in (f32 for the small float formats).
    type A: Copy;
    /// Reads one element; `b.len() == N`.
    fn get(b: &[u8]) -> Self::A;
    /// Writes one element (rounding to the storage format); `b.len() == N`.
    fn put(v: Self::A, b: &mut [u8]);
    /// Rounds an arithmetic value to what storing and reloading it gives.
    #[inline(always)]
    fn round(v: Self::A) -> Self::A {
        v
    }
    fn add(a: Self::A, b: Self::A) -> Self::A;
    fn mul(a: Self::A, b: Self::A) -> Self::A;
    fn max(a: Self::A, b: Self::A) -> Self::A;
    fn min(a: Self::A, b: Self::A) -> Self::A;
    /// Integer Avg's final division by `n >= 1`, truncating toward zero. Identity for floats
    /// (never called for them).
    fn div(a: Self::A, n: u32) -> Self::A;
}

macro_rules! int_kind {
    ($name:ident, $t:ty, $wide:ty) => {
        pub(crate) struct $name;
        impl Kind for $name {
            const N: usize = std::mem::size_of::<$t>();
            type A = $t;
            #[inline(always)]
            fn get(b: &[u8]) -> $t {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_le_bytes(a)
            }
            #[inline(always)]
            fn put(v: $t, b: &mut [u8]) {
                b.copy_from_slice(&v.to_le_bytes());
            }
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn mul(a: $t, b: $t) -> $t {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t {
                std::cmp::Ord::max(a, b)
            }
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t {
                std::cmp::Ord::min(a, b)
            }
            #[inline(always)]
            fn div(a: $t, n: u32) -> $t {
                // Widened so that n beyond the type's range is fine; Rust's `/` truncates
                // toward zero, n >= 1 so there is no overflow (i64::MIN / n with n >= 1 fits).
                ((a as $wide) / (n as $wide)) as $t
            }
        }
    };
}

int_kind!(I8, i8, i64);
int_kind!(U8, u8, u64);
int_kind!(I32, i32, i64);
int_kind!(U32, u32, u64);
int_kind!(I64, i64, i64);
int_kind!(U64, u64, u64);

macro_rules! native_float_kind {
    ($name:ident, $t:ty) => {
        pub(crate) struct $name;
        impl Kind for $name {
            const N: usize = std::mem::size_of::<$t>();
            type A = $t;
            #[inline(always)]
            fn get(b: &[u8]) -> $t {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_le_bytes(a)
            }
            #[inline(always)]
            fn put(v: $t, b: &mut [u8]) {
                b.copy_from_slice(&v.to_le_bytes());
            }
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t {
                a + b
            }
            #[inline(always)]
            fn mul(a: $t, b: $t) -> $t {
                a * b
            }
            // fmax/fmin semantics (a NaN operand is ignored when the other is a number) with
            // one answer for equal operands: Max gives +0 and Min -0 for a -0/+0 pair, as
            // IEEE 754-2019's maximum/minimum order them. `f32::min` leaves that pair open,
            // and LLVM's scalar and vector code answer it differently, so the block path
            // would not match the element-at-a-time reference.
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t {
                if a == b {
                    <$t>::from_bits(a.to_bits() & b.to_bits())
                } else {
                    a.max(b)
                }
            }
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t {
                if a == b {
                    <$t>::from_bits(a.to_bits() | b.to_bits())
                } else {
                    a.min(b)
                }
            }
            #[inline(always)]
            fn div(a: $t, _n: u32) -> $t {
                a
            }
        }
    };
}

native_float_kind!(F32, f32);
native_float_kind!(F64, f64);

macro_rules! small_float_kind {
    ($name:ident, $bytes:expr, $get:expr, $put:expr) => {
        pub(crate) struct $name;
        impl Kind for $name {
            const N: usize = $bytes;
            type A = f32;
            #[inline(always)]
            fn get(b: &[u8]) -> f32 {
                let mut a = [0u8; $bytes];
                a.copy_from_slice(b);
                ($get)(a)
            }
            #[inline(always)]
            fn put(v: f32, b: &mut [u8]) {
                b.copy_from_slice(&($put)(v));
            }
            #[inline(always)]
            fn round(v: f32) -> f32 {
                ($get)(($put)(v))
            }
            #[inline(always)]
            fn add(a: f32, b: f32) -> f32 {
                a + b
            }
            #[inline(always)]
            fn mul(a: f32, b: f32) -> f32 {
                a * b
            }
            #[inline(always)]
            fn max(a: f32, b: f32) -> f32 {
                F32::max(a, b)
            }
            #[inline(always)]
            fn min(a: f32, b: f32) -> f32 {
                F32::min(a, b)
            }
            #[inline(always)]
            fn div(a: f32, _n: u32) -> f32 {
                a
            }
        }
    };
}

small_float_kind!(
    F16,
    2,
    |a: [u8; 2]| f16_bits_to_f32(u16::from_le_bytes(a)),
    |v: f32| f32_to_f16_bits(v).to_le_bytes()
);
small_float_kind!(
    BF16,
    2,
    |a: [u8; 2]| bf16_bits_to_f32(u16::from_le_bytes(a)),
    |v: f32| f32_to_bf16_bits(v).to_le_bytes()
);
small_float_kind!(E4M3, 1, |a: [u8; 1]| e4m3_to_f32(a[0]), |v: f32| [
    f32_to_e4m3(v)
]);
small_float_kind!(E5M2, 1, |a: [u8; 1]| e5m2_to_f32(a[0]), |v: f32| [
    f32_to_e5m2(v)
]);
