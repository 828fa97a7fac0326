//! The simulator's hot paths (python/janusd/sim/).
//! - [`segments`]: a simulated device's step history and the per-request on-time count.

pub mod segments;
