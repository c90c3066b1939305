//! Mixed precision: autocast for the forward pass (bf16 on CPU or CUDA, fp16 on CUDA, through
//! the C++ shim since tch's own autocast is CUDA/fp16 only). The tensor half of dynamic loss
//! scaling (unscale and check) is one multi-tensor kernel in the shim (`ffi::unscale_grads`).

use crate::config::Amp;

/// Autocast on for as long as it lives (the forward pass and the loss).
pub struct Autocast {
    cuda: bool,
    active: bool,
}

impl Autocast {
    pub fn enter(amp: Amp, cuda: bool) -> Autocast {
        let active = amp != Amp::Off && super::ffi::autocast_set(cuda, true, amp == Amp::Fp16);
        Autocast { cuda, active }
    }

    pub fn active(&self) -> bool {
        self.active
    }
}

impl Drop for Autocast {
    fn drop(&mut self) {
        if self.active {
            super::ffi::autocast_set(self.cuda, false, false);
        }
    }
}

/// Whether autocast is on for this thread (tests).
pub fn autocast_enabled(cuda: bool) -> bool {
    super::ffi::autocast_enabled(cuda)
}
