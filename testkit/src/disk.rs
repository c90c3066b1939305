//! Small disks for the disk-full tests: a process run in its own mount namespace (`unshare`),
//! where a directory is a fresh tmpfs of a few MiB, so it fills up without touching the
//! machine's disk. From outside, the process's files are seen through `/proc/<pid>/root`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// How to run a process in its own mount namespace, where it may mount a tmpfs.
pub fn namespace_flags() -> &'static str {
    // As root in a container without CAP_SYS_ADMIN, a user namespace grants it; as plain root,
    // a mount namespace alone may be all that works.
    for flags in ["-Urm", "-m"] {
        let works = Command::new("unshare")
            .args([flags, "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if works {
            return flags;
        }
    }
    panic!(
        "cannot make a small filesystem for the disk-full tests: neither `unshare -Urm` nor `unshare -m` may mount a \
         tmpfs here (needs util-linux unshare and user namespaces, or root with CAP_SYS_ADMIN)"
    );
}

/// `command` (program, arguments and environment) run where `mount_point` is a tmpfs of `mib`
/// MiB of its own. `unshare` and `sh` both exec: the child keeps the pid of the one spawned.
pub fn on_small_disk(command: &Command, mount_point: &Path, mib: u64) -> Command {
    std::fs::create_dir_all(mount_point).unwrap();
    let mut wrapped = Command::new("unshare");
    wrapped
        .args([
            namespace_flags(),
            "sh",
            "-c",
            r#"mount -t tmpfs -o "size=$1" tmpfs "$2" && shift 2 && exec "$@""#,
            "sh",
        ])
        .arg(format!("{mib}m"))
        .arg(mount_point)
        .arg(command.get_program())
        .args(command.get_args());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => wrapped.env(key, value),
            None => wrapped.env_remove(key),
        };
    }
    wrapped
}

/// Checks that `mount_point` is a tmpfs of the process `pid`'s own.
pub fn assert_own_tmpfs(pid: u32, mount_point: &Path) {
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let text = mount_point.to_str().unwrap();
    assert!(
        mounts.lines().any(|line| line.contains(&format!(" {text} ")) && line.contains(" - tmpfs ")),
        "{text} is not the process's own tmpfs:\n{mounts}"
    );
}

/// `path` as the process `pid` in its own mount namespace sees it.
pub fn seen_from_outside(pid: u32, path: &Path) -> PathBuf {
    Path::new(&format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap())
}

/// Runs `script` with `sh` inside the namespaces of process `pid` (to remount its disk).
pub fn run_inside(pid: u32, script: &str) {
    let flags: &[&str] = if namespace_flags() == "-Urm" { &["-U", "-m", "--preserve-credentials"] } else { &["-m"] };
    let status = Command::new("nsenter").args(["-t", &pid.to_string()]).args(flags).args(["sh", "-c", script]).status();
    assert!(status.is_ok_and(|status| status.success()), "running `{script}` inside process {pid}'s namespace");
}
