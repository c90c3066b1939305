//! Safe wrappers over csrc/checkpoint.cpp: state dicts in torch.save's format.

use super::{owned_tensor, tensor_ptrs, ErrorBuffer};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::Path;
use tch::Tensor;

extern "C" {
    fn trainer_save_state_dict(
        path: *const c_char,
        names: *const *const c_char,
        tensors: *const *const c_void,
        count: c_int,
        error: *mut c_char,
        error_len: usize,
    ) -> c_int;
    fn trainer_load_state_dict(path: *const c_char, error: *mut c_char, error_len: usize) -> *mut c_void;
    fn trainer_state_dict_len(handle: *mut c_void) -> c_int;
    fn trainer_state_dict_name(handle: *mut c_void, index: c_int) -> *const c_char;
    fn trainer_state_dict_tensor(handle: *mut c_void, index: c_int) -> *mut c_void;
    fn trainer_state_dict_free(handle: *mut c_void);
}

fn c_path(path: &Path) -> Result<CString, String> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| format!("{} holds a NUL", path.display()))
}

/// Writes `{name: tensor}` as torch.save would (CPU copies of the tensors).
pub fn save_state_dict(path: &Path, entries: &[(String, Tensor)]) -> Result<(), String> {
    let path = c_path(path)?;
    let names: Vec<CString> = entries.iter().map(|(name, _)| CString::new(name.as_str()).unwrap_or_default()).collect();
    let name_pointers: Vec<*const c_char> = names.iter().map(|name| name.as_ptr()).collect();
    let tensors: Vec<Tensor> = entries.iter().map(|(_, tensor)| tensor.shallow_clone()).collect();
    let pointers = tensor_ptrs(&tensors);
    let mut error = ErrorBuffer::new();
    // SAFETY: C strings and live tensors, arrays of the length given, borrowed for the call.
    let status = unsafe {
        trainer_save_state_dict(
            path.as_ptr(),
            name_pointers.as_ptr(),
            pointers.as_ptr(),
            pointers.len() as c_int,
            error.as_mut_ptr(),
            error.len(),
        )
    };
    error.check(status)
}

/// A state dict file's entries, in the file's order, on the CPU.
pub fn load_state_dict(path: &Path) -> Result<Vec<(String, Tensor)>, String> {
    let path = c_path(path)?;
    let mut error = ErrorBuffer::new();
    // SAFETY: a C string in; a non-null handle is read below and freed once.
    unsafe {
        let handle = trainer_load_state_dict(path.as_ptr(), error.as_mut_ptr(), error.len());
        if handle.is_null() {
            return Err(error.message());
        }
        let count = trainer_state_dict_len(handle);
        let mut entries = Vec::with_capacity(count.max(0) as usize);
        for index in 0..count {
            let name = CStr::from_ptr(trainer_state_dict_name(handle, index)).to_string_lossy().into_owned();
            entries.push((name, owned_tensor(trainer_state_dict_tensor(handle, index))));
        }
        trainer_state_dict_free(handle);
        Ok(entries)
    }
}
