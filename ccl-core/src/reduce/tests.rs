//! Tests of the reduction arithmetic against independent references: a small-float decoder
//! and a round-to-nearest-even encoder written from the format definitions (working in
//! f64 on the sorted list of representable values), and i128 / f64 arithmetic.

use super::*;

// ---------------------------------------------------------------- helpers

/// splitmix64: deterministic test randomness (also used by `lanes_tests`).
pub(super) struct Rng(pub(super) u64);
impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Specials {
    /// exponent all-ones: mantissa 0 = inf, else NaN
    Ieee,
    /// only S.1111.111 is NaN; no infinities
    E4m3,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Overflow {
    Inf,
    Saturate,
}

/// An independent description of a small binary floating format.
#[derive(Clone, Copy, Debug)]
struct Fmt {
    name: &'static str,
    ebits: u32,
    mbits: u32,
    bias: i32,
    specials: Specials,
    overflow: Overflow,
    enc: fn(f32) -> u32,
    dec: fn(u32) -> f32,
}

impl Fmt {
    fn bits(&self) -> u32 {
        1 + self.ebits + self.mbits
    }
    fn count(&self) -> u32 {
        1 << self.bits()
    }
    fn sign_bit(&self) -> u32 {
        1 << (self.ebits + self.mbits)
    }

    /// Decodes a code from the format definition (value computed in f64).
    fn ref_decode(&self, code: u32) -> f64 {
        let neg = code & self.sign_bit() != 0;
        let emask = (1u32 << self.ebits) - 1;
        let mmask = (1u32 << self.mbits) - 1;
        let e = (code >> self.mbits) & emask;
        let m = code & mmask;
        let mag = match self.specials {
            Specials::Ieee if e == emask => {
                if m == 0 {
                    f64::INFINITY
                } else {
                    return f64::NAN;
                }
            }
            Specials::E4m3 if e == emask && m == mmask => return f64::NAN,
            _ if e == 0 => m as f64 * 2f64.powi(1 - self.bias - self.mbits as i32),
            _ => (1.0 + m as f64 / (1u64 << self.mbits) as f64) * 2f64.powi(e as i32 - self.bias),
        };
        if neg {
            -mag
        } else {
            mag
        }
    }

    /// All non-negative finite values with their codes, ascending.
    fn positives(&self) -> Vec<(f64, u32)> {
        let v: Vec<(f64, u32)> = (0..self.sign_bit())
            .map(|c| (self.ref_decode(c), c))
            .filter(|(v, _)| v.is_finite())
            .collect();
        assert!(
            v.windows(2).all(|w| w[0].0 < w[1].0),
            "{}: codes not monotonic",
            self.name
        );
        v
    }

    /// Round-to-nearest-even of `x` to this format, with its overflow rule; `None` for NaN.
    fn ref_round(&self, pos: &[(f64, u32)], x: f64) -> Option<u32> {
        if x.is_nan() {
            return None;
        }
        let sign = if x.is_sign_negative() {
            self.sign_bit()
        } else {
            0
        };
        let a = x.abs();
        let (max, max_code) = pos[pos.len() - 1];
        let code = if a > max {
            match self.overflow {
                Overflow::Saturate => max_code,
                Overflow::Inf => {
                    let ulp = max - pos[pos.len() - 2].0;
                    if a >= max + ulp / 2.0 {
                        ((1u32 << self.ebits) - 1) << self.mbits
                    } else {
                        max_code
                    }
                }
            }
        } else {
            let idx = pos.partition_point(|&(v, _)| v <= a);
            let (lo, lo_code) = pos[idx - 1];
            if lo == a {
                lo_code
            } else {
                let (hi, hi_code) = pos[idx];
                let mid = (lo + hi) / 2.0; // exact: few significant bits
                if a < mid {
                    lo_code
                } else if a > mid {
                    hi_code
                } else if lo_code & 1 == 0 {
                    lo_code
                } else {
                    hi_code
                }
            }
        };
        Some(sign | code)
    }
}

const F16: Fmt = Fmt {
    name: "f16",
    ebits: 5,
    mbits: 10,
    bias: 15,
    specials: Specials::Ieee,
    overflow: Overflow::Inf,
    enc: |x| f32_to_f16_bits(x) as u32,
    dec: |c| f16_bits_to_f32(c as u16),
};
const BF16: Fmt = Fmt {
    name: "bf16",
    ebits: 8,
    mbits: 7,
    bias: 127,
    specials: Specials::Ieee,
    overflow: Overflow::Inf,
    enc: |x| f32_to_bf16_bits(x) as u32,
    dec: |c| bf16_bits_to_f32(c as u16),
};
const E4M3: Fmt = Fmt {
    name: "e4m3",
    ebits: 4,
    mbits: 3,
    bias: 7,
    specials: Specials::E4m3,
    overflow: Overflow::Saturate,
    enc: |x| f32_to_e4m3(x) as u32,
    dec: |c| e4m3_to_f32(c as u8),
};
const E5M2: Fmt = Fmt {
    name: "e5m2",
    ebits: 5,
    mbits: 2,
    bias: 15,
    specials: Specials::Ieee,
    overflow: Overflow::Saturate,
    enc: |x| f32_to_e5m2(x) as u32,
    dec: |c| e5m2_to_f32(c as u8),
};
const FMTS: [Fmt; 4] = [F16, BF16, E4M3, E5M2];

fn fmt_of(d: DataType) -> Option<Fmt> {
    match d {
        DataType::Float16 => Some(F16),
        DataType::Bfloat16 => Some(BF16),
        DataType::Float8e4m3 => Some(E4M3),
        DataType::Float8e5m2 => Some(E5M2),
        _ => None,
    }
}

/// `Fmt::positives` of a small float type, computed once.
fn positives_cached(d: DataType) -> &'static [(f64, u32)] {
    use std::sync::OnceLock;
    static CACHE: [OnceLock<Vec<(f64, u32)>>; 4] = [
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
        OnceLock::new(),
    ];
    let i = match d {
        DataType::Float16 => 0,
        DataType::Bfloat16 => 1,
        DataType::Float8e4m3 => 2,
        _ => 3,
    };
    CACHE[i].get_or_init(|| fmt_of(d).expect("small float type").positives())
}

/// Checks the encoder on `x` against the reference rounding.
fn check_enc(f: &Fmt, pos: &[(f64, u32)], x: f32) {
    let got = (f.enc)(x);
    match f.ref_round(pos, x as f64) {
        Some(want) => assert_eq!(
            got,
            want,
            "{}: encode({x:e} = {:#010x}) = {got:#x}, want {want:#x}",
            f.name,
            x.to_bits()
        ),
        None => assert!(
            f.ref_decode(got).is_nan(),
            "{}: NaN encoded as {got:#x}",
            f.name
        ),
    }
}

// ---------------------------------------------------------------- conversions

#[test]
fn decode_matches_format_definition_exhaustively() {
    for f in FMTS {
        for c in 0..f.count() {
            let want = f.ref_decode(c);
            let got = (f.dec)(c) as f64;
            if want.is_nan() {
                assert!(got.is_nan(), "{} {c:#x}: want NaN, got {got}", f.name);
            } else {
                assert_eq!(got, want, "{} {c:#x}", f.name);
                assert_eq!(
                    got.is_sign_negative(),
                    want.is_sign_negative(),
                    "{} {c:#x} sign",
                    f.name
                );
            }
        }
    }
}

#[test]
fn every_pattern_round_trips_through_f32() {
    for f in FMTS {
        for c in 0..f.count() {
            let x = (f.dec)(c);
            let back = (f.enc)(x);
            if x.is_nan() {
                assert!(f.ref_decode(back).is_nan(), "{} {c:#x}", f.name);
            } else if x.is_infinite() && f.overflow == Overflow::Saturate {
                // e5m2 infinities saturate (CUDA __NV_SATFINITE)
                let max = f.positives().last().map(|p| p.1).unwrap_or(0);
                let sign = if x < 0.0 { f.sign_bit() } else { 0 };
                assert_eq!(back, sign | max, "{} {c:#x}", f.name);
            } else {
                assert_eq!(back, c, "{} {c:#x} ({x:e})", f.name);
            }
        }
    }
}

#[test]
fn known_fp8_values() {
    assert_eq!(e4m3_to_f32(0x7E), 448.0);
    assert_eq!(e4m3_to_f32(0x01), 2f32.powi(-9));
    assert_eq!(e4m3_to_f32(0x08), 2f32.powi(-6));
    assert_eq!(e4m3_to_f32(0x38), 1.0);
    assert!(e4m3_to_f32(0x7F).is_nan() && e4m3_to_f32(0xFF).is_nan());
    assert_eq!(e4m3_to_f32(0x78), 256.0); // S.1111.000 is a number in e4m3
    assert_eq!(e5m2_to_f32(0x7B), 57344.0);
    assert_eq!(e5m2_to_f32(0x7C), f32::INFINITY);
    assert_eq!(e5m2_to_f32(0xFC), f32::NEG_INFINITY);
    assert!(e5m2_to_f32(0x7D).is_nan() && e5m2_to_f32(0xFE).is_nan());
    assert_eq!(e5m2_to_f32(0x01), 2f32.powi(-16));
    assert_eq!(e5m2_to_f32(0x3C), 1.0);
    assert_eq!(E4M3_MAX, 448.0);
    assert_eq!(E5M2_MAX, 57344.0);
}

#[test]
fn rounding_at_every_midpoint_and_its_neighbours() {
    for f in FMTS {
        let pos = f.positives();
        for w in pos.windows(2) {
            let mid = ((w[0].0 + w[1].0) / 2.0) as f32;
            assert_eq!(mid as f64, (w[0].0 + w[1].0) / 2.0, "midpoint exact in f32");
            for x in [
                mid,
                mid.next_up(),
                mid.next_down(),
                w[0].0 as f32,
                (w[0].0 as f32).next_up(),
            ] {
                check_enc(&f, &pos, x);
                check_enc(&f, &pos, -x);
            }
        }
        // beyond the largest finite value
        let (max, _) = pos[pos.len() - 1];
        let ulp = max - pos[pos.len() - 2].0;
        for x in [
            max + ulp / 2.0,
            max + ulp / 4.0,
            max + ulp,
            max * 2.0,
            3.0e38,
            f64::INFINITY,
        ] {
            let x = x as f32;
            check_enc(&f, &pos, x);
            check_enc(&f, &pos, -x);
        }
        check_enc(&f, &pos, f32::NAN);
        check_enc(&f, &pos, -f32::NAN);
        check_enc(&f, &pos, f32::from_bits(1)); // smallest f32 subnormal
        check_enc(&f, &pos, -f32::from_bits(0x7F_FFFF)); // largest f32 subnormal
    }
}

#[test]
fn rounding_of_random_f32_matches_reference() {
    let mut rng = Rng(7);
    for f in FMTS {
        let pos = f.positives();
        for i in 0..100_000u32 {
            let bits = rng.next() as u32;
            let x = if i % 2 == 0 {
                f32::from_bits(bits)
            } else {
                // concentrate on the format's range: exponent within +-24 of 1.0
                let e = (127 - 28 + (bits >> 26) % 48) << 23;
                f32::from_bits((bits & 0x807F_FFFF) | e)
            };
            check_enc(&f, &pos, x);
        }
    }
}

#[test]
fn documented_conversion_edge_cases() {
    // f16
    assert_eq!(f32_to_f16_bits(65504.0), 0x7BFF);
    assert_eq!(f32_to_f16_bits(65519.996), 0x7BFF);
    assert_eq!(f32_to_f16_bits(65520.0), 0x7C00); // tie goes to even = inf
    assert_eq!(f32_to_f16_bits(f32::INFINITY), 0x7C00);
    assert_eq!(f32_to_f16_bits(f32::NEG_INFINITY), 0xFC00);
    assert_eq!(f32_to_f16_bits(f32::NAN), 0x7FFF);
    assert_eq!(f32_to_f16_bits(2f32.powi(-24)), 0x0001);
    assert_eq!(f32_to_f16_bits(2f32.powi(-25)), 0x0000); // tie to even (0)
    assert_eq!(f32_to_f16_bits(2f32.powi(-25).next_up()), 0x0001);
    assert_eq!(f32_to_f16_bits(3.0 * 2f32.powi(-25)), 0x0002); // 1.5 ulp -> 2
    assert_eq!(f32_to_f16_bits(-2f32.powi(-26)), 0x8000);
    assert_eq!(f32_to_f16_bits(2f32.powi(-14) - 2f32.powi(-25)), 0x0400); // -> min normal
    assert_eq!(f32_to_f16_bits(1.0 + 2f32.powi(-11)), 0x3C00); // tie, even is 1.0
    assert_eq!(f32_to_f16_bits(1.0 + 3.0 * 2f32.powi(-11)), 0x3C02); // tie, even is up
                                                                     // bf16
    assert_eq!(f32_to_bf16_bits(1.0 + 2f32.powi(-8)), 0x3F80);
    assert_eq!(f32_to_bf16_bits(1.0 + 3.0 * 2f32.powi(-8)), 0x3F82);
    assert_eq!(f32_to_bf16_bits(f32::MAX), 0x7F80); // rounds up to inf
    assert_eq!(f32_to_bf16_bits(f32::NAN), 0x7FFF);
    assert_eq!(f32_to_bf16_bits(f32::from_bits(0x7F80_0001)), 0x7FFF); // sNaN stays NaN
                                                                       // e4m3
    assert_eq!(f32_to_e4m3(448.0), 0x7E);
    assert_eq!(f32_to_e4m3(464.0), 0x7E);
    assert_eq!(f32_to_e4m3(480.0), 0x7E);
    assert_eq!(f32_to_e4m3(1.0e9), 0x7E);
    assert_eq!(f32_to_e4m3(f32::INFINITY), 0x7E);
    assert_eq!(f32_to_e4m3(f32::NEG_INFINITY), 0xFE);
    assert_eq!(f32_to_e4m3(-500.0), 0xFE);
    assert_eq!(f32_to_e4m3(f32::NAN), 0x7F);
    assert_eq!(f32_to_e4m3(2f32.powi(-9)), 0x01);
    assert_eq!(f32_to_e4m3(2f32.powi(-10)), 0x00);
    assert_eq!(f32_to_e4m3(2f32.powi(-10).next_up()), 0x01);
    assert_eq!(f32_to_e4m3(1.0625), 0x38); // tie between 1 and 1.125 -> 1
    assert_eq!(f32_to_e4m3(1.1875), 0x3A); // tie between 1.125 and 1.25 -> 1.25
    assert_eq!(f32_to_e4m3(240.0), 0x77); // exactly representable
    assert_eq!(f32_to_e4m3(248.0), 0x78); // tie between 240 (odd code) and 256 -> 256
    assert_eq!(f32_to_e4m3(232.0), 0x76); // tie between 224 (even code) and 240 -> 224
                                          // e5m2
    assert_eq!(f32_to_e5m2(57344.0), 0x7B);
    assert_eq!(f32_to_e5m2(61440.0), 0x7B);
    assert_eq!(f32_to_e5m2(f32::INFINITY), 0x7B);
    assert_eq!(f32_to_e5m2(f32::NEG_INFINITY), 0xFB);
    assert_eq!(f32_to_e5m2(f32::NAN), 0x7F);
    assert_eq!(f32_to_e5m2(2f32.powi(-16)), 0x01);
    assert_eq!(f32_to_e5m2(2f32.powi(-17)), 0x00);
    assert_eq!(f32_to_e5m2(3.0 * 2f32.powi(-17)), 0x02);
}

// ---------------------------------------------------------------- reductions

const OPS: [RedOpKind; 6] = [
    RedOpKind::Sum,
    RedOpKind::Prod,
    RedOpKind::Max,
    RedOpKind::Min,
    RedOpKind::Avg,
    RedOpKind::PreMulSum,
];

/// Value of one element by independent means: integers exactly in i128, floats in f64.
#[derive(Clone, Copy, Debug)]
enum Val {
    I(i128),
    F(f64),
}

fn is_signed(d: DataType) -> bool {
    matches!(d, DataType::Int8 | DataType::Int32 | DataType::Int64)
}

fn ref_value(d: DataType, b: &[u8]) -> Val {
    let n = d.size();
    let mut raw = [0u8; 16];
    raw[..n].copy_from_slice(&b[..n]);
    let u = u128::from_le_bytes(raw);
    if let Some(f) = fmt_of(d) {
        return Val::F(f.ref_decode(u as u32));
    }
    match d {
        DataType::Float32 => Val::F(f32::from_bits(u as u32) as f64),
        DataType::Float64 => Val::F(f64::from_bits(u as u64)),
        _ => Val::I(wrap(d, u as i128)),
    }
}

/// Reduces an integer modulo 2^bits into the type's range.
fn wrap(d: DataType, v: i128) -> i128 {
    let bits = 8 * d.size() as u32;
    let m = v.rem_euclid(1i128 << bits);
    if is_signed(d) && m >= 1i128 << (bits - 1) {
        m - (1i128 << bits)
    } else {
        m
    }
}

/// Rounds an exact-ish f64 result to the float type `d`, by independent means.
fn ref_round_float(d: DataType, x: f64) -> f64 {
    match d {
        DataType::Float64 => x,
        DataType::Float32 => x as f32 as f64,
        _ => {
            let f = fmt_of(d).expect("float type");
            match f.ref_round(positives_cached(d), x) {
                Some(c) => f.ref_decode(c),
                None => f64::NAN,
            }
        }
    }
}

/// The reference scalar for float Avg: float(1.0 / n) rounded to the type.
fn ref_avg_scalar(d: DataType, n: usize) -> f64 {
    let inv = 1.0 / n as f64;
    match d {
        DataType::Float64 => inv,
        _ => ref_round_float(d, inv as f32 as f64),
    }
}

/// Element-wise reference of `load` + `combine_inplace` over `vals` (one per rank) + finish.
fn ref_reduce(d: DataType, op: RedOpKind, scalar: Option<Val>, vals: &[Val]) -> Val {
    let n = vals.len();
    if d.is_float() {
        let rnd = |x: f64| ref_round_float(d, x);
        let s = match (op, scalar) {
            (RedOpKind::Avg, _) => Some(ref_avg_scalar(d, n)),
            (RedOpKind::PreMulSum, Some(Val::F(s))) => Some(s),
            _ => None,
        };
        let f = |v: &Val| match v {
            Val::F(x) => *x,
            Val::I(_) => unreachable!(),
        };
        let pre = |x: f64| s.map_or(x, |s| rnd(x * s));
        let mut acc = pre(f(&vals[0]));
        for v in &vals[1..] {
            let x = pre(f(v));
            acc = rnd(match op {
                RedOpKind::Prod => acc * x,
                RedOpKind::Max => acc.max(x),
                RedOpKind::Min => acc.min(x),
                _ => acc + x,
            });
        }
        Val::F(acc)
    } else {
        let i = |v: &Val| match v {
            Val::I(x) => *x,
            Val::F(_) => unreachable!(),
        };
        let s = match scalar {
            Some(Val::I(s)) if op == RedOpKind::PreMulSum => Some(s),
            _ => None,
        };
        // wrapping in i128 keeps the value mod 2^128, hence mod 2^bits
        let pre = |x: i128| s.map_or(x, |s| wrap(d, x.wrapping_mul(s)));
        let mut acc = pre(i(&vals[0]));
        for v in &vals[1..] {
            let x = pre(i(v));
            acc = wrap(
                d,
                match op {
                    RedOpKind::Prod => acc.wrapping_mul(x),
                    RedOpKind::Max => acc.max(x),
                    RedOpKind::Min => acc.min(x),
                    _ => acc + x,
                },
            );
        }
        if op == RedOpKind::Avg {
            acc /= n as i128; // i128 division truncates toward zero
        }
        Val::I(acc)
    }
}

fn same(a: Val, b: Val) -> bool {
    match (a, b) {
        (Val::I(x), Val::I(y)) => x == y,
        (Val::F(x), Val::F(y)) => (x.is_nan() && y.is_nan()) || x == y,
        _ => false,
    }
}

/// Random element bytes of `d`: full-range integers; floats that are finite, not NaN,
/// with a moderate exponent for f32/f64 (so sums and products stay meaningful).
fn random_elem(rng: &mut Rng, d: DataType, out: &mut [u8]) {
    let r = rng.next();
    match d {
        DataType::Float32 => {
            let e = (127 - 12 + (r >> 40) % 24) as u32;
            let bits = (r as u32 & 0x807F_FFFF) | (e << 23);
            out.copy_from_slice(&bits.to_le_bytes());
        }
        DataType::Float64 => {
            let e = 1023 - 30 + (r >> 52) % 60;
            let bits = (r & 0x800F_FFFF_FFFF_FFFF) | (e << 52);
            out.copy_from_slice(&bits.to_le_bytes());
        }
        _ => {
            let b = r.to_le_bytes();
            out.copy_from_slice(&b[..d.size()]);
            if let Some(f) = fmt_of(d) {
                let mut c = if d.size() == 2 {
                    u16::from_le_bytes([out[0], out[1]]) as u32
                } else {
                    out[0] as u32
                };
                // keep it finite: retry until a finite code
                while !f.ref_decode(c).is_finite() {
                    c = rng.next() as u32 & (f.count() - 1);
                }
                out.copy_from_slice(&c.to_le_bytes()[..d.size()]);
            }
        }
    }
}

/// Builds `len` bytes at byte offset `off` of a fresh buffer (to exercise unaligned access).
struct Shifted {
    buf: Vec<u8>,
    off: usize,
    len: usize,
}
impl Shifted {
    fn new(data: &[u8], off: usize) -> Shifted {
        let mut buf = vec![0xA5u8; data.len() + off + 8];
        buf[off..off + data.len()].copy_from_slice(data);
        Shifted {
            buf,
            off,
            len: data.len(),
        }
    }
    fn zeroed(len: usize, off: usize) -> Shifted {
        Shifted::new(&vec![0u8; len], off)
    }
    fn s(&self) -> &[u8] {
        &self.buf[self.off..self.off + self.len]
    }
    fn m(&mut self) -> &mut [u8] {
        &mut self.buf[self.off..self.off + self.len]
    }
    /// The guard bytes around the slice are untouched.
    fn guards_intact(&self) -> bool {
        self.buf[..self.off].iter().all(|&b| b == 0xA5)
            && self.buf[self.off + self.len..].iter().all(|&b| b == 0xA5)
    }
}

/// load + combine_inplace chain, everything at byte offset `off`.
fn run_inplace(r: &Reducer, inputs: &[Vec<u8>], off: usize) -> Vec<u8> {
    let len = inputs[0].len();
    let ins: Vec<Shifted> = inputs.iter().map(|v| Shifted::new(v, off)).collect();
    let mut acc = Shifted::zeroed(len, (off * 3) % 8);
    r.load(acc.m(), ins[0].s());
    for x in &ins[1..] {
        r.combine_inplace(acc.m(), x.s());
    }
    r.finish(acc.m());
    assert!(acc.guards_intact());
    acc.s().to_vec()
}

/// load + out-of-place combine chain (ping-pong buffers).
fn run_out_of_place(r: &Reducer, inputs: &[Vec<u8>], off: usize) -> Vec<u8> {
    let len = inputs[0].len();
    let ins: Vec<Shifted> = inputs.iter().map(|v| Shifted::new(v, off)).collect();
    let mut a = Shifted::zeroed(len, (off + 1) % 8);
    let mut b = Shifted::zeroed(len, (off + 5) % 8);
    r.load(a.m(), ins[0].s());
    for x in &ins[1..] {
        r.combine(b.m(), a.s(), x.s());
        std::mem::swap(&mut a, &mut b);
    }
    r.finish(a.m());
    assert!(a.guards_intact() && b.guards_intact());
    a.s().to_vec()
}

fn check_against_reference(
    d: DataType,
    op: RedOpKind,
    scalar: Option<&[u8]>,
    inputs: &[Vec<u8>],
    got: &[u8],
    what: &str,
) {
    let es = d.size();
    let sv = scalar.map(|s| ref_value(d, s));
    for (i, g) in got.chunks_exact(es).enumerate() {
        let vals: Vec<Val> = inputs
            .iter()
            .map(|v| ref_value(d, &v[i * es..(i + 1) * es]))
            .collect();
        let want = ref_reduce(d, op, sv, &vals);
        let have = ref_value(d, g);
        assert!(
            same(want, have),
            "{what}: {} {} n={} elem {i}: inputs {vals:?} scalar {sv:?}: got {have:?}, want {want:?}",
            d.name(),
            op.name(),
            inputs.len()
        );
    }
}

#[test]
fn every_dtype_and_op_matches_reference() {
    let mut rng = Rng(42);
    let elems = 37;
    for d in DataType::ALL {
        for op in OPS {
            for n in [1usize, 2, 3, 5, 8] {
                let es = d.size();
                let inputs: Vec<Vec<u8>> = (0..n)
                    .map(|_| {
                        let mut v = vec![0u8; elems * es];
                        for c in v.chunks_exact_mut(es) {
                            random_elem(&mut rng, d, c);
                        }
                        v
                    })
                    .collect();
                let mut scalar = vec![0u8; es];
                random_elem(&mut rng, d, &mut scalar);
                let sc = (op == RedOpKind::PreMulSum).then_some(&scalar[..]);
                let r = Reducer::new(d, op, sc, n).expect("valid reducer");
                assert_eq!(r.dtype(), d);
                assert_eq!(r.needs_finish(), op == RedOpKind::Avg && !d.is_float());
                let got = run_inplace(&r, &inputs, 0);
                check_against_reference(d, op, sc, &inputs, &got, "in-place");
                for off in 1..8 {
                    assert_eq!(
                        run_inplace(&r, &inputs, off),
                        got,
                        "{} {} unaligned offset {off}",
                        d.name(),
                        op.name()
                    );
                }
                for off in [0, 3] {
                    let oop = run_out_of_place(&r, &inputs, off);
                    // bitwise, except NaN payloads (none expected: inputs are finite, but
                    // inf - inf can make one)
                    for (k, (a, b)) in oop.chunks_exact(es).zip(got.chunks_exact(es)).enumerate() {
                        assert!(
                            a == b || same(ref_value(d, a), ref_value(d, b)),
                            "{} {} out-of-place differs at {k}",
                            d.name(),
                            op.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn exact_sums_and_products_of_small_integers() {
    // Integer-valued inputs whose sums/products every type represents exactly: checks the
    // arithmetic itself (including f64, whose stepwise reference is its own arithmetic).
    let mut rng = Rng(3);
    for d in DataType::ALL {
        for op in [
            RedOpKind::Sum,
            RedOpKind::Prod,
            RedOpKind::Max,
            RedOpKind::Min,
        ] {
            let n = 4;
            let elems = 19;
            let es = d.size();
            let mut vals = vec![vec![0i64; elems]; n];
            let mut inputs = vec![vec![0u8; elems * es]; n];
            for (r, row) in vals.iter_mut().enumerate() {
                for (i, v) in row.iter_mut().enumerate() {
                    // e4m3/e5m2 represent integers exactly only up to 16 / 8
                    let x = match op {
                        RedOpKind::Prod if is_signed(d) || d.is_float() => {
                            [1i64, -1, 2, 1][rng.below(4) as usize]
                        }
                        RedOpKind::Prod => [1i64, 3, 2, 1][rng.below(4) as usize],
                        _ => rng.below(5) as i64 - if d.is_float() { 2 } else { 0 },
                    };
                    *v = x;
                    f64_to_element(d, x as f64, &mut inputs[r][i * es..(i + 1) * es]);
                }
            }
            let r = Reducer::new(d, op, None, n).expect("reducer");
            let got = run_inplace(&r, &inputs, 1);
            for i in 0..elems {
                let col = vals.iter().map(|row| row[i]);
                let want = match op {
                    RedOpKind::Sum => col.sum::<i64>(),
                    RedOpKind::Prod => col.product::<i64>(),
                    RedOpKind::Max => col.max().unwrap_or(0),
                    _ => col.min().unwrap_or(0),
                };
                let have = element_to_f64(d, &got[i * es..(i + 1) * es]);
                assert_eq!(have, want as f64, "{} {} elem {i}", d.name(), op.name());
            }
        }
    }
}

#[test]
fn merge_of_partial_results_matches_chain() {
    let mut rng = Rng(11);
    for d in DataType::ALL {
        for op in OPS {
            let n = 6;
            let elems = 23;
            let es = d.size();
            let inputs: Vec<Vec<u8>> = (0..n)
                .map(|_| {
                    let mut v = vec![0u8; elems * es];
                    for (i, c) in v.chunks_exact_mut(es).enumerate() {
                        // small integers: exact everywhere so association order is irrelevant
                        let x = (rng.below(3) as i64) - if d.is_float() { 1 } else { 0 };
                        let x = if op == RedOpKind::Prod {
                            [1, -1][i % 2] * x.abs().max(1)
                        } else {
                            x
                        };
                        f64_to_element(d, x as f64, c);
                    }
                    v
                })
                .collect();
            let scalar = {
                let mut s = vec![0u8; es];
                f64_to_element(d, 2.0, &mut s);
                s
            };
            let sc = (op == RedOpKind::PreMulSum).then_some(&scalar[..]);
            let r = Reducer::new(d, op, sc, n).expect("reducer");
            // (0,1,2) and (3,4,5) reduced separately, then merged
            let mut left = vec![0u8; elems * es];
            let mut right = vec![0u8; elems * es];
            r.load(&mut left, &inputs[0]);
            r.combine_inplace(&mut left, &inputs[1]);
            r.combine_inplace(&mut left, &inputs[2]);
            r.load(&mut right, &inputs[3]);
            r.combine_inplace(&mut right, &inputs[4]);
            r.combine_inplace(&mut right, &inputs[5]);
            let mut out = vec![0u8; elems * es];
            r.merge(&mut out, &left, &right);
            r.merge_inplace(&mut left, &right);
            assert_eq!(
                out,
                left,
                "{} {} merge vs merge_inplace",
                d.name(),
                op.name()
            );
            r.finish(&mut left);
            let chain = run_inplace(&r, &inputs, 0);
            if op == RedOpKind::Avg && d.is_float() {
                // 1/6 is inexact: the tree and the chain may round differently; compare
                // against the reference of the chain only for the chain.
                check_against_reference(d, op, sc, &inputs, &chain, "chain");
            } else {
                assert_eq!(left, chain, "{} {} tree vs chain", d.name(), op.name());
            }
        }
    }
}

#[test]
fn integer_avg_truncates_toward_zero_after_wrapping_sum() {
    let r = Reducer::new(DataType::Int32, RedOpKind::Avg, None, 2).expect("reducer");
    let mut acc = (-7i32).to_le_bytes().to_vec();
    r.combine_inplace(&mut acc, &0i32.to_le_bytes());
    r.finish(&mut acc);
    assert_eq!(i32::from_le_bytes([acc[0], acc[1], acc[2], acc[3]]), -3);

    let r = Reducer::new(DataType::Int8, RedOpKind::Avg, None, 3).expect("reducer");
    let mut acc = vec![100u8];
    r.combine_inplace(&mut acc, &[100u8]); // 200 wraps to -56
    r.combine_inplace(&mut acc, &[(-1i8) as u8]); // -57
    r.finish(&mut acc);
    assert_eq!(acc[0] as i8, -19);

    let r = Reducer::new(DataType::Uint8, RedOpKind::Avg, None, 300).expect("reducer");
    let mut acc = vec![255u8];
    r.finish(&mut acc);
    assert_eq!(acc[0], 0);

    let r = Reducer::new(DataType::Int64, RedOpKind::Avg, None, 1).expect("reducer");
    let mut acc = i64::MIN.to_le_bytes().to_vec();
    r.finish(&mut acc);
    assert_eq!(acc, i64::MIN.to_le_bytes());

    let r = Reducer::new(DataType::Uint64, RedOpKind::Avg, None, 2).expect("reducer");
    let mut acc = u64::MAX.to_le_bytes().to_vec();
    r.finish(&mut acc);
    assert_eq!(acc, (u64::MAX / 2).to_le_bytes());
}

#[test]
fn float_avg_uses_nccl_scalar() {
    let cases: [(DataType, usize, Vec<u8>); 7] = [
        (DataType::Float32, 3, (1.0f32 / 3.0).to_le_bytes().to_vec()),
        (DataType::Float64, 3, (1.0f64 / 3.0).to_le_bytes().to_vec()),
        (DataType::Float16, 3, 0x3555u16.to_le_bytes().to_vec()),
        (DataType::Bfloat16, 3, 0x3EABu16.to_le_bytes().to_vec()),
        (DataType::Float8e4m3, 3, vec![0x2B]), // 0.34375
        (DataType::Float8e5m2, 3, vec![0x35]), // 0.3125
        (DataType::Float16, 8, 0x3000u16.to_le_bytes().to_vec()),
    ];
    for (d, n, want) in cases {
        let r = Reducer::new(d, RedOpKind::Avg, None, n).expect("reducer");
        assert_eq!(r.prescale(), Some(&want[..]), "{} n={n}", d.name());
        assert!(!r.needs_finish());
    }
    // exact case: 4 ranks of 1, 2, 3, 6 -> 3
    for d in [
        DataType::Float16,
        DataType::Bfloat16,
        DataType::Float32,
        DataType::Float64,
    ] {
        let r = Reducer::new(d, RedOpKind::Avg, None, 4).expect("reducer");
        let es = d.size();
        let mut bufs = vec![vec![0u8; es]; 4];
        for (b, v) in bufs.iter_mut().zip([1.0, 2.0, 3.0, 6.0]) {
            f64_to_element(d, v, b);
        }
        let mut acc = vec![0u8; es];
        r.load(&mut acc, &bufs[0]);
        for b in &bufs[1..] {
            r.combine_inplace(&mut acc, b);
        }
        r.finish(&mut acc);
        assert_eq!(element_to_f64(d, &acc), 3.0, "{}", d.name());
    }
}

#[test]
fn premulsum_rounds_the_product_then_the_sum() {
    // f16: 1 * (1 + 2^-10) * (1 + 2^-10) style: x * s rounded to f16 before the add.
    let s = f32_to_f16_bits(1.0 + 2f32.powi(-10)).to_le_bytes();
    let r = Reducer::new(DataType::Float16, RedOpKind::PreMulSum, Some(&s), 2).expect("r");
    let x = f32_to_f16_bits(1.0 + 2f32.powi(-10)).to_le_bytes();
    let mut acc = [0u8; 2];
    r.load(&mut acc, &x);
    // (1+2^-10)^2 = 1 + 2^-9 + 2^-20 -> rounds to 1 + 2^-9
    assert_eq!(
        f16_bits_to_f32(u16::from_le_bytes(acc)),
        1.0 + 2f32.powi(-9)
    );
    // integer PreMulSum wraps
    let r = Reducer::new(DataType::Uint8, RedOpKind::PreMulSum, Some(&[16]), 2).expect("r");
    let mut acc = [0u8];
    r.load(&mut acc, &[17]);
    assert_eq!(acc[0], 16); // 272 mod 256
    r.combine_inplace(&mut acc, &[1]);
    assert_eq!(acc[0], 32);
    // merge does not rescale
    r.merge_inplace(&mut acc, &[1]);
    assert_eq!(acc[0], 33);
}

#[test]
fn float_max_min_ignore_nan_and_sum_saturates_fp8() {
    for d in [
        DataType::Float16,
        DataType::Bfloat16,
        DataType::Float32,
        DataType::Float64,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ] {
        let es = d.size();
        let mut nan = vec![0u8; es];
        f64_to_element(d, f64::NAN, &mut nan);
        assert!(element_to_f64(d, &nan).is_nan(), "{}", d.name());
        let mut one = vec![0u8; es];
        f64_to_element(d, 1.0, &mut one);
        for op in [RedOpKind::Max, RedOpKind::Min] {
            let r = Reducer::new(d, op, None, 2).expect("r");
            let mut out = vec![0u8; es];
            r.combine(&mut out, &nan, &one);
            assert_eq!(element_to_f64(d, &out), 1.0, "{} {}", d.name(), op.name());
            r.combine(&mut out, &one, &nan);
            assert_eq!(element_to_f64(d, &out), 1.0, "{} {}", d.name(), op.name());
            r.combine(&mut out, &nan, &nan);
            assert!(element_to_f64(d, &out).is_nan());
        }
        let r = Reducer::new(d, RedOpKind::Sum, None, 2).expect("r");
        let mut out = vec![0u8; es];
        r.combine(&mut out, &nan, &one);
        assert!(
            element_to_f64(d, &out).is_nan(),
            "{} sum with NaN",
            d.name()
        );
    }
    // fp8 overflow saturates; f16 overflows to inf
    let r = Reducer::new(DataType::Float8e4m3, RedOpKind::Sum, None, 2).expect("r");
    let mut acc = [0x7Eu8];
    r.combine_inplace(&mut acc, &[0x7E]);
    assert_eq!(acc, [0x7E]);
    let r = Reducer::new(DataType::Float8e5m2, RedOpKind::Prod, None, 2).expect("r");
    let mut acc = [0xFBu8];
    r.combine_inplace(&mut acc, &[0x7B]);
    assert_eq!(acc, [0xFB]);
    let r = Reducer::new(DataType::Float16, RedOpKind::Sum, None, 2).expect("r");
    let mut acc = 0x7BFFu16.to_le_bytes();
    r.combine_inplace(&mut acc, &0x7BFFu16.to_le_bytes());
    assert_eq!(u16::from_le_bytes(acc), 0x7C00);
}

#[test]
fn invalid_arguments_are_typed_errors() {
    let e = Reducer::new(DataType::Float32, RedOpKind::PreMulSum, None, 2);
    assert!(matches!(e, Err(CclError::InvalidArgument(_))));
    let e = Reducer::new(DataType::Float32, RedOpKind::PreMulSum, Some(&[0, 0]), 2);
    assert!(matches!(e, Err(CclError::InvalidArgument(_))));
    let e = Reducer::new(DataType::Float32, RedOpKind::Sum, Some(&[0, 0, 0, 0]), 2);
    assert!(matches!(e, Err(CclError::InvalidArgument(_))));
    let e = Reducer::new(DataType::Int32, RedOpKind::Avg, None, 0);
    assert!(matches!(e, Err(CclError::InvalidArgument(_))));
    let e = Reducer::new(DataType::Float32, RedOpKind::Avg, None, 1 << 31);
    assert!(matches!(e, Err(CclError::InvalidArgument(_))));
    // nranks is ignored by the other ops
    assert!(Reducer::new(DataType::Int32, RedOpKind::Sum, None, 0).is_ok());
}

#[test]
fn element_conversions_round_trip() {
    let mut rng = Rng(5);
    for d in DataType::ALL {
        let es = d.size();
        for _ in 0..1000 {
            let mut b = vec![0u8; es];
            random_elem(&mut rng, d, &mut b);
            let v = element_to_f64(d, &b);
            let mut back = vec![0u8; es];
            f64_to_element(d, v, &mut back);
            if matches!(d, DataType::Int64 | DataType::Uint64) && v.abs() >= 2f64.powi(53) {
                continue; // not exactly representable in f64
            }
            assert_eq!(back, b, "{} {v}", d.name());
        }
    }
}

#[test]
fn reducer_is_send_sync_clone() {
    fn check<T: Send + Sync + Clone + 'static>() {}
    check::<Reducer>();
}
