//! NCCL data types and reduction operations as nccl-tests names them, plus exact
//! conversions between small integers and every element encoding (including the
//! half, bfloat16 and fp8 formats). Pure logic.

/// `ncclDataType_t` values and nccl-tests' names for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataType {
    /// int8
    Int8,
    /// uint8
    Uint8,
    /// int32
    Int32,
    /// uint32
    Uint32,
    /// int64
    Int64,
    /// uint64
    Uint64,
    /// half (IEEE binary16)
    Half,
    /// float
    Float,
    /// double
    Double,
    /// bfloat16
    Bfloat16,
    /// fp8 e4m3 (no infinities, NaN = S.1111.111)
    F8e4m3,
    /// fp8 e5m2 (IEEE-like)
    F8e5m2,
}

/// All types in `ncclDataType_t` order (what `-d all` iterates, library permitting).
pub const ALL_TYPES: [DataType; 12] = [
    DataType::Int8,
    DataType::Uint8,
    DataType::Int32,
    DataType::Uint32,
    DataType::Int64,
    DataType::Uint64,
    DataType::Half,
    DataType::Float,
    DataType::Double,
    DataType::Bfloat16,
    DataType::F8e4m3,
    DataType::F8e5m2,
];

/// Parameters of a binary floating-point format.
#[derive(Clone, Copy, Debug)]
pub struct FloatFmt {
    /// Exponent bits.
    pub exp_bits: u32,
    /// Mantissa (fraction) bits.
    pub man_bits: u32,
    /// True for e4m3: no infinities, only the all-ones pattern is NaN.
    pub fn_variant: bool,
}

impl DataType {
    /// The raw `ncclDataType_t`.
    pub fn nccl(self) -> i32 {
        self as i32
    }

    /// nccl-tests' name (`-d` value, column "type").
    pub fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Half => "half",
            DataType::Float => "float",
            DataType::Double => "double",
            DataType::Bfloat16 => "bfloat16",
            DataType::F8e4m3 => "f8e4m3",
            DataType::F8e5m2 => "f8e5m2",
        }
    }

    /// Parses a `-d` value (nccl-tests names, plus NCCL's spellings as aliases).
    pub fn parse(s: &str) -> Option<DataType> {
        let t = match s {
            "int8" | "char" => DataType::Int8,
            "uint8" => DataType::Uint8,
            "int32" | "int" => DataType::Int32,
            "uint32" => DataType::Uint32,
            "int64" => DataType::Int64,
            "uint64" => DataType::Uint64,
            "half" | "float16" | "fp16" => DataType::Half,
            "float" | "float32" | "fp32" => DataType::Float,
            "double" | "float64" | "fp64" => DataType::Double,
            "bfloat16" | "bf16" => DataType::Bfloat16,
            "f8e4m3" | "fp8_e4m3" => DataType::F8e4m3,
            "f8e5m2" | "fp8_e5m2" => DataType::F8e5m2,
            _ => return None,
        };
        Some(t)
    }

    /// Element size in bytes.
    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::F8e4m3 | DataType::F8e5m2 => 1,
            DataType::Half | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Double => 8,
        }
    }

    /// Whether the type is a floating-point format.
    pub fn is_float(self) -> bool {
        self.float_fmt().is_some()
    }

    /// Whether the type is an unsigned integer.
    pub fn is_unsigned(self) -> bool {
        matches!(self, DataType::Uint8 | DataType::Uint32 | DataType::Uint64)
    }

    /// The floating-point format, `None` for integers.
    pub fn float_fmt(self) -> Option<FloatFmt> {
        let f = |e, m, fnv| {
            Some(FloatFmt {
                exp_bits: e,
                man_bits: m,
                fn_variant: fnv,
            })
        };
        match self {
            DataType::Half => f(5, 10, false),
            DataType::Float => f(8, 23, false),
            DataType::Double => f(11, 52, false),
            DataType::Bfloat16 => f(8, 7, false),
            DataType::F8e4m3 => f(4, 3, true),
            DataType::F8e5m2 => f(5, 2, false),
            _ => None,
        }
    }

    /// Largest M such that every integer in [-M, M] (signed) or [0, M] (unsigned) is
    /// exactly representable; capped at 2^40 so sums of small values never overflow i64.
    pub fn max_exact_int(self) -> i64 {
        let cap = 1i64 << 40;
        match self {
            DataType::Int8 => 127,
            DataType::Uint8 => 255,
            DataType::Int32 => i32::MAX as i64,
            DataType::Uint32 => u32::MAX as i64,
            DataType::Int64 | DataType::Uint64 => cap,
            _ => match self.float_fmt() {
                Some(ff) => (1i64 << (ff.man_bits + 1).min(40)).min(cap),
                None => cap,
            },
        }
    }

    /// Largest k such that 2^k (and -2^k for signed) is exactly representable without
    /// overflow (for product inputs).
    pub fn max_pow2(self) -> u32 {
        match self {
            DataType::Int8 => 6,
            DataType::Uint8 => 7,
            DataType::Int32 => 30,
            DataType::Uint32 => 31,
            DataType::Int64 => 62,
            DataType::Uint64 => 63,
            DataType::Half => 15,
            DataType::Float | DataType::Bfloat16 => 120,
            DataType::Double => 1000,
            DataType::F8e4m3 => 8,
            DataType::F8e5m2 => 15,
        }
    }

    /// Encodes the integer `v` (which the caller keeps representable) as element bytes,
    /// little endian, `self.size()` bytes written into `out`. Integers wrap like C casts.
    pub fn encode_int(self, v: i64, out: &mut [u8]) {
        match self {
            DataType::Int8 | DataType::Uint8 => out[0] = v as u8,
            DataType::Int32 | DataType::Uint32 => {
                out[..4].copy_from_slice(&(v as u32).to_le_bytes())
            }
            DataType::Int64 | DataType::Uint64 => {
                out[..8].copy_from_slice(&(v as u64).to_le_bytes())
            }
            DataType::Float => out[..4].copy_from_slice(&(v as f32).to_le_bytes()),
            DataType::Double => out[..8].copy_from_slice(&(v as f64).to_le_bytes()),
            _ => {
                // Minifloats: `v` is exactly representable by construction.
                let bits = self
                    .float_fmt()
                    .map(|ff| encode_exact(ff, v as f64))
                    .unwrap_or(0);
                let n = self.size();
                out[..n].copy_from_slice(&bits.to_le_bytes()[..n]);
            }
        }
    }

    /// Decodes element bytes to f64 (exact for every format here except 64-bit integers
    /// beyond 2^53, which the tests never produce).
    pub fn decode(self, b: &[u8]) -> f64 {
        match self {
            DataType::Int8 => b[0] as i8 as f64,
            DataType::Uint8 => b[0] as f64,
            DataType::Int32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            DataType::Uint32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            DataType::Int64 => i64::from_le_bytes(arr8(b)) as f64,
            DataType::Uint64 => u64::from_le_bytes(arr8(b)) as f64,
            DataType::Float => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            DataType::Double => f64::from_le_bytes(arr8(b)),
            _ => {
                let n = self.size();
                let mut raw = [0u8; 8];
                raw[..n].copy_from_slice(&b[..n]);
                match self.float_fmt() {
                    Some(ff) => decode_bits(ff, u64::from_le_bytes(raw)),
                    None => 0.0,
                }
            }
        }
    }

    /// The spacing between adjacent representable values at magnitude |x| (1 for integers).
    pub fn ulp_at(self, x: f64) -> f64 {
        match self.float_fmt() {
            None => 1.0,
            Some(ff) => {
                let bias = (1i32 << (ff.exp_bits - 1)) - 1;
                let min_exp = 1 - bias;
                let a = x.abs();
                let e = if a == 0.0 {
                    min_exp
                } else {
                    (a.log2().floor() as i32).max(min_exp)
                };
                2f64.powi(e - ff.man_bits as i32)
            }
        }
    }
}

fn arr8(b: &[u8]) -> [u8; 8] {
    [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]
}

/// Decodes a raw bit pattern of the format `ff` (low bits of `bits`).
pub fn decode_bits(ff: FloatFmt, bits: u64) -> f64 {
    let man_mask = (1u64 << ff.man_bits) - 1;
    let exp_mask = (1u64 << ff.exp_bits) - 1;
    let man = bits & man_mask;
    let exp = (bits >> ff.man_bits) & exp_mask;
    let neg = (bits >> (ff.man_bits + ff.exp_bits)) & 1 == 1;
    let bias = (1i32 << (ff.exp_bits - 1)) - 1;
    let sign = if neg { -1.0 } else { 1.0 };
    if exp == exp_mask {
        if ff.fn_variant {
            if man == man_mask {
                return f64::NAN;
            }
        } else if man == 0 {
            return sign * f64::INFINITY;
        } else {
            return f64::NAN;
        }
    }
    let frac = man as f64 / (1u64 << ff.man_bits) as f64;
    if exp == 0 {
        sign * frac * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + frac) * 2f64.powi(exp as i32 - bias)
    }
}

/// Encodes `x`, which must be exactly representable in `ff` (zero, or a normal number
/// whose mantissa fits), as a raw bit pattern; values that are not are truncated.
pub fn encode_exact(ff: FloatFmt, x: f64) -> u64 {
    let sign_bit = 1u64 << (ff.man_bits + ff.exp_bits);
    let neg = x < 0.0;
    let a = x.abs();
    let s = if neg { sign_bit } else { 0 };
    if a == 0.0 {
        return s;
    }
    let bias = (1i32 << (ff.exp_bits - 1)) - 1;
    let mut e = a.log2().floor() as i32;
    // Guard against log2 rounding at exact powers of two.
    if 2f64.powi(e) > a {
        e -= 1;
    } else if 2f64.powi(e + 1) <= a {
        e += 1;
    }
    let biased = e + bias;
    if biased <= 0 {
        // Subnormal.
        let m = (a / 2f64.powi(1 - bias) * (1u64 << ff.man_bits) as f64) as u64;
        return s | m;
    }
    let frac = a / 2f64.powi(e) - 1.0;
    let m = (frac * (1u64 << ff.man_bits) as f64) as u64;
    s | ((biased as u64) << ff.man_bits) | m
}

/// Reduction operations as nccl-tests names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedOp {
    /// ncclSum
    Sum,
    /// ncclProd
    Prod,
    /// ncclMax
    Max,
    /// ncclMin
    Min,
    /// ncclAvg
    Avg,
    /// ncclRedOpCreatePreMulSum with a per-rank scalar
    MulSum,
}

/// All ops in nccl-tests order (what `-o all` iterates, library permitting).
pub const ALL_OPS: [RedOp; 6] = [
    RedOp::Sum,
    RedOp::Prod,
    RedOp::Max,
    RedOp::Min,
    RedOp::Avg,
    RedOp::MulSum,
];

impl RedOp {
    /// nccl-tests' name.
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
            RedOp::MulSum => "mulsum",
        }
    }

    /// Parses a `-o` value.
    pub fn parse(s: &str) -> Option<RedOp> {
        ALL_OPS.iter().copied().find(|o| o.name() == s)
    }

    /// The raw `ncclRedOp_t` (MulSum has none: it is created per call).
    pub fn nccl(self) -> i32 {
        match self {
            RedOp::Sum => 0,
            RedOp::Prod => 1,
            RedOp::Max => 2,
            RedOp::Min => 3,
            RedOp::Avg => 4,
            RedOp::MulSum => -1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_and_bf16_known_bits() {
        let mut b = [0u8; 8];
        DataType::Half.encode_int(1, &mut b);
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), 0x3c00);
        DataType::Half.encode_int(-2, &mut b);
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), 0xc000);
        DataType::Half.encode_int(2048, &mut b);
        assert_eq!(u16::from_le_bytes([b[0], b[1]]), 0x6800);
        DataType::Bfloat16.encode_int(3, &mut b);
        assert_eq!(
            u16::from_le_bytes([b[0], b[1]]),
            (3.0f32.to_bits() >> 16) as u16
        );
        DataType::F8e4m3.encode_int(1, &mut b);
        assert_eq!(b[0], 0x38);
        DataType::F8e4m3.encode_int(16, &mut b);
        assert_eq!(b[0], 0x58);
        DataType::F8e5m2.encode_int(1, &mut b);
        assert_eq!(b[0], 0x3c);
        DataType::F8e5m2.encode_int(-8, &mut b);
        assert_eq!(b[0], 0xc8);
        assert!(DataType::F8e4m3.decode(&[0x7f]).is_nan());
        assert_eq!(DataType::F8e4m3.decode(&[0x7e]), 448.0);
        assert_eq!(DataType::F8e5m2.decode(&[0x7b]), 57344.0);
        assert!(DataType::F8e5m2.decode(&[0x7c]).is_infinite());
    }

    #[test]
    fn every_exact_integer_round_trips() {
        for t in ALL_TYPES {
            let m = t.max_exact_int().min(5000);
            let lo = if t.is_unsigned() { 0 } else { -m };
            let mut b = [0u8; 8];
            for v in lo..=m {
                t.encode_int(v, &mut b);
                assert_eq!(t.decode(&b), v as f64, "{t:?} {v}");
            }
            for k in 0..=t.max_pow2().min(60) {
                t.encode_int(1i64 << k, &mut b);
                assert_eq!(t.decode(&b), (1i64 << k) as f64, "{t:?} 2^{k}");
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for t in ALL_TYPES {
            assert_eq!(DataType::parse(t.name()), Some(t));
        }
        for o in ALL_OPS {
            assert_eq!(RedOp::parse(o.name()), Some(o));
        }
        assert_eq!(DataType::parse("quad"), None);
        assert_eq!(RedOp::parse("xor"), None);
    }

    #[test]
    fn ulp() {
        assert_eq!(DataType::Float.ulp_at(1.0), f32::EPSILON as f64);
        assert_eq!(DataType::Half.ulp_at(1024.0), 1.0);
        assert_eq!(DataType::Int32.ulp_at(5.0), 1.0);
    }
}
