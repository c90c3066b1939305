//! `app-bench lab --live`: the simulated lab's trace (`lab.rs`: six users' sweeps over two
//! hours, the same seeded job lengths) through real processes, time compressed by `--speed`: a
//! real server, four real workers of 8 fake GPUs each, and real jobs (a shell script that
//! sleeps its length, saves its progress to `$APP_CHECKPOINT_DIR` every 5 simulated minutes,
//! resumes from it, and dies of SIGTERM, which it does not handle; each start and save goes to
//! a ledger, and a preempted attempt lost the time from its last one to its end). The
//! server's own settings are scaled too (`min_runtime_secs`, `preempt_grace_secs`,
//! `backfill_after_secs`; the worker uploads checkpoints every second). Two policies, each in
//! fresh processes: FIFO by priority (one user: the server as it runs without users) and the
//! fair share with preemption and reservations (six users' tokens). What the pure simulation
//! cannot show: the claims' latency, the workers' polling, the jobs' start-up, all counted as
//! GPUs idle while work waits. Asserts nothing.

use crate::lab::{self, BenchLabArgs, Outcome, CHECKPOINT, GPUS, MIN, MIN_RUNTIME, STEP, USERS, WORKERS};
use crate::processes::{options, wait_for, Processes};
use anyhow::Context;
use client::Client;
use shared::api::{JobQuery, SubmitQuery};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const WORKER_TOKEN: &str = "lab-live-worker-token-0123456789";

/// The job: `$1` = `INDEX_WORKMS`, `$2` = checkpoint every ms, `$3` = the ledger its starts
/// and saves go to (job, attempt, GPUs, Unix ms), `$4` = its GPUs. It does not handle SIGTERM
/// (a handler would stop the worker from waiting for its next save, decision 0088).
const JOB: &str = r#"#!/bin/bash
work=${1#*_}; every=$2; ledger=$3; gpus=$4
dir=${APP_CHECKPOINT_DIR:?}
done_ms=0
[ -f "$dir/progress" ] && done_ms=$(cat "$dir/progress")
echo "$APP_JOB_ID $APP_ATTEMPT $gpus $(date +%s%3N)" >> "$ledger"
while [ "$done_ms" -lt "$work" ]; do
  step=$(( work - done_ms )); [ "$step" -gt "$every" ] && step=$every
  sleep "$(printf '%d.%03d' $((step / 1000)) $((step % 1000)))"
  done_ms=$(( done_ms + step ))
  echo "$done_ms" > "$dir/progress.tmp" && mv "$dir/progress.tmp" "$dir/progress"
  echo "$APP_JOB_ID $APP_ATTEMPT $gpus $(date +%s%3N)" >> "$ledger"
done
"#;

fn token(user: usize) -> String {
    format!("lab-live-{}-token-0123456789", USERS[user])
}

/// A sweep of the trace: its user, when it is submitted (simulated ms), its jobs' GPUs,
/// timeout (simulated ms) and lengths (simulated ms).
struct Sweep {
    user: usize,
    at: i64,
    gpus: u32,
    timeout: i64,
    works: Vec<i64>,
}

fn sweeps(seed: u64) -> Vec<Sweep> {
    let mut sweeps: Vec<Sweep> = Vec::new();
    for job in lab::jobs(seed, 1) {
        match sweeps.iter_mut().find(|sweep| sweep.user == job.user && sweep.at == job.submitted) {
            Some(sweep) => sweep.works.push(job.work),
            None => sweeps.push(Sweep {
                user: job.user,
                at: job.submitted,
                gpus: job.gpus,
                timeout: job.timeout,
                works: vec![job.work],
            }),
        }
    }
    sweeps
}

pub async fn run(args: &BenchLabArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.speed >= 1.0 && args.speed <= 600.0, "--speed must be 1 to 600, not {}", args.speed);
    println!(
        "live lab: {WORKERS} worker processes x {GPUS} fake GPUs, {} users, 2 hours of arrivals at {}x (seed {}); \
         real jobs that checkpoint every 5 simulated minutes and lose the rest on SIGTERM",
        USERS.len(),
        args.speed,
        args.seed
    );
    for fair in [false, true] {
        let name = match fair {
            false => "FIFO by priority (one user: today without users), live",
            true => "fair share + preemption + reservations (six users), live",
        };
        let outcome = one_policy(fair, args).await.with_context(|| format!("the live lab, {name}"))?;
        lab::print_outcome(name, &outcome);
    }
    Ok(())
}

/// Real milliseconds of `simulated` ones.
fn real(simulated: i64, speed: f64) -> Duration {
    Duration::from_secs_f64(simulated as f64 / 1000.0 / speed)
}

async fn one_policy(fair: bool, args: &BenchLabArgs) -> anyhow::Result<Outcome> {
    let speed = args.speed;
    let dir = tempfile::tempdir()?;
    let app = crate::app_binary()?;
    let script = dir.path().join("job.sh");
    std::fs::write(&script, JOB)?;
    let ledger = dir.path().join("ledger");
    std::fs::write(&ledger, "")?;
    let secs = |simulated: i64| simulated as f64 / 1000.0 / speed;
    let mut settings = format!(
        "[server]\nheartbeat_secs = 0.5\nmin_runtime_secs = {}\npreempt_grace_secs = {}\nbackfill_after_secs = {}\n\
         preemptible = true\n",
        secs(MIN_RUNTIME),
        secs(2 * MIN),
        secs(lab::BACKFILL_AFTER)
    );
    if fair {
        let users: String = (0..USERS.len()).map(|user| format!("{}:{}\n", USERS[user], token(user))).collect();
        std::fs::write(dir.path().join("users"), users)?;
        std::fs::write(dir.path().join("workers"), format!("{WORKER_TOKEN}\n"))?;
        settings.push_str(&format!(
            "user_token_file = {:?}\nworker_token_file = {:?}\n",
            dir.path().join("users").display().to_string(),
            dir.path().join("workers").display().to_string()
        ));
    }
    settings.push_str(&format!("[worker]\ncheckpoint_secs = 1\nfake_gpus = \"{GPUS}x80GiB\"\nmax_jobs = {GPUS}\n"));
    let config = dir.path().join("app.toml");
    std::fs::write(&config, settings)?;
    let log = |name: &str| std::fs::File::create(dir.path().join(format!("{name}.log")));
    let mut processes = Processes(Vec::new());
    let url = processes.server(&app, dir.path(), &["--config".as_ref(), config.as_os_str()])?;
    let observer = Client::with_options(&url, &options(fair.then(|| token(0))))?;
    wait_for(Duration::from_secs(30), || async { observer.health().await.is_ok() }).await?;
    for worker in 0..WORKERS {
        let mut command = Command::new(&app);
        command
            .args(["--client-only", "--url", &url, "--name", &format!("box-{worker}"), "--config"])
            .arg(&config)
            .arg("--work-dir")
            .arg(dir.path().join(format!("work-{worker}")))
            .stdout(Stdio::null())
            .stderr(log(&format!("worker-{worker}"))?);
        if fair {
            command.env("APP_TOKEN", WORKER_TOKEN);
        }
        processes.0.push(command.spawn()?);
    }
    wait_for(Duration::from_secs(30), || async {
        observer.workers().await.is_ok_and(|workers| workers.len() == WORKERS)
    })
    .await?;

    // Arrivals, each at its time; what each sweep is: its user and GPUs, and when it came.
    let plan = sweeps(args.seed);
    let started = Instant::now();
    let mut arrivals = Vec::new();
    for (number, sweep) in plan.iter().enumerate() {
        let client = Client::with_options(&url, &options(fair.then(|| token(sweep.user))))?;
        let values: Vec<String> = sweep
            .works
            .iter()
            .enumerate()
            .map(|(index, work)| format!("\"{index}_{}\"", real(*work, speed).as_millis()))
            .collect();
        let yaml = format!(
            "name: {user}-{number}\ncommand: bash {script} {{job}} {every} {ledger} {gpus}\npreemptible: true\n\
             timeout: {timeout}s\nresources: {{gpus: {gpus}}}\ngrid:\n  job: [{values}]\n",
            user = USERS[sweep.user],
            script = script.display(),
            every = real(CHECKPOINT, speed).as_millis(),
            ledger = ledger.display(),
            gpus = sweep.gpus,
            timeout = real(sweep.timeout, speed).as_secs_f64().ceil(),
            values = values.join(", ")
        );
        let at = started + real(sweep.at, speed);
        arrivals.push(tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            client.submit(&yaml, &SubmitQuery::default()).await.map(|_| Instant::now())
        }));
    }

    // Samples every simulated step: each user's GPUs in use, who has work queued.
    let by_name: BTreeMap<String, (usize, u32)> = plan
        .iter()
        .enumerate()
        .map(|(number, sweep)| (format!("{}-{number}", USERS[sweep.user]), (sweep.user, sweep.gpus)))
        .collect();
    let jobs_in_all: u64 = plan.iter().map(|sweep| sweep.works.len() as u64).sum();
    let (mut used, mut backlogged) = (Vec::new(), Vec::new());
    let (mut idle, mut waiting_steps, mut busy) = (0u64, 0u64, 0u64);
    let step = real(STEP, speed);
    let cap = started + real(12 * 60 * MIN, speed);
    let mut tick = tokio::time::interval(step);
    // A slow listing delays the samples after it rather than bunching them up.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let sweeps = observer.sweeps().await?;
        let mut step_used = vec![0u32; USERS.len()];
        let mut step_backlog = vec![false; USERS.len()];
        let mut ended = 0;
        for sweep in &sweeps {
            let Some(&(user, gpus)) = by_name.get(&sweep.name) else { continue };
            step_used[user] += gpus * sweep.counts.running as u32;
            step_backlog[user] |= sweep.counts.queued > 0;
            ended += sweep.counts.succeeded + sweep.counts.failed + sweep.counts.cancelled;
        }
        let in_use: u32 = step_used.iter().sum();
        busy += u64::from(in_use);
        if step_backlog.iter().any(|waiting| *waiting) {
            idle += u64::from((GPUS * WORKERS as u32).saturating_sub(in_use));
            waiting_steps += u64::from(GPUS * WORKERS as u32);
        }
        used.push(step_used);
        backlogged.push(step_backlog);
        if ended >= jobs_in_all || Instant::now() >= cap {
            break;
        }
    }
    let makespan = started.elapsed();
    let mut submitted_at = Vec::new();
    for arrival in arrivals {
        submitted_at.push(arrival.await?.context("submitting a sweep")?);
    }

    // Waits: submission to each job's first start (the attempts' times are the server's
    // clock, Unix ms: taken against the same clock here).
    let now_unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as i64;
    let mut waits = vec![Vec::new(); USERS.len()];
    // Each attempt's last start or save (Unix ms), and its GPUs, from the ledger.
    let mut kept: BTreeMap<(i64, u32), (i64, f64)> = BTreeMap::new();
    for line in std::fs::read_to_string(&ledger)?.lines() {
        let fields: Vec<i64> = line.split_whitespace().filter_map(|field| field.parse().ok()).collect();
        if let [job, attempt, gpus, at] = fields[..] {
            let last = kept.entry((job, attempt as u32)).or_insert((at, gpus as f64));
            last.0 = last.0.max(at);
        }
    }
    let (mut lost_gpu_ms, mut preemptions) = (0f64, 0usize);
    for (number, sweep) in plan.iter().enumerate() {
        let submitted = now_unix - submitted_at[number].elapsed().as_millis() as i64;
        let query = JobQuery {
            sweep: Some(format!("{}-{number}", USERS[sweep.user])),
            limit: Some(1000),
            ..Default::default()
        };
        for job in observer.jobs(&query).await?.jobs {
            let attempts = observer.job_attempts(job.id).await?;
            // A preempted attempt (requeued) lost the time from its last save to its end.
            let preempted = |attempt: &&shared::api::AttemptInfo| {
                attempt.reason.as_deref().is_some_and(|reason| reason.starts_with("preempted"))
            };
            for attempt in attempts.iter().filter(preempted) {
                let (Some(ended), Some((saved, gpus))) = (attempt.ended_at, kept.get(&(job.id.get(), attempt.attempt)))
                else {
                    continue;
                };
                lost_gpu_ms += (ended - saved).max(0) as f64 * gpus;
                preemptions += 1;
            }
            let first = attempts.iter().map(|attempt| attempt.started_at).min();
            let wait_real = first.unwrap_or(now_unix) - submitted;
            waits[sweep.user].push((wait_real.max(0) as f64 * speed) as i64);
        }
    }
    let busy_gpu_ms = busy as f64 * step.as_secs_f64() * 1000.0;
    drop(processes);
    let _ = dir_kept(dir.path());
    Ok(Outcome {
        waits,
        used,
        backlogged,
        idle_while_waiting: idle as f64 / waiting_steps.max(1) as f64,
        lost_fraction: lost_gpu_ms / busy_gpu_ms.max(1.0),
        preemptions,
        makespan_min: makespan.as_secs_f64() * speed / 60.0,
    })
}

/// Where the processes' logs were, when `APP_LAB_KEEP` asks that they be kept.
fn dir_kept(dir: &Path) -> anyhow::Result<()> {
    if let Some(keep) = std::env::var_os("APP_LAB_KEEP") {
        let target = Path::new(&keep).join(dir.file_name().unwrap_or_default());
        std::fs::create_dir_all(&target)?;
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.path().extension().is_some_and(|ext| ext == "log") {
                std::fs::copy(entry.path(), target.join(entry.file_name()))?;
            }
        }
    }
    Ok(())
}
