//! Products against a float64 reference over the dequantized weights, on random blocks.

use super::*;
use proptest::prelude::*;

fn f32_to_f16(v: f32) -> u16 {
    // round-to-nearest for normal values in range (all the tests use)
    let b = v.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
    let man = b & 0x7f_ffff;
    if exp <= 0 {
        return sign;
    }
    let mut h = ((exp as u32) << 10) | (man >> 13);
    if man & 0x1fff > 0x1000 || (man & 0x1fff == 0x1000 && h & 1 == 1) {
        h += 1;
    }
    sign | h as u16
}

struct Case {
    x: Vec<f32>,
    qs: Vec<u8>,
    sc: Vec<u16>,
}

fn case(format: Format, m: usize, n: usize, k: usize, seed: u64) -> Case {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let mut next = move || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 33) as u32
    };
    let x = (0..m * k).map(|_| (next() % 2001) as f32 / 1000.0 - 1.0).collect();
    let qs = (0..n * format.row_bytes(k)).map(|_| next() as u8).collect();
    let sc = (0..n * format.row_scales(k)).map(|_| f32_to_f16((next() % 1000) as f32 / 1e4 - 0.05)).collect();
    Case { x, qs, sc }
}

fn reference(c: &Case, format: Format, m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let w = QMatrix { format, n, k, qs: &c.qs, sc: &c.sc };
    let mut wf = vec![0f32; n * k];
    dequantize(w, 0, n, &mut wf).unwrap();
    let mut out = vec![0f64; m * n];
    let mut mag = vec![0f64; m * n];
    for i in 0..m {
        for r in 0..n {
            for j in 0..k {
                let t = c.x[i * k + j] as f64 * wf[r * k + j] as f64;
                out[i * n + r] += t;
                mag[i * n + r] += t.abs() + (c.x[i * k + j] as f64).abs() * 0.06;
            }
        }
    }
    (out, mag)
}

fn check(format: Format, m: usize, n: usize, k: usize, threads: usize, seed: u64) {
    let c = case(format, m, n, k, seed);
    let (want, mag) = reference(&c, format, m, n, k);
    let mut out = vec![0f32; m * n];
    matmul(&c.x, m, QMatrix { format, n, k, qs: &c.qs, sc: &c.sc }, &mut out, threads).unwrap();
    for i in 0..m * n {
        // float32 sums in another order: a few ulps of the terms' magnitude
        assert!((out[i] as f64 - want[i]).abs() <= 1e-6 * mag[i], "{format:?} [{m},{n},{k}] at {i}: {} vs {}", out[i], want[i]);
    }
}

#[test]
fn q8_dequantizes_to_d_times_q() {
    let qs = [0u8, 1, 255, 128].repeat(8);
    let sc = [f32_to_f16(0.5)];
    let mut out = vec![0f32; 32];
    dequantize(QMatrix { format: Format::Q8, n: 1, k: 32, qs: &qs, sc: &sc }, 0, 1, &mut out).unwrap();
    assert_eq!(&out[..4], &[0.0, 0.5, -0.5, -64.0]);
}

#[test]
fn q4_dequantizes_low_nibbles_first() {
    let qs = [0x21u8; 16];
    let sc = [f32_to_f16(2.0), f32_to_f16(-1.0)];
    let mut out = vec![0f32; 32];
    dequantize(QMatrix { format: Format::Q4, n: 1, k: 32, qs: &qs, sc: &sc }, 0, 1, &mut out).unwrap();
    assert_eq!(out[0], 1.0); // 2 * 1 - 1
    assert_eq!(out[16], 3.0); // 2 * 2 - 1
}

#[test]
fn f16_conversion_is_exact() {
    for h in [0u16, 0x3c00, 0xbc00, 0x7bff, 0x0400, 0xc123] {
        assert_eq!(f32_to_f16(f16_to_f32(h)), h, "{h:#x}");
    }
    assert_eq!(f16_to_f32(0x0001), f32::powi(2.0, -24));
    assert_eq!(f16_to_f32(0x83ff), -1023.0 * f32::powi(2.0, -24));
    assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("f16c") {
        // every float16 value, against the cpu's own conversion (the simd path's)
        for h in 0..=u16::MAX {
            // SAFETY: f16c is present
            let hw = unsafe { hw_f16(h) };
            let sw = f16_to_f32(h);
            assert!(hw.to_bits() == sw.to_bits() || (hw.is_nan() && sw.is_nan()), "{h:#x}: {hw} vs {sw}");
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c")]
unsafe fn hw_f16(h: u16) -> f32 {
    use std::arch::x86_64::*;
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

#[test]
fn dequantized_weights_are_d_q_plus_m_exactly() {
    // the simd path (when the cpu has it) against the formula in float64: d q is exact in
    // float32 (11 + 8 significant bits), so one rounding of d q + m is the value
    for format in [Format::Q4, Format::Q8] {
        let c = case(format, 1, 5, 96, 3);
        let mut got = vec![0f32; 5 * 96];
        dequantize(QMatrix { format, n: 5, k: 96, qs: &c.qs, sc: &c.sc }, 0, 5, &mut got).unwrap();
        for r in 0..5 {
            for j in 0..96 {
                let (b, e) = (j / BLOCK, j % BLOCK);
                let want = match format {
                    Format::Q4 => {
                        let byte = c.qs[r * 48 + b * 16 + e % 16];
                        let q = if e < 16 { byte & 15 } else { byte >> 4 };
                        (f16_to_f32(c.sc[r * 6 + 2 * b]) as f64 * q as f64 + f16_to_f32(c.sc[r * 6 + 2 * b + 1]) as f64) as f32
                    }
                    Format::Q8 => (f16_to_f32(c.sc[r * 3 + b]) as f64 * c.qs[r * 96 + j] as i8 as f64) as f32,
                };
                assert_eq!(got[r * 96 + j].to_bits(), want.to_bits(), "{format:?} row {r} col {j}");
            }
        }
    }
}

#[test]
fn bad_shapes_are_errors() {
    let qs = vec![0u8; 16];
    let sc = vec![0u16; 2];
    let w = QMatrix { format: Format::Q4, n: 1, k: 32, qs: &qs, sc: &sc };
    let mut out = vec![0f32; 1];
    assert!(matmul(&[0.0; 31], 1, w, &mut out, 1).is_err());
    assert!(matmul(&[0.0; 32], 1, QMatrix { k: 30, ..w }, &mut out, 1).is_err());
    assert!(matmul(&[0.0; 32], 1, QMatrix { qs: &qs[..8], ..w }, &mut out, 1).is_err());
    assert!(matmul(&[0.0; 32], 1, w, &mut out, 1).is_ok());
}

#[test]
fn threads_split_rows_without_changing_results() {
    let c = case(Format::Q4, 3, 200, 96, 9);
    let w = QMatrix { format: Format::Q4, n: 200, k: 96, qs: &c.qs, sc: &c.sc };
    let mut one = vec![0f32; 600];
    let mut four = vec![0f32; 600];
    matmul(&c.x, 3, w, &mut one, 1).unwrap();
    matmul(&c.x, 3, w, &mut four, 4).unwrap();
    assert_eq!(one, four);
}

#[test]
fn back_to_back_products_from_two_callers_agree_with_one_thread() {
    // thousands of short jobs, two callers contending for the pool (one runs alone when it is
    // busy), workers joining late or not at all: every product is still the 1-thread one
    let c = case(Format::Q4, 1, 256, 64, 3);
    let w = QMatrix { format: Format::Q4, n: 256, k: 64, qs: &c.qs, sc: &c.sc };
    let mut want = vec![0f32; 256];
    matmul(&c.x, 1, w, &mut want, 1).unwrap();
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut got = vec![0f32; 256];
                for i in 0..2000 {
                    got.fill(f32::NAN);
                    matmul(&c.x, 1, w, &mut got, 2 + i % 3).unwrap();
                    assert_eq!(got, want);
                }
            });
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn products_match_the_dequantized_reference(q4 in any::<bool>(), m in 1usize..4, n in 1usize..70,
                                                blocks in 1usize..7, threads in 1usize..4, seed in any::<u64>()) {
        check(if q4 { Format::Q4 } else { Format::Q8 }, m, n, blocks * BLOCK, threads, seed);
    }
}
