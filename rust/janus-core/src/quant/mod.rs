//! Matrix products over GGUF-style block-quantized weights with float32 activations.
//!
//! Why float32 activations (not llama.cpp's 8-bit ones): the engine's contract is that a
//! quantized model's greedy output equals the float32 product of the same dequantized
//! weights token for token; quantizing the activations would break that. So each block's
//! integers are widened to float32 in registers and multiplied with the row as it is: the
//! product differs from the dequantized float32 product only by summation order.
//!
//! Formats (row-major, each weight row independent, so fused matrices are row ranges):
//! - Q4: `qs` [N, K/2] bytes, GGUF's nibble order per 32-block (byte j: element j in the
//!   low nibble, j + 16 in the high one), `sc` [N, K/32, 2] float16 (d, m): w = d * q + m
//!   (Q4_1 as stored; Q4_0's w = d * (q - 8) is m = -8d, exact in float16).
//! - Q8: `qs` [N, K] int8, `sc` [N, K/32] float16 d: w = d * q (GGUF Q8_0).
//!
//! The x86-64 path needs AVX2, FMA and F16C (checked once at run time); elsewhere a
//! scalar loop computes the same sums in the same per-block order.

mod kernels;
mod pool;

use std::fmt;

pub const BLOCK: usize = 32;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantError(pub String);

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for QuantError {}

/// Which block format a weight is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Q4,
    Q8,
}

impl Format {
    /// Bytes of `qs` per weight row of `k` inputs.
    pub fn row_bytes(self, k: usize) -> usize {
        match self {
            Format::Q4 => k / 2,
            Format::Q8 => k,
        }
    }
    /// float16 scale values per weight row.
    pub fn row_scales(self, k: usize) -> usize {
        match self {
            Format::Q4 => k / BLOCK * 2,
            Format::Q8 => k / BLOCK,
        }
    }
}

/// One quantized weight matrix [n, k], borrowed.
#[derive(Clone, Copy)]
pub struct QMatrix<'a> {
    pub format: Format,
    pub n: usize,
    pub k: usize,
    pub qs: &'a [u8],
    pub sc: &'a [u16],
}

impl QMatrix<'_> {
    fn check(&self) -> Result<(), QuantError> {
        if self.k == 0 || !self.k.is_multiple_of(BLOCK) {
            return Err(QuantError(format!("k = {} is not a positive multiple of {BLOCK}", self.k)));
        }
        if self.qs.len() != self.n * self.format.row_bytes(self.k) {
            return Err(QuantError(format!("qs holds {} bytes, [{}, {}] {:?} needs {}", self.qs.len(), self.n, self.k,
                                          self.format, self.n * self.format.row_bytes(self.k))));
        }
        if self.sc.len() != self.n * self.format.row_scales(self.k) {
            return Err(QuantError(format!("sc holds {} values, needs {}", self.sc.len(), self.n * self.format.row_scales(self.k))));
        }
        Ok(())
    }
}

/// Rows of w per chunk a thread takes (pool::for_chunks): a few chunks per thread, whole
/// cache lines of out (multiples of 16 floats), at least 16 rows.
fn chunk_rows(n: usize, threads: usize) -> usize {
    (n / (threads.max(1) * 8)).clamp(16, 512).div_ceil(16) * 16
}

/// out [m, n] = x [m, k] @ w.T, on up to `threads` threads (chunks of w's rows shared between them).
pub fn matmul(x: &[f32], m: usize, w: QMatrix<'_>, out: &mut [f32], threads: usize) -> Result<(), QuantError> {
    w.check()?;
    if x.len() != m * w.k || out.len() != m * w.n {
        return Err(QuantError(format!("x holds {} values and out {}: [{m}, {}] and [{m}, {}] expected", x.len(), out.len(), w.k, w.n)));
    }
    let prep = kernels::prepare(x, m, w);
    let prep = &prep;
    let out_addr = out.as_mut_ptr() as usize;
    pool::for_chunks(threads, w.n, chunk_rows(w.n, threads), &|r0, r1| {
        kernels::matmul_rows(x, m, prep, w, r0, r1, out_addr as *mut f32, w.n);
    });
    Ok(())
}

/// The float32 weights [n, k] (w = d * q + m, or d * q), into `out`: the reference the
/// products are checked against, and a prefill's way to a float32 matrix product.
pub fn dequantize(w: QMatrix<'_>, row0: usize, rows: usize, out: &mut [f32]) -> Result<(), QuantError> {
    w.check()?;
    if row0 + rows > w.n || out.len() != rows * w.k {
        return Err(QuantError(format!("rows [{row0}, {}) of {} into {} values", row0 + rows, w.n, out.len())));
    }
    for r in 0..rows {
        kernels::dequantize_row(w, row0 + r, &mut out[r * w.k..(r + 1) * w.k]);
    }
    Ok(())
}

/// float16 bits -> float32 (exact), for the scalar path and the tests.
pub fn f16_to_f32(h: u16) -> f32 {
    let neg = h & 0x8000 != 0;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let v = match exp {
        0 => man as f32 * f32::powi(2.0, -24), // zero or subnormal: exact in float32
        0x1f if man == 0 => f32::INFINITY,
        0x1f => f32::NAN,
        _ => f32::from_bits(((exp + 112) << 23) | (man << 13)),
    };
    if neg { -v } else { v }
}

#[cfg(test)]
mod tests;
