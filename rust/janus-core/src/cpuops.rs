//! Small per-row operations of a cpu decode step, one call each instead of the six torch
//! ops (and their dispatch, ~50 us per call on a 576-wide row here) that a float32 RMSNorm
//! takes in torch 2.15.

/// For each of `rows` rows of width `cols`: h += add (when given), then
/// out = w * (h * 1/sqrt(mean(h^2) + eps)), HF's RMSNorm order of operations (the sum of
/// squares in float64, so it is at least as exact as torch's float32 one).
pub fn add_rms_norm(h: &mut [f32], add: Option<&[f32]>, w: &[f32], eps: f32, out: &mut [f32], cols: usize) -> Result<(), String> {
    if cols == 0 || !h.len().is_multiple_of(cols) || w.len() != cols || out.len() != h.len() || add.is_some_and(|a| a.len() != h.len()) {
        return Err(format!("rms_norm: h {} values, add {:?}, w {}, out {}, cols {cols}", h.len(), add.map(<[f32]>::len),
                           w.len(), out.len()));
    }
    for (r, (hr, or)) in h.chunks_exact_mut(cols).zip(out.chunks_exact_mut(cols)).enumerate() {
        if let Some(a) = add {
            for (x, y) in hr.iter_mut().zip(&a[r * cols..(r + 1) * cols]) {
                *x += *y;
            }
        }
        let ss: f64 = hr.iter().map(|&x| (x as f64) * (x as f64)).sum();
        let inv = 1.0 / ((ss / cols as f64) as f32 + eps).sqrt();
        for ((o, &x), &g) in or.iter_mut().zip(hr.iter()).zip(w) {
            *o = g * (x * inv);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norm_of_a_row_and_the_residual_added_first() {
        let mut h = vec![3.0f32, 4.0, 0.0, 0.0];
        let add = vec![0.0f32, 0.0, 0.0, 0.0];
        let mut out = vec![0f32; 4];
        add_rms_norm(&mut h, Some(&add), &[1.0, 2.0, 1.0, 1.0], 0.0, &mut out, 4).unwrap();
        assert_eq!(out, vec![1.2, 3.2, 0.0, 0.0]); // rms = sqrt(25 / 4) = 2.5
        let mut h2 = vec![1.0f32, 1.0];
        add_rms_norm(&mut h2, Some(&[1.0, -3.0]), &[1.0, 1.0], 0.0, &mut out[..2], 2).unwrap();
        assert_eq!(h2, vec![2.0, -2.0]);
        assert_eq!(&out[..2], &[1.0, -1.0]);
        assert!(add_rms_norm(&mut h2, None, &[1.0], 0.0, &mut out[..2], 2).is_err());
    }
}

/// One decoding sequence's attention over its paged KV cache, float32.
pub struct DecodeAttn<'a> {
    pub q: &'a [f32],     // [hq, d], this step's queries (rotary applied)
    pub k_new: &'a [f32], // [hkv, d], this step's key and value, written at position ctx - 1
    pub v_new: &'a [f32],
    pub blocks: &'a [i64], // the sequence's block table (at least ceil(ctx / block_size) ids)
    pub block_size: usize,
    pub block_stride: usize, // values from one cache block to the next (a KV region interleaves layers)
    pub num_blocks: usize,
    pub hkv: usize,
    pub d: usize,
    pub ctx: usize, // positions 0 .. ctx - 1 attended, the last one this step's
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    // eight independent partial sums: the compiler keeps them in one vector register
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Writes k_new / v_new into the caches ([num_blocks, block_size, hkv, d] each, blocks
/// `block_stride` values apart, so a slice of (num_blocks - 1) * block_stride + block_size *
/// hkv * d values), then
/// out [hq, d] = softmax(q k^T / sqrt(d)) v per query head over its kv head (GQA: query
/// head h reads kv head h / (hq / hkv)), with the max subtracted before exp as SDPA does.
pub fn decode_attention(a: &DecodeAttn<'_>, kc: &mut [f32], vc: &mut [f32], out: &mut [f32]) -> Result<(), String> {
    let (d, hkv, bs) = (a.d, a.hkv, a.block_size);
    let hq = a.q.len() / d.max(1);
    let row = hkv * d; // one position's keys of all kv heads
    let nblk = a.num_blocks;
    let span = nblk.saturating_sub(1) * a.block_stride + bs * row;
    if d == 0 || hkv == 0 || bs == 0 || a.ctx == 0 || nblk == 0 || a.block_stride < bs * row || kc.len() != span
        || !hq.is_multiple_of(hkv) || a.q.len() != hq * d || a.k_new.len() != row
        || a.v_new.len() != row || vc.len() != kc.len() || out.len() != a.q.len() || a.blocks.len() * bs < a.ctx
        || a.blocks[..a.ctx.div_ceil(bs)].iter().any(|&b| b < 0 || b as usize >= nblk)
    {
        return Err(format!("decode attention: bad shapes (hq {hq}, hkv {hkv}, d {d}, ctx {}, {} blocks of {nblk})", a.ctx, a.blocks.len()));
    }
    let at = |p: usize| a.blocks[p / bs] as usize * a.block_stride + (p % bs) * row;
    let w = at(a.ctx - 1);
    kc[w..w + row].copy_from_slice(a.k_new);
    vc[w..w + row].copy_from_slice(a.v_new);
    let scale = 1.0 / (d as f32).sqrt();
    let group = hq / hkv;
    let mut scores = vec![0f32; a.ctx];
    for h in 0..hq {
        let kvh = h / group;
        let qh = &a.q[h * d..(h + 1) * d];
        let mut max = f32::NEG_INFINITY;
        for (p, s) in scores.iter_mut().enumerate() {
            let o = at(p) + kvh * d;
            *s = dot(qh, &kc[o..o + d]) * scale;
            max = max.max(*s);
        }
        let mut sum = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let oh = &mut out[h * d..(h + 1) * d];
        oh.fill(0.0);
        for (p, &s) in scores.iter().enumerate() {
            let o = at(p) + kvh * d;
            for (x, &v) in oh.iter_mut().zip(&vc[o..o + d]) {
                *x += s * v;
            }
        }
        let inv = 1.0 / sum;
        oh.iter_mut().for_each(|x| *x *= inv);
    }
    Ok(())
}

#[cfg(test)]
mod attn_tests {
    use super::*;

    #[test]
    fn attention_matches_a_direct_softmax_and_writes_the_new_kv() {
        let (d, hkv, hq, bs, ctx) = (8, 2, 4, 4, 6);
        let f = |i: usize| ((i * 37 % 17) as f32 - 8.0) / 8.0;
        let q: Vec<f32> = (0..hq * d).map(f).collect();
        let kn: Vec<f32> = (0..hkv * d).map(|i| f(i + 5)).collect();
        let vn: Vec<f32> = (0..hkv * d).map(|i| f(i + 9)).collect();
        let stride = bs * hkv * d + 8; // blocks apart by more than their size, as in a KV region
        let mut kc: Vec<f32> = (0..2 * stride + bs * hkv * d).map(|i| f(i + 1)).collect();
        let mut vc: Vec<f32> = (0..2 * stride + bs * hkv * d).map(|i| f(i + 2)).collect();
        let blocks = [2i64, 0];
        let mut out = vec![0f32; hq * d];
        let a = DecodeAttn { q: &q, k_new: &kn, v_new: &vn, blocks: &blocks, block_size: bs, block_stride: stride,
                             num_blocks: 3, hkv, d, ctx };
        decode_attention(&a, &mut kc, &mut vc, &mut out).unwrap();
        let pos = |p: usize| blocks[p / bs] as usize * stride + (p % bs) * hkv * d;
        assert_eq!(&kc[pos(ctx - 1)..pos(ctx - 1) + hkv * d], &kn[..]);
        for h in 0..hq {
            let kvh = h / (hq / hkv);
            let s: Vec<f64> = (0..ctx).map(|p| (0..d).map(|i| q[h * d + i] as f64 * kc[pos(p) + kvh * d + i] as f64).sum::<f64>()
                / (d as f64).sqrt()).collect();
            let m = s.iter().cloned().fold(f64::MIN, f64::max);
            let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for i in 0..d {
                let want: f64 = (0..ctx).map(|p| e[p] / z * vc[pos(p) + kvh * d + i] as f64).sum();
                assert!((out[h * d + i] as f64 - want).abs() < 1e-5, "head {h} dim {i}");
            }
        }
        let bad = DecodeAttn { blocks: &[2, 3], ..a };
        assert!(decode_attention(&bad, &mut kc, &mut vc, &mut out).is_err());
    }
}
