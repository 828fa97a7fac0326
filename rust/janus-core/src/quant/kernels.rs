//! The per-row loops: an AVX2/FMA/F16C path on x86-64 (chosen once at run time) and a
//! scalar one with the same per-block sums, for other cpus.

use super::{f16_to_f32, Format, QMatrix, BLOCK};

#[cfg(target_arch = "x86_64")]
fn simd() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        std::env::var_os("JANUS_QUANT_SCALAR").is_none()
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// A product's activations, prepared once per call (before the rows are split between
/// threads): each row's block sums (the m term of Q4: sum_j x_j (d q_j + m) = d sum_j x_j
/// q_j + m sum_j x_j) and, for the simd Q4 path, the row permuted into the order in which
/// the kernel widens nibbles (avx2::dot_q4_pair).
pub(super) struct Prepared {
    xsum: Vec<f32>,
    xperm: Vec<f32>,
    xs4: Vec<f32>,
}

pub(super) fn prepare(x: &[f32], m: usize, w: QMatrix<'_>) -> Prepared {
    let nb = w.k / BLOCK;
    let mut p = Prepared { xsum: Vec::new(), xperm: Vec::new(), xs4: Vec::new() };
    if w.format != Format::Q4 {
        return p;
    }
    p.xsum = x.chunks_exact(BLOCK).map(|b| b.iter().sum()).collect();
    #[cfg(target_arch = "x86_64")]
    if simd() {
        let pairs = nb / 2;
        p.xperm = x.to_vec(); // an odd last block stays in place
        p.xs4 = vec![0f32; m * pairs * 8];
        for i in 0..m {
            let (xr, xo) = (&x[i * w.k..(i + 1) * w.k], &mut p.xperm[i * w.k..(i + 1) * w.k]);
            for g in 0..pairs {
                for lane in 0..8 {
                    let block = 2 * g + lane / 4;
                    for n in 0..8 {
                        // nibble n of dword lane % 4 of the block: byte 4 (lane % 4) + n / 2, the
                        // high nibble (element + 16) for odd n
                        let e = 4 * (lane % 4) + n / 2 + 16 * (n % 2);
                        xo[g * 64 + n * 8 + lane] = xr[block * BLOCK + e];
                    }
                    // a quarter of the block's sum in each of its four lanes (exact: a power of 2)
                    p.xs4[(i * pairs + g) * 8 + lane] = p.xsum[i * nb + block] / 4.0;
                }
            }
        }
    }
    p
}

/// Rows [r0, r1) of out [m, ldo] = x [m, k] @ w.T. `out` is a raw pointer because threads
/// write disjoint column ranges of the same rows.
#[allow(clippy::too_many_arguments)]
pub(super) fn matmul_rows(x: &[f32], m: usize, prep: &Prepared, w: QMatrix<'_>, r0: usize, r1: usize, out: *mut f32,
                          ldo: usize) {
    let nb = w.k / BLOCK;
    let rb = w.format.row_bytes(w.k);
    let rs = w.format.row_scales(w.k);
    for r in r0..r1 {
        let qs = &w.qs[r * rb..(r + 1) * rb];
        let sc = &w.sc[r * rs..(r + 1) * rs];
        for i in 0..m {
            let xr = &x[i * w.k..(i + 1) * w.k];
            let v = match w.format {
                Format::Q4 => dot_q4(xr, &prep.xsum[i * nb..(i + 1) * nb], prep, i, qs, sc),
                Format::Q8 => dot_q8(xr, qs, sc),
            };
            // SAFETY: out holds m * ldo values (checked by matmul) and r < n <= ldo
            unsafe { *out.add(i * ldo + r) = v };
        }
    }
}

fn dot_q4(x: &[f32], xsum: &[f32], prep: &Prepared, i: usize, qs: &[u8], sc: &[u16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if !prep.xperm.is_empty() {
        let (k, pairs) = (x.len(), xsum.len() / 2);
        // SAFETY: xperm is non-empty only when simd() holds; slices are whole blocks
        return unsafe { avx2::dot_q4(&prep.xperm[i * k..(i + 1) * k], &prep.xs4[i * pairs * 8..(i + 1) * pairs * 8], xsum, qs, sc) };
    }
    let _ = (prep, i);
    let mut acc = 0f32;
    for b in 0..xsum.len() {
        let mut s = 0f32;
        for j in 0..16 {
            let byte = qs[b * 16 + j];
            s += x[b * BLOCK + j] * (byte & 15) as f32 + x[b * BLOCK + j + 16] * (byte >> 4) as f32;
        }
        acc += f16_to_f32(sc[2 * b]) * s + f16_to_f32(sc[2 * b + 1]) * xsum[b];
    }
    acc
}

fn dot_q8(x: &[f32], qs: &[u8], sc: &[u16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: as dot_q4
        return unsafe { avx2::dot_q8(x, qs, sc) };
    }
    let mut acc = 0f32;
    for (b, &d) in sc.iter().enumerate() {
        let s: f32 = (0..BLOCK).map(|j| x[b * BLOCK + j] * qs[b * BLOCK + j] as i8 as f32).sum();
        acc += f16_to_f32(d) * s;
    }
    acc
}

/// One weight row as float32 (the file's values exactly).
pub(super) fn dequantize_row(w: QMatrix<'_>, r: usize, out: &mut [f32]) {
    let nb = w.k / BLOCK;
    let rb = w.format.row_bytes(w.k);
    let rs = w.format.row_scales(w.k);
    let qs = &w.qs[r * rb..(r + 1) * rb];
    let sc = &w.sc[r * rs..(r + 1) * rs];
    #[cfg(target_arch = "x86_64")]
    if simd() {
        // SAFETY: the cpu has the features; qs, sc and out are the row's whole blocks
        unsafe {
            match w.format {
                Format::Q4 => avx2::dequantize_q4(qs, sc, out),
                Format::Q8 => avx2::dequantize_q8(qs, sc, out),
            }
        }
        return;
    }
    for b in 0..nb {
        let o = &mut out[b * BLOCK..(b + 1) * BLOCK];
        match w.format {
            Format::Q4 => {
                let (d, m) = (f16_to_f32(sc[2 * b]), f16_to_f32(sc[2 * b + 1]));
                for j in 0..16 {
                    let byte = qs[b * 16 + j];
                    o[j] = d * (byte & 15) as f32 + m;
                    o[j + 16] = d * (byte >> 4) as f32 + m;
                }
            }
            Format::Q8 => {
                let d = f16_to_f32(sc[b]);
                for j in 0..BLOCK {
                    o[j] = d * qs[b * BLOCK + j] as i8 as f32;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn widen_u8(v: __m128i) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn widen_i8(q: *const u8) -> __m256 {
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(q as *const __m128i)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_block(x: *const f32, q: *const u8) -> __m256 {
        let raw = _mm_loadu_si128(q as *const __m128i);
        let mask = _mm_set1_epi8(15);
        let lo = _mm_and_si128(raw, mask);
        let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
        let a = _mm256_mul_ps(widen_u8(lo), _mm256_loadu_ps(x));
        let a = _mm256_fmadd_ps(widen_u8(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x.add(8)), a);
        let a = _mm256_fmadd_ps(widen_u8(hi), _mm256_loadu_ps(x.add(16)), a);
        _mm256_fmadd_ps(widen_u8(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x.add(24)), a)
    }

    /// Two blocks' sum_j x_j q_j as 8 lanes (lanes 0-3: the first block, 4-7: the second)
    /// from their 32 bytes read as 8 dwords: nibble n of every dword by a shift and a mask,
    /// no byte shuffles (the shuffle port, not memory, bounds the plain widening here). `xp`
    /// is the pair's 64 inputs permuted to match (kernels::prepare).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4_pair(xp: *const f32, q: *const u8) -> __m256 {
        let raw = _mm256_loadu_si256(q as *const __m256i);
        let mask = _mm256_set1_epi32(15);
        let nib = |v: __m256i| _mm256_cvtepi32_ps(_mm256_and_si256(v, mask));
        let mut e = _mm256_mul_ps(nib(raw), _mm256_loadu_ps(xp));
        let mut o = _mm256_mul_ps(nib(_mm256_srli_epi32::<4>(raw)), _mm256_loadu_ps(xp.add(8)));
        e = _mm256_fmadd_ps(nib(_mm256_srli_epi32::<8>(raw)), _mm256_loadu_ps(xp.add(16)), e);
        o = _mm256_fmadd_ps(nib(_mm256_srli_epi32::<12>(raw)), _mm256_loadu_ps(xp.add(24)), o);
        e = _mm256_fmadd_ps(nib(_mm256_srli_epi32::<16>(raw)), _mm256_loadu_ps(xp.add(32)), e);
        o = _mm256_fmadd_ps(nib(_mm256_srli_epi32::<20>(raw)), _mm256_loadu_ps(xp.add(40)), o);
        e = _mm256_fmadd_ps(nib(_mm256_srli_epi32::<24>(raw)), _mm256_loadu_ps(xp.add(48)), e);
        o = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32::<28>(raw)), _mm256_loadu_ps(xp.add(56)), o);
        _mm256_add_ps(e, o)
    }

    /// sum_b d_b * sum_j x_j q_j + m_b * xsum_b over a row, two blocks per turn
    /// (q4_pair); an odd last block the plain way (q4_block, x in place).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4(xperm: &[f32], xs4: &[f32], xsum: &[f32], qs: &[u8], sc: &[u16]) -> f32 {
        let nb = xsum.len();
        let (xp, qp, sp) = (xperm.as_ptr(), qs.as_ptr(), sc.as_ptr());
        let d_idx = _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2);
        let m_idx = _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3);
        let mut acc = _mm256_setzero_ps();
        let mut macc = _mm256_setzero_ps();
        for g in 0..nb / 2 {
            // (d0, m0, d1, m1) as float32, spread to the pair's lanes
            let dm = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_loadl_epi64(sp.add(4 * g) as *const __m128i)));
            let s = q4_pair(xp.add(64 * g), qp.add(32 * g));
            acc = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dm, d_idx), s, acc);
            macc = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(dm, m_idx), _mm256_loadu_ps(xs4.as_ptr().add(8 * g)), macc);
        }
        let mut tail = 0f32;
        if nb % 2 == 1 {
            let b = nb - 1;
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((sp.add(2 * b) as *const i32).read_unaligned()));
            let s0 = q4_block(xp.add(b * 32), qp.add(b * 16));
            tail = _mm_cvtss_f32(dm) * hsum(s0) + _mm_cvtss_f32(_mm_movehdup_ps(dm)) * xsum[b];
        }
        hsum(_mm256_add_ps(acc, macc)) + tail
    }

    /// A Q4 row's weights d q + m (one rounding of an exact d q: the scalar loop's values).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dequantize_q4(qs: &[u8], sc: &[u16], out: &mut [f32]) {
        let mask = _mm_set1_epi8(15);
        for b in 0..sc.len() / 2 {
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128((sc.as_ptr().add(2 * b) as *const i32).read_unaligned()));
            let d = _mm256_set1_ps(_mm_cvtss_f32(dm));
            let m = _mm256_set1_ps(_mm_cvtss_f32(_mm_movehdup_ps(dm)));
            let raw = _mm_loadu_si128(qs.as_ptr().add(16 * b) as *const __m128i);
            let lo = _mm_and_si128(raw, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
            let o = out.as_mut_ptr().add(32 * b);
            _mm256_storeu_ps(o, _mm256_fmadd_ps(d, widen_u8(lo), m));
            _mm256_storeu_ps(o.add(8), _mm256_fmadd_ps(d, widen_u8(_mm_srli_si128(lo, 8)), m));
            _mm256_storeu_ps(o.add(16), _mm256_fmadd_ps(d, widen_u8(hi), m));
            _mm256_storeu_ps(o.add(24), _mm256_fmadd_ps(d, widen_u8(_mm_srli_si128(hi, 8)), m));
        }
    }

    /// A Q8_0 row's weights d q (exact).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dequantize_q8(qs: &[u8], sc: &[u16], out: &mut [f32]) {
        for (b, &h) in sc.iter().enumerate() {
            let d = _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32))));
            let (q, o) = (qs.as_ptr().add(32 * b), out.as_mut_ptr().add(32 * b));
            for j in 0..4 {
                _mm256_storeu_ps(o.add(8 * j), _mm256_mul_ps(d, widen_i8(q.add(8 * j))));
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q8_block(x: *const f32, q: *const u8) -> __m256 {
        let a = _mm256_mul_ps(widen_i8(q), _mm256_loadu_ps(x));
        let a = _mm256_fmadd_ps(widen_i8(q.add(8)), _mm256_loadu_ps(x.add(8)), a);
        let a = _mm256_fmadd_ps(widen_i8(q.add(16)), _mm256_loadu_ps(x.add(16)), a);
        _mm256_fmadd_ps(widen_i8(q.add(24)), _mm256_loadu_ps(x.add(24)), a)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q8(x: &[f32], qs: &[u8], sc: &[u16]) -> f32 {
        let nb = sc.len();
        let (xp, qp) = (x.as_ptr(), qs.as_ptr());
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let mut b = 0;
        while b + 2 <= nb {
            let d = _mm_cvtph_ps(_mm_cvtsi32_si128((sc.as_ptr().add(b) as *const i32).read_unaligned()));
            acc0 = _mm256_fmadd_ps(_mm256_set1_ps(_mm_cvtss_f32(d)), q8_block(xp.add(b * 32), qp.add(b * 32)), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_set1_ps(_mm_cvtss_f32(_mm_movehdup_ps(d))), q8_block(xp.add(b * 32 + 32), qp.add(b * 32 + 32)), acc1);
            b += 2;
        }
        if b < nb {
            let d = _mm256_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(sc[b] as i32))));
            acc0 = _mm256_fmadd_ps(d, q8_block(xp.add(b * 32), qp.add(b * 32)), acc0);
        }
        hsum(_mm256_add_ps(acc0, acc1))
    }
}
