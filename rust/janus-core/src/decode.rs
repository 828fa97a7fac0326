//! One batch-1 decode layer of the Llama family in one call: RMSNorm (with the previous
//! layer's MLP residual), the fused q/k/v product (+ bias), rotary in place, the KV write
//! and attention over the sequence's paged cache, the o product and its residual,
//! RMSNorm, the fused gate/up product, SiLU(gate) * up and the down product.
//!
//! Why: the same layer as ~20 torch ops and Python calls cost ~0.3 ms of dispatch per
//! layer on this cpu (a third of a SmolLM2 step); the products already were native. The
//! arithmetic is the Python forward's, op for op (janusd/engine/models/llama.py): the
//! same kernels (quant::matmul, cpuops), the residual added by the next norm, rotary as
//! x * cos + roll(x) * sin_rot (two roundings and a sum, no fused multiply-add), so a
//! step differs from it only in SiLU's exp (libm's, not torch's vectorized one).

use crate::cpuops::{add_rms_norm, decode_attention, DecodeAttn};
use crate::quant::{self, QMatrix};

/// The sizes every layer of a model shares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerDims {
    pub hidden: usize,
    pub nq: usize,  // query heads
    pub nkv: usize, // key / value heads
    pub hd: usize,  // head dim (even)
    pub inter: usize,
    pub eps: f32,
}

impl LayerDims {
    fn qkv_rows(&self) -> usize {
        (self.nq + 2 * self.nkv) * self.hd
    }
}

/// One layer's weights: norms in float32, matrices block-quantized (rows: outputs).
#[derive(Clone, Copy)]
pub struct LayerWeights<'a> {
    pub ln1: &'a [f32],
    pub qkv: QMatrix<'a>, // [(nq + 2 nkv) hd, hidden]: q, k, v rows
    pub qkv_bias: Option<&'a [f32]>,
    pub o: QMatrix<'a>, // [hidden, nq hd]
    pub ln2: &'a [f32],
    pub gate_up: QMatrix<'a>, // [2 inter, hidden]: gate rows, then up
    pub down: QMatrix<'a>,    // [hidden, inter]
}

/// The step's token: its position's rotary rows and the sequence's paged KV layout.
pub struct StepPos<'a> {
    pub cos: &'a [f32],     // [hd]
    pub sin_rot: &'a [f32], // [hd], the first half negated (janusd rope.py)
    pub blocks: &'a [i64],
    pub ctx: usize, // positions attended, this token's the last
    pub block_size: usize,
    pub block_stride: usize,
    pub num_blocks: usize,
}

/// The buffers of a step, reused layer to layer; `m` is the last MLP output, added to the
/// hidden row by the next layer's norm (or by `finish`).
pub struct Scratch {
    x: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    o: Vec<f32>,
    gu: Vec<f32>,
    g: Vec<f32>,
    m: Vec<f32>,
    pending: bool,
}

impl Scratch {
    pub fn new(d: &LayerDims) -> Self {
        let z = |n: usize| vec![0f32; n];
        Scratch { x: z(d.hidden), qkv: z(d.qkv_rows()), attn: z(d.nq * d.hd), o: z(d.hidden), gu: z(2 * d.inter),
                  g: z(d.inter), m: z(d.hidden), pending: false }
    }
}

fn check(d: &LayerDims, w: &LayerWeights<'_>, p: &StepPos<'_>, h: &[f32]) -> Result<(), String> {
    let shapes = [(w.qkv, d.qkv_rows(), d.hidden), (w.o, d.hidden, d.nq * d.hd), (w.gate_up, 2 * d.inter, d.hidden),
                  (w.down, d.hidden, d.inter)];
    let bad_matrix = shapes.iter().any(|(m, n, k)| m.n != *n || m.k != *k);
    if d.hd == 0 || d.hd % 2 == 1 || d.nkv == 0 || d.nq % d.nkv != 0 || h.len() != d.hidden || w.ln1.len() != d.hidden
        || w.ln2.len() != d.hidden || bad_matrix || w.qkv_bias.is_some_and(|b| b.len() != d.qkv_rows())
        || p.cos.len() != d.hd || p.sin_rot.len() != d.hd
    {
        return Err(format!("decode layer: shapes do not fit {d:?} (hidden row {}, rotary rows {} / {})", h.len(), p.cos.len(),
                           p.sin_rot.len()));
    }
    Ok(())
}

/// HF's rotary of each head of `x` ([heads, hd]) in place: x * cos + roll(x, hd / 2) * sin_rot.
pub fn rotary(x: &mut [f32], hd: usize, cos: &[f32], sin_rot: &[f32]) {
    let half = hd / 2;
    let mut tmp = vec![0f32; hd];
    for head in x.chunks_exact_mut(hd) {
        tmp.copy_from_slice(head);
        for i in 0..hd {
            head[i] = tmp[i] * cos[i] + tmp[(i + half) % hd] * sin_rot[i];
        }
    }
}

/// out[i] = silu(gu[i]) * gu[inter + i] (gu: gate, then up).
pub fn silu_mul(gu: &[f32], out: &mut [f32]) {
    let (gate, up) = gu.split_at(out.len());
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

/// One layer on the hidden row `h` (the residual stream, updated in place: the attention
/// output is added here, this layer's MLP output is left in `s` for the next layer's norm).
/// `kc` / `vc`: this layer's caches as cpuops::decode_attention takes them.
#[allow(clippy::too_many_arguments)]
pub fn decode_layer(d: &LayerDims, w: &LayerWeights<'_>, p: &StepPos<'_>, kc: &mut [f32], vc: &mut [f32], h: &mut [f32],
                    s: &mut Scratch, threads: usize) -> Result<(), String> {
    check(d, w, p, h)?;
    let err = |e: quant::QuantError| e.0;
    let add = if s.pending { Some(&s.m[..]) } else { None };
    add_rms_norm(h, add, w.ln1, d.eps, &mut s.x, d.hidden)?;
    quant::matmul(&s.x, 1, w.qkv, &mut s.qkv, threads).map_err(err)?;
    if let Some(b) = w.qkv_bias {
        s.qkv.iter_mut().zip(b).for_each(|(y, &bb)| *y += bb);
    }
    let (qk, v) = s.qkv.split_at_mut((d.nq + d.nkv) * d.hd);
    rotary(qk, d.hd, p.cos, p.sin_rot);
    let (q, k) = qk.split_at(d.nq * d.hd);
    let a = DecodeAttn { q, k_new: k, v_new: v, blocks: p.blocks, block_size: p.block_size, block_stride: p.block_stride,
                         num_blocks: p.num_blocks, hkv: d.nkv, d: d.hd, ctx: p.ctx };
    decode_attention(&a, kc, vc, &mut s.attn)?;
    quant::matmul(&s.attn, 1, w.o, &mut s.o, threads).map_err(err)?;
    add_rms_norm(h, Some(&s.o), w.ln2, d.eps, &mut s.x, d.hidden)?;
    quant::matmul(&s.x, 1, w.gate_up, &mut s.gu, threads).map_err(err)?;
    silu_mul(&s.gu, &mut s.g);
    quant::matmul(&s.g, 1, w.down, &mut s.m, threads).map_err(err)?;
    s.pending = true;
    Ok(())
}

/// After the last layer: h += its MLP output.
pub fn finish(h: &mut [f32], s: &mut Scratch) {
    if s.pending {
        h.iter_mut().zip(&s.m).for_each(|(x, &m)| *x += m);
        s.pending = false;
    }
}

#[cfg(test)]
mod tests;
