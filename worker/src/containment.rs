//! Every process a job starts ends with its attempt, also one that left the job's process
//! group and session (`setsid sleep 300 &`), which a group kill never reaches and which, on a
//! GPU box, can keep a GPU's memory.
//!
//! Two mechanisms, the first where the worker may use it:
//! - **cgroup v2**: the worker makes `app-worker-<pid>/` in its own cgroup and one cgroup per
//!   attempt slot inside it; a job's first process is moved into its slot's cgroup as it
//!   starts, and whatever is still in it when the attempt ends is killed with `cgroup.kill`
//!   (every descendant, whatever session or group it made). Needs a writable cgroup v2 tree:
//!   root on a host, a systemd unit with `Delegate=yes`; not Docker's read-only one.
//! - **subreaper**, always on: the worker is the child subreaper of its jobs
//!   (`PR_SET_CHILD_SUBREAPER`), so a process orphaned by its job's end is re-parented to the
//!   worker rather than to init. Such adopted processes carry the job's variables (`APP_JOB_ID`,
//!   `APP_ATTEMPT`, and `APP_WORKER_PID`, this worker's), and are killed once their attempt has
//!   ended: at once when the attempt was stopped (cancel, timeout, lost), and by a sweep at every
//!   heartbeat otherwise; their zombies are reaped. A process that also cleared its environment
//!   escapes this one; the cgroup does not let it.
//!
//! A worker killed with SIGKILL leaves this to the guard (`guard.rs`), which kills the cgroup
//! tree and every process carrying `APP_WORKER_PID` of the dead worker.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use shared::api::{JobAttempt, JobId};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The variable that names the worker a job process belongs to.
pub const WORKER_PID_VARIABLE: &str = "APP_WORKER_PID";

/// How this worker keeps its jobs' processes, set up once at start.
#[derive(Debug)]
pub struct Containment {
    /// `app-worker-<pid>/` in the worker's cgroup v2, when it could be made.
    cgroups: Option<PathBuf>,
    pid: u32,
    /// The worker's own session and process group (no job process of ours shares both).
    session: i32,
    group: i32,
    /// Said once: moving a job into its cgroup failed, so only the subreaper holds them.
    move_failed: AtomicBool,
    /// The processes the worker started itself (job leaders, the guard), which their own
    /// waiters reap: never killed or reaped by the sweeps, whatever their environment says.
    own: Mutex<HashSet<i32>>,
}

impl Containment {
    /// Makes the worker the subreaper of its jobs and, unless `use_cgroups` is false or the
    /// tree is not writable, the cgroup of its jobs.
    pub fn start(use_cgroups: bool) -> Containment {
        if let Err(error) = nix::sys::prctl::set_child_subreaper(true) {
            tracing::warn!(%error, "cannot become the subreaper of the jobs: processes that leave a job may outlive it");
        }
        let pid = std::process::id();
        let cgroups = use_cgroups.then(|| own_cgroup_dir().map(|dir| dir.join(format!("app-worker-{pid}")))).flatten();
        let cgroups = cgroups.filter(|dir| {
            remove_stale_siblings(dir);
            std::fs::create_dir(dir).or_else(|error| exists_ok(error, dir)).is_ok()
        });
        let session = nix::unistd::getsid(None).map_or(-1, Pid::as_raw);
        let group = nix::unistd::getpgrp().as_raw();
        Containment { cgroups, pid, session, group, move_failed: AtomicBool::new(false), own: Mutex::default() }
    }

    /// A process the worker started and waits for itself (registered before it can be seen
    /// by a sweep: right after it was spawned, before anything awaits).
    pub fn started(&self, pid: u32) {
        if let Ok(mut own) = self.own.lock() {
            own.insert(pid as i32);
        }
    }

    /// The process was reaped by its waiter.
    pub fn reaped(&self, pid: u32) {
        if let Ok(mut own) = self.own.lock() {
            own.remove(&(pid as i32));
        }
    }

    fn is_own(&self, pid: i32) -> bool {
        self.own.lock().is_ok_and(|own| own.contains(&pid))
    }

    /// How job processes are kept, for the start-up log and `app workers`.
    pub fn describe(&self) -> String {
        match &self.cgroups {
            Some(dir) if !self.move_failed.load(Ordering::Relaxed) => format!("cgroup v2 ({})", dir.display()),
            _ => "subreaper and environment sweep (no writable cgroup v2)".into(),
        }
    }

    /// The parent cgroup of every job's, for the guard.
    pub fn cgroup_dir(&self) -> Option<&Path> {
        self.cgroups.as_deref()
    }

    /// The variable to put in every job's environment.
    pub fn variable(&self) -> (String, String) {
        (WORKER_PID_VARIABLE.to_string(), self.pid.to_string())
    }

    /// Puts the job's first process, `pid`, into slot `slot`'s cgroup (made on first use).
    /// Returns the cgroup when it holds the job.
    pub fn enter(&self, slot: usize, pid: u32) -> Option<PathBuf> {
        let dir = self.cgroups.as_ref()?.join(format!("slot-{slot}"));
        let entered = std::fs::create_dir(&dir)
            .or_else(|error| exists_ok(error, &dir))
            .and_then(|()| std::fs::write(dir.join("cgroup.procs"), pid.to_string()));
        match entered {
            Ok(()) => Some(dir),
            Err(error) => {
                if !self.move_failed.swap(true, Ordering::Relaxed) {
                    tracing::warn!(%error, cgroup = %dir.display(), "cannot move a job into its cgroup; processes that leave a job are found by the subreaper sweep instead");
                }
                None
            }
        }
    }

    /// Ends every process left of `attempt` once its own group was killed: its cgroup's, and
    /// the adopted ones carrying its variables (`sweep` false skips the latter: the heartbeat's
    /// sweep finds them).
    pub async fn end(&self, attempt: JobAttempt, cgroup: Option<&Path>, sweep: bool) {
        if let Some(dir) = cgroup {
            kill_cgroup(dir).await;
        }
        if sweep {
            self.kill_adopted(|held| held == attempt).await;
        }
    }

    /// The heartbeat's sweep: kills the adopted processes of attempts not in `running`, and
    /// reaps the zombies of processes the worker adopted.
    pub async fn sweep(&self, running: &HashSet<JobAttempt>) {
        self.kill_adopted(|held| !running.contains(&held)).await;
    }

    /// Kills the worker's adopted processes whose attempt `ended` says has ended, until none
    /// is left (each kill re-parents the victim's children to the worker), and reaps them.
    async fn kill_adopted(&self, ended: impl Fn(JobAttempt) -> bool) {
        for _ in 0..16 {
            let adopted = self.adopted();
            let victims: Vec<i32> =
                adopted.iter().filter(|(_, attempt)| attempt.is_some_and(&ended)).map(|(pid, _)| *pid).collect();
            self.reap(&adopted);
            if victims.is_empty() {
                return;
            }
            for pid in &victims {
                // Listed since the scan: a job's leader spawned meanwhile, not an escapee.
                if !self.is_own(*pid) {
                    let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// The worker's children that are not its own processes: adopted from jobs. With the
    /// attempt their environment names (none for a zombie, whose environment is gone).
    fn adopted(&self) -> Vec<(i32, Option<JobAttempt>)> {
        let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
        let mut adopted = Vec::new();
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else { continue };
            let Some(stat) =
                std::fs::read_to_string(format!("/proc/{pid}/stat")).ok().and_then(|line| Stat::parse(&line))
            else {
                continue;
            };
            if stat.parent != self.pid as i32 || self.is_own(pid) {
                continue;
            }
            if stat.zombie {
                if self.orphan_zombie(&stat) {
                    adopted.push((pid, None));
                }
                continue;
            }
            if let Some(attempt) = self.attempt_in_environment(pid) {
                adopted.push((pid, Some(attempt)));
            }
        }
        adopted
    }

    /// A zombie child the worker did not start itself (job leaders and the guard are listed as
    /// its own, see [`Containment::started`]): one outside the worker's own process group. The
    /// worker's other children (`git`, the trainer probe) stay in its group, and their waiters
    /// reap them.
    fn orphan_zombie(&self, stat: &Stat) -> bool {
        stat.session != self.session || stat.group != self.group
    }

    fn attempt_in_environment(&self, pid: i32) -> Option<JobAttempt> {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        let value = |name: &[u8]| {
            environ
                .split(|byte| *byte == 0)
                .find_map(|entry| entry.strip_prefix(name).and_then(|rest| rest.strip_prefix(b"=")))
                .and_then(|value| std::str::from_utf8(value).ok())
        };
        if value(WORKER_PID_VARIABLE.as_bytes())? != self.pid.to_string() {
            return None;
        }
        let job_id: i64 = value(b"APP_JOB_ID")?.parse().ok()?;
        let attempt: u32 = value(b"APP_ATTEMPT")?.parse().ok()?;
        Some(JobAttempt { job_id: JobId::new(job_id), attempt })
    }

    fn reap(&self, adopted: &[(i32, Option<JobAttempt>)]) {
        use nix::sys::wait::{waitpid, WaitPidFlag};
        for (pid, attempt) in adopted {
            if attempt.is_none() {
                let _ = waitpid(Pid::from_raw(*pid), Some(WaitPidFlag::WNOHANG));
            }
        }
    }
}

impl Drop for Containment {
    /// The jobs' cgroups go with a worker that ends normally (its jobs ended before).
    fn drop(&mut self) {
        if let Some(dir) = &self.cgroups {
            remove_cgroup_tree(dir);
        }
    }
}

/// The fields of `/proc/<pid>/stat` this module reads.
struct Stat {
    zombie: bool,
    parent: i32,
    group: i32,
    session: i32,
}

impl Stat {
    /// The command name (in parentheses) may hold spaces and parentheses: fields start after
    /// the last `)`.
    fn parse(line: &str) -> Option<Stat> {
        let mut fields = line[line.rfind(')')? + 1..].split_whitespace();
        let state = fields.next()?;
        let parent = fields.next()?.parse().ok()?;
        let group = fields.next()?.parse().ok()?;
        let session = fields.next()?.parse().ok()?;
        Some(Stat { zombie: state == "Z" || state == "X", parent, group, session })
    }
}

/// Kills every process in `dir` (and its descendants' cgroups), and waits briefly until it is
/// empty; the cgroup itself is kept for the slot's next attempt.
async fn kill_cgroup(dir: &Path) {
    if !populated(dir) {
        return;
    }
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    for _ in 0..200 {
        if !populated(dir) {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    tracing::warn!(cgroup = %dir.display(), "a job's cgroup still has processes 2 s after cgroup.kill");
}

/// Whether a cgroup (or one below it) still holds a process.
fn populated(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.events"))
        .map(|events| events.lines().any(|line| line == "populated 1"))
        .unwrap_or(false)
}

/// Removes `dir` and the cgroups in it (rmdir only: a cgroup holding a process stays).
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Removes the empty job cgroups of workers that no longer run (killed, their guard gone too).
fn remove_stale_siblings(own: &Path) {
    let Some(parent) = own.parent() else { return };
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) =
            name.to_str().and_then(|name| name.strip_prefix("app-worker-")).and_then(|pid| pid.parse().ok())
        else {
            continue;
        };
        if kill(Pid::from_raw(pid), None).is_err() {
            remove_cgroup_tree(&entry.path());
        }
    }
}

fn exists_ok(error: std::io::Error, dir: &Path) -> std::io::Result<()> {
    match error.kind() {
        std::io::ErrorKind::AlreadyExists if dir.is_dir() => Ok(()),
        _ => Err(error),
    }
}

/// This process's cgroup v2 directory: its `0::` line of `/proc/self/cgroup` under the mount
/// point of the `cgroup2` filesystem.
fn own_cgroup_dir() -> Option<PathBuf> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = cgroup.lines().find_map(|line| line.strip_prefix("0::"))?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mounts.lines().find_map(cgroup2_mount_point)?;
    Some(mount.join(path.trim_start_matches('/')))
}

/// The mount point of a `/proc/self/mountinfo` line when its filesystem is `cgroup2`.
fn cgroup2_mount_point(line: &str) -> Option<PathBuf> {
    let (before, after) = line.split_once(" - ")?;
    if after.split_whitespace().next()? != "cgroup2" {
        return None;
    }
    // Mount points escape spaces as \040.
    Some(PathBuf::from(before.split_whitespace().nth(4)?.replace("\\040", " ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_and_mount_lines_are_read() {
        let stat = Stat::parse("42 (a) b) S 7 40 41 0 -1").unwrap();
        assert_eq!((stat.zombie, stat.parent, stat.group, stat.session), (false, 7, 40, 41));
        assert!(Stat::parse("43 (x) Z 1 43 43").unwrap().zombie);
        let line = "35 25 0:30 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw,nsdelegate";
        assert_eq!(cgroup2_mount_point(line), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(cgroup2_mount_point("36 25 0:31 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu"), None);
    }
}
