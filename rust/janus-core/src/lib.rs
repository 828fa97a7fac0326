//! janus-core: the pure Rust core of janusd.
//!
//! Nothing here knows about Python: the binding crate `janus-py` converts
//! types and errors only. Each module owns one thing:
//! - [`cpuops`]: small per-row operations of a cpu decode step (RMSNorm with its residual add).
//! - [`decode`]: a whole batch-1 decode layer of the Llama family in one call (cpu, quantized matrices).
//! - [`dispatch`]: Moore-Hodgson, LST-IMH and the clock-injected online dispatcher.
//! - [`xtensor`]: the per-device physical page pool, virtual regions and mapping backends.
//! - [`quant`]: products over block-quantized (GGUF Q4 / Q8_0) weights, float32 activations.
//! - [`sim`]: the simulator's hot paths (a simulated device's step segments).

pub mod cpuops;
pub mod decode;
pub mod dispatch;
pub mod quant;
pub mod sim;
pub mod xtensor;
