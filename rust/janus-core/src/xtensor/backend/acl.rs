//! npu backend: Ascend ACL through the C shim `csrc/acl_shim.c`, which dlopens
//! libascendcl.so at run time. One physical allocation (aclrtMallocPhysical) per page;
//! map/unmap page by page (aclrtMapMem/aclrtUnmapMem work on whole allocations).
//! Streams: [`AclStream`] (create / synchronize / destroy).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Mutex;

use super::{Backend, DeviceKind};
use crate::xtensor::error::{XtError, XtResult};

pub const LIBRARY: &str = "libascendcl.so";

extern "C" {
    fn janus_acl_load(libname: *const c_char, err: *mut c_char, errlen: usize) -> c_int;
    fn janus_acl_open_device(device: i32) -> c_int;
    fn janus_acl_reserve(size: usize, out: *mut *mut c_void) -> c_int;
    fn janus_acl_release(va: *mut c_void) -> c_int;
    fn janus_acl_malloc_physical(size: usize, device: i32, handle: *mut *mut c_void) -> c_int;
    fn janus_acl_free_physical(handle: *mut c_void) -> c_int;
    fn janus_acl_map(va: *mut c_void, size: usize, handle: *mut c_void) -> c_int;
    fn janus_acl_unmap(va: *mut c_void) -> c_int;
    fn janus_acl_stream_create(out: *mut *mut c_void) -> c_int;
    fn janus_acl_stream_synchronize(stream: *mut c_void) -> c_int;
    fn janus_acl_stream_destroy(stream: *mut c_void) -> c_int;
}

fn check(rc: c_int, what: &str) -> XtResult<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(XtError::backend(format!("npu backend: {what} failed (aclError {rc})")))
    }
}

/// Load libascendcl.so (once per process). Errors name the library and dlerror's text.
pub fn load() -> XtResult<()> {
    let mut err = [0 as c_char; 512];
    let name = super::dl::library_name("JANUSD_ACL_LIBRARY", LIBRARY);
    let c_name = std::ffi::CString::new(name.clone())
        .map_err(|_| XtError::backend(format!("npu backend: bad library name {name:?}")))?;
    // SAFETY: valid NUL-terminated name and a writable buffer of the given length.
    let rc = unsafe { janus_acl_load(c_name.as_ptr(), err.as_mut_ptr(), err.len()) };
    if rc != 0 {
        // SAFETY: the shim always NUL-terminates err (snprintf).
        let msg = unsafe { CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned();
        return Err(XtError::backend(format!("npu backend: cannot load {name} ({msg})")));
    }
    Ok(())
}

pub struct AclBackend {
    handles: Vec<usize>,
    page_size: usize,
    /// Page-sized mapped addresses, so `release` can unmap what is still mapped.
    mapped: Mutex<std::collections::BTreeSet<usize>>,
}

impl AclBackend {
    pub fn new(num_pages: usize, page_size: usize, device_index: u32) -> XtResult<Self> {
        load()?;
        if page_size == 0 || page_size.checked_rem(2 << 20) != Some(0) {
            return Err(XtError::invalid(format!(
                "npu backend: page_size must be a multiple of 2 MiB, got {page_size}"
            )));
        }
        let dev = device_index as i32;
        check(unsafe { janus_acl_open_device(dev) }, "aclInit/aclrtSetDevice")?;
        let mut b = Self { handles: Vec::with_capacity(num_pages), page_size, mapped: Mutex::default() };
        for i in 0..num_pages {
            let mut h: *mut c_void = std::ptr::null_mut();
            // SAFETY: h is a valid out pointer.
            check(
                unsafe { janus_acl_malloc_physical(page_size, dev, &mut h) },
                &format!("aclrtMallocPhysical of page {i}"),
            )?; // on error, Drop frees the pages made so far
            b.handles.push(h as usize);
        }
        Ok(b)
    }
}

impl Drop for AclBackend {
    fn drop(&mut self) {
        for &h in &self.handles {
            unsafe { janus_acl_free_physical(h as *mut c_void) };
        }
    }
}

impl Backend for AclBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Npu
    }
    fn page_size(&self) -> usize {
        self.page_size
    }
    fn num_pages(&self) -> usize {
        self.handles.len()
    }
    fn reserve(&self, nbytes: usize) -> XtResult<usize> {
        let mut p: *mut c_void = std::ptr::null_mut();
        check(unsafe { janus_acl_reserve(nbytes, &mut p) }, "aclrtReserveMemAddress")?;
        Ok(p as usize)
    }
    fn release(&self, va: usize, nbytes: usize) -> XtResult<()> {
        let inside: Vec<usize> =
            self.mapped.lock().unwrap().range(va..va + nbytes).copied().collect();
        for a in inside {
            self.unmap(a, self.page_size)?;
        }
        check(unsafe { janus_acl_release(va as *mut c_void) }, "aclrtReleaseMemAddress")
    }
    /// All or nothing: a failure part-way unmaps the pages this call mapped (the caller's
    /// rollback only undoes earlier calls).
    fn map(&self, va: usize, first_page: u32, count: usize) -> XtResult<()> {
        if first_page as usize + count > self.handles.len() {
            return Err(XtError::invalid(format!("pages {first_page}+{count} out of range")));
        }
        for i in 0..count {
            let h = self.handles[first_page as usize + i];
            let a = va + i * self.page_size;
            if let Err(e) = check(unsafe { janus_acl_map(a as *mut c_void, self.page_size, h as *mut c_void) }, "aclrtMapMem") {
                if i > 0 {
                    let _ = self.unmap(va, i * self.page_size);
                }
                return Err(e);
            }
            self.mapped.lock().unwrap().insert(a);
        }
        Ok(())
    }
    fn unmap(&self, va: usize, nbytes: usize) -> XtResult<()> {
        for i in 0..nbytes / self.page_size {
            let a = va + i * self.page_size;
            check(unsafe { janus_acl_unmap(a as *mut c_void) }, "aclrtUnmapMem")?;
            self.mapped.lock().unwrap().remove(&a);
        }
        Ok(())
    }
}

/// One ACL stream (one per model: PAPER.md §7, compute sharing).
pub struct AclStream(usize);

impl AclStream {
    pub fn new() -> XtResult<Self> {
        load()?;
        let mut s: *mut c_void = std::ptr::null_mut();
        check(unsafe { janus_acl_stream_create(&mut s) }, "aclrtCreateStream")?;
        Ok(Self(s as usize))
    }
    pub fn synchronize(&self) -> XtResult<()> {
        check(unsafe { janus_acl_stream_synchronize(self.0 as *mut c_void) }, "aclrtSynchronizeStream")
    }
    pub fn raw(&self) -> usize {
        self.0
    }
}

impl Drop for AclStream {
    fn drop(&mut self) {
        unsafe { janus_acl_stream_destroy(self.0 as *mut c_void) };
    }
}
