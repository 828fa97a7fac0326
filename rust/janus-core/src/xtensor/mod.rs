//! xTensor: physical page pool, virtual regions and mapping backends (PAPER.md §7).
//!
//! - [`pool`]: pure page bookkeeping (KV from the low end, weights best-fit from the high end).
//! - [`backend`]: host (memfd + mmap), cuda (driver VMM API via dlopen), npu (ACL via a C shim).
//! - [`region`]: reserved virtual ranges, weight segments, KV regions with a mapped-page cache.
//! - [`device`]: one device's pool, global region, segments and regions, behind one lock.
//! - `kv`: the KV-region methods of [`DevicePool`] (resize, page ids, global offsets).
//! - `cache`: per-model caches of mapped-but-unused KV pages and the refill thread.
//! - `state`: what sits behind a device's lock, and the whole-device integrity check.
//! - [`stats`]: statistics and the fragmentation definition.
//! - [`mod@bench`]: the measurements behind `janus bench xtensor`.

pub mod backend;
pub mod bench;
mod cache;
pub mod device;
pub mod error;
mod kv;
pub mod pool;
pub mod region;
mod state;
pub mod stats;
#[cfg(test)]
mod tests;

pub use device::{DevicePool, KvInfo, SegmentInfo, DEFAULT_CACHE_HIGH, DEFAULT_CACHE_LOW};
pub use error::{XtError, XtErrorKind, XtResult};
pub use stats::Stats;
