//! Block loops for the small floating formats (f16, bf16, fp8 e4m3/e5m2), written so that
//! the compiler vectorises them: each block of [`B`] elements is decoded into an `[f32; B]`
//! array (branch-free bit manipulation), reduced lane by lane in f32, and encoded back with
//! round-to-nearest-even (fp8 saturating) by branch-free encoders.
//!
//! The results are bit-identical to the element-at-a-time path of [`super::kinds`] (the
//! reference: same f32 arithmetic, same rounding; `tests.rs` compares both over random and
//! edge inputs, NaN/Inf/subnormals included). On x86_64 the loops are compiled for the
//! baseline target and with AVX2 enabled (fp8 also with AVX-512F), picked at run time
//! (`is_x86_feature_detected!`, cached by std). The conversions there: bf16 and fp8 in
//! AVX2 integer code, fp8 in AVX-512F code where the CPU has it (sixteen lanes, mask
//! selects), f16 with the F16C conversion instructions when present (exact decode but for
//! signalling NaNs, which come out quiet; round-to-nearest-even encode with NaN lanes
//! replaced by the canonical NaN, as the element path does). Elements past the last whole
//! block go through the element-at-a-time path.

use super::convert::{
    bf16_bits_to_f32, e4m3_to_f32, e5m2_to_f32, f16_bits_to_f32, f32_to_e4m3, f32_to_e5m2,
    f32_to_f16_bits, Fp8Format, E4M3_FORMAT, E5M2_FORMAT,
};
use super::kinds::{Kind, BF16, E4M3, E5M2, F16, F32};

/// Elements per block.
pub(crate) const B: usize = 32;

/// A small floating format whose elements are `N` little-endian bytes holding up to 16 bits.
pub(crate) trait Lanes: Kind<A = f32> {
    /// True only for [`F16`] (which has a hardware path on x86_64).
    const IS_F16: bool = false;
    /// True only for [`BF16`] (which has an AVX2 path on x86_64).
    const IS_BF16: bool = false;
    /// The format's parameters for the FP8 types (which have an AVX2 path on x86_64).
    const FP8: Option<Fp8Format> = None;
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
    const IS_F16: bool = true;
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
    const IS_BF16: bool = true;
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
    const FP8: Option<Fp8Format> = Some(E4M3_FORMAT);
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
    const FP8: Option<Fp8Format> = Some(E5M2_FORMAT);
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
    /// `fmax` semantics, `+0` for `-0` and `+0` (`F32::max`).
    Max,
    /// `fmin` semantics, `-0` for `-0` and `+0` (`F32::min`).
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

/// How a block of `B` elements is converted: [`Soft`] (the [`Lanes`] methods, any CPU) or,
/// for f16 on x86_64, the F16C instructions.
///
/// # Safety
/// `decode`/`encode` may require CPU features ([`Codec`] implementors say which); callers
/// must only call them where those features are known to be present.
trait Codec {
    /// The element format.
    type K: Lanes;
    /// [`Lanes::decode`].
    ///
    /// # Safety
    /// The CPU has the features this codec needs.
    unsafe fn decode(src: &[u8], out: &mut [f32; B]);
    /// [`Lanes::encode`].
    ///
    /// # Safety
    /// The CPU has the features this codec needs.
    unsafe fn encode(v: &[f32; B], dst: &mut [u8]);
}

/// The portable codec: needs no CPU feature.
struct Soft<K>(std::marker::PhantomData<K>);

impl<K: Lanes> Codec for Soft<K> {
    type K = K;
    #[inline(always)]
    unsafe fn decode(src: &[u8], out: &mut [f32; B]) {
        K::decode(src, out)
    }
    #[inline(always)]
    unsafe fn encode(v: &[f32; B], dst: &mut [u8]) {
        K::encode(v, dst)
    }
}

/// # Safety
/// The CPU has the features `C` needs.
#[inline(always)]
unsafe fn map2_with<C: Codec>(dst: &mut [u8], a: &[u8], b: &[u8], f: impl Fn(f32, f32) -> f32) {
    let n = <C::K as Kind>::N;
    let (full, all) = split::<C::K>(dst.len().min(a.len()).min(b.len()));
    let bb = B * n;
    let mut xa = [0f32; B];
    let mut ya = [0f32; B];
    let mut r = [0f32; B];
    for ((d, x), y) in dst[..full]
        .chunks_exact_mut(bb)
        .zip(a[..full].chunks_exact(bb))
        .zip(b[..full].chunks_exact(bb))
    {
        // SAFETY: passed on from the caller.
        unsafe {
            C::decode(x, &mut xa);
            C::decode(y, &mut ya);
        }
        for i in 0..B {
            r[i] = f(xa[i], ya[i]);
        }
        // SAFETY: passed on from the caller.
        unsafe { C::encode(&r, d) };
    }
    for ((d, x), y) in dst[full..all]
        .chunks_exact_mut(n)
        .zip(a[full..all].chunks_exact(n))
        .zip(b[full..all].chunks_exact(n))
    {
        C::K::put(f(C::K::get(x), C::K::get(y)), d);
    }
}

/// # Safety
/// The CPU has the features `C` needs.
#[inline(always)]
unsafe fn update2_with<C: Codec>(acc: &mut [u8], b: &[u8], f: impl Fn(f32, f32) -> f32) {
    let n = <C::K as Kind>::N;
    let (full, all) = split::<C::K>(acc.len().min(b.len()));
    let bb = B * n;
    let mut xa = [0f32; B];
    let mut ya = [0f32; B];
    let mut r = [0f32; B];
    for (d, y) in acc[..full]
        .chunks_exact_mut(bb)
        .zip(b[..full].chunks_exact(bb))
    {
        // SAFETY: passed on from the caller.
        unsafe {
            C::decode(d, &mut xa);
            C::decode(y, &mut ya);
        }
        for i in 0..B {
            r[i] = f(xa[i], ya[i]);
        }
        // SAFETY: passed on from the caller.
        unsafe { C::encode(&r, d) };
    }
    for (d, y) in acc[full..all]
        .chunks_exact_mut(n)
        .zip(b[full..all].chunks_exact(n))
    {
        C::K::put(f(C::K::get(d), C::K::get(y)), d);
    }
}

/// # Safety
/// The CPU has the features `C` needs.
#[inline(always)]
unsafe fn scale_with<C: Codec>(dst: &mut [u8], src: &[u8], s: f32) {
    let n = <C::K as Kind>::N;
    let (full, all) = split::<C::K>(dst.len().min(src.len()));
    let bb = B * n;
    let mut xa = [0f32; B];
    for (d, x) in dst[..full]
        .chunks_exact_mut(bb)
        .zip(src[..full].chunks_exact(bb))
    {
        // SAFETY: passed on from the caller.
        unsafe { C::decode(x, &mut xa) };
        for v in xa.iter_mut() {
            *v *= s;
        }
        // SAFETY: passed on from the caller.
        unsafe { C::encode(&xa, d) };
    }
    for (d, x) in dst[full..all]
        .chunks_exact_mut(n)
        .zip(src[full..all].chunks_exact(n))
    {
        C::K::put(C::K::get(x) * s, d);
    }
}

/// Expands one operation into its monomorphised loop.
///
/// # Safety
/// The CPU has the features `C` needs.
#[inline(always)]
unsafe fn map2_op<C: Codec>(op: LaneOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    // SAFETY: (every arm) the CPU-feature promise is passed on from the caller.
    unsafe {
        match op {
            LaneOp::Add => map2_with::<C>(dst, a, b, |x, y| x + y),
            LaneOp::Mul => map2_with::<C>(dst, a, b, |x, y| x * y),
            LaneOp::Max => map2_with::<C>(dst, a, b, F32::max),
            LaneOp::Min => map2_with::<C>(dst, a, b, F32::min),
            LaneOp::PreMulAdd(s) => map2_with::<C>(dst, a, b, move |x, y| x + C::K::round1(y * s)),
        }
    }
}

/// # Safety
/// The CPU has the features `C` needs.
#[inline(always)]
unsafe fn update2_op<C: Codec>(op: LaneOp, acc: &mut [u8], b: &[u8]) {
    // SAFETY: (every arm) the CPU-feature promise is passed on from the caller.
    unsafe {
        match op {
            LaneOp::Add => update2_with::<C>(acc, b, |x, y| x + y),
            LaneOp::Mul => update2_with::<C>(acc, b, |x, y| x * y),
            LaneOp::Max => update2_with::<C>(acc, b, F32::max),
            LaneOp::Min => update2_with::<C>(acc, b, F32::min),
            LaneOp::PreMulAdd(s) => update2_with::<C>(acc, b, move |x, y| x + C::K::round1(y * s)),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86;

/// One codec of a format as safe functions (tests only): its name, [`Lanes::decode`] and
/// [`Lanes::encode`] as it does them.
#[cfg(test)]
pub(super) struct TestCodec {
    pub(super) name: &'static str,
    pub(super) decode: fn(&[u8], &mut [f32; B]),
    pub(super) encode: fn(&[f32; B], &mut [u8]),
}

/// Every codec of `K` this CPU can run: the portable one, then the hardware ones.
#[cfg(test)]
pub(super) fn codecs_for_tests<K: Lanes>() -> Vec<TestCodec> {
    let mut out = vec![TestCodec {
        name: "portable",
        decode: |s, o| K::decode(s, o),
        encode: |v, d| K::encode(v, d),
    }];
    #[cfg(target_arch = "x86_64")]
    out.extend(x86::codecs_for_tests::<K>());
    out
}

/// `dst[i] = op(a[i], b[i])` over whole elements of the shortest slice.
pub(crate) fn map2<K: Lanes>(op: LaneOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        if K::IS_F16 && x86::f16c() {
            // SAFETY: AVX2 and F16C support were just checked; K is F16 (IS_F16).
            return unsafe { x86::map2_f16(op, dst, a, b) };
        }
        if K::IS_BF16 && x86::avx2() {
            // SAFETY: AVX2 support was just checked; HwBf16 needs only AVX2; K is BF16.
            return unsafe { x86::map2::<x86::HwBf16>(op, dst, a, b) };
        }
        if K::FP8.is_some() && x86::avx512f() {
            // SAFETY: AVX-512F support was just checked; HwFp8x16 needs only that.
            return unsafe { x86::map2_x16::<x86::HwFp8x16<K>>(op, dst, a, b) };
        }
        if K::FP8.is_some() && x86::avx2() {
            // SAFETY: AVX2 support was just checked; HwFp8 needs only AVX2; K is an FP8 kind.
            return unsafe { x86::map2::<x86::HwFp8<K>>(op, dst, a, b) };
        }
        if x86::avx2() {
            // SAFETY: AVX2 support was just checked; Soft needs no feature.
            return unsafe { x86::map2::<Soft<K>>(op, dst, a, b) };
        }
    }
    // SAFETY: Soft needs no CPU feature.
    unsafe { map2_op::<Soft<K>>(op, dst, a, b) }
}

/// `acc[i] = op(acc[i], b[i])` over whole elements of the shorter slice.
pub(crate) fn update2<K: Lanes>(op: LaneOp, acc: &mut [u8], b: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        if K::IS_F16 && x86::f16c() {
            // SAFETY: AVX2 and F16C support were just checked; K is F16 (IS_F16).
            return unsafe { x86::update2_f16(op, acc, b) };
        }
        if K::IS_BF16 && x86::avx2() {
            // SAFETY: AVX2 support was just checked; HwBf16 needs only AVX2; K is BF16.
            return unsafe { x86::update2::<x86::HwBf16>(op, acc, b) };
        }
        if K::FP8.is_some() && x86::avx512f() {
            // SAFETY: AVX-512F support was just checked; HwFp8x16 needs only that.
            return unsafe { x86::update2_x16::<x86::HwFp8x16<K>>(op, acc, b) };
        }
        if K::FP8.is_some() && x86::avx2() {
            // SAFETY: AVX2 support was just checked; HwFp8 needs only AVX2; K is an FP8 kind.
            return unsafe { x86::update2::<x86::HwFp8<K>>(op, acc, b) };
        }
        if x86::avx2() {
            // SAFETY: AVX2 support was just checked; Soft needs no feature.
            return unsafe { x86::update2::<Soft<K>>(op, acc, b) };
        }
    }
    // SAFETY: Soft needs no CPU feature.
    unsafe { update2_op::<Soft<K>>(op, acc, b) }
}

/// `dst[i] = round(src[i] * s)` over whole elements of the shorter slice.
pub(crate) fn scale<K: Lanes>(dst: &mut [u8], src: &[u8], s: f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if K::IS_F16 && x86::f16c() {
            // SAFETY: AVX2 and F16C support were just checked; K is F16 (IS_F16).
            return unsafe { x86::scale_f16(dst, src, s) };
        }
        if K::IS_BF16 && x86::avx2() {
            // SAFETY: AVX2 support was just checked; HwBf16 needs only AVX2; K is BF16.
            return unsafe { x86::scale::<x86::HwBf16>(dst, src, s) };
        }
        if K::FP8.is_some() && x86::avx512f() {
            // SAFETY: AVX-512F support was just checked; HwFp8x16 needs only that.
            return unsafe { x86::scale_x16::<x86::HwFp8x16<K>>(dst, src, s) };
        }
        if K::FP8.is_some() && x86::avx2() {
            // SAFETY: AVX2 support was just checked; HwFp8 needs only AVX2; K is an FP8 kind.
            return unsafe { x86::scale::<x86::HwFp8<K>>(dst, src, s) };
        }
        if x86::avx2() {
            // SAFETY: AVX2 support was just checked; Soft needs no feature.
            return unsafe { x86::scale::<Soft<K>>(dst, src, s) };
        }
    }
    // SAFETY: Soft needs no CPU feature.
    unsafe { scale_with::<Soft<K>>(dst, src, s) }
}
