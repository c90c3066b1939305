//! `app status [SWEEP] [--status S] [--mine | --user NAME] [--json]`: the sweeps in the queue
//! with their owners, or jobs (of one sweep, or of every sweep with `--status`) with their
//! start, duration and best metric; a queued job says why it waits (its place in the queue, or
//! why no connected worker can run it). `--mine` and `--user` keep one user's sweeps and jobs,
//! filtered by the server (`?owner=`).

use super::{format, table, UrlArg};
use anyhow::Context;
use clap::Args;
use comfy_table::Table;
use shared::api::{Job, JobQuery, JobSort, SortOrder, StatusCounts, SweepInfo, SweepQuery};
use shared::job::JobStatus;
use shared::sweep::{Goal, Metric};
use std::io::Write;

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// A sweep (id or name): list its jobs. Without it, list the sweeps (or, with --status,
    /// the jobs of every sweep in that status).
    pub sweep: Option<String>,
    /// Only jobs in this status: queued, running, succeeded, failed, cancelled.
    #[arg(long)]
    pub status: Option<JobStatus>,
    /// How many jobs to list.
    #[arg(long, default_value_t = 50)]
    pub limit: u32,
    /// Print JSON: the list of sweeps (each with its `owner`), or {"total": N, "jobs": [...]}.
    #[arg(long)]
    pub json: bool,
    /// Only your own sweeps and their jobs (the user your token names: `app whoami`).
    #[arg(long, conflicts_with = "user")]
    pub mine: bool,
    /// Only this user's sweeps and their jobs.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    #[command(flatten)]
    pub url: UrlArg,
}

/// The owner `--mine` or `--user` asks for, if either.
pub async fn owner_asked(client: &client::Client, mine: bool, user: Option<&str>) -> anyhow::Result<Option<String>> {
    if let Some(name) = user {
        shared::names::check_user_name(name).map_err(|why| anyhow::anyhow!("--user {name}: {why}"))?;
        return Ok(Some(name.to_string()));
    }
    if !mine {
        return Ok(None);
    }
    let me = client.whoami().await.context("asking the server who your token names (for --mine)")?;
    Ok(Some(me.name))
}

pub async fn run(args: StatusArgs) -> anyhow::Result<()> {
    let client = super::client(&args.url)?;
    let mut out = std::io::stdout().lock();
    let width = table::terminal_width();
    let now = format::now_ms();
    let owner = owner_asked(&client, args.mine, args.user.as_deref()).await?;
    let (metric, query) = match (&args.sweep, args.status) {
        (None, None) => {
            let at = client.base_url().to_string();
            let query = SweepQuery { owner: owner.clone() };
            let sweeps = client.sweeps_where(&query).await.with_context(|| format!("listing sweeps at {at}"))?;
            if args.json {
                writeln!(out, "{}", serde_json::to_string_pretty(&sweeps)?)?;
            } else if sweeps.is_empty() {
                match &owner {
                    Some(owner) => writeln!(out, "no sweeps of {owner}")?,
                    None => writeln!(out, "no sweeps yet: submit one with `app submit FILE`")?,
                }
            } else {
                writeln!(out, "{}", table::render(&sweeps_table(&sweeps, now, width)))?;
                for sweep in &sweeps {
                    if let Some(why) = &sweep.held_back {
                        writeln!(out, "{} waits for its owner's quota: {why}", sweep.name)?;
                    }
                    if sweep.preempted > 0 {
                        writeln!(out, "{}: {}", sweep.name, preempted_sentence(sweep.preempted))?;
                    }
                    if let Some(reserved) = &sweep.reserved {
                        writeln!(out, "{}: {}", sweep.name, reserved_sentence(reserved, now))?;
                    }
                }
            }
            return Ok(());
        }
        (None, Some(status)) => (None, JobQuery { status: Some(status), owner, ..JobQuery::default() }),
        (Some(key), status) => {
            let detail = client.sweep(key).await.with_context(|| format!("looking up sweep {key}"))?;
            let sweep = detail.info;
            if !args.json {
                writeln!(out, "{}", sweep_line(&sweep))?;
                if let Some(paused) = &sweep.paused {
                    writeln!(out, "{}", paused.reason)?;
                }
                if let Some(missing) = &detail.metric_missing {
                    writeln!(out, "warning: {}", missing.sentence())?;
                }
                if let Some(class) = &sweep.priority_class {
                    writeln!(out, "priority class: {class} (across users, a higher class goes first and may preempt)")?;
                }
                if let Some(why) = &sweep.held_back {
                    writeln!(out, "its queued jobs wait for its owner's quota: {why}")?;
                }
                if sweep.preempted > 0 {
                    writeln!(out, "{}", preempted_sentence(sweep.preempted))?;
                }
                if let Some(reserved) = &sweep.reserved {
                    writeln!(out, "{}", reserved_sentence(reserved, now))?;
                }
                if let Some(reason) = &detail.unplaceable {
                    writeln!(out, "its queued jobs cannot run on any connected worker: {reason}")?;
                }
            }
            let query = JobQuery { sweep: Some(sweep.id.to_string()), status, owner, ..JobQuery::default() };
            (sweep.metric, query)
        }
    };
    // Across sweeps the newest jobs matter most; within a sweep, index order reads best.
    let order = if args.sweep.is_none() { SortOrder::Desc } else { SortOrder::Asc };
    let query =
        JobQuery { limit: Some(args.limit), sort: Some(JobSort::Id), order: Some(order), positions: true, ..query };
    let page = client.jobs(&query).await.context("listing jobs")?;
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&page)?)?;
        return Ok(());
    }
    if page.jobs.is_empty() {
        let what = args.status.map(|status| format!("{status} ")).unwrap_or_default();
        writeln!(out, "no {what}jobs")?;
        return Ok(());
    }
    let table = jobs_table(&page.jobs, metric.as_ref(), args.sweep.is_none(), now, width);
    writeln!(out, "{}", table::render(&table))?;
    let shown = page.jobs.len() as u64;
    if page.total > shown {
        writeln!(out, "... {} more (use --limit or --status)", page.total - shown)?;
    }
    Ok(())
}

/// `sweep vaep-grid (id 3): 108 jobs: 80 queued, 8 running, 20 succeeded; owner user-a`
/// (counts that are zero left out, so the line fits a terminal).
fn sweep_line(sweep: &SweepInfo) -> String {
    let (name, id, total, progress) = (&sweep.name, sweep.id, sweep.counts.total(), progress(&sweep.counts));
    format!("sweep {name} (id {id}): {total} jobs: {progress}; owner {}", sweep.owner)
}

pub fn goal_word(goal: Goal) -> &'static str {
    match goal {
        Goal::Minimize => "minimize",
        Goal::Maximize => "maximize",
    }
}

/// One row per sweep, newest first (as the server lists them), with its owner: a column per
/// status, or when that does not fit, one `progress` cell with the counts that are not zero
/// (and the owner under the name).
pub fn sweeps_table(sweeps: &[SweepInfo], now: i64, width: Option<u16>) -> Table {
    let mut wide = table::Layout::new([
        "id",
        "sweep",
        "owner",
        "jobs",
        "queued",
        "running",
        "succeeded",
        "failed",
        "cancelled",
        "created",
    ]);
    for sweep in sweeps {
        let counts = &sweep.counts;
        wide.rows.push(vec![
            sweep.id.to_string(),
            shown_name(sweep),
            sweep.owner.clone(),
            counts.total().to_string(),
            counts.queued.to_string(),
            counts.running.to_string(),
            counts.succeeded.to_string(),
            counts.failed.to_string(),
            counts.cancelled.to_string(),
            format::age(sweep.created_at, now),
        ]);
    }
    wide.right = vec![0, 3, 4, 5, 6, 7, 8];
    wide.fixed = vec![0, 2, 3, 4, 5, 6, 7, 8, 9];
    let narrow = || {
        // The owner goes under the sweep's name.
        let mut narrow = table::Layout::new(["id", "sweep\nowner", "jobs", "progress", "created"]);
        for sweep in sweeps {
            narrow.rows.push(vec![
                sweep.id.to_string(),
                format!("{}\n{}", shown_name(sweep), sweep.owner),
                sweep.counts.total().to_string(),
                progress(&sweep.counts),
                format::age(sweep.created_at, now),
            ]);
        }
        narrow.right = vec![0, 2];
        narrow.fixed = vec![0, 2, 4];
        narrow
    };
    table::fit(wide, narrow, width)
}

/// The sweep's name, marked when its failing runs paused it.
fn shown_name(sweep: &SweepInfo) -> String {
    match sweep.paused {
        Some(_) => format!("{} (paused)", sweep.name),
        None => sweep.name.clone(),
    }
}

/// `80 queued, 8 running, 17 succeeded`: the counts that are not zero, in lifecycle order.
pub fn progress(counts: &StatusCounts) -> String {
    let parts: Vec<String> = [
        (counts.queued, "queued"),
        (counts.running, "running"),
        (counts.succeeded, "succeeded"),
        (counts.failed, "failed"),
        (counts.cancelled, "cancelled"),
    ]
    .into_iter()
    .filter(|(count, _)| *count > 0)
    .map(|(count, word)| format!("{count} {word}"))
    .collect();
    parts.join(", ")
}

/// The best value of the sweep's metric in a job's latest attempt, by the metric's goal.
pub fn best_of(job: &Job, metric: &Metric) -> Option<f64> {
    let summary = job.metrics.get(&metric.name)?;
    Some(match metric.goal {
        Goal::Minimize => summary.min,
        Goal::Maximize => summary.max,
    })
}

/// Why a queued job waits, in a few words: `cannot run: <why>`, `next in the queue`, or
/// `12 ahead in the queue`; `None` for a job that is not queued.
pub fn waiting_text(job: &Job) -> Option<String> {
    let waiting = job.waiting.as_ref().filter(|_| job.status == JobStatus::Queued)?;
    match (&waiting.reason, waiting.position) {
        (Some(reason), _) => Some(format!("cannot run: {reason}")),
        (None, Some(0)) => Some("next in the queue".into()),
        (None, Some(ahead)) => Some(format!("{ahead} ahead in the queue")),
        (None, None) => None,
    }
}

/// Why a job is in its status: why a queued one waits, else the reason it records.
fn why(job: &Job) -> Option<String> {
    waiting_text(job).or_else(|| job.reason.clone())
}

/// How long the latest attempt ran (so far, while it runs).
pub fn duration_of(job: &Job, now: i64) -> String {
    match (job.started_at, job.finished_at, job.status) {
        (Some(start), Some(end), _) => format::duration_ms(end - start),
        (Some(start), None, JobStatus::Running) => format::duration_ms(now - start),
        _ => String::new(),
    }
}

/// Jobs with where and when they ran, the sweep's metric when it has one, their parameters
/// and why they are in their status: one line each, or when that does not fit, folded into
/// cells of several lines (status over reason, worker over start over duration, one
/// parameter per line).
pub fn jobs_table(jobs: &[Job], metric: Option<&Metric>, with_sweep: bool, now: i64, width: Option<u16>) -> Table {
    let status_of = |job: &Job| {
        if job.attempt > 1 {
            format!("{} (try {})", job.status, job.attempt)
        } else {
            job.status.to_string()
        }
    };
    let best = |job: &Job| metric.and_then(|metric| best_of(job, metric)).map(format::metric).unwrap_or_default();
    let mut header: Vec<String> = vec!["job".into()];
    if with_sweep {
        header.push("sweep".into());
    }
    header.extend(["#", "status", "worker", "started", "took"].map(String::from));
    if let Some(metric) = metric {
        header.push(format!("best {}", metric.name));
    }
    header.push("params".into());
    // No reason column when no job has one (a sweep that ran well).
    let reasons = jobs.iter().any(|job| why(job).is_some());
    if reasons {
        header.push("reason".into());
    }
    let mut wide = table::Layout::new(header);
    for job in jobs {
        let mut row = vec![job.id.to_string()];
        if with_sweep {
            row.push(job.sweep.clone());
        }
        row.extend([
            job.index.to_string(),
            status_of(job),
            job.worker.clone().unwrap_or_default(),
            job.started_at.map(|start| format::age(start, now)).unwrap_or_default(),
            duration_of(job, now),
        ]);
        if metric.is_some() {
            row.push(best(job));
        }
        row.push(format::params(&job.params));
        if reasons {
            row.push(why(job).unwrap_or_default());
        }
        wide.rows.push(row);
    }
    let first = usize::from(with_sweep);
    wide.right = vec![0, first + 1, first + 4, first + 5];
    wide.fixed = vec![0, first + 1, first + 2, first + 4, first + 5];
    if metric.is_some() {
        wide.right.push(first + 6);
        wide.fixed.push(first + 6);
    }
    let narrow = || {
        let mut header = vec!["job".to_string(), "status".into(), "ran".into()];
        if let Some(metric) = metric {
            header.push(format!("best\n{}", metric.name));
        }
        header.push("params".into());
        let mut narrow = table::Layout::new(header);
        for job in jobs {
            let mut id = format!("{} #{}", job.id, job.index);
            if with_sweep {
                id = format!("{id}\n{}", job.sweep);
            }
            // A cancelled job's reason is `cancelled` again: said once.
            let reason = why(job).filter(|reason| *reason != job.status.to_string());
            let status = lines([status_of(job), reason.unwrap_or_default()]);
            let started = job.started_at.map(|start| format::age(start, now)).unwrap_or_default();
            let ran = lines([job.worker.clone().unwrap_or_default(), started, duration_of(job, now)]);
            let mut row = vec![id, status, ran];
            if metric.is_some() {
                row.push(best(job));
            }
            row.push(format::params_lines(&job.params));
            narrow.rows.push(row);
        }
        narrow.fixed = if with_sweep { vec![] } else { vec![0] };
        if metric.is_some() {
            narrow.right = vec![3];
            narrow.fixed.push(3);
        }
        narrow
    };
    table::fit(wide, narrow, width)
}

/// The non-empty values, one per line.
fn lines(values: impl IntoIterator<Item = String>) -> String {
    values.into_iter().filter(|value| !value.is_empty()).collect::<Vec<_>>().join("\n")
}

/// `app status`'s line for a sweep whose jobs were preempted.
fn preempted_sentence(times: u64) -> String {
    let times = if times == 1 { "once".to_string() } else { format!("{times} times") };
    format!("its jobs were preempted {times} (requeued with no retry spent, to resume from their last checkpoint)")
}

/// `app status`'s line for a sweep whose large job holds a worker.
fn reserved_sentence(reserved: &shared::api::Reserved, now: i64) -> String {
    let when = match reserved.starts_at {
        Some(at) if at <= now => "now".to_string(),
        Some(at) => format!("within {}", format::duration_ms((at - now).max(0))),
        None => "when a job without a timeout ends".to_string(),
    };
    format!(
        "job {} holds worker {} and starts there {when}; meanwhile its GPUs go only to jobs that end before",
        reserved.job, reserved.worker
    )
}
