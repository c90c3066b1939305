//! What keeps the worker's credentials (its token; the server's tokens too in `app` alone)
//! out of reach of the jobs it runs as its own user: its environment, command line and memory
//! under `/proc/<pid>/`. Jobs never inherit them (`job_env::inherited_environment`), but
//! `/proc/$PPID/environ` printed them into a job's log, which every user can read.
//!
//! - The process is made non-dumpable (`PR_SET_DUMPABLE` 0): `/proc/<pid>/environ`, `mem`,
//!   `maps` and `fd` then open only for a process with `CAP_SYS_PTRACE`; measured on the
//!   kernels here, `environ` and `maps` stay readable to the same user, which is why
//!   `cli::secrets` starts a serving process again without its credentials. (`cmdline` stays
//!   readable to all: no token is ever on it, and a `--database-url` with a password is warned
//!   about at start.)
//! - A worker running as root also removes `CAP_SYS_PTRACE` from its bounding and inheritable
//!   sets, so jobs it starts as root cannot have it; the worker itself keeps it (it reads its
//!   jobs' `/proc` entries, also those of a `run_as` user).
//!
//! Both must happen before the binary starts any thread: capability sets are per thread, and
//! threads inherit them from the thread that made them.

/// Makes this process keep its memory from same-user processes and, when it runs jobs, keeps
/// `CAP_SYS_PTRACE` from them. Called by the binary before its first thread, in every mode
/// that serves (a server keeps tokens too, and may share a box with a worker's jobs).
pub fn keep_credentials_from_jobs(runs_jobs: bool) {
    if let Err(error) = nix::sys::prctl::set_dumpable(false) {
        tracing::warn!(%error, "cannot make the process non-dumpable: processes of the same user can read its tokens from /proc");
    }
    if !runs_jobs {
        return;
    }
    use caps::{CapSet, Capability};
    let ptrace = Capability::CAP_SYS_PTRACE;
    if !caps::has_cap(None, CapSet::Bounding, ptrace).unwrap_or(false) {
        return;
    }
    let dropped =
        caps::drop(None, CapSet::Inheritable, ptrace).and_then(|()| caps::drop(None, CapSet::Bounding, ptrace));
    if let Err(error) = dropped {
        tracing::warn!(%error, "cannot keep CAP_SYS_PTRACE from jobs: a job running as root could read the worker's token from its memory (set run_as in the worker's config)");
    }
}

/// Whether this process may still hand `CAP_SYS_PTRACE` to a job it starts.
pub fn jobs_may_trace() -> bool {
    caps::has_cap(None, caps::CapSet::Bounding, caps::Capability::CAP_SYS_PTRACE).unwrap_or(false)
}
