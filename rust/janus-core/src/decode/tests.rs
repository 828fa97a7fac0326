//! A decode layer against a float64 reference over the dequantized weights (HF's layer:
//! rotate_half rotary, softmax attention, SiLU), on random Q4 / Q8_0 blocks.

use super::*;
use crate::quant::{dequantize, Format};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    fn unit(&mut self) -> f32 {
        (self.next() % 2001) as f32 / 1000.0 - 1.0
    }
}

struct OwnedMatrix {
    format: Format,
    n: usize,
    k: usize,
    qs: Vec<u8>,
    sc: Vec<u16>,
}

impl OwnedMatrix {
    fn random(format: Format, n: usize, k: usize, rng: &mut Rng) -> Self {
        let qs = (0..n * format.row_bytes(k)).map(|_| rng.next() as u8).collect();
        // float16 scales of either sign, magnitudes 2^-7 .. 2^-4 (exponents 8 .. 11)
        let sc = (0..n * format.row_scales(k)).map(|_| {
            let r = rng.next();
            (((r & 1) << 15) | ((8 + (r >> 1) % 3) << 10) | ((r >> 4) & 0x3ff)) as u16
        }).collect();
        OwnedMatrix { format, n, k, qs, sc }
    }
    fn view(&self) -> QMatrix<'_> {
        QMatrix { format: self.format, n: self.n, k: self.k, qs: &self.qs, sc: &self.sc }
    }
    fn times(&self, x: &[f64]) -> Vec<f64> {
        let mut w = vec![0f32; self.n * self.k];
        dequantize(self.view(), 0, self.n, &mut w).unwrap();
        (0..self.n).map(|r| (0..self.k).map(|j| w[r * self.k + j] as f64 * x[j]).sum()).collect()
    }
}

fn norm(h: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    let inv = 1.0 / (h.iter().map(|x| x * x).sum::<f64>() / h.len() as f64 + eps).sqrt();
    h.iter().zip(w).map(|(x, &g)| x * inv * g as f64).collect()
}

#[test]
fn a_layer_matches_the_float64_reference_and_leaves_the_mlp_for_the_next_norm() {
    let d = LayerDims { hidden: 64, nq: 4, nkv: 2, hd: 16, inter: 96, eps: 1e-5 };
    let mut rng = Rng(7);
    let (qkv, o) = (OwnedMatrix::random(Format::Q4, d.qkv_rows(), 64, &mut rng), OwnedMatrix::random(Format::Q8, 64, 64, &mut rng));
    let (gu, down) = (OwnedMatrix::random(Format::Q4, 192, 64, &mut rng), OwnedMatrix::random(Format::Q4, 64, 96, &mut rng));
    let ln1: Vec<f32> = (0..64).map(|_| 1.0 + rng.unit() / 4.0).collect();
    let ln2: Vec<f32> = (0..64).map(|_| 1.0 + rng.unit() / 4.0).collect();
    let bias: Vec<f32> = (0..d.qkv_rows()).map(|_| rng.unit() / 8.0).collect();
    let w = LayerWeights { ln1: &ln1, qkv: qkv.view(), qkv_bias: Some(&bias), o: o.view(), ln2: &ln2, gate_up: gu.view(),
                           down: down.view() };
    let (bs, row, ctx) = (4, d.nkv * d.hd, 7);
    let stride = bs * row + 8; // blocks further apart than their size, as in a KV region
    let span = 2 * stride + bs * row;
    let mut kcache: Vec<f32> = (0..span).map(|_| rng.unit()).collect();
    let mut vcache: Vec<f32> = (0..span).map(|_| rng.unit()).collect();
    let blocks = [2i64, 0];
    let theta: Vec<f64> = (0..d.hd / 2).map(|i| (ctx - 1) as f64 / 10000f64.powf(2.0 * i as f64 / d.hd as f64)).collect();
    let cos: Vec<f32> = (0..d.hd).map(|i| theta[i % (d.hd / 2)].cos() as f32).collect();
    let sin: Vec<f32> = (0..d.hd).map(|i| theta[i % (d.hd / 2)].sin() as f32).collect();
    let sin_rot: Vec<f32> = (0..d.hd).map(|i| if i < d.hd / 2 { -sin[i] } else { sin[i] }).collect();
    let h0: Vec<f32> = (0..64).map(|_| rng.unit()).collect();
    let at = |p: usize| blocks[p / bs] as usize * stride + (p % bs) * row;
    let (kbefore, vbefore) = (kcache.clone(), vcache.clone());

    let mut h = h0.clone();
    let mut s = Scratch::new(&d);
    let p = StepPos { cos: &cos, sin_rot: &sin_rot, blocks: &blocks, ctx, block_size: bs, block_stride: stride, num_blocks: 3 };
    decode_layer(&d, &w, &p, &mut kcache, &mut vcache, &mut h, &mut s, 2).unwrap();
    let after_attn = h.clone();
    finish(&mut h, &mut s);

    // the reference, HF's order, float64
    let hf: Vec<f64> = h0.iter().map(|&x| x as f64).collect();
    let x = norm(&hf, &ln1, 1e-5);
    let mut y: Vec<f64> = qkv.times(&x).iter().zip(&bias).map(|(a, &b)| a + b as f64).collect();
    for head in y[..(d.nq + d.nkv) * d.hd].chunks_exact_mut(d.hd) {
        let c = head.to_vec();
        for i in 0..d.hd {
            let rot = if i < d.hd / 2 { -c[i + d.hd / 2] } else { c[i - d.hd / 2] };
            head[i] = c[i] * cos[i] as f64 + rot * sin[i] as f64;
        }
    }
    let (q, kv) = y.split_at(d.nq * d.hd);
    let key = |p: usize, g: usize, i: usize| if p == ctx - 1 { kv[g * d.hd + i] } else { kbefore[at(p) + g * d.hd + i] as f64 };
    let val = |p: usize, g: usize, i: usize| {
        if p == ctx - 1 { kv[row + g * d.hd + i] } else { vbefore[at(p) + g * d.hd + i] as f64 }
    };
    let mut attn = vec![0f64; d.nq * d.hd];
    for hq in 0..d.nq {
        let g = hq / (d.nq / d.nkv);
        let sc: Vec<f64> = (0..ctx).map(|p| (0..d.hd).map(|i| q[hq * d.hd + i] * key(p, g, i)).sum::<f64>() / (d.hd as f64).sqrt()).collect();
        let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
        let e: Vec<f64> = sc.iter().map(|v| (v - mx).exp()).collect();
        let z: f64 = e.iter().sum();
        for i in 0..d.hd {
            attn[hq * d.hd + i] = (0..ctx).map(|p| e[p] / z * val(p, g, i)).sum();
        }
    }
    let h1: Vec<f64> = hf.iter().zip(o.times(&attn)).map(|(a, b)| a + b).collect();
    let gu_out = gu.times(&norm(&h1, &ln2, 1e-5));
    let g: Vec<f64> = (0..96).map(|i| gu_out[i] / (1.0 + (-gu_out[i]).exp()) * gu_out[96 + i]).collect();
    let h2: Vec<f64> = h1.iter().zip(down.times(&g)).map(|(a, b)| a + b).collect();

    let close = |a: &[f32], b: &[f64]| a.iter().zip(b).all(|(&x, &y)| (x as f64 - y).abs() <= 1e-4 * (1.0 + y.abs()));
    assert!(close(&after_attn, &h1), "{after_attn:?} vs {h1:?}");
    assert!(close(&h, &h2), "{h:?} vs {h2:?}");
    // this step's k and v landed at position ctx - 1 (block 0, offset 2)
    let wpos = at(ctx - 1);
    assert!(close(&kcache[wpos..wpos + row], &kv[..row]));
    assert!(close(&vcache[wpos..wpos + row], &kv[row..]));
}

#[test]
fn rotary_is_rotate_half_and_bad_shapes_are_errors() {
    let (cos, sin_rot) = ([0.5f32, 0.25, 0.5, 0.25], [-1.0f32, -2.0, 1.0, 2.0]);
    let mut x = [1.0f32, 2.0, 3.0, 4.0];
    rotary(&mut x, 4, &cos, &sin_rot);
    // HF: x * cos + cat(-x2, x1) * sin with sin = (1, 2, 1, 2)
    assert_eq!(x, [1.0 * 0.5 - 3.0, 2.0 * 0.25 - 8.0, 3.0 * 0.5 + 1.0, 4.0 * 0.25 + 4.0]);
    let mut out = [0f32; 2];
    silu_mul(&[0.0, 1.0, 3.0, 2.0], &mut out);
    assert_eq!(out[0], 0.0);
    assert!((out[1] - 2.0 / (1.0 + (-1f32).exp())).abs() < 1e-6);

    let d = LayerDims { hidden: 32, nq: 2, nkv: 1, hd: 8, inter: 32, eps: 1e-5 };
    let mut rng = Rng(3);
    let m = OwnedMatrix::random(Format::Q8, 32, 32, &mut rng);
    let ln = vec![1f32; 32];
    let w = LayerWeights { ln1: &ln, qkv: m.view(), qkv_bias: None, o: m.view(), ln2: &ln, gate_up: m.view(), down: m.view() };
    let p = StepPos { cos: &[1.0; 8], sin_rot: &[0.0; 8], blocks: &[0], ctx: 1, block_size: 1, block_stride: 16, num_blocks: 1 };
    let (mut kc, mut vc, mut h) = (vec![0f32; 16], vec![0f32; 16], vec![0f32; 32]);
    let e = decode_layer(&d, &w, &p, &mut kc, &mut vc, &mut h, &mut Scratch::new(&d), 1).unwrap_err();
    assert!(e.contains("shapes"), "{e}");
}
