//! Safe wrappers over csrc/ddp.cpp: a c10d process group (Gloo or NCCL) joined through a
//! TCPStore, and c10d's Reducer over a model's parameters.

use super::{tensor_ptrs, ErrorBuffer};
use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CString};
use std::time::Duration;
use tch::Tensor;

extern "C" {
    fn trainer_ddp_new(
        master_addr: *const c_char,
        port: c_int,
        rank: c_int,
        world: c_int,
        cuda_device: c_int,
        timeout_ms: i64,
        error: *mut c_char,
        error_len: usize,
    ) -> *mut c_void;
    fn trainer_ddp_attach(
        handle: *mut c_void,
        params: *const *const c_void,
        names: *const *const c_char,
        count: c_int,
        bucket_bytes: i64,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn trainer_ddp_prepare_forward(handle: *mut c_void, error: *mut c_char, error_len: usize) -> c_int;
    fn trainer_ddp_prepare_backward(handle: *mut c_void, error: *mut c_char, error_len: usize) -> c_int;
    fn trainer_ddp_broadcast(
        handle: *mut c_void,
        tensors: *const *const c_void,
        count: c_int,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn trainer_ddp_all_reduce_sum(
        handle: *mut c_void,
        tensor: *const c_void,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn trainer_ddp_free(handle: *mut c_void);
}

/// This process's membership of the run. After any failed collective it is left as it is when
/// dropped (tearing down a group whose peer died can wait on that peer); the process is about
/// to exit with the error anyway.
pub struct ProcessGroup {
    handle: *mut c_void,
    failed: Cell<bool>,
}

impl ProcessGroup {
    /// Joins `world` ranks at `master_addr:port` as `rank`: Gloo on the CPU, or NCCL on CUDA
    /// device `cuda_device`.
    pub fn join(
        master_addr: &str,
        port: u16,
        rank: usize,
        world: usize,
        cuda_device: Option<usize>,
        timeout: Duration,
    ) -> Result<ProcessGroup, String> {
        let address = CString::new(master_addr).map_err(|_| format!("MASTER_ADDR `{master_addr}` holds a NUL"))?;
        let mut error = ErrorBuffer::new();
        // SAFETY: a NUL-terminated string and integers in; a non-null result is a handle this
        // value owns from here on.
        let handle = unsafe {
            trainer_ddp_new(
                address.as_ptr(),
                c_int::from(port),
                rank as c_int,
                world as c_int,
                cuda_device.map_or(-1, |index| index as c_int),
                timeout.as_millis().min(i64::MAX as u128) as i64,
                error.as_mut_ptr(),
                error.len(),
            )
        };
        if handle.is_null() {
            return Err(error.message());
        }
        Ok(ProcessGroup { handle, failed: Cell::new(false) })
    }

    fn run(&self, call: impl FnOnce(*mut c_void, *mut c_char, usize) -> c_int) -> Result<(), String> {
        let mut error = ErrorBuffer::new();
        let status = call(self.handle, error.as_mut_ptr(), error.len());
        let result = error.check(status);
        if result.is_err() {
            self.failed.set(true);
        }
        result
    }

    /// Builds the Reducer over `params` (named for its messages), after checking that every
    /// rank has the same parameters.
    pub fn attach(&self, params: &[Tensor], names: &[String], bucket_bytes: usize) -> Result<(), String> {
        let pointers = tensor_ptrs(params);
        let names: Vec<CString> = names.iter().map(|name| CString::new(name.as_str()).unwrap_or_default()).collect();
        let name_pointers: Vec<*const c_char> = names.iter().map(|name| name.as_ptr()).collect();
        self.run(|handle, error, error_len| {
            // SAFETY: the handle is live; arrays of live tensors and C strings of the length
            // given, borrowed for the call (the Reducer keeps its own references).
            unsafe {
                trainer_ddp_attach(
                    handle,
                    pointers.as_ptr(),
                    name_pointers.as_ptr(),
                    pointers.len() as c_int,
                    bucket_bytes as i64,
                    error,
                    error_len,
                )
            }
        })
    }

    pub fn prepare_forward(&self) -> Result<(), String> {
        // SAFETY: the handle is live and attached.
        self.run(|handle, error, error_len| unsafe { trainer_ddp_prepare_forward(handle, error, error_len) })
    }

    pub fn prepare_backward(&self) -> Result<(), String> {
        // SAFETY: as above.
        self.run(|handle, error, error_len| unsafe { trainer_ddp_prepare_backward(handle, error, error_len) })
    }

    /// Overwrites `tensors` with rank 0's.
    pub fn broadcast(&self, tensors: &[Tensor]) -> Result<(), String> {
        if tensors.is_empty() {
            return Ok(());
        }
        let pointers = tensor_ptrs(tensors);
        // SAFETY: the handle is live; an array of live tensors of the length given.
        self.run(|handle, error, error_len| unsafe {
            trainer_ddp_broadcast(handle, pointers.as_ptr(), pointers.len() as c_int, error, error_len)
        })
    }

    /// Sums `tensor` over the ranks in place.
    pub fn all_reduce_sum(&self, tensor: &Tensor) -> Result<(), String> {
        // SAFETY: the handle is live; a live tensor borrowed for the call.
        self.run(|handle, error, error_len| unsafe {
            trainer_ddp_all_reduce_sum(handle, super::tensor_ptr(tensor), error, error_len)
        })
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if !self.failed.get() {
            // SAFETY: the handle came from trainer_ddp_new and is freed once, here.
            unsafe { trainer_ddp_free(self.handle) }
        }
    }
}
