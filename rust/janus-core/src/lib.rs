//! janus-core: the pure Rust core of janusd.
//!
//! Nothing here knows about Python: the binding crate `janus-py` converts
//! types and errors only. Each module owns one thing:
//! - [`dispatch`]: Moore-Hodgson, LST-IMH and the clock-injected online dispatcher.
//! - [`xtensor`]: the per-device physical page pool, virtual regions and mapping backends.
//! - [`sim`]: the simulator's hot paths (a simulated device's step segments).

pub mod dispatch;
pub mod sim;
pub mod xtensor;
