//! The launcher: `app train` with several ranks on this machine starts them as children of
//! itself with torchrun's variables (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`,
//! `MASTER_ADDR`, `MASTER_PORT`), passes rank 0's output through, and watches them. When a rank
//! exits with an error or is killed, the others are stopped (SIGTERM, then SIGKILL after a
//! grace period) and the run fails with `rank N died (...)`: nobody waits on a dead peer. A
//! rank dies with its launcher (a parent-death signal), so a killed launcher leaves none behind.
//! SIGTERM to the group (a preemption) is not a death: the ranks save their epoch and exit
//! with 143 together (`crate::stop`), and so does the launcher.

use super::TrainError;
use crate::ranks::LaunchPlan;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Set in each rank's environment: the launcher's pid, for the parent-death check.
const LAUNCHER_PID: &str = "APP_TRAIN_LAUNCHER_PID";
/// How long stopped ranks get to exit on SIGTERM before SIGKILL.
const GRACE: Duration = Duration::from_secs(5);

struct RankProcess {
    rank: usize,
    child: Child,
    /// The rank's own one-line error, when it printed one.
    error: Arc<Mutex<Option<String>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// Starts this machine's ranks with the same arguments as this process and waits for them.
pub fn run(plan: &LaunchPlan) -> Result<(), TrainError> {
    let port = match plan.master_port {
        Some(port) => port,
        None => free_port().map_err(super::io_error("finding a free port for MASTER_PORT"))?,
    };
    let exe = std::env::current_exe().map_err(super::io_error("finding this program to start the ranks"))?;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let mut ranks = Vec::with_capacity(plan.local_ranks);
    for local in 0..plan.local_ranks {
        let rank = plan.node_rank * plan.local_ranks + local;
        let mut command = Command::new(&exe);
        command
            .args(&args)
            .envs(plan.child_env(local, port))
            .env(LAUNCHER_PID, std::process::id().to_string())
            .stderr(Stdio::piped());
        if rank != 0 {
            command.stdout(Stdio::null());
        }
        let spawned = command.spawn();
        let mut child = match spawned {
            Ok(child) => child,
            Err(error) => {
                stop(&mut ranks);
                return Err(TrainError::Io { what: format!("starting rank {rank}"), error });
            }
        };
        let error = Arc::new(Mutex::new(None));
        let reader = child.stderr.take().map(|stderr| {
            let error = Arc::clone(&error);
            std::thread::spawn(move || forward_stderr(rank, stderr, &error))
        });
        ranks.push(RankProcess { rank, child, error, reader });
    }
    watch(&mut ranks)
}

/// Passes a rank's stderr through, prefixed with its rank, keeping its final error line
/// (`error: ...`) for the launcher's own message instead.
fn forward_stderr(rank: usize, stderr: std::process::ChildStderr, error: &Mutex<Option<String>>) {
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        if let Some(message) = line.strip_prefix("error: ") {
            *error.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(message.to_string());
        } else {
            let _ = writeln!(std::io::stderr(), "[rank {rank}] {line}");
        }
    }
}

fn watch(ranks: &mut [RankProcess]) -> Result<(), TrainError> {
    let mut finished = vec![false; ranks.len()];
    let mut stopped = false;
    loop {
        for (index, rank) in ranks.iter_mut().enumerate() {
            if finished[index] {
                continue;
            }
            let Ok(Some(status)) = rank.child.try_wait() else { continue };
            finished[index] = true;
            // A rank exits with 143 only once told to stop (SIGTERM, to it or to any rank: they
            // agree after each epoch), having saved that epoch: the others do the same.
            if status.code() == Some(crate::stop::EXIT_STATUS) {
                stopped = true;
                continue;
            }
            if !status.success() {
                let (number, error) = (rank.rank, Arc::clone(&rank.error));
                stop(ranks);
                let error = error.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
                return Err(TrainError::RankDied { rank: number, how: describe(status), error });
            }
        }
        if finished.iter().all(|done| *done) {
            for rank in ranks.iter_mut() {
                if let Some(reader) = rank.reader.take() {
                    let _ = reader.join();
                }
            }
            return match stopped {
                true => Err(TrainError::Stopped("the ranks stopped by SIGTERM after saving their last epoch".into())),
                false => Ok(()),
            };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGTERM to every rank still running, SIGKILL to those still there after the grace period.
fn stop(ranks: &mut [RankProcess]) {
    for rank in ranks.iter_mut() {
        if matches!(rank.child.try_wait(), Ok(None)) {
            let _ = kill(Pid::from_raw(rank.child.id() as i32), Signal::SIGTERM);
        }
    }
    let deadline = Instant::now() + GRACE;
    for rank in ranks.iter_mut() {
        while matches!(rank.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(rank.child.try_wait(), Ok(None)) {
            let _ = rank.child.kill();
            let _ = rank.child.wait();
        }
        if let Some(reader) = rank.reader.take() {
            let _ = reader.join();
        }
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => match Signal::try_from(signal) {
            Ok(name) => format!("killed by {name}"),
            Err(_) => format!("killed by signal {signal}"),
        },
        _ => status.to_string(),
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?.local_addr()?.port())
}

/// In a rank our launcher started: die with it. Returns an error when it is already gone.
pub fn die_with_launcher() -> Result<(), TrainError> {
    let Some(launcher) = std::env::var(LAUNCHER_PID).ok().and_then(|pid| pid.parse::<i32>().ok()) else {
        return Ok(());
    };
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    if nix::unistd::getppid().as_raw() != launcher {
        return Err(TrainError::Torch("the launcher of this rank has exited".into()));
    }
    Ok(())
}
