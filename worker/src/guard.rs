//! Jobs die with their worker, even a worker killed with SIGKILL.
//!
//! Each job runs in its own process group, which a killed worker can no longer signal: left
//! alone, the job would run on beside the attempt the server starts elsewhere (or on this box,
//! with a GPU the new worker thinks is free). So the worker starts a small guard at start-up: a
//! `sh` in its own process group whose stdin is a pipe only the worker holds. The worker tells
//! it `+<group>` when a job starts and `-<group>` once the job's group is gone. When the worker
//! dies, however it dies, the kernel closes the pipe; the guard reads end-of-file and kills
//! every group still listed. The guard costs one idle process and two short pipe writes per
//! job.
//!
//! Processes that left their job's group (`setsid`) go too: the guard kills the jobs' cgroup
//! tree when the worker had one, and every process whose environment names the dead worker
//! (`APP_WORKER_PID`, see `containment`) that it may read; and it unmounts the attempts' code
//! overlays (`code_copy`).

use std::io::Write;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;

/// The guard's loop: keeps the list of live groups, kills them all at end-of-file, then the
/// jobs' cgroup tree (`$1`, when there is one) and the processes carrying `APP_WORKER_PID`
/// of its worker (`$PPID`).
const SCRIPT: &str = r#"
groups=""
while IFS= read -r line; do
    case "$line" in
        +*) groups="$groups ${line#+}" ;;
        -*) kept=""
            for group in $groups; do [ "$group" = "${line#-}" ] || kept="$kept $group"; done
            groups=$kept ;;
    esac
done
for group in $groups; do kill -9 "-$group" 2>/dev/null; done
[ -n "$1" ] && [ -e "$1/cgroup.kill" ] && echo 1 > "$1/cgroup.kill" 2>/dev/null
for environ in /proc/[0-9]*/environ; do
    if tr '\0' '\n' < "$environ" 2>/dev/null | grep -qx "APP_WORKER_PID=$PPID"; then
        pid=${environ#/proc/}
        kill -9 "${pid%/environ}" 2>/dev/null
    fi
done
# The attempts' code overlays under the work directory (`$2`) are unmounted.
if [ -n "$2" ]; then
    while read -r _ _ _ _ point rest; do
        case "$rest" in *" - overlay app-code "*) ;; *) continue ;; esac
        case "$point" in "$2"/*) umount -l "$point" 2>/dev/null ;; esac
    done < /proc/self/mountinfo
fi
# The emptied cgroups go too (a cgroup is removed only once its processes are gone).
if [ -n "$1" ]; then
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        for slot in "$1"/slot-*; do [ -d "$slot" ] && rmdir "$slot" 2>/dev/null; done
        rmdir "$1" 2>/dev/null && break
        sleep 0.2
    done
fi
"#;

pub struct Guard {
    stdin: Mutex<Option<ChildStdin>>,
    child: Mutex<Child>,
}

impl Guard {
    /// Starts the guard process; `cgroup` is the jobs' cgroup tree, when the worker has one,
    /// and `work_dir` the worker's (its attempts' code overlays are unmounted).
    pub fn start(cgroup: Option<&std::path::Path>, work_dir: Option<&std::path::Path>) -> std::io::Result<Guard> {
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(crate::executor::SHELL)
            .args(["-c", SCRIPT, "guard"])
            .arg(cgroup.map(|dir| dir.as_os_str()).unwrap_or_default())
            .arg(work_dir.map(|dir| dir.as_os_str()).unwrap_or_default())
            // Not the worker's credentials: jobs can read a same-user process's environment.
            .env_clear()
            .envs(crate::job_env::inherited_environment())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own group: a Ctrl-C meant for the worker must not take the guard down first.
            .process_group(0)
            .spawn()?;
        let stdin = child.stdin.take();
        Ok(Guard { stdin: Mutex::new(stdin), child: Mutex::new(child) })
    }

    /// The guard's process id (a child the worker reaps itself).
    pub fn pid(&self) -> Option<u32> {
        self.child.lock().ok().map(|child| child.id())
    }

    /// A job's process group to kill should the worker die.
    pub fn watch(&self, group: i32) {
        self.tell(&format!("+{group}\n"));
    }

    /// The job's group is gone: nothing to kill for it any more.
    pub fn forget(&self, group: i32) {
        self.tell(&format!("-{group}\n"));
    }

    fn tell(&self, line: &str) {
        let Ok(mut stdin) = self.stdin.lock() else { return };
        let written = stdin.as_mut().map(|pipe| pipe.write_all(line.as_bytes()));
        if let Some(Err(error)) = written {
            tracing::warn!(%error, "the job guard is gone; jobs would outlive a killed worker");
            *stdin = None;
        }
    }
}

impl Drop for Guard {
    /// A worker that ends normally has ended its jobs itself; the guard ends with the pipe.
    fn drop(&mut self) {
        if let Ok(mut stdin) = self.stdin.lock() {
            stdin.take();
        }
        if let Ok(mut child) = self.child.lock() {
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn alive(pid: i32) -> bool {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
            && !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| stat.contains(") Z "))
    }

    fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn groups_still_listed_die_when_the_guard_loses_its_worker() {
        use std::os::unix::process::CommandExt;
        let guard = Guard::start(None, None).unwrap();
        let spawn = || Command::new("sleep").arg("1000").process_group(0).spawn().unwrap();
        let (mut kept, mut forgotten) = (spawn(), spawn());
        let (kept_pid, forgotten_pid) = (kept.id() as i32, forgotten.id() as i32);
        guard.watch(kept_pid);
        guard.watch(forgotten_pid);
        guard.forget(forgotten_pid);
        // What a dying worker does without meaning to: its end of the pipe closes.
        drop(guard);
        wait_until("the listed group is killed", || kept.try_wait().unwrap().is_some());
        assert!(alive(forgotten_pid), "a group the worker took back is left alone");
        forgotten.kill().unwrap();
        forgotten.wait().unwrap();
        assert!(!alive(kept_pid));
    }
}
