//! Snapshots of every table the CLI prints, at 80 and 200 columns (and unfitted, as piped):
//! what fits stays on one line, what does not folds at spaces, nothing passes the width.

use super::{files, results, status, table, workers};
use serde_json::json;
use shared::api::{
    AttemptRecord, Job, JobId, ManifestEntry, MetricSummary, ResultVersion, StatusCounts, SummaryRow, SweepId,
    SweepInfo, SweepSummary, WorkerId, WorkerInfo, WorkerState,
};
use shared::job::JobStatus;
use shared::placement::{Capacity, GpuSlot};
use shared::sweep::{Goal, Metric, SweepForm};
use std::collections::BTreeMap;

/// A fixed "now": 2027-01-15 08:00:00 UTC.
const NOW: i64 = 1_800_000_000_000;
const MINUTE: i64 = 60_000;

fn val_loss() -> Metric {
    Metric { name: "val_loss".into(), goal: Goal::Minimize }
}

fn summary(last: f64, min: f64, max: f64) -> MetricSummary {
    MetricSummary { last, min, max, step: Some(30), count: 30 }
}

fn vaep_params(index: u64) -> serde_json::Value {
    let lrs = [0.001, 0.0005, 0.0001];
    let batches = [2048, 4096, 8192];
    json!({
        "lr": lrs[(index as usize / 3) % 3],
        "batch_size": batches[index as usize % 3],
        "hidden_dims": [256, 128, 64],
        "horizon": 10 + 5 * (index % 3),
        "optimizer": "adamw",
    })
}

fn job(id: i64, index: u64, status: JobStatus, attempt: u32) -> Job {
    let started = NOW - (40 - id) * MINUTE;
    let (finished, exit_code, reason) = match status {
        JobStatus::Succeeded => (Some(started + 12 * MINUTE + 5_000), Some(0), None),
        JobStatus::Failed => (Some(started + 3_400), Some(1), Some("exited with code 1".to_string())),
        JobStatus::Cancelled => (Some(started + 90_000), None, Some("cancelled".to_string())),
        JobStatus::Running | JobStatus::Queued => (None, None, None),
    };
    let started = (status != JobStatus::Queued).then_some(started);
    let mut metrics = BTreeMap::new();
    if status == JobStatus::Succeeded || status == JobStatus::Running {
        metrics.insert("val_loss".to_string(), summary(0.2 + id as f64 / 1000.0, 0.1 + id as f64 / 997.0, 0.9));
        metrics.insert("val_accuracy".to_string(), summary(0.81, 0.5, 0.83 + id as f64 / 1000.0));
    }
    Job {
        id: JobId::new(id),
        sweep_id: SweepId::new(3),
        sweep: "vaep-grid".into(),
        owner: "user-a".into(),
        index,
        params: vaep_params(index),
        command: "python train.py".into(),
        status,
        priority: 0,
        attempt,
        crash_count: 0,
        retries_left: 0,
        resources: Default::default(),
        timeout_secs: None,
        worker_id: started.map(|_| WorkerId::new(1)),
        worker: started.map(|_| if id % 2 == 0 { "gpu-box-1".into() } else { "gpu-box-2".into() }),
        lease_expires_at: None,
        cancel_requested: false,
        exit_code,
        reason,
        created_at: NOW - 60 * MINUTE,
        started_at: started,
        finished_at: finished,
        gpus: Vec::new(),
        notes: Vec::new(),
        metrics,
        stopped_early: None,
        gpu_usage: None,
        waiting: None,
    }
}

fn jobs() -> Vec<Job> {
    vec![
        job(21, 0, JobStatus::Succeeded, 1),
        job(22, 1, JobStatus::Failed, 2),
        job(23, 2, JobStatus::Running, 1),
        job(24, 3, JobStatus::Cancelled, 1),
        job(25, 4, JobStatus::Queued, 0),
    ]
}

fn sweeps() -> Vec<SweepInfo> {
    let counts =
        |queued, running, succeeded, failed, cancelled| StatusCounts { queued, running, succeeded, failed, cancelled };
    vec![
        SweepInfo {
            id: SweepId::new(3),
            name: "vaep-grid".into(),
            owner: "user-a".into(),
            form: SweepForm::Native,
            metric: Some(val_loss()),
            created_at: NOW - 42 * MINUTE,
            counts: counts(80, 8, 17, 2, 1),
            paused: None,
            held_back: None,
            preempted: 0,
            reserved: None,
            priority_class: None,
        },
        SweepInfo {
            id: SweepId::new(2),
            name: "wandb-random-search-with-a-long-name".into(),
            owner: "lab.lead".into(),
            form: SweepForm::Wandb,
            metric: None,
            created_at: NOW - 26 * 60 * MINUTE,
            counts: counts(0, 0, 20, 0, 0),
            paused: None,
            held_back: None,
            preempted: 0,
            reserved: None,
            priority_class: None,
        },
    ]
}

fn leaderboard_summary() -> SweepSummary {
    let rows = [(1, 21, 0), (2, 26, 5), (3, 27, 6)]
        .into_iter()
        .map(|(rank, job_id, index)| {
            let mut metrics = BTreeMap::new();
            metrics.insert("val_loss".to_string(), summary(0.15 + rank as f64 / 100.0, 0.1 + rank as f64 / 97.0, 0.8));
            metrics.insert("val_accuracy".to_string(), summary(0.84 - rank as f64 / 100.0, 0.5, 0.85));
            metrics.insert("epoch_seconds".to_string(), summary(12.25, 11.0, 19.5));
            SummaryRow {
                rank: Some(rank),
                job_id: JobId::new(job_id),
                index,
                status: JobStatus::Succeeded,
                params: vaep_params(index),
                score: Some(0.1 + rank as f64 / 97.0),
                metrics,
                stopped_early: None,
                gpu_usage: None,
            }
        })
        .collect();
    SweepSummary { sweep: "vaep-grid".into(), metric: Some(val_loss()), rows }
}

fn workers_list() -> Vec<WorkerInfo> {
    let gpu =
        |index| GpuSlot { index, memory_total: 24 << 30, memory_free: 24 << 30, exclusive_held: false, shared_jobs: 0 };
    vec![
        WorkerInfo {
            id: WorkerId::new(1),
            name: "gpu-box-1".into(),
            capacity: Capacity {
                job_slots: 8,
                gpus: vec![gpu(0), gpu(1)],
                capabilities: shared::capabilities::Capabilities {
                    code_copy: Some("overlay".into()),
                    ..Default::default()
                },
            },
            registered_at: NOW - 90 * MINUTE,
            last_seen_at: NOW - 2_000,
            running: 2,
            state: WorkerState::Healthy,
            running_jobs: vec![JobId::new(23), JobId::new(31)],
        },
        WorkerInfo {
            id: WorkerId::new(2),
            name: "laptop".into(),
            capacity: Capacity { job_slots: 4, gpus: Vec::new(), ..Capacity::default() },
            registered_at: NOW - 600 * MINUTE,
            last_seen_at: NOW - 300 * MINUTE,
            running: 0,
            state: WorkerState::Left,
            running_jobs: Vec::new(),
        },
    ]
}

fn versions() -> Vec<ResultVersion> {
    let file = |path: &str, size: u64| ManifestEntry {
        path: path.into(),
        size,
        sha256: format!("{:016x}", size.wrapping_mul(0x9e37_79b9_7f4a_7c15)).repeat(4),
    };
    vec![ResultVersion {
        job_id: JobId::new(21),
        attempt: 1,
        path: "results/vaep-grid/0/v1".into(),
        files: vec![
            file("model_best.pt", 734_003_200),
            file("training_history.json", 18_432),
            file("results/predictions.csv", 5_242_880),
            file("config.json", 612),
        ],
        record: AttemptRecord {
            exit_code: Some(0),
            outcome: "exited with code 0".into(),
            worker: "gpu-box-1".into(),
            ..AttemptRecord::default()
        },
        params: vaep_params(0),
        metrics: BTreeMap::new(),
        stored_at: NOW - 5 * MINUTE,
    }]
}

/// The table at each width, checking no line passes it.
fn at_widths(render: impl Fn(Option<u16>) -> String) -> String {
    let mut text = String::new();
    for width in [Some(80u16), Some(200), None] {
        let rendered = render(width);
        if let Some(width) = width {
            for line in rendered.lines() {
                let length = console::measure_text_width(line);
                assert!(length <= usize::from(width), "{length} > {width} columns: {line}");
            }
        }
        let label = width.map_or("unfitted (piped)".to_string(), |width| format!("{width} columns"));
        text.push_str(&format!("--- {label}\n{rendered}\n"));
    }
    text
}

#[test]
fn sweeps_table() {
    insta::assert_snapshot!(at_widths(|width| table::render(&status::sweeps_table(&sweeps(), NOW, width))));
}

#[test]
fn jobs_of_a_sweep_show_start_duration_and_best_metric() {
    let metric = val_loss();
    insta::assert_snapshot!(at_widths(|width| {
        table::render(&status::jobs_table(&jobs(), Some(&metric), false, NOW, width))
    }));
}

#[test]
fn jobs_across_sweeps_name_their_sweep() {
    let failed: Vec<Job> = jobs().into_iter().filter(|job| job.status == JobStatus::Failed).collect();
    insta::assert_snapshot!(at_widths(|width| table::render(&status::jobs_table(&failed, None, true, NOW, width))));
}

#[test]
fn the_leaderboard_puts_the_ranking_metric_first_and_folds_parameters_when_narrow() {
    let summary = leaderboard_summary();
    let narrow = table::render(&results::leaderboard(&summary, Some(80)));
    let header: Vec<&str> = narrow.lines().take(2).collect();
    assert!(header[0].trim_start().starts_with("rank │ val_loss │"), "{narrow}");
    assert!(header[1].contains("(min)"), "{narrow}");
    assert!(narrow.contains("batch_size=2048"), "folded as key=value below 80 columns:\n{narrow}");
    let wide = table::render(&results::leaderboard(&summary, Some(200)));
    assert!(wide.lines().next().unwrap().contains("│ batch_size │"), "a column each when they fit:\n{wide}");
    insta::assert_snapshot!(at_widths(|width| table::render(&results::leaderboard(&summary, width))));
}

#[test]
fn workers_table() {
    insta::assert_snapshot!(at_widths(|width| table::render(&workers::workers_table(&workers_list(), NOW, width))));
}

#[test]
fn files_listing_in_human_units() {
    insta::assert_snapshot!(at_widths(|width| files::listing(&versions(), NOW, width)));
}

#[test]
fn the_leaderboard_says_constants_once_and_names_runs_stopped_early() {
    let mut summary = leaderboard_summary();
    summary.rows[2].stopped_early =
        Some(shared::api::StoppedEarly { rung: 3, cutoff: Some(0.3), reason: "stopped early".into(), at: 1 });
    summary.rows[2].status = JobStatus::Cancelled;
    summary.rows[2].rank = None;
    let (constants, varying) = results::without_constants(summary);
    let names: Vec<&str> = constants.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["hidden_dims", "optimizer"], "{constants:?}");
    assert_eq!(constants[1].1, "adamw");
    let wide = table::render(&results::leaderboard(&varying, Some(200)));
    let header = wide.lines().next().unwrap();
    assert!(header.contains("│ lr") && !header.contains("optimizer") && !header.contains("hidden_dims"), "{wide}");
    assert!(wide.contains("stopped early") && wide.matches("cancelled").count() == 0, "{wide}");
    // One run: nothing is constant across runs.
    let mut one = leaderboard_summary();
    one.rows.truncate(1);
    assert!(results::without_constants(one).0.is_empty());
}
