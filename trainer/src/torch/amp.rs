//! Mixed precision: autocast for the forward pass (bf16 on CPU or CUDA, fp16 on CUDA, through
//! the C++ shim since tch's own autocast is CUDA/fp16 only), and the tensor half of dynamic
//! loss scaling: unscale the gradients and check them for inf/NaN.

use crate::config::Amp;
use tch::Tensor;

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

/// Multiplies every gradient by `1 / scale` in place and says whether any holds an inf or
/// NaN (one device-to-host read per step, as torch's GradScaler does).
pub fn unscale_and_check(variables: &[Tensor], scale: f64) -> bool {
    tch::no_grad(|| {
        let mut flags = Vec::with_capacity(variables.len());
        for variable in variables {
            let mut grad = variable.grad();
            if grad.defined() {
                let _ = grad.g_mul_scalar_(1.0 / scale);
                flags.push(grad.isfinite().all().logical_not());
            }
        }
        !flags.is_empty() && Tensor::stack(&flags, 0).any().int64_value(&[]) != 0
    })
}
