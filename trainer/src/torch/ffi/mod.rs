//! The crate's only unsafe code: the C++ shim (csrc/) and loading libtorch_cuda.so. Each
//! submodule wraps one shim file in safe functions; tensors cross as tch's `C_tensor`
//! pointers, borrowed for the call, and tensors the shim creates come back owned by tch.
//!
//! Why the dlopen: tch links `libtorch_cuda.so`, but the linker's `--as-needed` drops it
//! because no symbol of it is used directly, and the CUDA backend then never registers, so a
//! GPU machine silently trains on its CPU. Linking it with `--no-as-needed` instead would make
//! the binary fail to start on a CPU machine without the CUDA libraries. Loading it at start-up
//! with RTLD_GLOBAL registers the backend where it can, and falls back to the CPU where not.
#![allow(unsafe_code)]

pub mod checkpoint;
pub mod ddp;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;
use tch::Tensor;

extern "C" {
    fn trainer_autocast_set(device: c_int, enabled: c_int, dtype: c_int) -> c_int;
    fn trainer_autocast_enabled(device: c_int) -> c_int;
    fn trainer_set_tf32(enabled: c_int) -> c_int;
    fn trainer_cuda_peak_allocated(device: c_int) -> i64;
    fn trainer_cuda_reset_peak(device: c_int) -> c_int;
    fn trainer_cuda_empty_cache() -> c_int;
    fn trainer_cuda_set_device(index: c_int, error: *mut c_char, error_len: usize) -> c_int;
    fn trainer_empty_pinned(like: *const c_void, rows: i64, error: *mut c_char, error_len: usize) -> *mut c_void;
    fn trainer_h2d_start(
        source: *const c_void,
        device: c_int,
        out: *mut *mut c_void,
        error: *mut c_char,
        error_len: usize,
    ) -> *mut c_void;
    fn trainer_h2d_wait(handle: *mut c_void, tensor: *const c_void, error: *mut c_char, error_len: usize) -> c_int;
    fn trainer_d2h_pinned(
        sources: *const *const c_void,
        count: c_int,
        outs: *mut *mut c_void,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn trainer_clip_grad_norm(
        params: *const *const c_void,
        count: c_int,
        max_norm: f64,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn trainer_unscale_grads(
        params: *const *const c_void,
        count: c_int,
        inv_scale: f64,
        found_inf: *mut c_int,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn trainer_set_thread_omp_threads(threads: c_int) -> c_int;
}

/// A buffer for the shim's error messages.
pub(crate) struct ErrorBuffer([c_char; 1024]);

impl ErrorBuffer {
    pub(crate) fn new() -> ErrorBuffer {
        ErrorBuffer([0; 1024])
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut c_char {
        self.0.as_mut_ptr()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The first line of the message (libtorch appends a C++ backtrace after it).
    pub(crate) fn message(&self) -> String {
        // SAFETY: the buffer is zeroed at creation and the shim always writes a NUL-terminated
        // string that fits (trainer_copy_error), so it holds a valid C string.
        let text = unsafe { CStr::from_ptr(self.0.as_ptr()) }.to_string_lossy();
        super::first_line(&text)
    }

    /// `Ok` for status 0, else the message.
    pub(crate) fn check(&self, status: c_int) -> Result<(), String> {
        if status == 0 {
            Ok(())
        } else {
            Err(self.message())
        }
    }
}

pub(crate) fn tensor_ptr(tensor: &Tensor) -> *const c_void {
    tensor.as_ptr().cast()
}

fn tensor_ptrs(tensors: &[Tensor]) -> Vec<*const c_void> {
    tensors.iter().map(tensor_ptr).collect()
}

/// Takes ownership of a tensor the shim allocated with `new at::Tensor`.
///
/// # Safety
/// `pointer` must be such a tensor, not null, and not owned by anything else.
pub(crate) unsafe fn owned_tensor(pointer: *mut c_void) -> Tensor {
    // SAFETY: per the contract above; tch frees it with `at_free`, i.e. `delete`.
    unsafe { Tensor::from_ptr(pointer.cast()) }
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

/// TF32 for CUDA matmuls and convolutions, or IEEE fp32.
pub(crate) fn set_tf32(enabled: bool) -> bool {
    // SAFETY: as above; sets two fields of libtorch's global context.
    unsafe { trainer_set_tf32(c_int::from(enabled)) == 0 }
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

/// Makes CUDA device `index` this thread's current device.
pub(crate) fn cuda_set_device(index: usize) -> Result<(), String> {
    let mut error = ErrorBuffer::new();
    // SAFETY: integers in, a buffer of the length passed for the message.
    let status = unsafe { trainer_cuda_set_device(index as c_int, error.as_mut_ptr(), error.len()) };
    error.check(status)
}

/// An uninitialised page-locked tensor like `like` with `rows` rows (CUDA machines only).
pub(crate) fn empty_pinned(like: &Tensor, rows: i64) -> Result<Tensor, String> {
    let mut error = ErrorBuffer::new();
    // SAFETY: `like` is a live tensor borrowed for the call; a non-null result is a new
    // tensor that nothing else owns.
    unsafe {
        let pointer = trainer_empty_pinned(tensor_ptr(like), rows, error.as_mut_ptr(), error.len());
        if pointer.is_null() {
            Err(error.message())
        } else {
            Ok(owned_tensor(pointer))
        }
    }
}

/// A host-to-device copy running on a side stream.
pub(crate) struct PendingCopy {
    handle: *mut c_void,
    tensor: Option<Tensor>,
}

impl PendingCopy {
    /// Makes the compute stream wait for the copy and hands over the device tensor.
    pub(crate) fn finish(mut self) -> Result<Tensor, String> {
        let tensor = self.tensor.take().expect("a pending copy holds its tensor");
        let handle = std::mem::replace(&mut self.handle, std::ptr::null_mut());
        let mut error = ErrorBuffer::new();
        // SAFETY: `handle` came from trainer_h2d_start and is consumed (freed) here, once.
        let status = unsafe { trainer_h2d_wait(handle, tensor_ptr(&tensor), error.as_mut_ptr(), error.len()) };
        error.check(status).map(|()| tensor)
    }
}

impl Drop for PendingCopy {
    fn drop(&mut self) {
        if !self.handle.is_null() {
            if let Some(tensor) = &self.tensor {
                let mut error = ErrorBuffer::new();
                // SAFETY: as in `finish`; an unused copy is still waited for and freed once.
                unsafe {
                    trainer_h2d_wait(self.handle, tensor_ptr(tensor), error.as_mut_ptr(), error.len());
                }
            }
        }
    }
}

/// Starts copying `source` (best page-locked) to CUDA device `device` on a side stream.
pub(crate) fn copy_to_cuda(source: &Tensor, device: usize) -> Result<PendingCopy, String> {
    let mut error = ErrorBuffer::new();
    let mut out: *mut c_void = std::ptr::null_mut();
    // SAFETY: `source` is borrowed for the call; on success the shim sets `out` to a new
    // tensor and returns the copy's handle, both owned by the PendingCopy from here on.
    unsafe {
        let handle = trainer_h2d_start(tensor_ptr(source), device as c_int, &mut out, error.as_mut_ptr(), error.len());
        if handle.is_null() || out.is_null() {
            return Err(error.message());
        }
        Ok(PendingCopy { handle, tensor: Some(owned_tensor(out)) })
    }
}

/// The tensors on the host, contiguous: GPU tensors copied into page-locked memory on a side
/// stream (the calling thread waits for the copies, training on the default stream does not),
/// host tensors as they are.
pub(crate) fn copy_to_host(sources: &[Tensor]) -> Result<Vec<Tensor>, String> {
    let pointers = tensor_ptrs(sources);
    let mut outs: Vec<*mut c_void> = vec![std::ptr::null_mut(); sources.len()];
    let mut error = ErrorBuffer::new();
    // SAFETY: an array of live tensors borrowed for the call and an array of as many slots;
    // on success the shim fills every slot with a new tensor that nothing else owns.
    unsafe {
        let status = trainer_d2h_pinned(
            pointers.as_ptr(),
            pointers.len() as c_int,
            outs.as_mut_ptr(),
            error.as_mut_ptr(),
            error.len(),
        );
        error.check(status)?;
        Ok(outs.into_iter().map(|pointer| owned_tensor(pointer)).collect())
    }
}

/// Clips the gradients' global L2 norm to `max_norm` on the device (no host sync).
pub(crate) fn clip_grad_norm(params: &[Tensor], max_norm: f64) -> Result<(), String> {
    let pointers = tensor_ptrs(params);
    let mut error = ErrorBuffer::new();
    // SAFETY: an array of live tensors borrowed for the call, with its length.
    let status = unsafe {
        trainer_clip_grad_norm(pointers.as_ptr(), pointers.len() as c_int, max_norm, error.as_mut_ptr(), error.len())
    };
    error.check(status)
}

/// Multiplies the gradients by `1 / scale`; whether any of them holds an inf or NaN.
pub(crate) fn unscale_grads(params: &[Tensor], scale: f64) -> Result<bool, String> {
    let pointers = tensor_ptrs(params);
    let mut error = ErrorBuffer::new();
    let mut found: c_int = 0;
    // SAFETY: as above, plus an int the shim writes.
    let status = unsafe {
        trainer_unscale_grads(
            pointers.as_ptr(),
            pointers.len() as c_int,
            1.0 / scale,
            &mut found,
            error.as_mut_ptr(),
            error.len(),
        )
    };
    error.check(status).map(|()| found != 0)
}

/// OpenMP threads of the calling thread only.
pub(crate) fn set_thread_omp_threads(threads: usize) {
    // SAFETY: an integer in; the shim looks omp_set_num_threads up and does nothing without it.
    unsafe {
        trainer_set_thread_omp_threads(threads.max(1) as c_int);
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
/// crate was built against). `Err` holds the loader's messages.
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

/// Whether the NVIDIA driver library can be loaded (CUDA's device count is 0 without it).
pub fn driver_present() -> Result<(), String> {
    use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};
    // SAFETY: libcuda.so.1's initialisers only set up the driver's own state; it is the
    // library libtorch's CUDA runtime loads anyway, and the handle is dropped (refcounted).
    unsafe { Library::open(Some("libcuda.so.1"), RTLD_NOW | RTLD_LOCAL) }.map(drop).map_err(|error| error.to_string())
}

/// Free and total bytes of CUDA device `index` (cudaMemGetInfo, found in the CUDA runtime
/// libtorch_cuda loaded).
pub(crate) fn cuda_memory_info(index: usize) -> Option<(u64, u64)> {
    type MemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> c_int;
    cuda_set_device(index).ok()?;
    // SAFETY: dlsym on the global namespace with a NUL-terminated name; the symbol, when
    // there, is cudaMemGetInfo(size_t*, size_t*) -> cudaError_t.
    unsafe {
        let symbol = libc::dlsym(libc::RTLD_DEFAULT, c"cudaMemGetInfo".as_ptr());
        if symbol.is_null() {
            return None;
        }
        let get: MemGetInfo = std::mem::transmute::<*mut c_void, MemGetInfo>(symbol);
        let (mut free, mut total) = (0usize, 0usize);
        (get(&mut free, &mut total) == 0).then_some((free as u64, total as u64))
    }
}
