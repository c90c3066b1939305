//! `app wait SWEEP|JOB` (and `app submit --wait`): wait until every job has finished, with a
//! progress bar on a terminal; then exit non-zero if any failed, printing the failed jobs with
//! their reasons and the last lines of their logs, as a script needs to see them. Jobs that no
//! connected worker can run are said to be so (with why) rather than waited for silently.

use super::UrlArg;
use anyhow::Context;
use clap::Args;
use client::Client;
use indicatif::{ProgressBar, ProgressStyle};
use shared::api::{Job, JobId, JobQuery, LogQuery, StatusCounts};
use shared::job::JobStatus;
use std::collections::VecDeque;
use std::io::Write;
use std::time::{Duration, Instant};

/// Failed jobs shown in full; the others are counted.
const SHOWN_FAILURES: usize = 5;
/// Log lines shown per failed job.
const LOG_LINES: usize = 10;

#[derive(Debug, Args)]
pub struct WaitArgs {
    /// A job id (a number) or a sweep (id with --sweep, or name).
    #[arg(value_name = "SWEEP|JOB")]
    pub target: String,
    /// Treat TARGET as a sweep (id or name) even if it is a number.
    #[arg(long)]
    pub sweep: bool,
    /// Give up after this many seconds (exit non-zero, jobs keep running).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    #[command(flatten)]
    pub url: UrlArg,
}

/// What is waited for.
#[derive(Debug, Clone)]
pub enum Target {
    Sweep(String),
    Job(JobId),
}

pub async fn run(args: WaitArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let target = match args.target.parse::<JobId>() {
        Ok(id) if !args.sweep => Target::Job(id),
        _ => Target::Sweep(args.target.clone()),
    };
    let timeout = match args.timeout {
        Some(seconds) => Some(
            Duration::try_from_secs_f64(seconds)
                .map_err(|_| anyhow::anyhow!("--timeout must be a number of seconds, not {seconds}"))?,
        ),
        None => None,
    };
    wait(&client, &target, timeout).await
}

/// What a wait follows: the target's counts, why its queued jobs cannot run (if they cannot)
/// and, for a sweep, its metric when finished runs have not reported it.
struct Seen {
    counts: StatusCounts,
    unplaceable: Option<String>,
    metric_missing: Option<String>,
}

/// The target now. A sweep its failing runs paused ends the wait with its reason.
async fn counts(client: &Client, target: &Target) -> anyhow::Result<Seen> {
    match target {
        Target::Sweep(key) => {
            let sweep = client.sweep(key).await.with_context(|| format!("following sweep {key}"))?;
            if let Some(paused) = &sweep.info.paused {
                anyhow::bail!("sweep {}: {}", sweep.info.name, paused.reason);
            }
            let metric_missing = sweep.metric_missing.map(|missing| missing.sentence());
            Ok(Seen { counts: sweep.info.counts, unplaceable: sweep.unplaceable, metric_missing })
        }
        Target::Job(id) => {
            let job = client.job(*id).await.with_context(|| format!("following job {id}"))?;
            let mut counts = StatusCounts::default();
            counts.add(job.status, 1);
            Ok(Seen { counts, unplaceable: job.waiting.and_then(|waiting| waiting.reason), metric_missing: None })
        }
    }
}

/// Warns of a sweep's metric that its runs have not reported, if so; answers whether it did.
fn say_missing(target: &Target, missing: &Option<String>) -> bool {
    if let Some(missing) = missing {
        eprintln!("warning: {}: {missing}", name(target));
    }
    missing.is_some()
}

fn finished(counts: &StatusCounts) -> u64 {
    counts.succeeded + counts.failed + counts.cancelled
}

/// Waits until no job of `target` is queued or running; an error when any failed.
pub async fn wait(client: &Client, target: &Target, timeout: Option<Duration>) -> anyhow::Result<()> {
    let started = Instant::now();
    let Seen { mut counts, mut unplaceable, mut metric_missing } = counts(client, target).await?;
    let mut said: Option<String> = None;
    let mut said_metric = false;
    // Drawn only on a terminal (indicatif hides itself otherwise).
    let bar = ProgressBar::new(counts.total());
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} finished, {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    // Quick at first (a short job ends soon), then every two seconds for long sweeps.
    let mut pause = Duration::from_millis(100);
    while finished(&counts) < counts.total() {
        bar.set_length(counts.total());
        bar.set_position(finished(&counts));
        bar.set_message(format!("{} running, {} queued, {} failed", counts.running, counts.queued, counts.failed));
        if unplaceable != said {
            if let Some(reason) = &unplaceable {
                // On stderr, above the bar: stdout keeps the final result for scripts.
                bar.suspend(|| {
                    eprintln!("{}: queued jobs cannot run on any connected worker: {reason}", name(target));
                    eprintln!("  (they wait until such a worker connects; Ctrl-C stops waiting, the jobs stay queued)");
                });
            }
            said = unplaceable.clone();
        }
        // Once, as soon as a finished run shows it: not at the end of a long sweep.
        if !said_metric {
            said_metric = bar.suspend(|| say_missing(target, &metric_missing));
        }
        if let Some(limit) = timeout {
            if started.elapsed() >= limit {
                bar.finish_and_clear();
                anyhow::bail!(
                    "{}: timed out after {:.0}s with {} of {} jobs finished ({} running, {} queued)",
                    name(target),
                    limit.as_secs_f64(),
                    finished(&counts),
                    counts.total(),
                    counts.running,
                    counts.queued
                );
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(2));
        Seen { counts, unplaceable, metric_missing } = self::counts(client, target).await?;
    }
    bar.finish_and_clear();
    if !said_metric {
        say_missing(target, &metric_missing);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}: {} succeeded, {} failed, {} cancelled",
        name(target),
        counts.succeeded,
        counts.failed,
        counts.cancelled
    )?;
    if counts.failed == 0 {
        return Ok(());
    }
    let failed = failed_jobs(client, target).await?;
    for job in failed.iter().take(SHOWN_FAILURES) {
        writeln!(out, "{}", failure_line(job))?;
        for line in last_log_lines(client, job.id, LOG_LINES).await.unwrap_or_default() {
            writeln!(out, "    | {line}")?;
        }
    }
    if counts.failed > SHOWN_FAILURES as u64 {
        let hint = match target {
            Target::Sweep(key) => format!("app status {key} --status failed"),
            Target::Job(_) => String::new(),
        };
        writeln!(out, "... and {} more failed jobs: {hint}", counts.failed - SHOWN_FAILURES as u64)?;
    }
    drop(out);
    anyhow::bail!("{}: {} of {} jobs failed", name(target), counts.failed, counts.total())
}

fn name(target: &Target) -> String {
    match target {
        Target::Sweep(key) => format!("sweep {key}"),
        Target::Job(id) => format!("job {id}"),
    }
}

async fn failed_jobs(client: &Client, target: &Target) -> anyhow::Result<Vec<Job>> {
    match target {
        Target::Sweep(key) => {
            let query = JobQuery {
                sweep: Some(key.clone()),
                status: Some(JobStatus::Failed),
                limit: Some(SHOWN_FAILURES as u32),
                ..JobQuery::default()
            };
            Ok(client.jobs(&query).await.context("listing failed jobs")?.jobs)
        }
        Target::Job(id) => Ok(vec![client.job(*id).await.with_context(|| format!("reading job {id}"))?]),
    }
}

/// `job 12 (#3, lr=0.1) failed on gpu-1: exited with code 1`.
pub fn failure_line(job: &Job) -> String {
    let params = super::format::params(&job.params);
    let params = if params.is_empty() { String::new() } else { format!(", {params}") };
    let worker = job.worker.as_ref().map(|worker| format!(" on {worker}")).unwrap_or_default();
    let reason = job.reason.clone().unwrap_or_else(|| "no reason recorded".into());
    format!("job {} (#{}{params}) failed{worker}: {reason}", job.id, job.index)
}

/// The last `count` lines of the latest attempt's log. The log is read page by page from the
/// start (the API has no tail), keeping only the last lines.
async fn last_log_lines(client: &Client, job: JobId, count: usize) -> anyhow::Result<Vec<String>> {
    let mut query = LogQuery::default();
    let mut lines: VecDeque<String> = VecDeque::with_capacity(count + 1);
    let mut partial = String::new();
    loop {
        let chunk = client.log(job, &query).await?;
        if chunk.text.is_empty() {
            break;
        }
        query.attempt = Some(chunk.attempt);
        query.offset = chunk.next_offset;
        partial.push_str(&chunk.text);
        let mut pieces: Vec<&str> = partial.split('\n').collect();
        let rest = tail_of(pieces.pop().unwrap_or_default(), PARTIAL_LINE_BYTES).to_string();
        for line in pieces {
            push_line(&mut lines, line, count);
        }
        partial = rest;
    }
    if !partial.is_empty() {
        push_line(&mut lines, &partial, count);
    }
    Ok(lines.into())
}

/// The most of an unfinished line kept while reading on (a progress bar may never end one).
const PARTIAL_LINE_BYTES: usize = 4096;

/// What a terminal would show of `line`: after its last carriage return, without colour codes.
fn push_line(lines: &mut VecDeque<String>, line: &str, count: usize) {
    let shown = line.trim_end_matches('\r').rsplit('\r').next().unwrap_or_default();
    lines.push_back(console::strip_ansi_codes(tail_of(shown, PARTIAL_LINE_BYTES)).trim_end().to_string());
    if lines.len() > count {
        lines.pop_front();
    }
}

/// The last `bytes` bytes of `text` (fewer, to start on a character).
fn tail_of(text: &str, bytes: usize) -> &str {
    let start = text.len().saturating_sub(bytes);
    let start = (start..text.len()).find(|index| text.is_char_boundary(*index)).unwrap_or(text.len());
    &text[start..]
}
