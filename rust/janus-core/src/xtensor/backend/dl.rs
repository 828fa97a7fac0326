//! Minimal run-time loading of a shared library (dlopen/dlsym), so that janus-core has
//! no link-time dependency on vendor drivers.

use std::ffi::{CStr, CString};

pub struct Library {
    handle: *mut libc::c_void,
    name: String,
}

// SAFETY: a dlopen handle may be used from any thread.
unsafe impl Send for Library {}
unsafe impl Sync for Library {}

fn dlerror_string() -> String {
    // SAFETY: dlerror returns a thread-local C string or null.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown dlopen error".to_string()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

impl Library {
    /// Open `name`; the error string is dlerror's text.
    pub fn open(name: &str) -> Result<Self, String> {
        let c = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: plain dlopen of a NUL-terminated name.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return Err(dlerror_string());
        }
        Ok(Self { handle, name: name.to_string() })
    }

    /// Look up `symbol` and reinterpret it as the function pointer type `T`.
    ///
    /// # Safety
    /// `T` must be the correct `extern "C" fn` type of the symbol.
    pub unsafe fn sym<T: Copy>(&self, symbol: &str) -> Result<T, String> {
        let c = CString::new(symbol).map_err(|e| e.to_string())?;
        let p = libc::dlsym(self.handle, c.as_ptr());
        if p.is_null() {
            return Err(format!("{}: missing symbol {symbol}", self.name));
        }
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut libc::c_void>());
        Ok(std::mem::transmute_copy::<*mut libc::c_void, T>(&p))
    }
}

/// The library to dlopen: `var` from the environment when set (an operator's path to a
/// specific driver build, or a test naming a missing one), else `default`.
pub fn library_name(var: &str, default: &str) -> String {
    std::env::var(var).ok().filter(|s| !s.is_empty()).unwrap_or_else(|| default.to_string())
}
