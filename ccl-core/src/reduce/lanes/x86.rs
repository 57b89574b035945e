//! The x86_64 codecs and the loops compiled with AVX2 / AVX-512F for them (see the
//! parent module); every entry point is `unsafe` with the CPU features it needs, and the
//! dispatch in the parent checks them at run time.

use super::*;
use std::arch::x86_64::*;

/// f16 through the F16C conversion instructions (`vcvtph2ps` is exact, except that it
/// quiets signalling NaNs, which changes no result: every NaN encodes to the canonical
/// one; `vcvtps2ph`
/// with round-to-nearest-even is IEEE's conversion; NaN lanes are then replaced by
/// the canonical `0x7FFF`, as [`super::super::convert::f32_to_f16_bits`] does).
/// Needs AVX2 and F16C.
pub(super) struct HwF16;

impl Codec for HwF16 {
    type K = F16;
    #[inline(always)]
    unsafe fn decode(src: &[u8], out: &mut [f32; B]) {
        let src = &src[..B * 2];
        for k in 0..B / 8 {
            // SAFETY: bytes 16k..16k+16 are inside `src` (B * 2 bytes) and `out` has
            // lanes 8k..8k+8; unaligned load/store; F16C/AVX present (caller).
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(16 * k).cast());
                _mm256_storeu_ps(out.as_mut_ptr().add(8 * k), _mm256_cvtph_ps(h));
            }
        }
    }
    #[inline(always)]
    unsafe fn encode(v: &[f32; B], dst: &mut [u8]) {
        let dst = &mut dst[..B * 2];
        for k in 0..B / 8 {
            // SAFETY: lanes 8k..8k+8 of `v`, bytes 16k..16k+16 of `dst` (B * 2
            // bytes); unaligned load/store; AVX2/F16C present (caller).
            unsafe {
                let x = _mm256_loadu_ps(v.as_ptr().add(8 * k));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
                let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
                let m = _mm_packs_epi32(
                    _mm256_castsi256_si128(nan),
                    _mm256_extracti128_si256::<1>(nan),
                );
                let r = _mm_blendv_epi8(h, _mm_set1_epi16(0x7FFF), m);
                _mm_storeu_si128(dst.as_mut_ptr().add(16 * k).cast(), r);
            }
        }
    }
}

/// bf16 with AVX2 integer instructions: decode is a zero-extend and shift; encode adds
/// `0x7FFF + lsb` and shifts (round to nearest even, as
/// [`super::super::convert::f32_to_bf16_bits`]), NaN lanes become `0x7FFF`. Needs AVX2.
pub(super) struct HwBf16;

impl Codec for HwBf16 {
    type K = BF16;
    #[inline(always)]
    unsafe fn decode(src: &[u8], out: &mut [f32; B]) {
        let src = &src[..B * 2];
        for k in 0..B / 8 {
            // SAFETY: bytes 16k..16k+16 are inside `src` (B * 2 bytes), lanes 8k..8k+8
            // inside `out`; unaligned load/store; AVX2 present (caller).
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(16 * k).cast());
                let w = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h));
                _mm256_storeu_ps(out.as_mut_ptr().add(8 * k), _mm256_castsi256_ps(w));
            }
        }
    }
    #[inline(always)]
    unsafe fn encode(v: &[f32; B], dst: &mut [u8]) {
        let dst = &mut dst[..B * 2];
        /// Eight f32 lanes -> their bf16 bits in the low half of each 32-bit lane.
        ///
        /// # Safety
        /// The CPU has AVX2.
        #[inline(always)]
        unsafe fn round8(xf: __m256) -> __m256i {
            // SAFETY: register-only AVX2 operations; AVX2 present (caller).
            unsafe {
                let x = _mm256_castps_si256(xf);
                let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(x), _mm256_set1_epi32(1));
                let biased = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb);
                let r = _mm256_srli_epi32::<16>(biased);
                // NaN lanes (unordered with themselves): one compare, no mask of the sign
                let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(xf, xf));
                _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FFF), nan)
            }
        }
        for k in 0..B / 16 {
            // SAFETY: lanes 16k..16k+16 of `v`, bytes 32k..32k+32 of `dst` (B * 2
            // bytes); unaligned load/store; AVX2 present (caller).
            unsafe {
                let r0 = round8(_mm256_loadu_ps(v.as_ptr().add(16 * k)));
                let r1 = round8(_mm256_loadu_ps(v.as_ptr().add(16 * k + 8)));
                // every lane <= 0xFFFF: the unsigned-saturating pack is exact; it packs
                // within 128-bit halves (r0 lo, r1 lo, r0 hi, r1 hi), so reorder the
                // quadwords to r0 lo, r0 hi, r1 lo, r1 hi
                let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(r0, r1));
                _mm256_storeu_si256(dst.as_mut_ptr().add(32 * k).cast(), p);
            }
        }
    }
}

/// FP8 (E4M3 or E5M2, `K::FP8`) with AVX2 integer instructions: the same branch-free
/// steps as the element conversions of [`super::super::convert`] (decode: rebias, the
/// subnormals through one exact float subtraction, the specials; encode: rebias and
/// round to nearest even, the subnormals through one float addition, saturation, NaN
/// -> `0x7F`), eight lanes at a time, with blends for the selects. Needs AVX2.
pub(super) struct HwFp8<K>(std::marker::PhantomData<K>);

/// The format of `K`; only called for FP8 kinds (the dispatch checks `K::FP8`).
#[inline(always)]
fn fp8_format<K: Lanes>() -> Fp8Format {
    match K::FP8 {
        Some(f) => f,
        None => unreachable!("HwFp8 is only used for FP8 kinds"),
    }
}

/// Eight codes (in the low byte of each 32-bit lane) -> the f32 bits
/// [`super::super::convert::e4m3_to_f32`] / `e5m2_to_f32` give.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn fp8_decode8(f: &Fp8Format, x: __m256i) -> __m256i {
    // SAFETY: register-only AVX2 operations; AVX2 present (caller).
    unsafe {
        let shift = _mm_cvtsi32_si128(f.shift() as i32);
        let sign = _mm256_slli_epi32::<24>(_mm256_and_si256(x, _mm256_set1_epi32(0x80)));
        let em = _mm256_and_si256(x, _mm256_set1_epi32(0x7F));
        let placed = _mm256_sll_epi32(em, shift);
        let normal = _mm256_add_epi32(placed, _mm256_set1_epi32(f.rebias() as i32));
        // subnormal (and zero): m * quantum = (magic + m * quantum) - magic, exact
        let magic = f.sub_magic();
        let sub = _mm256_castps_si256(_mm256_sub_ps(
            _mm256_castsi256_ps(_mm256_add_epi32(_mm256_set1_epi32(magic as i32), em)),
            _mm256_set1_ps(f32::from_bits(magic)),
        ));
        let is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(1 << f.mbits), em);
        let r = _mm256_blendv_epi8(normal, sub, is_sub);
        let r = if f.e4m3_specials {
            // S.1111.111 -> the quiet NaN
            let nan = _mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7F));
            _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0_0000), nan)
        } else {
            // exponent all ones: infinity or NaN, the payload kept (as binary16 does)
            let special = _mm256_cmpgt_epi32(em, _mm256_set1_epi32(0x7B));
            let inf_nan = _mm256_or_si256(placed, _mm256_set1_epi32(0x7F80_0000));
            _mm256_blendv_epi8(r, inf_nan, special)
        };
        _mm256_or_si256(r, sign)
    }
}

/// Eight f32 lanes -> their codes (in the low byte of each 32-bit lane), as
/// [`super::super::convert::f32_to_e4m3`] / `f32_to_e5m2` round them.
///
/// # Safety
/// The CPU has AVX2.
#[inline(always)]
unsafe fn fp8_encode8(f: &Fp8Format, x: __m256) -> __m256i {
    // SAFETY: register-only AVX2 operations; AVX2 present (caller).
    unsafe {
        let shift = f.shift();
        let count = _mm_cvtsi32_si128(shift as i32);
        let bits = _mm256_castps_si256(x);
        let sign = _mm256_and_si256(_mm256_srli_epi32::<24>(bits), _mm256_set1_epi32(0x80));
        let abs = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFF_FFFF));
        // normal: rebias and round the dropped bits to nearest even (wrapping, as the
        // element encoder; the lanes where it wraps are replaced below)
        let odd = _mm256_and_si256(_mm256_srl_epi32(abs, count), _mm256_set1_epi32(1));
        let round = _mm256_add_epi32(_mm256_set1_epi32((1 << (shift - 1)) - 1), odd);
        let normal = _mm256_srl_epi32(
            _mm256_add_epi32(
                _mm256_sub_epi32(abs, _mm256_set1_epi32(f.rebias() as i32)),
                round,
            ),
            count,
        );
        // subnormal: the FPU rounds |x| to a multiple of the quantum
        let magic = f.sub_magic();
        let sub = _mm256_sub_epi32(
            _mm256_castps_si256(_mm256_add_ps(
                _mm256_castsi256_ps(abs),
                _mm256_set1_ps(f32::from_bits(magic)),
            )),
            _mm256_set1_epi32(magic as i32),
        );
        // every constant and `abs` are below 2^31: the signed compares are exact
        let is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(f.min_normal_bits() as i32), abs);
        let r = _mm256_blendv_epi8(normal, sub, is_sub);
        let over = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(f.max_bits as i32));
        let r = _mm256_blendv_epi8(r, _mm256_set1_epi32(f.max_code as i32), over);
        let r = _mm256_or_si256(r, sign);
        let nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F80_0000));
        _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7F), nan)
    }
}

impl<K: Lanes> Codec for HwFp8<K> {
    type K = K;
    #[inline(always)]
    unsafe fn decode(src: &[u8], out: &mut [f32; B]) {
        let f = fp8_format::<K>();
        let src = &src[..B];
        for k in 0..B / 8 {
            // SAFETY: bytes 8k..8k+8 are inside `src` (B bytes), lanes 8k..8k+8 inside
            // `out`; unaligned load/store; AVX2 present (caller).
            unsafe {
                let x = _mm256_cvtepu8_epi32(_mm_loadl_epi64(src.as_ptr().add(8 * k).cast()));
                let r = fp8_decode8(&f, x);
                _mm256_storeu_ps(out.as_mut_ptr().add(8 * k), _mm256_castsi256_ps(r));
            }
        }
    }
    #[inline(always)]
    unsafe fn encode(v: &[f32; B], dst: &mut [u8]) {
        let f = fp8_format::<K>();
        let dst = &mut dst[..B];
        // SAFETY: lanes 0..32 of `v`, bytes 0..32 of `dst` (B = 32 bytes); unaligned
        // loads/store; AVX2 present (caller).
        unsafe {
            let c = |k: usize| fp8_encode8(&f, _mm256_loadu_ps(v.as_ptr().add(8 * k)));
            // every lane <= 0xFF: both unsigned-saturating packs are exact; they work
            // within 128-bit halves, so the dwords come out as lanes 0-3 of each
            // input, then lanes 4-7 of each, and a permute puts them in order
            let p = _mm256_packus_epi16(
                _mm256_packus_epi32(c(0), c(1)),
                _mm256_packus_epi32(c(2), c(3)),
            );
            let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(dst.as_mut_ptr().cast(), p);
        }
    }
}

/// [`HwFp8`] on sixteen lanes with AVX-512F: the same steps, with mask registers for
/// the selects and `vpmovdb` for the narrowing. Needs AVX-512F.
pub(super) struct HwFp8x16<K>(std::marker::PhantomData<K>);

/// Sixteen codes (low byte of each lane) -> f32 bits, as [`fp8_decode8`].
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn fp8_decode16(f: &Fp8Format, x: __m512i) -> __m512i {
    // SAFETY: register-only AVX-512F operations; AVX-512F present (caller).
    unsafe {
        let shift = _mm_cvtsi32_si128(f.shift() as i32);
        let sign = _mm512_slli_epi32::<24>(_mm512_and_si512(x, _mm512_set1_epi32(0x80)));
        let em = _mm512_and_si512(x, _mm512_set1_epi32(0x7F));
        let placed = _mm512_sll_epi32(em, shift);
        let normal = _mm512_add_epi32(placed, _mm512_set1_epi32(f.rebias() as i32));
        let magic = f.sub_magic();
        let sub = _mm512_castps_si512(_mm512_sub_ps(
            _mm512_castsi512_ps(_mm512_add_epi32(_mm512_set1_epi32(magic as i32), em)),
            _mm512_set1_ps(f32::from_bits(magic)),
        ));
        let is_sub = _mm512_cmplt_epu32_mask(em, _mm512_set1_epi32(1 << f.mbits));
        let r = _mm512_mask_mov_epi32(normal, is_sub, sub);
        let r = if f.e4m3_specials {
            let nan = _mm512_cmpeq_epi32_mask(em, _mm512_set1_epi32(0x7F));
            _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0_0000))
        } else {
            let special = _mm512_cmpgt_epu32_mask(em, _mm512_set1_epi32(0x7B));
            let inf_nan = _mm512_or_si512(placed, _mm512_set1_epi32(0x7F80_0000));
            _mm512_mask_mov_epi32(r, special, inf_nan)
        };
        _mm512_or_si512(r, sign)
    }
}

/// Sixteen f32 lanes -> sixteen code bytes, as [`fp8_encode8`].
///
/// # Safety
/// The CPU has AVX-512F.
#[inline(always)]
unsafe fn fp8_encode16(f: &Fp8Format, x: __m512) -> __m128i {
    // SAFETY: register-only AVX-512F operations; AVX-512F present (caller).
    unsafe {
        let shift = f.shift();
        let count = _mm_cvtsi32_si128(shift as i32);
        let bits = _mm512_castps_si512(x);
        let sign = _mm512_and_si512(_mm512_srli_epi32::<24>(bits), _mm512_set1_epi32(0x80));
        let abs = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFF_FFFF));
        let odd = _mm512_and_si512(_mm512_srl_epi32(abs, count), _mm512_set1_epi32(1));
        let round = _mm512_add_epi32(_mm512_set1_epi32((1 << (shift - 1)) - 1), odd);
        let normal = _mm512_srl_epi32(
            _mm512_add_epi32(
                _mm512_sub_epi32(abs, _mm512_set1_epi32(f.rebias() as i32)),
                round,
            ),
            count,
        );
        let magic = f.sub_magic();
        let sub = _mm512_sub_epi32(
            _mm512_castps_si512(_mm512_add_ps(
                _mm512_castsi512_ps(abs),
                _mm512_set1_ps(f32::from_bits(magic)),
            )),
            _mm512_set1_epi32(magic as i32),
        );
        let is_sub = _mm512_cmplt_epu32_mask(abs, _mm512_set1_epi32(f.min_normal_bits() as i32));
        let r = _mm512_mask_mov_epi32(normal, is_sub, sub);
        let over = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(f.max_bits as i32));
        let r = _mm512_mask_mov_epi32(r, over, _mm512_set1_epi32(f.max_code as i32));
        let r = _mm512_or_si512(r, sign);
        let nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7F80_0000));
        let r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7F));
        // every lane <= 0xFF: the truncating narrowing is exact
        _mm512_cvtepi32_epi8(r)
    }
}

impl<K: Lanes> Codec for HwFp8x16<K> {
    type K = K;
    #[inline(always)]
    unsafe fn decode(src: &[u8], out: &mut [f32; B]) {
        let f = fp8_format::<K>();
        let src = &src[..B];
        for k in 0..B / 16 {
            // SAFETY: bytes 16k..16k+16 are inside `src` (B bytes), lanes 16k..16k+16
            // inside `out`; unaligned load/store; AVX-512F present (caller).
            unsafe {
                let x = _mm512_cvtepu8_epi32(_mm_loadu_si128(src.as_ptr().add(16 * k).cast()));
                let r = fp8_decode16(&f, x);
                _mm512_storeu_ps(out.as_mut_ptr().add(16 * k), _mm512_castsi512_ps(r));
            }
        }
    }
    #[inline(always)]
    unsafe fn encode(v: &[f32; B], dst: &mut [u8]) {
        let f = fp8_format::<K>();
        let dst = &mut dst[..B];
        for k in 0..B / 16 {
            // SAFETY: lanes 16k..16k+16 of `v`, bytes 16k..16k+16 of `dst` (B bytes);
            // unaligned load/store; AVX-512F present (caller).
            unsafe {
                let r = fp8_encode16(&f, _mm512_loadu_ps(v.as_ptr().add(16 * k)));
                _mm_storeu_si128(dst.as_mut_ptr().add(16 * k).cast(), r);
            }
        }
    }
}

/// [`map2_op`] compiled for AVX-512F.
///
/// # Safety
/// The CPU must support AVX-512F, and `C` needs nothing more.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn map2_x16<C: Codec>(op: LaneOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    // SAFETY: C needs at most AVX-512F, promised by the caller.
    unsafe { map2_op::<C>(op, dst, a, b) }
}

/// [`update2_op`] compiled for AVX-512F.
///
/// # Safety
/// The CPU must support AVX-512F, and `C` needs nothing more.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn update2_x16<C: Codec>(op: LaneOp, acc: &mut [u8], b: &[u8]) {
    // SAFETY: C needs at most AVX-512F, promised by the caller.
    unsafe { update2_op::<C>(op, acc, b) }
}

/// [`scale_with`] compiled for AVX-512F.
///
/// # Safety
/// The CPU must support AVX-512F, and `C` needs nothing more.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn scale_x16<C: Codec>(dst: &mut [u8], src: &[u8], s: f32) {
    // SAFETY: C needs at most AVX-512F, promised by the caller.
    unsafe { scale_with::<C>(dst, src, s) }
}

/// AVX-512F support (cached by std after the first call).
#[inline(always)]
pub(super) fn avx512f() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

/// The hardware codecs of `K` that this CPU can run, as safe functions, for the tests
/// that compare every codec with the element conversions.
#[cfg(test)]
pub(super) fn codecs_for_tests<K: Lanes>() -> Vec<TestCodec> {
    /// # Safety
    /// The CPU has AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn dec_avx2<C: Codec>(s: &[u8], o: &mut [f32; B]) {
        // SAFETY: every codec but HwFp8x16 needs at most these features (caller).
        unsafe { C::decode(s, o) }
    }
    /// # Safety
    /// As for `dec_avx2`.
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn enc_avx2<C: Codec>(v: &[f32; B], d: &mut [u8]) {
        // SAFETY: as in `dec_avx2`.
        unsafe { C::encode(v, d) }
    }
    /// # Safety
    /// The CPU has AVX-512F.
    #[target_feature(enable = "avx512f")]
    unsafe fn dec_x16<C: Codec>(s: &[u8], o: &mut [f32; B]) {
        // SAFETY: HwFp8x16 needs AVX-512F (caller).
        unsafe { C::decode(s, o) }
    }
    /// # Safety
    /// As for `dec_x16`.
    #[target_feature(enable = "avx512f")]
    unsafe fn enc_x16<C: Codec>(v: &[f32; B], d: &mut [u8]) {
        // SAFETY: as in `dec_x16`.
        unsafe { C::encode(v, d) }
    }
    let mut out = Vec::new();
    if K::IS_F16 && f16c() {
        out.push(TestCodec {
            name: "F16C",
            decode: |s, o| {
                // SAFETY: pushed only when the CPU has AVX2 and F16C.
                unsafe { dec_avx2::<HwF16>(s, o) }
            },
            encode: |v, d| {
                // SAFETY: pushed only when the CPU has AVX2 and F16C.
                unsafe { enc_avx2::<HwF16>(v, d) }
            },
        });
    }
    if K::IS_BF16 && f16c() {
        out.push(TestCodec {
            name: "bf16 AVX2",
            decode: |s, o| {
                // SAFETY: pushed only when the CPU has AVX2 and F16C.
                unsafe { dec_avx2::<HwBf16>(s, o) }
            },
            encode: |v, d| {
                // SAFETY: pushed only when the CPU has AVX2 and F16C.
                unsafe { enc_avx2::<HwBf16>(v, d) }
            },
        });
    }
    if K::FP8.is_some() && f16c() {
        out.push(TestCodec {
            name: "fp8 AVX2",
            decode: |s, o| {
                // SAFETY: pushed only when the CPU has AVX2 and F16C.
                unsafe { dec_avx2::<HwFp8<K>>(s, o) }
            },
            encode: |v, d| {
                // SAFETY: pushed only when the CPU has AVX2 and F16C.
                unsafe { enc_avx2::<HwFp8<K>>(v, d) }
            },
        });
    }
    if K::FP8.is_some() && avx512f() {
        out.push(TestCodec {
            name: "fp8 AVX-512",
            decode: |s, o| {
                // SAFETY: pushed only when the CPU has AVX-512F.
                unsafe { dec_x16::<HwFp8x16<K>>(s, o) }
            },
            encode: |v, d| {
                // SAFETY: pushed only when the CPU has AVX-512F.
                unsafe { enc_x16::<HwFp8x16<K>>(v, d) }
            },
        });
    }
    out
}

/// [`map2_op`] compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2, and `C` needs nothing more.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn map2<C: Codec>(op: LaneOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    // SAFETY: C needs at most AVX2, promised by the caller.
    unsafe { map2_op::<C>(op, dst, a, b) }
}

/// [`update2_op`] compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2, and `C` needs nothing more.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn update2<C: Codec>(op: LaneOp, acc: &mut [u8], b: &[u8]) {
    // SAFETY: C needs at most AVX2, promised by the caller.
    unsafe { update2_op::<C>(op, acc, b) }
}

/// [`scale_with`] compiled for AVX2.
///
/// # Safety
/// The CPU must support AVX2, and `C` needs nothing more.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn scale<C: Codec>(dst: &mut [u8], src: &[u8], s: f32) {
    // SAFETY: C needs at most AVX2, promised by the caller.
    unsafe { scale_with::<C>(dst, src, s) }
}

/// f16 [`map2_op`] with F16C.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn map2_f16(op: LaneOp, dst: &mut [u8], a: &[u8], b: &[u8]) {
    // SAFETY: the features HwF16 needs are enabled here and promised by the caller.
    unsafe { map2_op::<HwF16>(op, dst, a, b) }
}

/// f16 [`update2_op`] with F16C.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn update2_f16(op: LaneOp, acc: &mut [u8], b: &[u8]) {
    // SAFETY: as for map2_f16.
    unsafe { update2_op::<HwF16>(op, acc, b) }
}

/// f16 [`scale_with`] with F16C.
///
/// # Safety
/// The CPU must support AVX2 and F16C.
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn scale_f16(dst: &mut [u8], src: &[u8], s: f32) {
    // SAFETY: as for map2_f16.
    unsafe { scale_with::<HwF16>(dst, src, s) }
}

/// AVX2 support (cached by std after the first call).
#[inline(always)]
pub(super) fn avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// AVX2 and F16C support.
#[inline(always)]
pub(super) fn f16c() -> bool {
    avx2() && std::arch::is_x86_feature_detected!("f16c")
}
