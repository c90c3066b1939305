//! The crate's only unsafe code: the C++ shim (csrc/shim.cpp) and loading libtorch_cuda.so.
//!
//! Why the dlopen: tch links `libtorch_cuda.so`, but the linker's `--as-needed` drops it
//! because no symbol of it is used directly, and the CUDA backend then never registers, so a
//! GPU machine silently trains on its CPU. Linking it with `--no-as-needed` instead would make
//! the binary fail to start on a CPU machine without the CUDA libraries. Loading it at start-up
//! with RTLD_GLOBAL registers the backend where it can, and falls back to the CPU where not.
#![allow(unsafe_code)]

use std::os::raw::c_int;
use std::sync::OnceLock;

extern "C" {
    fn trainer_autocast_set(device: c_int, enabled: c_int, dtype: c_int) -> c_int;
    fn trainer_autocast_enabled(device: c_int) -> c_int;
    fn trainer_cuda_peak_allocated(device: c_int) -> i64;
    fn trainer_cuda_reset_peak(device: c_int) -> c_int;
    fn trainer_cuda_empty_cache() -> c_int;
}

/// Which autocast state: device 0 = CPU, 1 = CUDA; dtype 0 = bf16, 1 = fp16.
pub(crate) fn autocast_set(cuda: bool, enabled: bool, fp16: bool) -> bool {
    // SAFETY: plain C ABI functions taking integers; the shim catches every C++ exception.
    unsafe { trainer_autocast_set(c_int::from(cuda), c_int::from(enabled), c_int::from(fp16)) == 0 }
}

pub(crate) fn autocast_enabled(cuda: bool) -> bool {
    // SAFETY: as above; reads thread-local state only.
    unsafe { trainer_autocast_enabled(c_int::from(cuda)) == 1 }
}

/// Peak bytes allocated on CUDA device `index` since the last reset.
pub(crate) fn cuda_peak_allocated(index: usize) -> Option<u64> {
    // SAFETY: as above; only called for a device index CUDA reported, and the shim returns
    // -1 rather than throwing for any other.
    let bytes = unsafe { trainer_cuda_peak_allocated(index as c_int) };
    u64::try_from(bytes).ok()
}

pub(crate) fn cuda_reset_peak(index: usize) {
    // SAFETY: as above.
    unsafe {
        trainer_cuda_reset_peak(index as c_int);
    }
}

/// Returns cached, unused blocks of the CUDA caching allocator to the driver.
pub(crate) fn cuda_empty_cache() {
    // SAFETY: as above; safe to call whether or not CUDA was initialised.
    unsafe {
        trainer_cuda_empty_cache();
    }
}

/// Hands memory glibc keeps after frees back to the system, so the next bench setting's peak
/// resident set is its own.
pub(crate) fn release_free_host_memory() {
    // SAFETY: malloc_trim only releases free heap pages; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

static CUDA: OnceLock<Result<(), String>> = OnceLock::new();

/// Loads libtorch_cuda.so once (first by name through the rpath, then from the directory the
/// crate was built against). `Err` says why CUDA is unavailable to this process.
pub fn load_cuda() -> Result<(), String> {
    CUDA.get_or_init(|| {
        use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
        let built_against = std::path::Path::new(env!("TRAINER_LIBTORCH_LIB")).join("libtorch_cuda.so");
        let mut errors = Vec::new();
        for candidate in [std::ffi::OsString::from("libtorch_cuda.so"), built_against.into_os_string()] {
            // SAFETY: loading libtorch's own CUDA library runs its static initialisers, which
            // register the CUDA backend with the libtorch already loaded; that is exactly what
            // the dynamic link would have done. The handle is kept for the process's lifetime.
            match unsafe { Library::open(Some(&candidate), RTLD_NOW | RTLD_GLOBAL) } {
                Ok(library) => {
                    std::mem::forget(library);
                    return Ok(());
                }
                Err(error) => errors.push(error.to_string()),
            }
        }
        Err(errors.join("; "))
    })
    .clone()
}
