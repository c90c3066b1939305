//! Runs one attempt: a fresh directory, the job's environment, `sh -c COMMAND` in its own
//! process group, stdout and stderr appended to the attempt's log file as they come, and a
//! whole-group kill (SIGTERM, then SIGKILL after a grace period) on cancel or timeout.
//!
//! A sweep's `setup:` line runs first in the same shell, bash where there is one (so
//! `source .venv/bin/activate` or `conda activate x` holds for the command); the shell marks that
//! setup succeeded before the command starts, so a setup that fails, or exits the shell, fails
//! the attempt as "setup failed".

use crate::containment::Containment;
use crate::guard::Guard;
use crate::run_as::RunAs;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use shared::api::{ClaimedJob, JobAttempt};
use shared::job::Outcome;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio::sync::{mpsc, Notify};

/// Where an attempt's files live: a reused slot directory, `<work_dir>/slots/<n>/` (see
/// `slots`), or `<work_dir>/<sweep>/<index>/attempt-<n>/` once kept.
#[derive(Debug, Clone)]
pub struct AttemptDirs {
    pub root: PathBuf,
    /// The job's fresh directory: empty, or its code snapshot unpacked (the job starts here or
    /// in a directory inside it, or in the sweep's `workdir`).
    pub cwd: PathBuf,
    /// `APP_CHECKPOINT_DIR`: empty, or the job's newest checkpoint restored.
    pub checkpoint: PathBuf,
    /// Where a checkpoint is packed before its upload, and downloaded before it is restored.
    pub checkpoint_archive: PathBuf,
    /// The job's own marks: a directory it may write (its `run_as` user owns it).
    pub state: PathBuf,
    /// The layers of an overlay the job's code view is mounted from (`code_copy`).
    pub code_layers: PathBuf,
    /// Written by the job's shell, in `state`, once its `setup:` line succeeded.
    pub setup_done: PathBuf,
    /// `APP_OUTPUT_DIR`: uploaded as the attempt's results.
    pub output: PathBuf,
    /// `APP_CONFIG`.
    pub config: PathBuf,
    /// `APP_METRICS_FILE`.
    pub metrics: PathBuf,
    /// stdout and stderr, as shipped to the server.
    pub log: PathBuf,
    /// `WANDB_SWEEP_PARAM_PATH` of a W&B-form job: its parameters as W&B's agent writes them,
    /// read by `wandb.init()` into `wandb.config`.
    pub wandb_params: PathBuf,
}

impl AttemptDirs {
    /// The directories of slot `slot`.
    pub fn for_slot(work_dir: &Path, slot: usize) -> AttemptDirs {
        Self::at(crate::slots::root(work_dir, slot))
    }

    /// Where an attempt is kept for a look: `<work_dir>/<sweep>/<index>/attempt-<n>`.
    pub fn kept(work_dir: &Path, job: &ClaimedJob) -> PathBuf {
        work_dir.join(&job.sweep).join(job.index.to_string()).join(format!("attempt-{}", job.attempt))
    }

    fn at(root: PathBuf) -> AttemptDirs {
        AttemptDirs {
            cwd: root.join("work"),
            checkpoint: root.join("checkpoint"),
            checkpoint_archive: root.join("checkpoint.tar.zst"),
            state: root.join("state"),
            code_layers: root.join("code-layers"),
            setup_done: root.join("state").join("setup-done"),
            output: root.join("output"),
            config: root.join("config.yaml"),
            metrics: root.join("metrics.jsonl"),
            log: root.join("job.log"),
            wandb_params: root.join("wandb-params.yaml"),
            root,
        }
    }

    /// Empties the attempt's directories and files, keeping them for the next attempt in the
    /// slot. The files keep their inodes (see [`reuse_file`]): a new inode per file per job
    /// made every short job pay ext4's inode allocator, which skips every inode freed in the last
    /// minutes, and with thousands of jobs those were thousands.
    pub fn clear(&self) -> std::io::Result<()> {
        crate::slots::empty(&self.cwd)?;
        crate::slots::empty(&self.output)?;
        crate::slots::empty(&self.checkpoint)?;
        for file in [&self.wandb_params, &self.setup_done, &self.checkpoint_archive] {
            remove_if_there(file)?;
        }
        for file in [&self.config, &self.metrics, &self.log] {
            if std::fs::symlink_metadata(file).is_ok() {
                reuse_file(file, b"", false, file == &self.metrics)?;
            }
        }
        Ok(())
    }

    /// Makes the directories fresh (empty; whatever a crashed worker or an earlier attempt left
    /// is removed, the directories themselves are kept), writes the config file and opens the
    /// log. Done in place when the slot's directories are empty (as its last attempt left
    /// them), else in one trip to a blocking thread for all of it: each `tokio::fs` call would
    /// be a trip of its own, and a short job's cost is mostly trips.
    /// With `fresh`, the attempt's own directories are removed and made again rather than
    /// emptied (a `run_as` job's directories must start as root's, see `run_as`).
    pub async fn prepare(&self, job: &ClaimedJob, fresh: bool) -> std::io::Result<std::fs::File> {
        // YAML is a superset of JSON, so the params object is a valid config file as is.
        let config = job.config.clone().unwrap_or_else(|| format!("{}\n", job.params));
        let wandb = match job.form {
            shared::sweep::SweepForm::Wandb => {
                Some(shared::sweep::wandb_params_file(&job.params.to_string()).map_err(std::io::Error::other)?)
            }
            _ => None,
        };
        let dirs = self.clone();
        let work = move || {
            if fresh {
                for dir in [&dirs.cwd, &dirs.output, &dirs.checkpoint, &dirs.state] {
                    match std::fs::remove_dir_all(dir) {
                        Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
                        _ => {}
                    }
                }
            }
            for dir in [&dirs.cwd, &dirs.output, &dirs.checkpoint] {
                crate::slots::empty(dir)?;
                std::fs::create_dir_all(dir)?;
            }
            std::fs::create_dir_all(&dirs.state)?;
            remove_if_there(&dirs.setup_done)?;
            remove_if_there(&dirs.wandb_params)?;
            reuse_file(&dirs.config, config.as_bytes(), false, false)?;
            if let Some(wandb) = wandb {
                std::fs::write(&dirs.wandb_params, wandb)?;
            }
            reuse_file(&dirs.metrics, b"", false, true)?;
            reuse_file(&dirs.log, b"", true, false)
        };
        // A slot emptied by its last attempt (the usual case) needs a handful of small calls:
        // done in place, without waking a blocking thread and waiting for it.
        let empty = |dir: &Path| std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none());
        if !fresh && [&self.cwd, &self.output, &self.checkpoint].into_iter().all(|dir| empty(dir)) {
            return work();
        }
        tokio::task::spawn_blocking(work).await.map_err(std::io::Error::other)?
    }
}

/// Removes `file`; one that is not there is fine.
fn remove_if_there(file: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(file) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// `file` holding exactly `contents`, opened for writing (appending with `append`), in the
/// inode the slot's last attempt used where there is one.
///
/// Why not a new file each time: ext4 skips every inode freed in the last minutes when it
/// hands out a new one (`recently_deleted`), so a worker that removed and made its three files
/// per job spent ever longer in the allocator as jobs went by, and after any large removal
/// (an earlier run's directories): 2,000 `true` jobs ran at 460-1,000 jobs/s depending on what
/// had been deleted before. Why not a truncation to zero either, where it can be helped: ext4's
/// `auto_da_alloc` writes a file truncated to zero back to disk when it is closed, so the
/// config is overwritten and cut to its new length instead, and the log and metrics are
/// truncated only when the last attempt wrote to them.
///
/// Whatever a job left at the path that is not a plain file of its own (a symlink, a
/// directory, a file with a second name elsewhere) is removed and a new file made: nothing is
/// written through a job's symlink or into a copy it kept by hard link.
fn reuse_file(file: &Path, contents: &[u8], append: bool, fresh_if_written: bool) -> std::io::Result<std::fs::File> {
    use std::io::Write;
    use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
    let open = |new: bool| {
        let mut options = std::fs::OpenOptions::new();
        if append {
            options.append(true);
        } else {
            options.write(true);
        }
        if new {
            options.create_new(true);
        } else {
            options.create(true);
        }
        // O_NONBLOCK: a FIFO a job left there fails to open at once (ENXIO) and is replaced,
        // where a plain open would wait for a reader forever (regular files ignore the flag).
        options.custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY).open(file)
    };
    let reused = open(false).and_then(|handle| match handle.metadata() {
        // A second name (a hard link a job made to keep its config) keeps what it holds.
        Ok(metadata) if metadata.is_file() && metadata.nlink() == 1 => Ok((handle, metadata.len())),
        Ok(_) => Err(std::io::Error::other("not a plain file of its own")),
        Err(error) => Err(error),
    });
    // A file the last attempt wrote may still be open in a process that left the job's group
    // and outlived it (the metrics file of a daemonized logger): it gets a new inode, so such
    // a stray writes into the old one, never into the next attempt's.
    let reused = reused.and_then(|(handle, length)| match fresh_if_written && length > 0 {
        true => Err(std::io::Error::other("written by the last attempt")),
        false => Ok((handle, length)),
    });
    let (handle, length) = match reused {
        Ok(reused) => reused,
        Err(_) => {
            match std::fs::symlink_metadata(file) {
                Ok(metadata) if metadata.is_dir() => std::fs::remove_dir_all(file)?,
                _ => remove_if_there(file)?,
            }
            (open(true)?, 0)
        }
    };
    if append {
        if length > 0 {
            handle.set_len(0)?;
        }
        (&handle).write_all(contents)?;
    } else {
        handle.write_all_at(contents, 0)?;
        if length > contents.len() as u64 {
            handle.set_len(contents.len() as u64)?;
        }
    }
    Ok(handle)
}

/// `APP_PARAM_<NAME>`: upper case, anything but letters and digits becomes `_`.
pub fn param_variable(name: &str) -> String {
    let mut variable = String::from("APP_PARAM_");
    variable.extend(name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }));
    variable
}

/// The environment a job sees, besides the worker's own.
pub fn environment(
    job: &ClaimedJob,
    dirs: &AttemptDirs,
    gpus: &[u32],
    master_port: Option<u16>,
) -> Vec<(String, String)> {
    let path = |path: &Path| path.to_string_lossy().to_string();
    let mut env = vec![
        ("APP_JOB_ID".to_string(), job.id.to_string()),
        ("APP_SWEEP".to_string(), job.sweep.clone()),
        ("APP_INDEX".to_string(), job.index.to_string()),
        ("APP_ATTEMPT".to_string(), job.attempt.to_string()),
        ("APP_CONFIG".to_string(), path(&dirs.config)),
        ("APP_OUTPUT_DIR".to_string(), path(&dirs.output)),
        ("APP_METRICS_FILE".to_string(), path(&dirs.metrics)),
        ("APP_CHECKPOINT_DIR".to_string(), path(&dirs.checkpoint)),
        // CUDA numbers GPUs by speed unless told otherwise; NVML (and --gpus) by PCI bus.
        ("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string()),
        // Empty for CPU jobs: they must not wander onto GPU 0.
        ("CUDA_VISIBLE_DEVICES".to_string(), gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
    ];
    if let Some(params) = job.params.as_object() {
        for (name, value) in params {
            let text = match value {
                serde_json::Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            env.push((param_variable(name), text));
        }
    }
    if job.form == shared::sweep::SweepForm::Wandb {
        env.push(("WANDB_SWEEP_PARAM_PATH".to_string(), path(&dirs.wandb_params)));
    }
    if gpus.len() > 1 {
        env.push(("WORLD_SIZE".to_string(), gpus.len().to_string()));
        env.push(("MASTER_ADDR".to_string(), "127.0.0.1".to_string()));
        env.push(("MASTER_PORT".to_string(), master_port.unwrap_or(29500).to_string()));
    }
    env
}

/// `PATH` with the directory of this worker's own binary first, so `app` in a job's command
/// (the `app train` of a `train:` sweep) is the same build as the worker running it.
pub fn path_with(own_binary: &Path, path: Option<&std::ffi::OsStr>) -> Option<(String, String)> {
    let dir = own_binary.parent()?.to_str()?.to_string();
    let rest = path.map(|path| path.to_string_lossy().into_owned()).unwrap_or_default();
    Some(("PATH".to_string(), if rest.is_empty() { dir } else { format!("{dir}:{rest}") }))
}

/// A free TCP port on loopback for `torchrun`'s rendezvous.
pub fn free_port() -> Option<u16> {
    std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok().map(|address| address.port())
}

/// The shell jobs run in, by absolute path: with a bare `sh`, and `PATH` set for the job, the
/// standard library would fall back from `posix_spawn` to a full fork of the multi-threaded
/// worker for every job.
pub const SHELL: &str = "/bin/sh";
/// The shell of a job with a `setup:` line, where there is one: setup lines are written for
/// bash (`source .venv/bin/activate`, `conda activate`), as SkyPilot's `setup` runs in bash.
pub const SETUP_SHELL: &str = "/bin/bash";

/// The worker's own environment as jobs inherit it: without any `APP_*` variable. The worker
/// and the server read their credentials and settings from those (`APP_TOKEN`,
/// `APP_WORKER_TOKEN`, `APP_USER_TOKEN`, the `*_TOKEN_FILE`s, `APP_TLS_KEY`, `APP_URL`, ...), and
/// a job runs user code whose output ends up in a log: it gets only the `APP_*` variables the
/// worker sets for it (see `environment`).
pub fn inherited_environment() -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    std::env::vars_os().filter(|(key, _)| !key.as_encoded_bytes().starts_with(b"APP_")).collect()
}

/// The reason of an attempt the worker stopped because the server no longer holds it for it:
/// such an attempt reports nothing.
pub const LEASE_LOST: &str = "lease lost";

/// Why the worker ends an attempt early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Cancel,
    /// The worker is shutting down for good; the job goes back to the queue.
    Abandon,
    /// The server says this worker no longer holds the attempt.
    Lost,
}

/// What starting a job needs besides its command.
pub struct Launch<'a> {
    pub command: &'a str,
    /// The sweep's `setup:` line, run before the command in the same shell.
    pub setup: Option<&'a str>,
    pub dirs: &'a AttemptDirs,
    /// Where the job starts: `dirs.cwd`, a directory inside it, or the sweep's `workdir`.
    pub cwd: &'a Path,
    /// The worker's environment without `APP_*` ([`inherited_environment`]).
    pub inherited: &'a [(std::ffi::OsString, std::ffi::OsString)],
    /// The job's own variables ([`environment`]).
    pub env: &'a [(String, String)],
    pub timeout: Option<Duration>,
    pub grace: Duration,
    pub guard: &'a Guard,
    /// Keeps the processes that leave the job's group (`containment`).
    pub containment: &'a Containment,
    pub attempt: JobAttempt,
    /// The attempt's slot: its cgroup, where the worker has them.
    pub slot: usize,
    /// The user the job runs as, when not the worker's.
    pub run_as: Option<&'a RunAs>,
}

/// How a job's process ended, and what is worth knowing beyond that.
#[derive(Debug)]
pub struct Ended {
    pub outcome: Outcome,
    /// Sentences for the attempt's notes (the worker's disk filled up and the log was cut).
    pub notes: Vec<String>,
}

/// Runs the command to its end, or until `stop` says otherwise or `timeout` passes; its output
/// goes to `log` (opened by [`AttemptDirs::prepare`]).
pub async fn run(
    launch: Launch<'_>,
    log: std::fs::File,
    mut stop: mpsc::Receiver<Stop>,
    log_written: Arc<Notify>,
) -> Ended {
    let Launch { command, setup, dirs, cwd, inherited, env, timeout, grace, guard, containment, attempt, slot, run_as } =
        launch;
    let failed = |reason: String| Ended { outcome: Outcome::Error { reason }, notes: Vec::new() };
    let script = setup.map(|setup| setup_script(setup, &dirs.setup_done, command));
    let shell = if setup.is_some() && Path::new(SETUP_SHELL).exists() { SETUP_SHELL } else { SHELL };
    let command = script.as_deref().unwrap_or(command);
    // A plain command line starts directly (one process fewer per job); anything a shell
    // would interpret goes to `sh -c`.
    let job_path = env.iter().rev().find(|(key, _)| key == "PATH").map(|(_, value)| value.clone());
    let job_path = job_path.or_else(|| std::env::var("PATH").ok()).unwrap_or_default();
    let direct = crate::launch::plain_words(command)
        .and_then(|words| Some((crate::launch::find_program_cached(&words[0], &job_path, cwd)?, words)));
    let spawn = |direct: Option<&(PathBuf, Vec<String>)>| {
        let mut launcher = match direct {
            Some((program, words)) => {
                let mut launcher = Command::new(program);
                launcher.arg0(&words[0]).args(&words[1..]);
                launcher
            }
            None => {
                let mut launcher = Command::new(shell);
                launcher.arg("-c").arg(command);
                launcher
            }
        };
        launcher
            .current_dir(cwd)
            // Jobs get the worker's environment without its own settings and credentials.
            .env_clear()
            .envs(inherited.iter().map(|(key, value)| (key, value)))
            .envs(env.iter().map(|(key, value)| (key, value)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(user) = run_as {
            // The standard library also drops the supplementary groups when it sets a uid.
            launcher.uid(user.uid.as_raw()).gid(user.gid.as_raw()).envs(user.environment());
        }
        launcher.spawn()
    };
    let spawned = match spawn(direct.as_ref()) {
        // A program found earlier and gone since: the shell says what is wrong, as it would.
        Err(error) if direct.is_some() && error.kind() == std::io::ErrorKind::NotFound => spawn(None),
        spawned => spawned,
    };
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) => return failed(format!("starting `{command}`: {error}")),
    };
    let group = child.id().map(|pid| Pid::from_raw(pid as i32));
    if let Some(group) = group {
        containment.started(group.as_raw() as u32);
        guard.watch(group.as_raw());
    }
    let cgroup = child.id().and_then(|pid| containment.enter(slot, pid));
    let (chunks, received) = mpsc::channel::<Vec<u8>>(64);
    let pipes = [
        child.stdout.take().map(|out| tokio::spawn(forward(out, chunks.clone()))),
        child.stderr.take().map(|err| tokio::spawn(forward(err, chunks.clone()))),
    ];
    drop(chunks);
    let writer = tokio::spawn(write_log(log, received, log_written));

    let deadline = async {
        match timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let mut stopped: Option<Outcome> = None;
    // The leader is not reaped before its group was killed (see `leader_exited`), so every
    // signal below reaches the job's own group and never a stranger given the same number.
    let exited = async {
        match group {
            Some(group) => leader_exited(group).await,
            None => std::future::pending().await,
        }
    };
    // A closed `stop` channel disables its branch (the pattern does not match); the others
    // still end the wait.
    let waited = tokio::select! {
        () = exited => None,
        status = child.wait(), if group.is_none() => Some(status),
        Some(reason) = stop.recv() => {
            stopped = Some(match reason {
                Stop::Cancel => Outcome::Killed { reason: "cancelled".into() },
                Stop::Lost => Outcome::Killed { reason: LEASE_LOST.into() },
                Stop::Abandon => Outcome::Abandoned,
            });
            terminate(group, grace).await;
            None
        }
        _ = &mut deadline => {
            let limit = timeout.unwrap_or_default().as_secs();
            stopped = Some(Outcome::Killed { reason: format!("timed out after {limit} s") });
            terminate(group, grace).await;
            None
        }
    };
    // Whatever the job left behind in its group goes with it (GPU memory is returned only
    // when every process holding it has ended); then the leader is reaped.
    if let Some(group) = group {
        let _ = killpg(group, Signal::SIGKILL);
        guard.forget(group.as_raw());
    }
    // And what left the group: its cgroup at once; the processes it left to the worker at
    // once when the job was stopped, else at the next heartbeat's sweep.
    containment.end(attempt, cgroup.as_deref(), stopped.is_some()).await;
    let status = match waited {
        Some(status) => status,
        None => child.wait().await,
    };
    if let Some(group) = group {
        containment.reaped(group.as_raw() as u32);
    }
    for mut pipe in pipes.into_iter().flatten() {
        // A grandchild that left the group (setsid) could hold a pipe open: give it two
        // seconds, then stop reading it, so it cannot keep growing the job's log.
        if tokio::time::timeout(Duration::from_secs(2), &mut pipe).await.is_err() {
            pipe.abort();
        }
    }
    let mut writer = writer;
    let notes = match tokio::time::timeout(Duration::from_secs(2), &mut writer).await {
        Ok(Ok(Some(note))) => vec![note],
        Ok(_) => Vec::new(),
        Err(_) => {
            writer.abort();
            Vec::new()
        }
    };
    let outcome = match (stopped, status) {
        (Some(outcome), _) => outcome,
        (None, Ok(status)) => Outcome::Exited { code: exit_code(status) },
        (None, Err(error)) => Outcome::Error { reason: format!("waiting for the job: {error}") },
    };
    let outcome = match (setup, outcome) {
        (Some(setup), Outcome::Exited { code }) if code != 0 && !dirs.setup_done.exists() => {
            Outcome::Error { reason: format!("setup failed: `{setup}` {}", shared::job::exit_reason(code)) }
        }
        (_, outcome) => outcome,
    };
    Ended { outcome, notes }
}

/// The shell script of a job with a `setup:` line: the line, then (if it succeeded) a mark
/// that it did, then the command, all in one shell.
pub fn setup_script(setup: &str, done: &Path, command: &str) -> String {
    let done = shlex::try_quote(&done.to_string_lossy()).map(|quoted| quoted.into_owned()).unwrap_or_default();
    format!(
        "{setup}
app_setup_status=$?
[ \"$app_setup_status\" -eq 0 ] || exit \"$app_setup_status\"
: > {done}
{command}
"
    )
}

/// SIGTERM to the whole group, SIGKILL after `grace`. The grace is for every process of the
/// group, not only the leader: a compound command's shell dies at once, its children may need
/// time. The leader stays unreaped meanwhile (its caller reaps it).
async fn terminate(group: Option<Pid>, grace: Duration) {
    let Some(group) = group else { return };
    let _ = killpg(group, Signal::SIGTERM);
    let deadline = tokio::time::Instant::now() + grace;
    while crate::job_processes::group_has_live_members(group.as_raw()) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = killpg(group, Signal::SIGKILL);
}

/// Resolves once the job's leader `pid` has exited, without reaping it. A process group's id
/// is its leader's PID, and the kernel gives that number to no other process while the leader
/// is unreaped: killing the group after `wait` could instead reach whoever got the number
/// since (with PIDs wrapping every few seconds on a busy box, a stranger's whole group).
/// Woken by SIGCHLD, with a slow poll as a fallback.
async fn leader_exited(pid: Pid) {
    use nix::errno::Errno;
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    let mut children = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child()).ok();
    loop {
        // Listening before looking: a SIGCHLD between the two is kept for the next `recv`.
        match waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG) {
            Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => {}
            // Exited (left as a zombie for the caller to reap), or not a child of ours any more.
            _ => return,
        }
        match children.as_mut() {
            Some(signals) => {
                let _ = tokio::time::timeout(Duration::from_secs(1), signals.recv()).await;
            }
            None => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// The exit code, or 128 + the signal for a process killed by one (as shells report it).
fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|signal| 128 + signal)).unwrap_or(-1)
}

async fn forward(mut pipe: impl AsyncRead + Unpin, chunks: mpsc::Sender<Vec<u8>>) {
    let mut buffer = vec![0u8; 16 * 1024];
    while let Ok(read) = pipe.read(&mut buffer).await {
        if read == 0 || chunks.send(buffer[..read].to_vec()).await.is_err() {
            break;
        }
    }
}

/// The most a job's log file grows on the worker's disk (the server keeps less).
pub const MAX_LOCAL_LOG_BYTES: u64 = 256 << 20;

/// Writes the job's output to its log file as it comes; returns a note when the log could not
/// be kept whole. The pipes are read to the end either way, so the job never blocks on them.
/// The writes are plain `write(2)`s into the page cache, done in place (no blocking-pool trip
/// per chunk); nothing is synced: a box that crashes loses the attempt anyway.
async fn write_log(
    mut log: std::fs::File,
    mut chunks: mpsc::Receiver<Vec<u8>>,
    written: Arc<Notify>,
) -> Option<String> {
    use std::io::Write;
    let mut size = 0u64;
    let mut note = None;
    while let Some(chunk) = chunks.recv().await {
        if note.is_some() || size >= MAX_LOCAL_LOG_BYTES {
            continue;
        }
        let result = if size + chunk.len() as u64 >= MAX_LOCAL_LOG_BYTES {
            let kept = &chunk[..((MAX_LOCAL_LOG_BYTES - size) as usize).min(chunk.len())];
            // On a line of its own, never glued to the line it cut.
            let mid_line = kept.last().is_some_and(|byte| *byte != b'\n');
            let marker = format!(
                "{}[app] log truncated at {MAX_LOCAL_LOG_BYTES} bytes on the worker\n",
                if mid_line { "\n" } else { "" }
            );
            size = MAX_LOCAL_LOG_BYTES;
            let written = match log.write_all(kept) {
                Ok(()) => log.write_all(marker.as_bytes()),
                Err(error) => Err(error),
            };
            if written.is_ok() {
                note = Some(format!("log truncated at {MAX_LOCAL_LOG_BYTES} bytes on the worker"));
            }
            written
        } else {
            size += chunk.len() as u64;
            log.write_all(&chunk)
        };
        if let Err(error) = result {
            let full = matches!(error.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded);
            let why = if full { "worker disk full" } else { "the worker could not write the job's log" };
            note = Some(format!("{why}: log truncated after about {size} bytes ({error})"));
            tracing::warn!(%error, path = "job.log", "{why}; the rest of the job's output is dropped");
        }
        written.notify_one();
    }
    written.notify_one();
    note
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claimed job with one parameter, as the server hands it out.
    fn claimed() -> ClaimedJob {
        serde_json::from_value(serde_json::json!({
            "id": 1, "attempt": 1, "sweep_id": 1, "sweep": "s", "form": "native", "index": 0,
            "params": {"lr": 0.1}, "command": "true", "config": null, "resources": {},
            "timeout_secs": null, "placement": {"gpus": []}, "lease_expires_at": 0
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_slot_is_made_fresh_for_each_attempt_whatever_the_last_one_left() {
        let job = claimed();
        let work = tempfile::tempdir().unwrap();
        let dirs = AttemptDirs::for_slot(work.path(), 0);
        // A new slot (nothing there yet: prepared on a blocking thread), one an earlier attempt
        // left files in (the same), and one left empty (prepared in place).
        for leftovers in [false, true, false] {
            if leftovers {
                std::fs::write(dirs.output.join("old.bin"), b"old").unwrap();
                std::fs::create_dir_all(dirs.cwd.join("deep/er")).unwrap();
                std::fs::write(&dirs.log, b"old log").unwrap();
            }
            let mut log = dirs.prepare(&job, false).await.unwrap();
            std::io::Write::write_all(&mut log, b"new\n").unwrap();
            for dir in [&dirs.cwd, &dirs.output, &dirs.checkpoint] {
                assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0, "{} is empty", dir.display());
            }
            assert_eq!(std::fs::read_to_string(&dirs.config).unwrap(), "{\"lr\":0.1}\n");
            assert_eq!(std::fs::read_to_string(&dirs.log).unwrap(), "new\n", "the log starts empty");
        }
        // Released: the files are emptied and stay, inode and all, for the next attempt (a new
        // inode per file per job costs ever more in ext4's allocator).
        use std::os::unix::fs::MetadataExt;
        let inodes = |dirs: &AttemptDirs| {
            [&dirs.config, &dirs.metrics, &dirs.log].map(|file| std::fs::metadata(file).unwrap().ino())
        };
        let before = inodes(&dirs);
        std::fs::write(&dirs.log, b"output\n").unwrap();
        dirs.clear().unwrap();
        for file in [&dirs.config, &dirs.metrics, &dirs.log] {
            assert_eq!(std::fs::metadata(file).unwrap().len(), 0, "{} is emptied", file.display());
        }
        assert!(dirs.cwd.is_dir() && dirs.output.is_dir(), "the directories stay for the next attempt");
        drop(dirs.prepare(&job, false).await.unwrap());
        assert_eq!(inodes(&dirs), before, "the next attempt writes into the same files");
        assert_eq!(std::fs::read_to_string(&dirs.config).unwrap(), "{\"lr\":0.1}\n");
    }

    #[tokio::test]
    async fn a_job_s_symlink_directory_or_hard_link_in_place_of_a_slot_file_is_replaced_never_written_through() {
        let job = claimed();
        let work = tempfile::tempdir().unwrap();
        let outside = work.path().join("precious.txt");
        std::fs::write(&outside, "keep me, I am long enough to be cut").unwrap();
        let dirs = AttemptDirs::for_slot(work.path(), 0);
        drop(dirs.prepare(&job, false).await.unwrap());
        // What a job could leave behind: its config and log swapped for links to a file of the
        // worker's user, its metrics file for a directory.
        for file in [&dirs.config, &dirs.log] {
            std::fs::remove_file(file).unwrap();
            std::os::unix::fs::symlink(&outside, file).unwrap();
        }
        std::fs::remove_file(&dirs.metrics).unwrap();
        std::fs::create_dir_all(dirs.metrics.join("inside")).unwrap();
        dirs.clear().unwrap();
        let mut log = dirs.prepare(&job, false).await.unwrap();
        std::io::Write::write_all(&mut log, b"new\n").unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep me, I am long enough to be cut");
        for file in [&dirs.config, &dirs.metrics, &dirs.log] {
            assert!(std::fs::symlink_metadata(file).unwrap().is_file(), "{} is a plain file again", file.display());
        }
        assert_eq!(std::fs::read_to_string(&dirs.config).unwrap(), "{\"lr\":0.1}\n");
        assert_eq!(std::fs::read_to_string(&dirs.metrics).unwrap(), "");
        assert_eq!(std::fs::read_to_string(&dirs.log).unwrap(), "new\n");
        drop(log);
        // A job that kept its log under a second name (a hard link) keeps it as it was.
        let kept = work.path().join("kept.log");
        std::fs::hard_link(&dirs.log, &kept).unwrap();
        dirs.clear().unwrap();
        drop(dirs.prepare(&job, false).await.unwrap());
        assert_eq!(std::fs::read_to_string(&kept).unwrap(), "new\n");
        assert_eq!(std::fs::read_to_string(&dirs.log).unwrap(), "");
        // A FIFO in a file's place (opening it for writing would wait for a reader forever)
        // is replaced at once.
        std::fs::remove_file(&dirs.metrics).unwrap();
        nix::unistd::mkfifo(&dirs.metrics, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let cleared = tokio::task::spawn_blocking({
            let dirs = dirs.clone();
            move || dirs.clear()
        });
        tokio::time::timeout(Duration::from_secs(10), cleared).await.expect("not stuck on the FIFO").unwrap().unwrap();
        assert!(std::fs::symlink_metadata(&dirs.metrics).unwrap().is_file());
    }

    #[tokio::test]
    async fn a_metrics_file_the_last_attempt_wrote_is_made_new_so_a_stray_writer_cannot_reach_the_next() {
        use std::os::unix::fs::MetadataExt;
        let job = claimed();
        let work = tempfile::tempdir().unwrap();
        let dirs = AttemptDirs::for_slot(work.path(), 0);
        drop(dirs.prepare(&job, false).await.unwrap());
        let unwritten = std::fs::metadata(&dirs.metrics).unwrap().ino();
        dirs.clear().unwrap();
        drop(dirs.prepare(&job, false).await.unwrap());
        assert_eq!(std::fs::metadata(&dirs.metrics).unwrap().ino(), unwritten, "an unwritten one is kept");
        // A process that outlived the job still holds the file open.
        let mut stray = std::fs::OpenOptions::new().append(true).open(&dirs.metrics).unwrap();
        std::io::Write::write_all(&mut stray, b"{\"loss\": 1}\n").unwrap();
        dirs.clear().unwrap();
        drop(dirs.prepare(&job, false).await.unwrap());
        std::io::Write::write_all(&mut stray, b"{\"loss\": 2}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&dirs.metrics).unwrap(), "", "the next attempt's file is its own");
        assert_ne!(std::fs::metadata(&dirs.metrics).unwrap().ino(), unwritten);
    }

    #[tokio::test]
    async fn the_leader_is_seen_to_exit_but_left_unreaped_so_its_group_id_stays_its_own() {
        let mut child = Command::new("sh").args(["-c", "exit 3"]).process_group(0).spawn().unwrap();
        let pid = Pid::from_raw(child.id().unwrap() as i32);
        tokio::time::timeout(Duration::from_secs(10), leader_exited(pid)).await.expect("the exit is seen");
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the leader is still listed");
        assert!(stat.contains(") Z "), "the leader is a zombie until reaped: {stat}");
        assert_eq!(child.wait().await.unwrap().code(), Some(3), "and the exit status is still there to reap");
    }

    /// Runs `command` to its end in an attempt under `root`, its log in `root/log`.
    async fn run_in(root: &Path, command: &str) -> Ended {
        let dirs = AttemptDirs::at(root.join("attempt"));
        std::fs::create_dir_all(&dirs.cwd).unwrap();
        let log = std::fs::File::create(root.join("log")).unwrap();
        let guard = Guard::start(None, None).unwrap();
        let containment = Containment::start(false);
        let (_stop, stopped) = mpsc::channel(1);
        let launch = Launch {
            command,
            setup: None,
            dirs: &dirs,
            cwd: &dirs.cwd,
            inherited: &[(std::ffi::OsString::from("PATH"), std::env::var_os("PATH").unwrap_or_default())],
            env: &[],
            timeout: Some(Duration::from_secs(60)),
            grace: Duration::from_secs(5),
            guard: &guard,
            containment: &containment,
            attempt: JobAttempt { job_id: shared::api::JobId::new(1), attempt: 1 },
            slot: 0,
            run_as: None,
        };
        run(launch, log, stopped, Arc::new(Notify::new())).await
    }

    #[tokio::test]
    async fn what_a_job_leaves_in_its_group_is_killed_when_its_leader_exits() {
        let root = tempfile::tempdir().unwrap();
        let pid_file = root.path().join("left");
        let command = format!("sleep 300 & echo $! > {}; exit 0", pid_file.display());
        let ended = run_in(root.path(), &command).await;
        assert!(matches!(ended.outcome, Outcome::Exited { code: 0 }), "{:?}", ended.outcome);
        let left: i32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let running = || {
            std::fs::read_to_string(format!("/proc/{left}/stat"))
                .is_ok_and(|stat| stat.contains("(sleep)") && !stat.contains(") Z "))
        };
        while running() {
            assert!(std::time::Instant::now() < deadline, "the job's background sleep outlived it");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
