//! Host backend (cpu devices): the physical pool is one memfd; a page is a page-sized
//! offset in it. Reserving is an inaccessible anonymous mapping (PROT_NONE, NORESERVE);
//! mapping a page is mmap(MAP_FIXED|MAP_SHARED) of the memfd at that page's offset, so
//! the same physical page can appear at several virtual addresses (real remapping);
//! unmapping puts a PROT_NONE anonymous mapping back so the reservation stays.
//!
//! Freed pages keep their bytes (like device memory): nobody zeroes them.

use std::io;

use super::{Backend, DeviceKind};
use crate::xtensor::error::{XtError, XtResult};

pub struct HostBackend {
    fd: libc::c_int,
    page_size: usize,
    num_pages: usize,
}

fn os_err(what: &str) -> XtError {
    XtError::backend(format!("host backend: {what}: {}", io::Error::last_os_error()))
}

fn host_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

impl HostBackend {
    pub fn new(num_pages: usize, page_size: usize) -> XtResult<Self> {
        let os_page = host_page_size();
        if page_size == 0 || page_size.checked_rem(os_page) != Some(0) {
            return Err(XtError::invalid(format!(
                "page_size must be a positive multiple of the OS page size {os_page}, got {page_size}"
            )));
        }
        let total = num_pages
            .checked_mul(page_size)
            .filter(|&t| t <= i64::MAX as usize)
            .ok_or_else(|| XtError::invalid("num_pages * page_size overflows"))?;
        // SAFETY: memfd_create with a static NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"janus-xtensor".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(os_err("memfd_create"));
        }
        // SAFETY: fd is ours.
        if unsafe { libc::ftruncate(fd, total as libc::off_t) } != 0 {
            let e = os_err("ftruncate of the page pool memfd");
            unsafe { libc::close(fd) };
            return Err(e);
        }
        Ok(Self { fd, page_size, num_pages })
    }

    pub fn fd(&self) -> libc::c_int {
        self.fd
    }
}

impl Drop for HostBackend {
    fn drop(&mut self) {
        // Existing mappings keep the memfd's pages alive; closing the fd is always safe.
        unsafe { libc::close(self.fd) };
    }
}

impl Backend for HostBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }
    fn page_size(&self) -> usize {
        self.page_size
    }
    fn num_pages(&self) -> usize {
        self.num_pages
    }

    fn reserve(&self, nbytes: usize) -> XtResult<usize> {
        if nbytes == 0 {
            return Err(XtError::invalid("cannot reserve 0 bytes"));
        }
        // SAFETY: a fresh anonymous mapping chosen by the kernel.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                nbytes,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_err(&format!("reserve {nbytes} bytes")));
        }
        Ok(p as usize)
    }

    fn release(&self, va: usize, nbytes: usize) -> XtResult<()> {
        // SAFETY: [va, va+nbytes) is a reservation we made; nothing else lives there.
        if unsafe { libc::munmap(va as *mut libc::c_void, nbytes) } != 0 {
            return Err(os_err("munmap of a reservation"));
        }
        Ok(())
    }

    fn map(&self, va: usize, first_page: u32, count: usize) -> XtResult<()> {
        if first_page as usize + count > self.num_pages {
            return Err(XtError::invalid(format!("pages {first_page}+{count} out of range")));
        }
        let len = count * self.page_size;
        // SAFETY: va lies inside one of our reservations (callers guarantee it).
        let p = unsafe {
            libc::mmap(
                va as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                self.fd,
                (first_page as usize * self.page_size) as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED || p as usize != va {
            return Err(os_err(&format!("map {count} page(s) at {va:#x}")));
        }
        Ok(())
    }

    fn unmap(&self, va: usize, nbytes: usize) -> XtResult<()> {
        // SAFETY: as in map; replaces the mapping with an inaccessible reservation.
        let p = unsafe {
            libc::mmap(
                va as *mut libc::c_void,
                nbytes,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os_err(&format!("unmap {nbytes} bytes at {va:#x}")));
        }
        Ok(())
    }
}
