//! Mapping backends: how physical pages are created and mapped into reserved virtual
//! ranges. One trait, one implementation per device kind, chosen by the kind string; a
//! backend whose library is missing fails at creation with one error naming the library
//! (never a silent fallback to another backend).

pub mod acl;
pub mod cuda;
mod dl;
pub mod host;

use std::sync::Arc;

use super::error::{XtError, XtResult};

/// Device kinds as the config names them (`DevicesConfig.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Cuda,
    Npu,
}

impl DeviceKind {
    pub fn parse(s: &str) -> XtResult<Self> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            "npu" => Ok(Self::Npu),
            other => Err(XtError::invalid(format!(
                "unknown device kind {other:?}: expected \"cpu\", \"cuda\" or \"npu\""
            ))),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Npu => "npu",
        }
    }
}

/// The physical pages of one device and the calls that map them.
///
/// Addresses are plain `usize` virtual addresses. `map` maps `count` physically
/// consecutive pages starting at `first_page` at `va`; `unmap` returns `[va, va+nbytes)`
/// to the reserved-but-unmapped state (the reservation stays).
pub trait Backend: Send + Sync {
    fn kind(&self) -> DeviceKind;
    fn page_size(&self) -> usize;
    fn num_pages(&self) -> usize;
    /// Reserve `nbytes` of virtual address space (nothing mapped, nothing accessible).
    fn reserve(&self, nbytes: usize) -> XtResult<usize>;
    /// Give back a reservation made by `reserve` (whatever is still mapped goes too).
    fn release(&self, va: usize, nbytes: usize) -> XtResult<()>;
    fn map(&self, va: usize, first_page: u32, count: usize) -> XtResult<()>;
    fn unmap(&self, va: usize, nbytes: usize) -> XtResult<()>;
}

/// Create the backend for `kind` with `num_pages` physical pages of `page_size` bytes.
pub fn create(
    kind: DeviceKind,
    num_pages: usize,
    page_size: usize,
    device_index: u32,
) -> XtResult<Arc<dyn Backend>> {
    Ok(match kind {
        DeviceKind::Cpu => Arc::new(host::HostBackend::new(num_pages, page_size)?),
        DeviceKind::Cuda => Arc::new(cuda::CudaBackend::new(num_pages, page_size, device_index)?),
        DeviceKind::Npu => Arc::new(acl::AclBackend::new(num_pages, page_size, device_index)?),
    })
}
