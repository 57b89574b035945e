//! Property tests of the block (vectorised) path of the small floating formats against the
//! element-at-a-time reference path (`Reducer::*_scalar`, the code that ran before the
//! block path existed): bytes must be identical for every operation, over seeded random
//! inputs mixed with edge values (±0, subnormals, the largest finite values, ±inf, NaNs),
//! random lengths (blocks plus tails) and unaligned offsets; fp8 pairs exhaustively.

use super::kinds::{BF16, E4M3, E5M2, F16};
use super::lanes::{Lanes, B};
use super::*;

use super::tests::Rng;

const SMALL: [DataType; 4] = [
    DataType::Float16,
    DataType::Bfloat16,
    DataType::Float8e4m3,
    DataType::Float8e5m2,
];

/// Edge codes of a format (low `8 * size` bits), both signs.
fn edges(d: DataType) -> Vec<u16> {
    let pos: &[u16] = match d {
        // 0, min subnormal, max subnormal, min normal, 1, max finite, inf, NaNs
        DataType::Float16 => &[
            0, 1, 0x3FF, 0x400, 0x3C00, 0x7BFF, 0x7C00, 0x7C01, 0x7E00, 0x7FFF,
        ],
        DataType::Bfloat16 => &[
            0, 1, 0x7F, 0x80, 0x3F80, 0x7F7F, 0x7F80, 0x7F81, 0x7FC0, 0x7FFF,
        ],
        DataType::Float8e4m3 => &[0, 1, 7, 8, 0x38, 0x7E, 0x7F],
        DataType::Float8e5m2 => &[0, 1, 3, 4, 0x3C, 0x7B, 0x7C, 0x7D, 0x7F],
        _ => unreachable!("not a small float"),
    };
    let sign: u16 = if d.size() == 2 { 0x8000 } else { 0x80 };
    pos.iter().flat_map(|&c| [c, c | sign]).collect()
}

/// `n` random elements of `d`: a third edge codes, a third random bit patterns, a third
/// values near 1 (so that sums and products stay in range and round in interesting ways).
fn random_elems(rng: &mut Rng, d: DataType, n: usize) -> Vec<u8> {
    let e = edges(d);
    let mut out = vec![0u8; n * d.size()];
    for c in out.chunks_exact_mut(d.size()) {
        let code: u16 = match rng.below(3) {
            0 => e[rng.below(e.len() as u64) as usize],
            1 => rng.next() as u16,
            _ => {
                let v = (rng.below(2001) as f64 - 1000.0) / 256.0;
                let mut b = [0u8; 2];
                f64_to_element(d, v, &mut b);
                u16::from_le_bytes(b)
            }
        };
        c.copy_from_slice(&code.to_le_bytes()[..d.size()]);
    }
    out
}

/// The reducers to test for `d`: every operator, PreMulSum with a random scalar, Avg.
fn reducers(rng: &mut Rng, d: DataType) -> Vec<Reducer> {
    let mut rs: Vec<Reducer> = [
        RedOpKind::Sum,
        RedOpKind::Prod,
        RedOpKind::Max,
        RedOpKind::Min,
    ]
    .iter()
    .map(|&op| Reducer::new(d, op, None, 2).unwrap())
    .collect();
    for _ in 0..3 {
        let s = random_elems(rng, d, 1);
        rs.push(Reducer::new(d, RedOpKind::PreMulSum, Some(&s), 2).unwrap());
    }
    rs.push(Reducer::new(d, RedOpKind::Avg, None, 3).unwrap());
    rs
}

/// Copies `data` into a fresh buffer at byte offset `off` (to test unaligned slices).
fn at(data: &[u8], off: usize) -> Vec<u8> {
    let mut v = vec![0xA5u8; off + data.len()];
    v[off..].copy_from_slice(data);
    v
}

/// Runs every entry point of `r` through both paths on `a`, `b` (same length) and asserts
/// identical bytes.
fn compare_paths(r: &Reducer, a: &[u8], b: &[u8], off: usize, what: &str) {
    let len = a.len();
    let (ao, bo) = (at(a, off), at(b, off));
    let (a, b) = (&ao[off..], &bo[off..]);
    let fill = |_: ()| at(&vec![0x5Au8; len], off);

    let (mut x, mut y) = (fill(()), fill(()));
    r.combine(&mut x[off..], a, b);
    r.combine_scalar(&mut y[off..], a, b);
    assert_eq!(x, y, "combine {what}");

    let (mut x, mut y) = (ao.clone(), ao.clone());
    r.combine_inplace(&mut x[off..], b);
    r.combine_inplace_scalar(&mut y[off..], b);
    assert_eq!(x, y, "combine_inplace {what}");

    let (mut x, mut y) = (ao.clone(), ao.clone());
    r.merge_inplace(&mut x[off..], b);
    r.merge_inplace_scalar(&mut y[off..], b);
    assert_eq!(x, y, "merge_inplace {what}");

    let (mut x, mut y) = (fill(()), fill(()));
    r.merge(&mut x[off..], a, b);
    r.merge_scalar(&mut y[off..], a, b);
    assert_eq!(x, y, "merge {what}");

    let (mut x, mut y) = (fill(()), fill(()));
    r.load(&mut x[off..], b);
    r.load_scalar(&mut y[off..], b);
    assert_eq!(x, y, "load {what}");
}

#[test]
fn block_path_matches_scalar_reference_on_random_inputs() {
    let mut rng = Rng(0x1859_2026);
    for d in SMALL {
        for r in reducers(&mut rng, d) {
            for round in 0..200 {
                // lengths around block multiples, plus random ones
                let n = match round % 4 {
                    0 => B * (1 + rng.below(4) as usize),
                    1 => B * (1 + rng.below(4) as usize) + 1 + rng.below(B as u64 - 1) as usize,
                    2 => rng.below(B as u64) as usize,
                    _ => rng.below(1000) as usize,
                };
                let a = random_elems(&mut rng, d, n);
                let b = random_elems(&mut rng, d, n);
                let off = rng.below(4) as usize;
                let what = format!("{} {:?} n={n} off={off}", d.name(), r.op());
                compare_paths(&r, &a, &b, off, &what);
            }
        }
    }
}

#[test]
fn block_path_matches_scalar_reference_on_every_fp8_pair() {
    let mut rng = Rng(7);
    for d in [DataType::Float8e4m3, DataType::Float8e5m2] {
        let a: Vec<u8> = (0..65536u32).map(|i| (i >> 8) as u8).collect();
        let b: Vec<u8> = (0..65536u32).map(|i| i as u8).collect();
        for r in reducers(&mut rng, d) {
            let what = format!("{} {:?} all pairs", d.name(), r.op());
            compare_paths(&r, &a, &b, 0, &what);
        }
    }
}

#[test]
fn block_path_matches_scalar_reference_on_every_16bit_value_against_edges() {
    let mut rng = Rng(11);
    for d in [DataType::Float16, DataType::Bfloat16] {
        let a: Vec<u8> = (0..65536u32)
            .flat_map(|i| (i as u16).to_le_bytes())
            .collect();
        let rs = reducers(&mut rng, d);
        // every edge value against every 16-bit value, under one reducer each (in turn,
        // so that every reducer meets several edges), argument order alternating
        for (k, e) in edges(d).into_iter().enumerate() {
            let b: Vec<u8> = std::iter::repeat_n(e.to_le_bytes(), 65536)
                .flatten()
                .collect();
            let r = &rs[k % rs.len()];
            let what = format!("{} {:?} all values vs {e:#x}", d.name(), r.op());
            if k % 2 == 0 {
                compare_paths(r, &a, &b, 0, &what);
            } else {
                compare_paths(r, &b, &a, 0, &what);
            }
        }
    }
}

/// Every code decodes like `Kind::get`; random and edge f32 values encode like `Kind::put`,
/// through every codec of `K` this CPU can run.
fn conversions_match<K: Lanes>(codes: u32, rng: &mut Rng) {
    let codecs = super::lanes::codecs_for_tests::<K>();
    for c in &codecs {
        conversions_match_with::<K>(codes, rng, c.decode, c.encode, c.name);
    }
}

fn conversions_match_with<K: Lanes>(
    codes: u32,
    rng: &mut Rng,
    decode: fn(&[u8], &mut [f32; B]),
    encode: fn(&[f32; B], &mut [u8]),
    codec: &str,
) {
    let mut got = [0f32; B];
    for base in (0..codes).step_by(B) {
        let bytes: Vec<u8> = (base..base + B as u32)
            .flat_map(|c| c.to_le_bytes().into_iter().take(K::N))
            .collect();
        decode(&bytes, &mut got);
        for (i, g) in got.iter().enumerate() {
            let want = K::get(&bytes[i * K::N..(i + 1) * K::N]);
            // F16C's `vcvtph2ps` quiets signalling NaNs (sets the quiet bit, keeps sign
            // and payload); a NaN only ever encodes to the canonical NaN, so a NaN for a
            // NaN is all the reduction needs. Every other value must be bit-identical.
            let same = if want.is_nan() {
                g.is_nan() && g.is_sign_negative() == want.is_sign_negative()
            } else {
                g.to_bits() == want.to_bits()
            };
            assert!(
                same,
                "{codec}: decode of {:#x}: {:#x}, want {:#x}",
                base + i as u32,
                g.to_bits(),
                want.to_bits()
            );
        }
    }
    let specials = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7F80_0001),
        f32::from_bits(0xFFFF_FFFF),
        f32::MAX,
        f32::MIN_POSITIVE,
        f32::from_bits(1),
        65504.0,
        65520.0,
        448.0,
        464.0,
        57344.0,
        61440.0,
    ];
    let mut vals = [0f32; B];
    for k in 0..20_000 {
        for (i, v) in vals.iter_mut().enumerate() {
            *v = if k == 0 && i < specials.len() {
                specials[i]
            } else {
                f32::from_bits(rng.next() as u32)
            };
        }
        if k % 2 == 1 {
            // values in the formats' ranges (random exponent in -30..20)
            for v in vals.iter_mut() {
                let e = rng.below(50) as i32 - 30;
                *v = (1.0 + (rng.below(1 << 23) as f32) / (1 << 23) as f32)
                    * 2f32.powi(e)
                    * if rng.below(2) == 0 { 1.0 } else { -1.0 };
            }
        }
        let mut out = vec![0u8; B * K::N];
        encode(&vals, &mut out);
        for (i, &v) in vals.iter().enumerate() {
            let mut want = [0u8; 2];
            K::put(v, &mut want[..K::N]);
            assert_eq!(
                &out[i * K::N..(i + 1) * K::N],
                &want[..K::N],
                "{codec}: encode of {v:e} ({:#x})",
                v.to_bits()
            );
            assert_eq!(K::round1(v).to_bits(), K::round(v).to_bits(), "round {v:e}");
        }
    }
}

#[test]
fn block_conversions_match_element_conversions() {
    let mut rng = Rng(3);
    conversions_match::<F16>(1 << 16, &mut rng);
    conversions_match::<BF16>(1 << 16, &mut rng);
    conversions_match::<E4M3>(1 << 8, &mut rng);
    conversions_match::<E5M2>(1 << 8, &mut rng);
}

#[test]
fn min_and_max_answer_zeros_of_opposite_sign_one_way_and_ignore_nan() {
    use super::kinds::{Kind, F32, F64};
    let (min_f32, max_f32) = (F32::min, F32::max);
    let bits = |x: f32| x.to_bits();
    for (a, b) in [(0.0f32, -0.0f32), (-0.0, 0.0)] {
        assert_eq!(bits(min_f32(a, b)), bits(-0.0), "min({a}, {b})");
        assert_eq!(bits(max_f32(a, b)), bits(0.0), "max({a}, {b})");
    }
    assert_eq!(F64::min(0.0, -0.0).to_bits(), (-0.0f64).to_bits());
    assert_eq!(F64::max(-0.0, 0.0).to_bits(), 0.0f64.to_bits());
    assert_eq!((min_f32(f32::NAN, 1.0), min_f32(1.0, f32::NAN)), (1.0, 1.0));
    assert_eq!((max_f32(f32::NAN, 2.0), max_f32(2.0, f32::NAN)), (2.0, 2.0));
    assert!(min_f32(f32::NAN, f32::NAN).is_nan());
    assert_eq!((min_f32(1.0, 2.0), max_f32(1.0, 2.0)), (1.0, 2.0));
    assert_eq!((min_f32(-3.0, -3.0), max_f32(5.5, 5.5)), (-3.0, 5.5));
}
