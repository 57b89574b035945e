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

/// `f32` -> IEEE binary16 bits, round to nearest even; overflow to ±inf; NaN -> `0x7FFF`.
#[inline]
pub fn f32_to_f16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = (bits >> 16) & 0x8000;
    let abs = bits & 0x7FFF_FFFF;
    // Normal results: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits
    // to nearest even by adding 0xFFF plus the kept LSB; a carry moves into the exponent.
    // (Wraps for small `abs`, where the value is not used.)
    let odd = (abs >> 13) & 1;
    let normal = abs.wrapping_sub(0x3800_0000).wrapping_add(0xFFF + odd) >> 13;
    let sub = subnormal_code(abs, 0x3F00_0000);
    let r = if abs < 0x3880_0000 { sub } else { normal };
    // 65520.0 = 0x477F_F000 and everything above it (inf included) rounds to infinity.
    let r = if abs >= 0x477F_F000 { 0x7C00 } else { r };
    if abs > 0x7F80_0000 {
        0x7FFF
    } else {
        (r | sign) as u16
    }
}

/// Code of a result in a small format's subnormal range (which extends up to the smallest
/// normal, whose code it returns when rounding up): `RNE(|x| / q)` where the quantum `q`
/// is the ulp of the f32 `magic` (`magic = q * 2^23`). Adding `magic` lets the FPU round
/// `|x|` to a multiple of `q` (round to nearest even, the default environment that all
/// Rust float arithmetic assumes); the low bits of the sum are then the code.
/// Only meaningful for `|x| < 2^MBITS * q`. With denormals-are-zero set, f32 subnormal
/// inputs read as 0, which is also their correct result here.
#[inline(always)]
fn subnormal_code(abs: u32, magic: u32) -> u32 {
    (f32::from_bits(abs) + f32::from_bits(magic))
        .to_bits()
        .wrapping_sub(magic)
}

/// IEEE binary16 bits -> `f32` (exact).
#[inline]
pub fn f16_bits_to_f32(b: u16) -> f32 {
    let x = b as u32;
    let sign = (x & 0x8000) << 16;
    let em = x & 0x7FFF;
    // normal: rebias the exponent 15 -> 127
    let normal = (em << 13) + 0x3800_0000;
    // subnormal (and zero): m * 2^-24 = (0.5 + m * 2^-24) - 0.5, exact
    let sub = (f32::from_bits(0x3F00_0000 + em) - 0.5).to_bits();
    // inf / NaN: exponent all ones, payload kept
    let special = (em << 13) | 0x7F80_0000;
    let r = if em >= 0x7C00 {
        special
    } else if em < 0x0400 {
        sub
    } else {
        normal
    };
    f32::from_bits(r | sign)
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

/// The parameters of an OCP FP8 format, shared by the element conversions below and the
/// vector codec (`lanes.rs`), so that both compute the same thing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fp8Format {
    /// Mantissa bits.
    pub(crate) mbits: u32,
    /// Exponent bias.
    pub(crate) bias: u32,
    /// f32 bit pattern of the largest finite value.
    pub(crate) max_bits: u32,
    /// Code of the largest finite value.
    pub(crate) max_code: u32,
    /// E4M3's specials (no infinities, only `S.1111.111` is NaN) rather than E5M2's
    /// IEEE-style ones (exponent all ones: infinity or NaN).
    pub(crate) e4m3_specials: bool,
}

impl Fp8Format {
    /// Shift between an f32 mantissa and this format's.
    #[inline(always)]
    pub(crate) const fn shift(&self) -> u32 {
        23 - self.mbits
    }
    /// f32 bits of the float whose ulp is the subnormal quantum `2^(1 - bias - mbits)`
    /// (see [`subnormal_code`]).
    #[inline(always)]
    pub(crate) const fn sub_magic(&self) -> u32 {
        (151 - self.bias - self.mbits) << 23
    }
    /// f32 bits of the smallest normal value.
    #[inline(always)]
    pub(crate) const fn min_normal_bits(&self) -> u32 {
        (127 + 1 - self.bias) << 23
    }
    /// What is added to a code's exponent-and-mantissa bits, shifted into place, to make
    /// the f32 bits of a normal value (the exponent rebiased `bias -> 127`).
    #[inline(always)]
    pub(crate) const fn rebias(&self) -> u32 {
        (127 - self.bias) << 23
    }
}

/// FP8 E4M3: bias 7, 3 mantissa bits, largest finite 448.
pub(crate) const E4M3_FORMAT: Fp8Format = Fp8Format {
    mbits: 3,
    bias: 7,
    max_bits: 0x43E0_0000,
    max_code: 0x7E,
    e4m3_specials: true,
};

/// FP8 E5M2: bias 15, 2 mantissa bits, largest finite 57344.
pub(crate) const E5M2_FORMAT: Fp8Format = Fp8Format {
    mbits: 2,
    bias: 15,
    max_bits: 0x4760_0000,
    max_code: 0x7B,
    e4m3_specials: false,
};

/// Shared FP8 encoder.
#[inline(always)]
fn f32_to_fp8(x: f32, f: &Fp8Format) -> u8 {
    let bits = x.to_bits();
    let sign = (bits >> 24) & 0x80;
    let abs = bits & 0x7FFF_FFFF;
    let shift = f.shift();
    // normal results: rebias 127 -> bias and round the dropped bits to nearest even
    let odd = (abs >> shift) & 1;
    let normal = abs
        .wrapping_sub(f.rebias())
        .wrapping_add((1 << (shift - 1)) - 1 + odd)
        >> shift;
    let sub = subnormal_code(abs, f.sub_magic());
    let r = if abs < f.min_normal_bits() {
        sub
    } else {
        normal
    };
    // finite overflow and infinities saturate (__NV_SATFINITE)
    let r = if abs > f.max_bits { f.max_code } else { r };
    if abs > 0x7F80_0000 {
        0x7F
    } else {
        (r | sign) as u8
    }
}

/// `f32` -> FP8 E4M3 (bias 7, no infinities, `S.1111.111` = NaN), round to nearest even,
/// saturating (CUDA `__NV_SATFINITE`): |x| > 448 and ±inf -> ±448; NaN -> `0x7F`.
#[inline]
pub fn f32_to_e4m3(x: f32) -> u8 {
    f32_to_fp8(x, &E4M3_FORMAT)
}

/// `f32` -> FP8 E5M2 (bias 15, IEEE-style inf/NaN), round to nearest even, saturating
/// (CUDA `__NV_SATFINITE`): |x| > 57344 and ±inf -> ±57344; NaN -> `0x7F`.
#[inline]
pub fn f32_to_e5m2(x: f32) -> u8 {
    f32_to_fp8(x, &E5M2_FORMAT)
}

/// FP8 E4M3 -> `f32` (exact; the NaN codes `S.1111.111` -> quiet NaN).
#[inline]
pub fn e4m3_to_f32(b: u8) -> f32 {
    let x = b as u32;
    let sign = (x & 0x80) << 24;
    let em = x & 0x7F;
    // normal: rebias the exponent 7 -> 127
    let normal = (em << 20) + ((127 - 7) << 23);
    // subnormal (and zero): m * 2^-9 = (2^14 + m * 2^-9) - 2^14, exact
    let sub = (f32::from_bits(0x4680_0000 + em) - 16384.0).to_bits();
    let r = if em == 0x7F {
        0x7FC0_0000
    } else if em < 0x08 {
        sub
    } else {
        normal
    };
    f32::from_bits(r | sign)
}

/// FP8 E5M2 -> `f32` (exact; NaN codes -> NaN). E5M2 is binary16 without its low byte.
#[inline]
pub fn e5m2_to_f32(b: u8) -> f32 {
    f16_bits_to_f32((b as u16) << 8)
}
