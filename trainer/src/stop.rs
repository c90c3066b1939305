//! A run asked to stop: SIGTERM (a preemption, a cancel, a worker shutting down) lets the
//! epoch under way finish and be saved, then the run ends with exit status 143 (128 + SIGTERM)
//! and a next attempt resumes after that epoch (`resume`). `app train` turns the signal into
//! [`request`]; the training loop asks [`requested`] after each epoch's checkpoint. A signal
//! reaches one process, and the process is the run: hence one flag for it.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// The exit status of a run stopped this way, as a shell reports a SIGTERM.
pub const EXIT_STATUS: i32 = 128 + 15;

/// Asks the run to stop after the epoch under way.
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Whether the run was asked to stop.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// The line a stopped run ends with: after which epoch, and where a next attempt resumes.
pub fn sentence(epoch: usize, saved_for_resume: bool) -> String {
    match saved_for_resume {
        true => format!(
            "stopped by SIGTERM after epoch {epoch}, which is saved: a next attempt resumes at epoch {}",
            epoch + 1
        ),
        false => format!("stopped by SIGTERM after epoch {epoch} (no $APP_CHECKPOINT_DIR: nothing to resume from)"),
    }
}
