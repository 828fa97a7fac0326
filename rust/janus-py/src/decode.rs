//! Python binding of janus_core::decode: `DecodePlan` holds a model's layer weights as
//! addresses, bound once (python/janusd/engine/models/native_step.py checks every tensor
//! before it hands one over), and `step` runs all layers of one batch-1 decode step with
//! the GIL released. Conversion only: the layer itself is the core's.

use janus_core::decode::{decode_layer, finish, LayerDims, LayerWeights, Scratch, StepPos};
use janus_core::quant::{Format, QMatrix};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// Addresses per layer: ln1, (fmt, qs, sc) of qkv, qkv bias (0: none), (fmt, qs, sc) of o,
/// ln2, (fmt, qs, sc) of gate_up, (fmt, qs, sc) of down; fmt 4 = Q4, 8 = Q8_0.
const FIELDS: usize = 15;
const MATRICES: [usize; 4] = [1, 5, 9, 12]; // where each matrix's fmt sits

#[pyclass(module = "janusd._native", frozen)]
pub struct DecodePlan {
    dims: LayerDims,
    layers: Vec<[usize; FIELDS]>,
}

fn format(code: usize) -> Option<Format> {
    match code {
        4 => Some(Format::Q4),
        8 => Some(Format::Q8),
        _ => None,
    }
}

/// SAFETY (of the callers): `a[at + 1]` / `a[at + 2]` address an [n, k] matrix of the format.
unsafe fn matrix<'a>(a: &[usize; FIELDS], at: usize, n: usize, k: usize) -> QMatrix<'a> {
    let f = format(a[at]).unwrap_or(Format::Q8); // checked by DecodePlan::new
    QMatrix { format: f, n, k, qs: std::slice::from_raw_parts(a[at + 1] as *const u8, n * f.row_bytes(k)),
              sc: std::slice::from_raw_parts(a[at + 2] as *const u16, n * f.row_scales(k)) }
}

/// SAFETY: as `matrix`, for every address of the layer at the plan's sizes.
unsafe fn weights<'a>(d: &LayerDims, a: &[usize; FIELDS]) -> LayerWeights<'a> {
    let f = |addr: usize, n: usize| std::slice::from_raw_parts(addr as *const f32, n);
    let qkv_rows = (d.nq + 2 * d.nkv) * d.hd;
    LayerWeights { ln1: f(a[0], d.hidden), qkv: matrix(a, 1, qkv_rows, d.hidden), qkv_bias: (a[4] != 0).then(|| f(a[4], qkv_rows)),
                   o: matrix(a, 5, d.hidden, d.nq * d.hd), ln2: f(a[8], d.hidden), gate_up: matrix(a, 9, 2 * d.inter, d.hidden),
                   down: matrix(a, 12, d.hidden, d.inter) }
}

#[pymethods]
impl DecodePlan {
    /// `layers`: FIELDS addresses per layer (see FIELDS), flat.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(hidden: usize, nq: usize, nkv: usize, hd: usize, inter: usize, eps: f32, layers: Vec<usize>) -> PyResult<Self> {
        if layers.is_empty() || !layers.len().is_multiple_of(FIELDS) || hd == 0 || nkv == 0 || hidden == 0 || inter == 0 {
            return Err(PyValueError::new_err(format!("decode plan: {} addresses for layers of {FIELDS}", layers.len())));
        }
        let rows: Vec<[usize; FIELDS]> = layers.chunks_exact(FIELDS).map(|c| c.try_into().unwrap_or([0; FIELDS])).collect();
        for (i, a) in rows.iter().enumerate() {
            let zero = a.iter().enumerate().any(|(j, &v)| v == 0 && j != 4 && !MATRICES.contains(&j));
            if zero || MATRICES.iter().any(|&m| format(a[m]).is_none()) {
                return Err(PyValueError::new_err(format!("decode plan: layer {i} has a null address or an unknown format")));
            }
        }
        Ok(Self { dims: LayerDims { hidden, nq, nkv, hd, inter, eps }, layers: rows })
    }

    /// All layers on the hidden row at `h` (float32 [hidden], updated in place): `cos` /
    /// `sin_rot` the position's rotary rows, `kv` each layer's (k, v) cache addresses,
    /// `blocks` the sequence's int64 block table of `nblocks` ids, `ctx` positions attended.
    #[allow(clippy::too_many_arguments)]
    fn step(&self, py: Python<'_>, h: usize, cos: usize, sin_rot: usize, kv: Vec<usize>, blocks: usize, nblocks: usize,
            ctx: usize, block_size: usize, block_stride: usize, num_blocks: usize, threads: usize) -> PyResult<()> {
        let d = self.dims;
        if kv.len() != 2 * self.layers.len() || [h, cos, sin_rot, blocks].contains(&0) || kv.contains(&0) || nblocks == 0 {
            return Err(PyValueError::new_err(format!("decode step: {} cache addresses for {} layers", kv.len(), self.layers.len())));
        }
        let span = num_blocks.saturating_sub(1) * block_stride + block_size * d.nkv * d.hd;
        py.detach(|| {
            // SAFETY: native_step.py checked the hidden row, the rotary table, the block table
            // and each layer's caches (a KV region's layer views) before passing their addresses
            unsafe {
                let hs = std::slice::from_raw_parts_mut(h as *mut f32, d.hidden);
                let p = StepPos { cos: std::slice::from_raw_parts(cos as *const f32, d.hd),
                                  sin_rot: std::slice::from_raw_parts(sin_rot as *const f32, d.hd),
                                  blocks: std::slice::from_raw_parts(blocks as *const i64, nblocks), ctx, block_size,
                                  block_stride, num_blocks };
                let mut s = Scratch::new(&d);
                for (i, a) in self.layers.iter().enumerate() {
                    let kc = std::slice::from_raw_parts_mut(kv[2 * i] as *mut f32, span);
                    let vc = std::slice::from_raw_parts_mut(kv[2 * i + 1] as *mut f32, span);
                    decode_layer(&d, &weights(&d, a), &p, kc, vc, hs, &mut s, threads)?;
                }
                finish(hs, &mut s);
            }
            Ok(())
        })
        .map_err(|e: String| PyValueError::new_err(e))
    }

    #[getter]
    fn num_layers(&self) -> usize {
        self.layers.len()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DecodePlan>()
}
