//! Python binding of janus_core::quant: products and dequantization over tensors' memory,
//! passed as addresses. The caller (janusd.engine.models.qmatrix) checks each tensor's
//! dtype, shape, contiguity and device before it hands over an address; this module only
//! turns them into slices and the core's errors into ValueError. The GIL is released.

use janus_core::quant::{self, Format, QMatrix};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

fn format(name: &str) -> PyResult<Format> {
    match name {
        "q4" => Ok(Format::Q4),
        "q8" => Ok(Format::Q8),
        _ => Err(PyValueError::new_err(format!("unknown quant format {name:?} (q4, q8)"))),
    }
}

/// SAFETY (of the callers): `qs` and `sc` address n rows of the format at k inputs.
unsafe fn matrix<'a>(fmt: Format, n: usize, k: usize, qs: usize, sc: usize) -> QMatrix<'a> {
    QMatrix {
        format: fmt,
        n,
        k,
        qs: std::slice::from_raw_parts(qs as *const u8, n * fmt.row_bytes(k)),
        sc: std::slice::from_raw_parts(sc as *const u16, n * fmt.row_scales(k)),
    }
}

/// out [m, n] float32 = x [m, k] float32 @ w.T for w [n, k] in `fmt` ("q4" / "q8").
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn quant_matmul(py: Python<'_>, fmt: &str, x: usize, m: usize, k: usize, qs: usize, sc: usize, n: usize, out: usize,
                threads: usize) -> PyResult<()> {
    let f = format(fmt)?;
    if !k.is_multiple_of(quant::BLOCK) || [x, qs, sc, out].contains(&0) {
        return Err(PyValueError::new_err(format!("k = {k} must be a multiple of {} and addresses non-null", quant::BLOCK)));
    }
    py.detach(|| {
        // SAFETY: the Python caller checked every tensor's size, dtype and contiguity
        let (xs, w, o) = unsafe {
            (std::slice::from_raw_parts(x as *const f32, m * k), matrix(f, n, k, qs, sc),
             std::slice::from_raw_parts_mut(out as *mut f32, m * n))
        };
        quant::matmul(xs, m, w, o, threads)
    })
    .map_err(|e| PyValueError::new_err(e.0))
}

/// out [rows, k] float32 = rows [row0, row0 + rows) of w [n, k] in `fmt`, dequantized.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn quant_dequantize(py: Python<'_>, fmt: &str, qs: usize, sc: usize, n: usize, k: usize, row0: usize, rows: usize,
                    out: usize) -> PyResult<()> {
    let f = format(fmt)?;
    if !k.is_multiple_of(quant::BLOCK) || row0 + rows > n || [qs, sc, out].contains(&0) {
        return Err(PyValueError::new_err(format!("rows [{row0}, {}) of {n} at k = {k}", row0 + rows)));
    }
    py.detach(|| {
        // SAFETY: as quant_matmul
        let (w, o) = unsafe { (matrix(f, n, k, qs, sc), std::slice::from_raw_parts_mut(out as *mut f32, rows * k)) };
        quant::dequantize(w, row0, rows, o)
    })
    .map_err(|e| PyValueError::new_err(e.0))
}

/// h [rows, cols] += add (when add != 0); out = RMSNorm(h) * w (janus_core::cpuops), float32.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn add_rms_norm(py: Python<'_>, h: usize, add: usize, w: usize, out: usize, rows: usize, cols: usize, eps: f32) -> PyResult<()> {
    if [h, w, out].contains(&0) {
        return Err(PyValueError::new_err("null address"));
    }
    py.detach(|| {
        // SAFETY: as quant_matmul; `add` may alias nothing else written here
        let (hs, ws, os) = unsafe {
            (std::slice::from_raw_parts_mut(h as *mut f32, rows * cols), std::slice::from_raw_parts(w as *const f32, cols),
             std::slice::from_raw_parts_mut(out as *mut f32, rows * cols))
        };
        let a = (add != 0).then(|| unsafe { std::slice::from_raw_parts(add as *const f32, rows * cols) });
        janus_core::cpuops::add_rms_norm(hs, a, ws, eps, os, cols)
    })
    .map_err(PyValueError::new_err)
}

/// One decoding sequence's attention over its paged float32 KV cache (janus_core::cpuops):
/// writes k_new / v_new at position ctx - 1, out [hq, d] = attention of q over 0 .. ctx - 1.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn decode_attention(py: Python<'_>, q: usize, k_new: usize, v_new: usize, kc: usize, vc: usize, num_blocks: usize,
                    block_stride: usize, blocks: usize, nblocks: usize, block_size: usize, hq: usize, hkv: usize, d: usize, ctx: usize,
                    out: usize) -> PyResult<()> {
    if [q, k_new, v_new, kc, vc, blocks, out].contains(&0) {
        return Err(PyValueError::new_err("null address"));
    }
    py.detach(|| {
        let cache = num_blocks.saturating_sub(1) * block_stride + block_size * hkv * d;
        // SAFETY: as quant_matmul (janusd.engine.models.qkernel.decode_attention checks)
        unsafe {
            let a = janus_core::cpuops::DecodeAttn {
                q: std::slice::from_raw_parts(q as *const f32, hq * d),
                k_new: std::slice::from_raw_parts(k_new as *const f32, hkv * d),
                v_new: std::slice::from_raw_parts(v_new as *const f32, hkv * d),
                blocks: std::slice::from_raw_parts(blocks as *const i64, nblocks),
                block_size,
                block_stride,
                num_blocks,
                hkv,
                d,
                ctx,
            };
            janus_core::cpuops::decode_attention(&a, std::slice::from_raw_parts_mut(kc as *mut f32, cache),
                                                 std::slice::from_raw_parts_mut(vc as *mut f32, cache),
                                                 std::slice::from_raw_parts_mut(out as *mut f32, hq * d))
        }
    })
    .map_err(PyValueError::new_err)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(decode_attention, m)?)?;
    m.add_function(wrap_pyfunction!(add_rms_norm, m)?)?;
    m.add_function(wrap_pyfunction!(quant_matmul, m)?)?;
    m.add_function(wrap_pyfunction!(quant_dequantize, m)?)?;
    Ok(())
}
