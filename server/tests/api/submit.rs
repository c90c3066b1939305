//! Submitting sweeps: expansion on the server, dry runs, names, listings, config examples.

use shared::api::{JobQuery, SubmitQuery};
use shared::job::JobStatus;
use std::path::Path;
use testkit::{sweep_of, TestApp};

const GRID: &str = "
name: vaep-grid
command: python train.py --lr {lr} --hidden {hidden}
metric: {name: val_loss, goal: minimize}
priority: 2
retries: 1
grid:
  lr: [0.1, 0.01]
  hidden: [[128, 64], [256]]
";

#[tokio::test]
async fn a_native_grid_becomes_one_queued_job_per_combination() {
    let app = TestApp::spawn().await;
    let response = app.submit(GRID).await;
    assert_eq!((response.name.as_str(), response.count), ("vaep-grid", 4));
    let page = app.client.jobs(&JobQuery { sweep: Some("vaep-grid".into()), ..JobQuery::default() }).await.unwrap();
    assert_eq!(page.total, 4);
    let first = &page.jobs[0];
    assert_eq!(first.status, JobStatus::Queued);
    assert_eq!((first.index, first.priority, first.retries_left, first.attempt), (0, 2, 1, 0));
    assert_eq!(first.params, serde_json::json!({"lr": 0.1, "hidden": [128, 64]}));
    assert_eq!(first.command, "python train.py --lr 0.1 --hidden '[128,64]'");
    assert_eq!(page.jobs[3].params, serde_json::json!({"lr": 0.01, "hidden": [256]}));
    let sweep = app.client.sweep("vaep-grid").await.unwrap();
    assert_eq!(sweep.info.counts.queued, 4);
    assert_eq!(sweep.source, GRID, "the submitted file is kept verbatim");
    assert_eq!(sweep.info.metric.unwrap().name, "val_loss");
}

#[tokio::test]
async fn a_dry_run_counts_and_previews_but_stores_nothing() {
    let app = TestApp::spawn().await;
    let query = SubmitQuery { dry_run: true, ..SubmitQuery::default() };
    let response = app.client.submit(GRID, &query).await.unwrap();
    assert!(response.dry_run && response.sweep_id.is_none());
    assert_eq!(response.count, 4);
    assert_eq!(response.preview.len(), 4);
    assert_eq!(response.preview[1].params, serde_json::json!({"lr": 0.1, "hidden": [256]}));
    assert!(app.client.sweeps().await.unwrap().is_empty());
    assert_eq!(app.client.jobs(&JobQuery::default()).await.unwrap().total, 0);
}

#[tokio::test]
async fn a_reused_name_gets_a_suffix_and_a_nameless_file_takes_the_given_name() {
    let app = TestApp::spawn().await;
    assert_eq!(app.submit(&sweep_of("same", 2)).await.name, "same");
    assert_eq!(app.submit(&sweep_of("same", 2)).await.name, "same-2");
    assert_eq!(app.submit(&sweep_of("same", 2)).await.name, "same-3");
    let query = SubmitQuery { name: Some("from-file-stem".into()), ..SubmitQuery::default() };
    let response = app.client.submit("command: \"true\"\n", &query).await.unwrap();
    assert_eq!((response.name.as_str(), response.count), ("from-file-stem", 1));
    let names: Vec<String> = app.client.sweeps().await.unwrap().into_iter().map(|sweep| sweep.name).collect();
    assert_eq!(names, ["from-file-stem", "same-3", "same-2", "same"], "newest first");
}

#[tokio::test]
async fn jobs_filter_by_status_and_page() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("paged", 25)).await;
    let worker = app.register("w1", 3).await;
    assert_eq!(app.claim(worker, 3).await.len(), 3);
    let running = JobQuery { status: Some(JobStatus::Running), ..JobQuery::default() };
    assert_eq!(app.client.jobs(&running).await.unwrap().total, 3);
    let by_worker = JobQuery { worker: Some("w1".into()), ..JobQuery::default() };
    assert_eq!(app.client.jobs(&by_worker).await.unwrap().total, 3);
    let page = JobQuery { limit: Some(10), offset: Some(20), ..JobQuery::default() };
    let page = app.client.jobs(&page).await.unwrap();
    assert_eq!((page.total, page.jobs.len()), (25, 5));
    assert_eq!(page.jobs[0].index, 20);
}

/// Every example in configs/ states its job count in a `# jobs: N` line; the server agrees.
#[tokio::test]
async fn every_config_example_expands_to_its_documented_count() {
    let app = TestApp::spawn().await;
    let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs");
    let mut checked = 0;
    for entry in std::fs::read_dir(&configs).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|ext| ext.to_str()) != Some("yaml") {
            continue;
        }
        let yaml = std::fs::read_to_string(&path).unwrap();
        let documented: u64 = yaml
            .lines()
            .find_map(|line| line.strip_prefix("# jobs: "))
            .unwrap_or_else(|| panic!("{} has no `# jobs: N` line", path.display()))
            .trim()
            .parse()
            .unwrap();
        let query = SubmitQuery { dry_run: true, ..SubmitQuery::default() };
        let response = app.client.submit(&yaml, &query).await.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(response.count, documented, "{}", path.display());
        checked += 1;
    }
    assert!(checked >= 3, "expected the native, W&B and CVLab-Kit examples, found {checked}");
}

/// A sweep this large is written in the background after its submission (decision 0076):
/// claims taken meanwhile get its jobs in index order, the last one last, and none twice. (A
/// sweep submitted after it may start before its unwritten rows: the order between sweeps holds
/// only as long as the writing keeps ahead of the claims, which it does by far in release builds.)
#[tokio::test]
async fn a_large_sweep_is_claimed_in_index_order_while_its_rows_are_written() {
    const JOBS: u64 = 24_001;
    let app = TestApp::spawn().await;
    let values: Vec<String> = (0..JOBS).map(|value| value.to_string()).collect();
    let response =
        app.submit(&format!("name: big\ncommand: \"true {{a}}\"\ngrid:\n  a: [{}]\n", values.join(", "))).await;
    assert_eq!(response.count, JOBS);
    let later = app.submit("name: later\ncommand: \"true\"\n").await;
    assert_eq!(later.count, 1);
    let worker = app.register("w", 1_000).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut claimed = Vec::new();
    while claimed.len() < JOBS as usize + 1 {
        assert!(std::time::Instant::now() < deadline, "only {} jobs claimed", claimed.len());
        let jobs = app.claim(worker, 1_000).await;
        if jobs.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        claimed.extend(jobs.into_iter().map(|job| (job.sweep, job.index)));
    }
    let big: Vec<u64> = claimed.iter().filter(|(sweep, _)| sweep == "big").map(|(_, index)| *index).collect();
    assert_eq!(big, (0..JOBS).collect::<Vec<_>>(), "every job once, in index order");
    assert!(claimed.contains(&("later".to_string(), 0)));
}
