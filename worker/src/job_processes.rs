//! Whose is a GPU process: the attempt of this worker it belongs to, found from `/proc`.
//!
//! Every job runs in its own process group, whose leader is the process the worker started
//! with the job's `APP_JOB_ID` and `APP_ATTEMPT`; every process of the job (a `torchrun` rank,
//! a data-loader worker) is in that group unless it left it. So a process is the job's whose
//! group leader carries those variables, or, for one that left its group, which carries them
//! itself. A process of another user, or in another PID namespace, is nobody's.

use crate::accounting::Attributed;
use crate::inventory::GpuProcess;
use shared::api::{JobAttempt, JobId};

/// The attempt whose process `pid` is, if it is one of this worker's jobs.
pub fn attempt_of(pid: u32) -> Option<JobAttempt> {
    let leader = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(i32::try_from(pid).ok()?))).ok()?;
    let leader = u32::try_from(leader.as_raw()).ok()?;
    from_environ(leader).or_else(|| (leader != pid).then(|| from_environ(pid)).flatten())
}

/// Every process with the attempt it belongs to.
pub fn attribute(processes: Vec<GpuProcess>) -> Vec<Attributed> {
    processes
        .into_iter()
        .map(|process| Attributed { gpu: process.gpu, memory: process.memory, attempt: attempt_of(process.pid) })
        .collect()
}

/// The PIDs of the process group `group`'s members that have not ended (zombies waiting to be
/// reaped do not count: they hold nothing and can do nothing).
fn members(group: i32) -> impl Iterator<Item = String> {
    let entries = std::fs::read_dir("/proc").into_iter().flatten().flatten();
    entries.filter_map(move |entry| {
        let pid = entry.file_name().into_string().ok().filter(|name| name.bytes().all(|byte| byte.is_ascii_digit()))?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (state, pgrp) = state_and_group(&stat)?;
        (pgrp == group && state != 'Z' && state != 'X').then_some(pid)
    })
}

/// Whether process group `group` has a member that has not ended.
pub fn group_has_live_members(group: i32) -> bool {
    members(group).next().is_some()
}

/// Whether a live process of the process group `group` has a handler for `signal` (its
/// `SigCgt` mask in `/proc/<pid>/status`): the job may act on it, rather than die of it.
pub fn group_catches(group: i32, signal: i32) -> bool {
    members(group)
        .any(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| catches(&status, signal)))
}

/// Whether a live process of the group `group` holds a file under `dir` open for writing (a
/// checkpoint being written).
pub fn writes_under(group: i32, dir: &std::path::Path) -> bool {
    let Ok(dir) = dir.canonicalize() else { return false };
    members(group).any(|pid| {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
        fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|target| target.starts_with(&dir))
                && std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", fd.file_name().to_string_lossy()))
                    .is_ok_and(|info| open_for_writing(&info))
        })
    })
}

/// Whether a `/proc/<pid>/fdinfo/<fd>` text's `flags` (octal) open the file for writing.
fn open_for_writing(fdinfo: &str) -> bool {
    let flags = fdinfo.lines().find_map(|line| line.strip_prefix("flags:")).map(str::trim);
    flags.and_then(|flags| u32::from_str_radix(flags, 8).ok()).is_some_and(|flags| flags & 0o3 != 0)
}

/// Whether a `/proc/<pid>/status` text's `SigCgt` mask (hex, bit N-1 for signal N) holds `signal`.
fn catches(status: &str, signal: i32) -> bool {
    let Some(mask) = status.lines().find_map(|line| line.strip_prefix("SigCgt:")) else { return false };
    let bit = u32::try_from(signal - 1).ok().filter(|bit| *bit < 64);
    u64::from_str_radix(mask.trim(), 16).ok().zip(bit).is_some_and(|(mask, bit)| mask & (1 << bit) != 0)
}

/// The state letter and the process group of a `/proc/<pid>/stat` line. The command name (in
/// parentheses) may hold spaces and parentheses itself: the fields start after the last `)`.
fn state_and_group(stat: &str) -> Option<(char, i32)> {
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _parent = fields.next()?;
    Some((state, fields.next()?.parse().ok()?))
}

fn from_environ(pid: u32) -> Option<JobAttempt> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    attempt_in(&environ)
}

/// `APP_JOB_ID` and `APP_ATTEMPT` of a NUL-separated environment block.
fn attempt_in(environ: &[u8]) -> Option<JobAttempt> {
    let value = |name: &[u8]| {
        environ
            .split(|byte| *byte == 0)
            .find_map(|entry| entry.strip_prefix(name).and_then(|rest| rest.strip_prefix(b"=")))
            .and_then(|value| std::str::from_utf8(value).ok())
    };
    let job_id: i64 = value(b"APP_JOB_ID")?.parse().ok()?;
    let attempt: u32 = value(b"APP_ATTEMPT")?.parse().ok()?;
    Some(JobAttempt { job_id: JobId::new(job_id), attempt })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attempt_is_read_from_the_environment_block() {
        let block = b"PATH=/bin\0APP_JOB_ID_X=9\0APP_JOB_ID=12\0APP_ATTEMPT=3\0";
        assert_eq!(attempt_in(block), Some(JobAttempt { job_id: JobId::new(12), attempt: 3 }));
        assert_eq!(attempt_in(b"APP_JOB_ID=12\0"), None);
        assert_eq!(attempt_in(b"APP_JOB_ID=x\0APP_ATTEMPT=1\0"), None);
    }

    #[test]
    fn the_caught_signals_are_read_from_the_status_mask() {
        let status = "Name:\tpython3\nSigIgn:\t0000000000001000\nSigCgt:\t0000000180004002\n";
        assert!(catches(status, 15), "SIGTERM: bit 14");
        assert!(catches(status, 2), "SIGINT: bit 1");
        assert!(!catches(status, 13), "SIGPIPE is ignored, not caught");
        assert!(!catches(status, 0) && !catches(status, 65), "no such signal");
        assert!(!catches("Name:\tsh\n", 15), "no mask");
    }

    /// A child killed and reaped when dropped: a failed assertion leaves no process behind
    /// (one holding the test's output open would keep `cargo test | ...` waiting).
    struct Spawned(std::process::Child);

    impl Drop for Spawned {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_file_open_for_writing_under_a_directory_is_seen_and_one_open_for_reading_is_not() {
        assert!(open_for_writing("pos:\t0\nflags:\t0100001\nmnt_id:\t25\n"), "O_WRONLY");
        assert!(open_for_writing("flags:\t02\n"), "O_RDWR");
        assert!(!open_for_writing("flags:\t0100000\n"), "read only");
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("deep").join("ckpt.pt");
        std::fs::create_dir(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "old").unwrap();
        let script = format!("exec 3>>{}; while :; do sleep 0.05; done", file.display());
        let writer = Spawned(std::process::Command::new("sh").args(["-c", &script]).process_group(0).spawn().unwrap());
        let reader = Spawned(
            std::process::Command::new("sh")
                .args(["-c", &format!("exec 3<{}; while :; do sleep 0.05; done", file.display())])
                .process_group(0)
                .spawn()
                .unwrap(),
        );
        let (writer, reader) = (writer.0.id() as i32, reader.0.id() as i32);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !writes_under(writer, dir.path()) {
            assert!(std::time::Instant::now() < deadline, "the open file was never seen");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        std::thread::sleep(std::time::Duration::from_millis(100)); // the reader's shell has opened it
        assert!(!writes_under(reader, dir.path()), "open for reading only");
        let sibling = dir.path().join("dee");
        std::fs::create_dir(&sibling).unwrap();
        assert!(!writes_under(writer, &sibling), "a directory whose name its path starts with");
    }

    #[test]
    fn a_group_catches_sigterm_while_a_member_traps_it() {
        use std::os::unix::process::CommandExt;
        let mut trapping = std::process::Command::new("sh")
            .args(["-c", "trap 'exit 0' TERM; while :; do sleep 0.05; done"])
            .process_group(0)
            .spawn()
            .unwrap();
        let mut plain = std::process::Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        let trapping_group = trapping.id() as i32;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !group_catches(trapping_group, 15) {
            assert!(std::time::Instant::now() < deadline, "the shell's trap was never seen");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!group_catches(plain.id() as i32, 15), "sleep dies of SIGTERM");
        for child in [&mut trapping, &mut plain] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    #[test]
    fn stat_lines_give_state_and_group_even_with_parentheses_in_the_name() {
        assert_eq!(state_and_group("42 (python3) S 1 42 42 0 -1"), Some(('S', 42)));
        assert_eq!(state_and_group("43 (a) b) (c) Z 42 7 7 0"), Some(('Z', 7)));
        assert_eq!(state_and_group("garbage"), None);
    }

    #[test]
    fn a_group_is_live_while_a_member_runs_and_not_once_only_its_zombie_leader_is_left() {
        use std::os::unix::process::CommandExt;
        let mut leader = std::process::Command::new("sleep").arg("30").process_group(0).spawn().unwrap();
        let group = leader.id() as i32;
        assert!(group_has_live_members(group));
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(group), nix::sys::signal::Signal::SIGKILL).unwrap();
        // Killed but not reaped: a zombie, which is no live member.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while group_has_live_members(group) {
            assert!(std::time::Instant::now() < deadline, "the killed leader still counts as live");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        leader.wait().unwrap();
    }

    #[test]
    fn a_child_in_the_group_of_a_job_process_is_that_jobs() {
        use std::os::unix::process::CommandExt;
        // A shell standing in for a job: its own group, the job's variables; its child sleeps.
        let mut job = std::process::Command::new("/bin/sh")
            .args(["-c", "sleep 30 & echo $!; wait"])
            .env("APP_JOB_ID", "41")
            .env("APP_ATTEMPT", "2")
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(job.stdout.take().unwrap()), &mut line).unwrap();
        let child: u32 = line.trim().parse().unwrap();
        let expected = Some(JobAttempt { job_id: JobId::new(41), attempt: 2 });
        assert_eq!(attempt_of(child), expected);
        assert_eq!(attempt_of(job.id()), expected);
        // This test process belongs to no job (unless the tests run as one).
        if std::env::var_os("APP_JOB_ID").is_none() {
            assert_eq!(attempt_of(std::process::id()), None);
        }
        let _ =
            nix::sys::signal::killpg(nix::unistd::Pid::from_raw(job.id() as i32), nix::sys::signal::Signal::SIGKILL);
        let _ = job.wait();
    }
}
