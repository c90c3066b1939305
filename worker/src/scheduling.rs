//! The worker gives the CPU to its jobs first: its own threads run as `SCHED_BATCH`, its jobs
//! as `SCHED_OTHER`, as they would from a shell.
//!
//! A `SCHED_BATCH` thread gets its fair share of CPU time, but when it wakes (a job's end, a
//! log chunk, a heartbeat, the server's answer) it does not preempt the process running on that
//! CPU: it waits for its turn. Measured on a 2-core box with `sleep 0.01` jobs
//! (`bench/job_startup.py`), the worker's own thread had preempted the jobs' start-ups 164–171
//! times per 400 jobs.
//!
//! The crate's only unsafe code: neither std nor nix wraps `sched_setscheduler`.
#![allow(unsafe_code)]

/// Whether this worker made itself `SCHED_BATCH` (its jobs are then given the normal policy).
static YIELDED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes the calling thread, and every thread it starts later, `SCHED_BATCH`, when it runs
/// with the normal policy; true when it did. A worker an operator started with another
/// (`chrt --idle`, a real-time one, already batch) is left as it is, and so are its jobs. Where
/// the change is refused (a seccomp filter), the worker runs as before and says so at debug
/// level.
pub fn yield_to_jobs() -> bool {
    if policy(0).ok() != Some(libc::SCHED_OTHER) {
        return false;
    }
    match set_policy(0, libc::SCHED_BATCH) {
        Ok(()) => {
            YIELDED.store(true, std::sync::atomic::Ordering::Relaxed);
            true
        }
        Err(error) => {
            tracing::debug!(%error, "could not run the worker as SCHED_BATCH");
            false
        }
    }
}

/// Runs `spawn`, which starts a job's process, with the normal policy the worker had before
/// [`yield_to_jobs`], so that the job inherits that policy from its first instruction on (a
/// policy set on the child after it started would race with whatever it forks at once). Then
/// the thread is batch again and yields: the `vfork` behind the spawn resumed it on the CPU
/// where its child had just begun to load, and the child goes on first.
pub fn spawn_as_usual<T>(spawn: impl FnOnce() -> T) -> T {
    if !YIELDED.load(std::sync::atomic::Ordering::Relaxed) {
        return spawn();
    }
    if let Err(error) = set_policy(0, libc::SCHED_OTHER) {
        tracing::warn!(%error, "could not start a job with the normal scheduling policy; it runs as SCHED_BATCH");
    }
    // Batch again however `spawn` ends, a panic included.
    struct Batch;
    impl Drop for Batch {
        fn drop(&mut self) {
            if set_policy(0, libc::SCHED_BATCH).is_ok() {
                std::thread::yield_now();
            }
        }
    }
    let _batch = Batch;
    spawn()
}

/// The scheduling policy of thread `tid` (0: the calling one).
pub fn policy(tid: libc::pid_t) -> std::io::Result<libc::c_int> {
    // SAFETY: sched_getscheduler takes a thread id and reads nothing from memory.
    let policy = unsafe { libc::sched_getscheduler(tid) };
    if policy < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(policy)
}

fn set_policy(tid: libc::pid_t, policy: libc::c_int) -> std::io::Result<()> {
    // Priority 0 is the only one the normal policies (OTHER, BATCH, IDLE) take.
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `param` is a valid sched_param that outlives the call, which only reads it.
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
