//! Runs one attempt: `sh -c COMMAND` in its own process group, in the attempt's fresh
//! directory (`attempt_dirs`) with its environment (`job_env`), stdout and stderr appended to
//! the attempt's log file as they come, and a whole-group kill (SIGTERM, then SIGKILL after a grace period) on cancel or timeout.
//!
//! A sweep's `setup:` line runs first in the same shell, bash where there is one (so
//! `source .venv/bin/activate` or `conda activate x` holds for the command); the shell marks that
//! setup succeeded before the command starts, so a setup that fails, or exits the shell, fails
//! the attempt as "setup failed".

use crate::attempt_dirs::AttemptDirs;
use crate::containment::Containment;
use crate::guard::Guard;
use crate::run_as::RunAs;
use crate::saves::{self, saving, writes_under, SaveWait, Saves};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use shared::api::JobAttempt;
use shared::job::Outcome;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;
use tokio::sync::{mpsc, Notify};

/// The shell jobs run in, by absolute path: with a bare `sh`, and `PATH` set for the job, the
/// standard library would fall back from `posix_spawn` to a full fork of the multi-threaded
/// worker for every job.
pub const SHELL: &str = "/bin/sh";
/// The shell of a job with a `setup:` line, where there is one: setup lines are written for
/// bash (`source .venv/bin/activate`, `conda activate`), as SkyPilot's `setup` runs in bash.
pub const SETUP_SHELL: &str = "/bin/bash";

/// Why the worker killed an attempt; its outcome says so in words (`Outcome::Killed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// A user cancelled it.
    Cancelled,
    /// The server no longer holds the attempt for this worker: it reports nothing.
    LeaseLost,
    /// It ran past its `timeout` of this many seconds.
    TimedOut(u64),
    /// The server preempted it: it goes back to the queue and resumes from its checkpoint.
    Preempted,
}

impl KillReason {
    pub fn outcome(self) -> Outcome {
        let reason = match self {
            KillReason::Cancelled => "cancelled".to_string(),
            KillReason::LeaseLost => "lease lost".to_string(),
            KillReason::TimedOut(limit) => format!("timed out after {limit} s"),
            KillReason::Preempted => return Outcome::Preempted,
        };
        Outcome::Killed { reason }
    }
}

/// Why the worker ends an attempt early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Cancel,
    /// The worker is shutting down for good; the job goes back to the queue.
    Abandon,
    /// The server says this worker no longer holds the attempt.
    Lost,
    /// The server preempted the attempt: SIGTERM, then SIGKILL after this grace (the server's
    /// `preempt_grace_secs`, not the worker's own grace).
    Preempt(Duration),
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
    /// Where its latest checkpoint save goes for the heartbeat.
    pub saved: &'a saves::Latest,
}

/// How a job's process ended, and what is worth knowing beyond that.
#[derive(Debug)]
pub struct Ended {
    pub outcome: Outcome,
    /// Why the worker killed it, when it did.
    pub killed: Option<KillReason>,
    /// It outlived its grace after SIGTERM and was killed with SIGKILL.
    pub forced: bool,
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
    let Launch {
        command,
        setup,
        dirs,
        cwd,
        inherited,
        env,
        timeout,
        grace,
        guard,
        containment,
        attempt,
        slot,
        run_as,
        saved,
    } = launch;
    let launch_grace = grace;
    let failed =
        |reason: String| Ended { outcome: Outcome::Error { reason }, killed: None, forced: false, notes: Vec::new() };
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
    // Biased, exit first: a job that has just ended is not stopped after the fact (a
    // preemption would throw away a finished run). A closed `stop` channel disables its branch
    // (the pattern does not match); the others still end the wait.
    let exited = async {
        // The leader is not reaped before its group was killed (see `leader_exited`), so every
        // signal below reaches the job's own group and never a stranger given the same number.
        match group {
            Some(group) => leader_exited(group).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(exited);
    // Its checkpoint saves, looked at while it runs: a preemption may wait for the next one.
    let mut saves = Saves::default();
    let mut looks = tokio::time::interval(saves::LOOK_EVERY);
    looks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut waiting: Option<SaveWait> = None;
    // Saves told to the heartbeat so far.
    let mut told = 0;
    let mut notes = Vec::new();
    let next = loop {
        let until = waiting.as_ref().map(|wait| wait.until);
        tokio::select! {
            biased;
            () = &mut exited => break Next::Exited(None),
            status = child.wait(), if group.is_none() => break Next::Exited(Some(status)),
            Some(reason) = stop.recv() => match (reason, &waiting) {
                // Each heartbeat repeats the order: the wait goes on.
                (Stop::Preempt(_), Some(_)) => {}
                (Stop::Preempt(preempt_grace), None) => {
                    match SaveWait::start(&saves, preempt_grace, group, &dirs.checkpoint) {
                        Some(wait) => waiting = Some(wait),
                        None => break Next::Stop(Some(KillReason::Preempted), preempt_grace),
                    }
                }
                (Stop::Cancel, _) => break Next::Stop(Some(KillReason::Cancelled), grace),
                (Stop::Lost, _) => break Next::Stop(Some(KillReason::LeaseLost), grace),
                // The worker stopping during a wait: a preemption still, with its own grace.
                (Stop::Abandon, Some(_)) => break Next::Stop(Some(KillReason::Preempted), grace),
                (Stop::Abandon, None) => break Next::Stop(None, grace),
            },
            _ = &mut deadline => break Next::Stop(Some(KillReason::TimedOut(timeout.unwrap_or_default().as_secs())), grace),
            () = tokio::time::sleep_until(until.unwrap_or_else(tokio::time::Instant::now)), if until.is_some() => {
                if let Some(wait) = waiting.as_mut() {
                    // A save under way at the due time may take until half the grace.
                    if wait.until < wait.most && saving(&saves, group, &dirs.checkpoint) {
                        wait.until = wait.most;
                    } else {
                        notes.push(wait.note(false));
                        break Next::Stop(Some(KillReason::Preempted), wait.grace_left());
                    }
                }
            }
            _ = looks.tick() => {
                saves.look(&dirs.checkpoint, || writes_under(group, &dirs.checkpoint));
                if saves.settled_after(told) {
                    told = saves.count();
                    if let Ok(mut latest) = saved.lock() {
                        *latest = saves.latest();
                    }
                }
                if let Some(wait) = waiting.take_if(|wait| wait.written(&saves, group, &dirs.checkpoint)) {
                    notes.push(wait.note(true));
                    break Next::Stop(Some(KillReason::Preempted), wait.grace_left());
                }
            }
        }
    };
    let (waited, stopped, killed, forced) = match next {
        Next::Exited(status) => (status, None, None, false),
        Next::Stop(reason, grace) => {
            // A preemption's grace may be long: the worker shutting down meanwhile, or losing
            // the attempt, cuts it to the worker's own.
            let cut = (reason == Some(KillReason::Preempted)).then_some((&mut stop, launch_grace));
            let forced = terminate(group, grace, cut).await;
            (None, Some(reason.map_or(Outcome::Abandoned, KillReason::outcome)), reason, forced)
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
    match tokio::time::timeout(Duration::from_secs(2), &mut writer).await {
        Ok(Ok(Some(note))) => notes.push(note),
        Ok(_) => {}
        Err(_) => writer.abort(),
    }
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
    Ended { outcome, killed, forced, notes }
}

/// How the wait for a job's end ended.
enum Next {
    /// It exited (with its status when its group is not watched).
    Exited(Option<std::io::Result<std::process::ExitStatus>>),
    /// The worker stops it: why (none: abandoned), and the grace from SIGTERM to SIGKILL.
    Stop(Option<KillReason>, Duration),
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
/// time. The leader stays unreaped meanwhile (its caller reaps it). With `cut`, an abandon or
/// a lost attempt received meanwhile shortens the grace to `cut`'s own. True when some process
/// outlived the grace.
async fn terminate(
    group: Option<Pid>,
    grace: Duration,
    mut cut: Option<(&mut mpsc::Receiver<Stop>, Duration)>,
) -> bool {
    let Some(group) = group else { return false };
    let _ = killpg(group, Signal::SIGTERM);
    let mut deadline = tokio::time::Instant::now() + grace;
    while crate::job_processes::group_has_live_members(group.as_raw()) && tokio::time::Instant::now() < deadline {
        if let Some((stop, shorter)) = cut.as_mut() {
            if let Ok(Stop::Abandon | Stop::Lost) = stop.try_recv() {
                deadline = deadline.min(tokio::time::Instant::now() + *shorter);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let forced = crate::job_processes::group_has_live_members(group.as_raw());
    let _ = killpg(group, Signal::SIGKILL);
    forced
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
        run_telling(root, command, &saves::Latest::default()).await
    }

    /// [`run_in`], its saves told to `saved`.
    async fn run_telling(root: &Path, command: &str, saved: &saves::Latest) -> Ended {
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
            saved,
        };
        run(launch, log, stopped, Arc::new(Notify::new())).await
    }

    #[tokio::test]
    async fn each_save_that_ends_is_put_where_the_next_heartbeat_takes_it() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("attempt").join("checkpoint");
        let command =
            format!("sleep 1; mkdir -p {d}; echo 1 > {d}/a; sleep 1.6; echo 2 > {d}/b; sleep 1.6", d = dir.display());
        let saved = saves::Latest::default();
        let ended = run_telling(root.path(), &command, &saved).await;
        assert!(matches!(ended.outcome, Outcome::Exited { code: 0 }), "{:?}", ended.outcome);
        let (at, every) = saved.lock().unwrap().take().expect("the second save was told");
        let written = std::fs::metadata(dir.join("b")).unwrap().modified().unwrap();
        let written = written.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
        assert!((written - at).abs() < 50, "dated by its file: {at} against {written}");
        assert!(every.is_some_and(|every| (1_300..3_000).contains(&every)), "the interval since the first: {every:?}");
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
