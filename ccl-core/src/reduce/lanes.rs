//! Block loops for the small floating formats (f16, bf16, fp8 e4m3/e5m2), written so that
//! the compiler vectorises them: each block of [`B`] elements is decoded into an `[f32; B]`
//! array (branch-free bit manipulation), reduced lane by lane in f32, and encoded back with
//! round-to-nearest-even (fp8 saturating) by branch-free encoders.
//!
//! The results are bit-identical to the element-at-a-time path of [`super::kinds`] (the
//! reference: same f32 arithmetic, same rounding; `tests.rs` compares both over random and
//! edge inputs, NaN/Inf/subnormals included). On x86_64 the loops are compiled twice: for
//! the baseline target and with AVX2 enabled, picked at run time
//! (`is_x86_feature_detected!`, cached by std). Elements past the last whole block go
//! through the element-at-a-time path.

use super::convert::{
    bf16_bits_to_f32, e4m3_to_f32, e5m2_to_f32, f16_bits_to_f32, f32_to_e4m3, f32_to_e5m2,
    f32_to_f16_bits,
};
use super::kinds::{Kind, BF16, E4M3, E5M2, F16};

/// Elements per block.
pub(crate) const B: usize = 32;

/// A small floating format whose elements are `N` little-endian bytes holding up to 16 bits.
pub(crate) trait Lanes: Kind<A = f32> {
    /// Element bits (low `8 * N` bits of the `u32`) -> exact f32.
    fn dec1(bits: u32) -> f32;
    /// f32 -> element bits, rounded as [`Kind::put`] does; branch-free.
    fn enc1(v: f32) -> u32;

    /// Decodes `B` elements from `src` (`src.len() == B * N`).
    #[inline(always)]
    fn decode(src: &[u8], out: &mut [f32; B]) {
        // A constant length lets the compiler drop the bounds checks (and vectorise).
        let src = &src[..B * Self::N];
        for (i, o) in out.iter_mut().enumerate() {
            let mut bits = 0u32;
            for k in 0..Self::N {
                bits |= u32::from(src[i * Self::N + k]) << (8 * k);
            }
            *o = Self::dec1(bits);
        }
    }

    /// Encodes `B` values into `dst` (`dst.len() == B * N`).
    #[inline(always)]
    fn encode(v: &[f32; B], dst: &mut [u8]) {
        let dst = &mut dst[..B * Self::N];
        for (i, &x) in v.iter().enumerate() {
            let bits = Self::enc1(x);
            for k in 0..Self::N {
                dst[i * Self::N + k] = (bits >> (8 * k)) as u8;
            }
        }
    }

    /// What storing and reloading `v` gives ([`Kind::round`]).
    #[inline(always)]
    fn round1(v: f32) -> f32 {
        Self::dec1(Self::enc1(v))
    }
}

/// `f32` -> bfloat16 bits without a branch: the same result as
/// [`super::convert::f32_to_bf16_bits`] (round to nearest even, NaN -> `0x7FFF`).
#[inline(always)]
fn bf16_enc(x: f32) -> u32 {
    let bits = x.to_bits();
    let lsb = (bits >> 16) & 1;
    // Wraps only for NaN bit patterns, whose result is replaced below.
    let r = bits.wrapping_add(0x7FFF + lsb) >> 16;
    if bits & 0x7FFF_FFFF > 0x7F80_0000 {
        0x7FFF
    } else {
        r
    }
}

impl Lanes for F16 {
    #[inline(always)]
    fn dec1(bits: u32) -> f32 {
        f16_bits_to_f32(bits as u16)
    }
    #[inline(always)]
    fn enc1(v: f32) -> u32 {
        u32::from(f32_to_f16_bits(v))
    }
}

impl Lanes for BF16 {
    #[inline(always)]
    fn dec1(bits: u32) -> f32 {
        bf16_bits_to_f32(bits as u16)
    }
    #[inline(always)]
    fn enc1(v: f32) -> u32 {
        bf16_enc(v)
    }
}

impl Lanes for E4M3 {
    #[inline(always)]
    fn dec1(bits: u32) -> f32 {
        e4m3_to_f32(bits as u8)
    }
    #[inline(always)]
    fn enc1(v: f32) -> u32 {
        u32::from(f32_to_e4m3(v))
    }
}

impl Lanes for E5M2 {
    #[inline(always)]
    fn dec1(bits: u32) -> f32 {
        e5m2_to_f32(bits as u8)
    }
    #[inline(always)]
    fn enc1(v: f32) -> u32 {
        u32::from(f32_to_e5m2(v))
    }
}

/// The lane operation `f(x, y)` of a two-input loop.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum LaneOp {
    Add,
    Mul,
    /// `fmax` semantics (`f32::max`).
    Max,
    /// `fmin` semantics (`f32::min`).
    Min,
    /// `x + round(y * s)`: PreMulSum's combine with the local input `y`.
    PreMulAdd(f32),
}

/// Byte length covered by whole blocks, and the total byte length of whole elements, of
/// the shortest slice.
#[inline(always)]
fn split<K: Kind>(len: usize) -> (usize, usize) {
    let n = len / K::N;
    (n / B * B * K::N, n * K::N)
}

#[inline(always)]
fn map2_with<K: Lanes>(dst: &mut [u8], a: &[u8], b: &[u8], f: impl Fn(f32, f32) -> f32) {
    let (full, all) = split::<K>(dst.len().min(a.len()).min(b.len()));
    let bb = B * K::N;
    let mut xa = [0f32; B];
    let mut ya = [0f32; B];
    let mut r = [0f32; B];
    for ((d, x), y) in dst[..full]
        .chunks_exact_mut(bb)
        .zip(a[..full].chunks_exact(bb))
        .zip(b[..full].chunks_exact(bb))
    {
        K::decode(x, &mut xa);
        K::decode(y, &mut ya);
        for i in 0..B {
            r[i] = f(xa[i], ya[i]);
        }
        K::encode(&r, d);
    }
    for ((d, x), y) in dst[full..all]
        .chunks_exact_mut(K::N)
        .zip(a[full..all].chunks_exact(K::N))
        .zip(b[full..all].chunks_exact(K::N))
    {
        K::put(f(K::get(x), K::get(y)), d);
    }
}

#[inline(always)]
fn update2_with<K: Lanes>(acc: &mut [u8], b: &[u8], f: impl Fn(f32, f32) -> f32) {
    let (full, all) = split::<K>(acc.len().min(b.len()));
    let bb = B * K::N;
    let mut xa = [0f32; B];
    let mut ya = [0f32; B];
    let mut r = [0f32; B];
    for (d, y) in acc[..full]
        .chunks_exact_mut(bb)
        .zip(b[..full].chunks_exact(bb))
    {
        K::decode(d, &mut xa);
        K::decode(y, &mut ya);
        for i in 0..B {
            r[i] = f(xa[i], ya[i]);
        }
        K::encode(&r, d);
    }
    for (d, y) in acc[full..all]
        .chunks_exact_mut(K::N)
        .zip(b[full..all].chunks_exact(K::N))
    {
        K::put(f(K::get(d), K::get(y)), d);
    }
}

#[inline(always)]
fn scale_with<K: Lanes>(dst: &mut [u8], src: &[u8], s: f32) {
    let (full, all) = split::<K>(dst.len().min(src.len()));
    let bb = B * K::N;
    let mut xa = [0f32; B];
    for (d, x) in dst[..full]
        .chunks_exact_mut(bb)
        .zip(src[..full].chunks_exact(bb))
    {
        K::decode(x, &mut xa);
        for v in xa.iter_mut() {
            *v *= s;
        }
        K::encode(&xa, d);
    }
    for (d, x) in dst[full..all]
        .chunks_exact_mut(K::N)
        .zip(src[full..all].chunks_exact(K::N))
    {
        K::put(K::get(x) * s, d);
    }
}

/// Expands one operation into its monomorphised loop.
#[inline(always)]
fn map2_op<K: Lanes>(op: LaneOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    match op {
        LaneOp::Add => map2_with::<K>(dst, a, b, |x, y| x + y),
        LaneOp::Mul => map2_with::<K>(dst, a, b, |x, y| x * y),
        LaneOp::Max => map2_with::<K>(dst, a, b, f32::max),
        LaneOp::Min => map2_with::<K>(dst, a, b, f32::min),
        LaneOp::PreMulAdd(s) => map2_with::<K>(dst, a, b, move |x, y| x + K::round1(y * s)),
    }
}

#[inline(always)]
fn update2_op<K: Lanes>(op: LaneOp, acc: &mut [u8], b: &[u8]) {
    match op {
        LaneOp::Add => update2_with::<K>(acc, b, |x, y| x + y),
        LaneOp::Mul => update2_with::<K>(acc, b, |x, y| x * y),
        LaneOp::Max => update2_with::<K>(acc, b, f32::max),
        LaneOp::Min => update2_with::<K>(acc, b, f32::min),
        LaneOp::PreMulAdd(s) => update2_with::<K>(acc, b, move |x, y| x + K::round1(y * s)),
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;

    /// [`map2_op`] compiled for AVX2.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn map2<K: Lanes>(op: LaneOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
        map2_op::<K>(op, dst, a, b)
    }

    /// [`update2_op`] compiled for AVX2.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn update2<K: Lanes>(op: LaneOp, acc: &mut [u8], b: &[u8]) {
        update2_op::<K>(op, acc, b)
    }

    /// [`scale_with`] compiled for AVX2.
    ///
    /// # Safety
    /// The CPU must support AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn scale<K: Lanes>(dst: &mut [u8], src: &[u8], s: f32) {
        scale_with::<K>(dst, src, s)
    }
}

/// True when the AVX2 versions can run (cached by std after the first call).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// `dst[i] = op(a[i], b[i])` over whole elements of the shortest slice.
pub(crate) fn map2<K: Lanes>(op: LaneOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 support was just checked.
        return unsafe { avx2::map2::<K>(op, dst, a, b) };
    }
    map2_op::<K>(op, dst, a, b)
}

/// `acc[i] = op(acc[i], b[i])` over whole elements of the shorter slice.
pub(crate) fn update2<K: Lanes>(op: LaneOp, acc: &mut [u8], b: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 support was just checked.
        return unsafe { avx2::update2::<K>(op, acc, b) };
    }
    update2_op::<K>(op, acc, b)
}

/// `dst[i] = round(src[i] * s)` over whole elements of the shorter slice.
pub(crate) fn scale<K: Lanes>(dst: &mut [u8], src: &[u8], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: AVX2 support was just checked.
        return unsafe { avx2::scale::<K>(dst, src, s) };
    }
    scale_with::<K>(dst, src, s)
}
