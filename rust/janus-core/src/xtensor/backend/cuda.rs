//! cuda backend: the CUDA driver's virtual memory management API, loaded at run time
//! from libcuda.so.1 (dlopen; no link-time dependency). One physical allocation
//! (cuMemCreate) per page; cuMemMap + cuMemSetAccess per mapping; cuMemUnmap page by page
//! (an unmap must cover whole earlier mappings).

use std::collections::BTreeSet;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::Mutex;

use super::dl::Library;
use super::{Backend, DeviceKind};
use crate::xtensor::error::{XtError, XtResult};

pub const LIBRARY: &str = "libcuda.so.1";

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
type CuDevicePtr = u64;
type CuMemHandle = u64;

#[repr(C)]
#[derive(Clone, Copy)]
struct CuMemLocation {
    kind: c_int, // CU_MEM_LOCATION_TYPE_DEVICE = 1
    id: c_int,
}

#[repr(C)]
struct CuMemAllocationProp {
    kind: c_int,                   // CU_MEM_ALLOCATION_TYPE_PINNED = 1
    requested_handle_types: c_int, // CU_MEM_HANDLE_TYPE_NONE = 0
    location: CuMemLocation,
    win32_handle_meta_data: *mut c_void,
    compression_type: u8,
    gpu_direct_rdma_capable: u8,
    usage: u16,
    reserved: [u8; 4],
}

#[repr(C)]
struct CuMemAccessDesc {
    location: CuMemLocation,
    flags: c_int, // CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
}

#[derive(Clone, Copy)]
struct Api {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    granularity: unsafe extern "C" fn(*mut usize, *const CuMemAllocationProp, c_int) -> CuResult,
    address_reserve: unsafe extern "C" fn(*mut CuDevicePtr, usize, usize, CuDevicePtr, u64) -> CuResult,
    address_free: unsafe extern "C" fn(CuDevicePtr, usize) -> CuResult,
    create: unsafe extern "C" fn(*mut CuMemHandle, usize, *const CuMemAllocationProp, u64) -> CuResult,
    release: unsafe extern "C" fn(CuMemHandle) -> CuResult,
    map: unsafe extern "C" fn(CuDevicePtr, usize, usize, CuMemHandle, u64) -> CuResult,
    unmap: unsafe extern "C" fn(CuDevicePtr, usize) -> CuResult,
    set_access: unsafe extern "C" fn(CuDevicePtr, usize, *const CuMemAccessDesc, usize) -> CuResult,
}

/// Load libcuda.so.1 and resolve the VMM entry points. The error names the library.
fn load() -> XtResult<(Library, Api)> {
    let name = super::dl::library_name("JANUSD_CUDA_LIBRARY", LIBRARY);
    let lib = Library::open(&name)
        .map_err(|e| XtError::backend(format!("cuda backend: cannot load {name} ({e})")))?;
    let sym_err = |e: String| XtError::backend(format!("cuda backend: {e}"));
    // SAFETY: the types match the CUDA driver API prototypes (cuda.h).
    let api = unsafe {
        Api {
            init: lib.sym("cuInit").map_err(sym_err)?,
            device_get: lib.sym("cuDeviceGet").map_err(sym_err)?,
            primary_ctx_retain: lib.sym("cuDevicePrimaryCtxRetain").map_err(sym_err)?,
            ctx_set_current: lib.sym("cuCtxSetCurrent").map_err(sym_err)?,
            get_error_string: lib.sym("cuGetErrorString").map_err(sym_err)?,
            granularity: lib.sym("cuMemGetAllocationGranularity").map_err(sym_err)?,
            address_reserve: lib.sym("cuMemAddressReserve").map_err(sym_err)?,
            address_free: lib.sym("cuMemAddressFree").map_err(sym_err)?,
            create: lib.sym("cuMemCreate").map_err(sym_err)?,
            release: lib.sym("cuMemRelease").map_err(sym_err)?,
            map: lib.sym("cuMemMap").map_err(sym_err)?,
            unmap: lib.sym("cuMemUnmap").map_err(sym_err)?,
            set_access: lib.sym("cuMemSetAccess").map_err(sym_err)?,
        }
    };
    Ok((lib, api))
}

pub struct CudaBackend {
    _lib: Library,
    api: Api,
    ctx: usize,
    device: c_int,
    page_size: usize,
    handles: Vec<CuMemHandle>,
    mapped: Mutex<BTreeSet<usize>>,
}

impl CudaBackend {
    pub fn new(num_pages: usize, page_size: usize, device_index: u32) -> XtResult<Self> {
        let (lib, api) = load()?;
        let mut b = Self {
            _lib: lib,
            api,
            ctx: 0,
            device: 0,
            page_size,
            handles: Vec::with_capacity(num_pages),
            mapped: Mutex::default(),
        };
        b.check(unsafe { (api.init)(0) }, "cuInit")?;
        let mut dev: CuDevice = 0;
        b.check(unsafe { (api.device_get)(&mut dev, device_index as c_int) }, "cuDeviceGet")?;
        b.device = dev;
        let mut ctx: CuContext = std::ptr::null_mut();
        b.check(unsafe { (api.primary_ctx_retain)(&mut ctx, dev) }, "cuDevicePrimaryCtxRetain")?;
        b.ctx = ctx as usize;
        b.set_current()?;
        let prop = b.prop();
        let mut gran = 0usize;
        b.check(unsafe { (api.granularity)(&mut gran, &prop, 0) }, "cuMemGetAllocationGranularity")?;
        if page_size == 0 || gran == 0 || page_size.checked_rem(gran) != Some(0) {
            return Err(XtError::invalid(format!(
                "cuda backend: page_size {page_size} is not a multiple of the allocation granularity {gran}"
            )));
        }
        for i in 0..num_pages {
            let mut h: CuMemHandle = 0;
            b.check(unsafe { (api.create)(&mut h, page_size, &prop, 0) }, &format!("cuMemCreate of page {i}"))?;
            b.handles.push(h); // on error, Drop releases the pages made so far
        }
        Ok(b)
    }

    fn prop(&self) -> CuMemAllocationProp {
        CuMemAllocationProp {
            kind: 1,
            requested_handle_types: 0,
            location: CuMemLocation { kind: 1, id: self.device },
            win32_handle_meta_data: std::ptr::null_mut(),
            compression_type: 0,
            gpu_direct_rdma_capable: 0,
            usage: 0,
            reserved: [0; 4],
        }
    }

    fn check(&self, rc: CuResult, what: &str) -> XtResult<()> {
        if rc == 0 {
            return Ok(());
        }
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString writes a static string pointer.
        let text = unsafe {
            if (self.api.get_error_string)(rc, &mut s) == 0 && !s.is_null() {
                CStr::from_ptr(s).to_string_lossy().into_owned()
            } else {
                "unknown error".to_string()
            }
        };
        Err(XtError::backend(format!("cuda backend: {what} failed: CUresult {rc} ({text})")))
    }

    /// Driver calls act on the calling thread's current context (the background refill
    /// thread included), so every entry point makes the primary context current.
    fn set_current(&self) -> XtResult<()> {
        self.check(unsafe { (self.api.ctx_set_current)(self.ctx as CuContext) }, "cuCtxSetCurrent")
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let _ = self.set_current();
        for &h in &self.handles {
            unsafe { (self.api.release)(h) };
        }
    }
}

impl CudaBackend {
    fn map_pages(&self, va: usize, first_page: u32, count: usize, done: &mut usize) -> XtResult<()> {
        for i in 0..count {
            let h = self.handles[first_page as usize + i];
            let a = va + i * self.page_size;
            self.check(unsafe { (self.api.map)(a as CuDevicePtr, self.page_size, 0, h, 0) }, "cuMemMap")?;
            self.mapped.lock().unwrap().insert(a);
            *done += 1;
        }
        let desc = CuMemAccessDesc { location: CuMemLocation { kind: 1, id: self.device }, flags: 3 };
        self.check(
            unsafe { (self.api.set_access)(va as CuDevicePtr, count * self.page_size, &desc, 1) },
            "cuMemSetAccess",
        )
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }
    fn page_size(&self) -> usize {
        self.page_size
    }
    fn num_pages(&self) -> usize {
        self.handles.len()
    }
    fn reserve(&self, nbytes: usize) -> XtResult<usize> {
        self.set_current()?;
        let mut p: CuDevicePtr = 0;
        self.check(
            unsafe { (self.api.address_reserve)(&mut p, nbytes, self.page_size, 0, 0) },
            &format!("cuMemAddressReserve of {nbytes} bytes"),
        )?;
        Ok(p as usize)
    }
    fn release(&self, va: usize, nbytes: usize) -> XtResult<()> {
        let inside: Vec<usize> = self.mapped.lock().unwrap().range(va..va + nbytes).copied().collect();
        for a in inside {
            self.unmap(a, self.page_size)?;
        }
        self.set_current()?;
        self.check(unsafe { (self.api.address_free)(va as CuDevicePtr, nbytes) }, "cuMemAddressFree")
    }
    /// All or nothing, like the host backend: if a page fails to map (or access cannot be
    /// set), the pages this call mapped are unmapped again, so the caller's rollback (which
    /// only undoes earlier calls) leaves no stray mapping that would make a later cuMemMap
    /// at these addresses fail.
    fn map(&self, va: usize, first_page: u32, count: usize) -> XtResult<()> {
        if first_page as usize + count > self.handles.len() {
            return Err(XtError::invalid(format!("pages {first_page}+{count} out of range")));
        }
        self.set_current()?;
        let mut done = 0;
        let result = self.map_pages(va, first_page, count, &mut done);
        if result.is_err() && done > 0 {
            let _ = self.unmap(va, done * self.page_size);
        }
        result
    }
    fn unmap(&self, va: usize, nbytes: usize) -> XtResult<()> {
        self.set_current()?;
        for i in 0..nbytes / self.page_size {
            let a = va + i * self.page_size;
            self.check(unsafe { (self.api.unmap)(a as CuDevicePtr, self.page_size) }, "cuMemUnmap")?;
            self.mapped.lock().unwrap().remove(&a);
        }
        Ok(())
    }
}
