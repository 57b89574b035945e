//! Bit-exact conversions between `f32` and the small floating formats NCCL reduces in:
//! IEEE binary16 (`half`), bfloat16, and the two OCP FP8 formats (E4M3, E5M2).
//!
//! Every narrowing conversion rounds to nearest, ties to even (what CUDA's `cvt.rn` does):
//!
//! * `f32 -> f16`: overflow goes to ±inf (values >= 65520 in magnitude); subnormals are
//!   produced exactly; any NaN becomes the canonical NaN `0x7FFF` (as `cvt.rn.f16.f32`).
//! * `f32 -> bf16`: overflow goes to ±inf; any NaN becomes the canonical NaN `0x7FFF`.
//! * `f32 -> e4m3 / e5m2`: CUDA's `__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ..)`: finite values
//!   beyond the largest finite value, and ±inf, saturate to ±max (e4m3 448 = `0x7E`,
//!   e5m2 57344 = `0x7B`); NaN becomes `0x7F` (a NaN in both formats, sign dropped as the CUDA
//!   host path does); magnitudes <= half the smallest subnormal become ±0.
//!
//! Widening conversions are exact; they keep the sign and payload of NaNs (bfloat16, half)
//! or map them to a quiet f32 NaN (fp8).

/// Rounds `x` (finite, magnitude not above the format's largest finite value, or above it
/// when the caller handles overflow afterwards) to a small binary format with `MBITS`
/// explicit mantissa bits and exponent bias `BIAS`, returning the code without its sign.
/// The result of rounding up out of the largest binade is the code after the largest
/// finite one (the caller decides what that means).
#[inline(always)]
fn round_abs_to_small<const MBITS: u32, const BIAS: i32>(abs_bits: u32) -> u32 {
    // abs_bits is a non-negative finite f32 (bits 0..=0x7F7F_FFFF).
    let exp_field = (abs_bits >> 23) as i32;
    let (e, m) = if exp_field == 0 {
        // f32 subnormal: value = m * 2^-149, i.e. exponent field 1 without implicit bit.
        (1, abs_bits & 0x7F_FFFF)
    } else {
        (exp_field, (abs_bits & 0x7F_FFFF) | 0x80_0000)
    };
    // value = m * 2^(e - 150). The result's binade exponent te is the value's unbiased
    // exponent, clamped below at the format's minimum normal exponent 1 - BIAS (there the
    // format has subnormals with the same quantum).
    let te = (e - 127).max(1 - BIAS);
    // quantum of the result: 2^(te - MBITS); units = value / quantum = m >> s
    let s = (150 + te - MBITS as i32 - e).clamp(0, 31) as u32;
    let q = m >> s;
    let rem = m & ((1u32 << s) - 1);
    let half = if s == 0 { 0 } else { 1u32 << (s - 1) };
    let round_up = s != 0 && (rem > half || (rem == half && (q & 1) == 1));
    let n = q + round_up as u32;
    // code = ((te + BIAS - 1) << MBITS) + n covers both the normal case (n in
    // [2^MBITS, 2^(MBITS+1)], the carry moving into the next binade) and the subnormal case
    // (te + BIAS - 1 == 0, n in [0, 2^MBITS], where 2^MBITS is the smallest normal).
    (((te + BIAS - 1) as u32) << MBITS) + n
}

/// `f32` -> IEEE binary16 bits, round to nearest even; overflow to ±inf; NaN -> `0x7FFF`.
#[inline]
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let abs = bits & 0x7FFF_FFFF;
    if abs > 0x7F80_0000 {
        return 0x7FFF;
    }
    // 65520.0 = 0x477F_F000 and everything above it (inf included) rounds to infinity.
    if abs >= 0x477F_F000 {
        return sign | 0x7C00;
    }
    sign | round_abs_to_small::<10, 15>(abs) as u16
}

/// IEEE binary16 bits -> `f32` (exact).
#[inline]
pub fn f16_bits_to_f32(b: u16) -> f32 {
    let b = b as u32;
    let sign = (b & 0x8000) << 16;
    let e = (b >> 10) & 0x1F;
    let m = b & 0x3FF;
    let bits = if e == 0x1F {
        sign | 0x7F80_0000 | (m << 13)
    } else if e != 0 {
        sign | ((e + 112) << 23) | (m << 13)
    } else {
        // zero or subnormal: m * 2^-24, exact in f32 (0x3380_0000 is 2^-24)
        let v = (m as f32) * f32::from_bits(0x3380_0000);
        return if sign != 0 { -v } else { v };
    };
    f32::from_bits(bits)
}

/// `f32` -> bfloat16 bits, round to nearest even; overflow to ±inf; NaN -> `0x7FFF`.
#[inline]
pub fn f32_to_bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if bits & 0x7FFF_FFFF > 0x7F80_0000 {
        return 0x7FFF;
    }
    let lsb = (bits >> 16) & 1;
    // Cannot overflow u32: the largest finite bits 0xFF7F_FFFF + 0x8000 < 2^32.
    ((bits + 0x7FFF + lsb) >> 16) as u16
}

/// bfloat16 bits -> `f32` (exact).
#[inline]
pub fn bf16_bits_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// Largest finite e4m3 value.
pub const E4M3_MAX: f32 = 448.0;
/// Largest finite e5m2 value.
pub const E5M2_MAX: f32 = 57344.0;

/// `f32` -> FP8 E4M3 (bias 7, no infinities, `S.1111.111` = NaN), round to nearest even,
/// saturating (CUDA `__NV_SATFINITE`): |x| > 448 and ±inf -> ±448; NaN -> `0x7F`.
#[inline]
pub fn f32_to_e4m3(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & 0x7FFF_FFFF;
    if abs > 0x7F80_0000 {
        return 0x7F;
    }
    if abs > E4M3_MAX.to_bits() {
        return sign | 0x7E;
    }
    sign | round_abs_to_small::<3, 7>(abs) as u8
}

/// `f32` -> FP8 E5M2 (bias 15, IEEE-style inf/NaN), round to nearest even, saturating
/// (CUDA `__NV_SATFINITE`): |x| > 57344 and ±inf -> ±57344; NaN -> `0x7F`.
#[inline]
pub fn f32_to_e5m2(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let abs = bits & 0x7FFF_FFFF;
    if abs > 0x7F80_0000 {
        return 0x7F;
    }
    if abs > E5M2_MAX.to_bits() {
        return sign | 0x7B;
    }
    sign | round_abs_to_small::<2, 15>(abs) as u8
}

/// Decodes one small-float code to f32 bits (const so the tables are built at compile time).
const fn small_to_f32_bits(
    code: u8,
    ebits: u32,
    mbits: u32,
    bias: u32,
    ieee_specials: bool,
) -> u32 {
    let code = code as u32;
    let sign = (code >> 7) << 31;
    let e = (code >> mbits) & ((1 << ebits) - 1);
    let m = code & ((1 << mbits) - 1);
    let emax = (1 << ebits) - 1;
    if ieee_specials && e == emax {
        return if m == 0 {
            sign | 0x7F80_0000
        } else {
            0x7FC0_0000
        };
    }
    if !ieee_specials && e == emax && m == (1 << mbits) - 1 {
        return 0x7FC0_0000;
    }
    if e == 0 {
        if m == 0 {
            return sign;
        }
        // subnormal m * 2^(1 - bias - mbits): normalise
        let mut mm = m;
        let mut exp = 1 + 127 - bias; // f32 biased exponent of 2^(1 - bias)
        while mm & (1 << mbits) == 0 {
            mm <<= 1;
            exp -= 1;
        }
        mm &= (1 << mbits) - 1;
        return sign | (exp << 23) | (mm << (23 - mbits));
    }
    sign | ((e + 127 - bias) << 23) | (m << (23 - mbits))
}

const fn build_table(ebits: u32, mbits: u32, bias: u32, ieee: bool) -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = small_to_f32_bits(i as u8, ebits, mbits, bias, ieee);
        i += 1;
    }
    t
}

static E4M3_TABLE: [u32; 256] = build_table(4, 3, 7, false);
static E5M2_TABLE: [u32; 256] = build_table(5, 2, 15, true);

/// FP8 E4M3 -> `f32` (exact; NaN codes -> quiet NaN).
#[inline]
pub fn e4m3_to_f32(b: u8) -> f32 {
    f32::from_bits(E4M3_TABLE[b as usize])
}

/// FP8 E5M2 -> `f32` (exact; NaN codes -> quiet NaN).
#[inline]
pub fn e5m2_to_f32(b: u8) -> f32 {
    f32::from_bits(E5M2_TABLE[b as usize])
}
