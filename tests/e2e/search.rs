//! Adaptive search and early stopping end to end: the real `app` binary as server and worker
//! processes, jobs that compute their metric with `awk` and write it to `$APP_METRICS_FILE`.

use shared::api::{Job, SweepDetail};
use shared::job::JobStatus;
use std::time::Duration;
use testkit::{wait_until, ServerProcess, WorkerProcess};

const LONG: Duration = Duration::from_secs(120);

/// A W&B bayes sweep over `x`, `y` in [-1, 1] whose runs report the quadratic
/// `(x - 0.3)^2 + (y + 0.2)^2` once, after `sleep` seconds.
fn quadratic(name: &str, seed: u64, run_cap: u64, sleep: f64) -> String {
    format!(
        r#"name: {name}
method: bayes
seed: {seed}
run_cap: {run_cap}
metric: {{name: loss, goal: minimize}}
parameters:
  x: {{min: -1.0, max: 1.0}}
  y: {{min: -1.0, max: 1.0}}
command: >-
  sleep {sleep}; awk -v x="$APP_PARAM_X" -v y="$APP_PARAM_Y"
  'BEGIN {{ printf "{{\"step\": 1, \"loss\": %.17g}}\n", (x - 0.3)^2 + (y + 0.2)^2 }}' >> "$APP_METRICS_FILE"
"#
    )
}

/// Waits until the sweep has `count` jobs, all finished; returns them in index order.
async fn all_finished(server: &ServerProcess, sweep: &str, count: usize) -> Vec<Job> {
    let mut jobs = wait_until(&format!("{count} jobs of {sweep} finished"), LONG, || async {
        let jobs = server.jobs_of(sweep).await;
        (jobs.len() >= count && jobs.iter().all(|job| job.status.is_terminal())).then_some(jobs)
    })
    .await;
    jobs.sort_by_key(|job| job.index);
    jobs
}

async fn detail(server: &ServerProcess, sweep: &str) -> SweepDetail {
    server.client().sweep(sweep).await.unwrap()
}

fn distance(job: &Job) -> f64 {
    let (x, y) = (job.params["x"].as_f64().unwrap(), job.params["y"].as_f64().unwrap());
    ((x - 0.3).powi(2) + (y + 0.2).powi(2)).sqrt()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bayes_sweep_runs_exactly_run_cap_jobs_homes_in_and_is_reproducible() {
    let server = ServerProcess::start();
    // One run at a time: each proposal then knows every result before it, so the sequence is
    // a function of the seed alone.
    let _worker = WorkerProcess::start(&server.url, "solo", &["--max-jobs", "1"]);
    server.submit(&quadratic("quad", 11, 30, 0.0)).await;
    let first = all_finished(&server, "quad", 30).await;
    assert_eq!(first.iter().map(|job| job.index).collect::<Vec<_>>(), (0..30).collect::<Vec<_>>());
    assert!(first.iter().all(|job| job.status == JobStatus::Succeeded), "{first:#?}");
    assert!(first.iter().all(|job| job.metrics.contains_key("loss")));
    let state = detail(&server, "quad").await.search.unwrap();
    assert_eq!((state.proposed, state.open), (30, false));
    // Nothing more comes: a grid submitted after it runs alone.
    server.submit("name: after\ncommand: 'true'\ngrid: {i: [1, 2]}\n").await;
    all_finished(&server, "after", 2).await;
    assert_eq!(server.jobs_of("quad").await.len(), 30, "run_cap bounds the sweep");

    // The first 10 runs are random; the model (the GP alone on this 2-D bowl, decision 0093)
    // keeps exploring after them, so its runs sit nearer the optimum than the random start's
    // rather than all on it.
    let random_start = median(first[..10].iter().map(distance).collect());
    let model = median(first[20..].iter().map(distance).collect());
    assert!(model < random_start, "later runs sit nearer the optimum: {model} against {random_start} at random");

    server.submit(&quadratic("quad-again", 11, 30, 0.0)).await;
    let again = all_finished(&server, "quad-again", 30).await;
    let params = |jobs: &[Job]| jobs.iter().map(|job| job.params.clone()).collect::<Vec<_>>();
    assert_eq!(params(&first), params(&again), "the same seed and results give the same runs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_random_sweep_without_run_cap_keeps_making_runs_until_cancelled() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "pair", &["--max-jobs", "2"]);
    let yaml = "name: endless\nmethod: random\nparameters: {x: {values: [1, 2, 3]}, y: {min: 0.0, max: 1.0}}\n\
                command: 'echo $APP_PARAM_X'\n";
    server.submit(yaml).await;
    wait_until("the endless sweep ran 12 runs", LONG, || async {
        let jobs = server.jobs_of("endless").await;
        (jobs.iter().filter(|job| job.status == JobStatus::Succeeded).count() >= 12).then_some(())
    })
    .await;
    server.client().cancel_sweep("endless").await.unwrap();
    let stopped = wait_until("no run of the endless sweep waits or runs", LONG, || async {
        let jobs = server.jobs_of("endless").await;
        jobs.iter().all(|job| job.status.is_terminal()).then_some(jobs.len())
    })
    .await;
    // The worker goes on claiming (it runs another sweep to its end); nothing new comes.
    server.submit("name: later\ncommand: 'true'\ngrid: {i: [1, 2, 3, 4]}\n").await;
    all_finished(&server, "later", 4).await;
    let jobs = server.jobs_of("endless").await;
    assert_eq!(jobs.len(), stopped, "a cancelled sweep makes no more runs");
    let mut indexes: Vec<u64> = jobs.iter().map(|job| job.index).collect();
    indexes.sort_unstable();
    assert_eq!(indexes, (0..stopped as u64).collect::<Vec<_>>());
    let state = detail(&server, "endless").await.search.unwrap();
    assert!(!state.open && state.run_cap.is_none(), "{state:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyperband_stops_bad_runs_at_their_rung_and_lets_good_runs_finish() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "serial", &["--max-jobs", "1"]);
    // Runs report `good + 1/step` for steps 1 to 10, 0.3 s apart, one at a time. The two runs
    // with good = 0 come first (the grid's first key is slowest); at rung 2 each later run is
    // outside the best half (eta 2) of the runs that reached it so far.
    let yaml = r#"name: halving
method: grid
metric: {name: loss, goal: minimize}
early_terminate: {type: hyperband, min_iter: 2, eta: 2}
parameters:
  good: {values: [0, 5, 6, 7]}
  rep: {values: [1, 2]}
command: >-
  for s in 1 2 3 4 5 6 7 8 9 10; do
  awk -v g="$APP_PARAM_GOOD" -v s="$s" 'BEGIN { printf "{\"step\": %d, \"loss\": %.17g}\n", s, g + 1 / s }'
  >> "$APP_METRICS_FILE"; sleep 0.3; done
"#;
    let submitted = server.client().submit(yaml, &Default::default()).await.unwrap();
    assert!(submitted.search.unwrap().early_stop.unwrap().contains("hyperband"));
    let jobs = all_finished(&server, "halving", 8).await;
    for job in &jobs {
        let good = job.params["good"].as_i64().unwrap();
        if good == 0 {
            assert_eq!(job.status, JobStatus::Succeeded, "{job:#?}");
            assert!(job.stopped_early.is_none());
            assert_eq!(job.metrics["loss"].step, Some(10), "a good run trains to its end");
            continue;
        }
        assert_eq!(job.status, JobStatus::Cancelled, "{job:#?}");
        let stop = job.stopped_early.as_ref().unwrap_or_else(|| panic!("job {} is not stopped early", job.id));
        // Every run before it reached step 2 with `good + 0.5`; the best half of them go on.
        let mut at_rung: Vec<f64> =
            jobs[..=job.index as usize].iter().map(|run| run.params["good"].as_f64().unwrap() + 0.5).collect();
        at_rung.sort_by(f64::total_cmp);
        let cutoff = at_rung[(at_rung.len() / 2).max(1) - 1];
        assert_eq!((stop.rung, stop.cutoff), (2, Some(cutoff)), "{stop:?}");
        let reason = job.reason.as_deref().unwrap_or_default();
        assert!(
            reason.starts_with("stopped early: at step 2") && reason.contains(&format!("(cutoff {cutoff})")),
            "{reason}"
        );
        assert!(job.metrics["loss"].step.unwrap() < 10, "job {} was stopped before its end", job.id);
    }
    let board = server.client().summary("halving", None).await.unwrap();
    let stopped_at: Vec<bool> = board.rows.iter().map(|row| row.stopped_early.is_some()).collect();
    assert_eq!(stopped_at, [false, false, true, true, true, true, true, true], "stopped runs come after the ranked");
    assert_eq!(detail(&server, "halving").await.search.unwrap().stopped_early, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_mid_sweep_goes_on_without_repeating_an_index() {
    let mut server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "steady", &["--max-jobs", "2"]);
    server.submit(&quadratic("restarted", 4, 12, 0.4)).await;
    wait_until("a few runs were made and one finished", LONG, || async {
        let jobs = server.jobs_of("restarted").await;
        (jobs.len() >= 3 && jobs.iter().any(|job| job.status == JobStatus::Succeeded)).then_some(())
    })
    .await;
    server.stop();
    server.restart();
    let jobs = all_finished(&server, "restarted", 12).await;
    assert_eq!(jobs.iter().map(|job| job.index).collect::<Vec<_>>(), (0..12).collect::<Vec<_>>());
    assert!(jobs.iter().all(|job| job.status == JobStatus::Succeeded), "{jobs:#?}");
    assert_eq!(detail(&server, "restarted").await.search.unwrap().proposed, 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metric_that_never_arrives_turns_proposals_random_and_the_sweep_says_so() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "nan", &["--max-jobs", "1"]);
    // Python's json writes NaN for a diverged loss: not JSON, so no point ever arrives.
    let yaml = r#"name: diverged
method: bayes
run_cap: 4
metric: {name: loss}
parameters: {x: {min: 0.0, max: 1.0}}
command: >-
  echo '{"step": 1, "loss": NaN}' >> "$APP_METRICS_FILE"
"#;
    server.submit(yaml).await;
    let jobs = all_finished(&server, "diverged", 4).await;
    assert!(jobs.iter().all(|job| job.status == JobStatus::Succeeded && job.metrics.is_empty()), "{jobs:#?}");
    let notes = detail(&server, "diverged").await.search.unwrap().notes;
    assert!(notes.iter().any(|note| note.contains("no finished run has reported `loss`")), "{notes:?}");
}

/// `target/browser-screenshots/<name>`, emptied.
fn screenshot_dir(name: &str) -> std::path::PathBuf {
    let dir =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().join("browser-screenshots").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Needs what tests/e2e/browser.rs needs (Debian's chromium, `npm ci` in tests/browser:
/// `scripts/install-test-deps.sh`); fails without them rather than skip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_runs_stopped_early_apart_and_what_an_adaptive_sweep_will_do() {
    assert!(
        testkit::repo("tests/browser/node_modules/playwright-core/package.json").exists(),
        "tests/browser/node_modules has no playwright-core: run scripts/install-test-deps.sh"
    );
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "serial", &["--max-jobs", "1"]);
    let yaml = r#"name: page-halving
method: grid
metric: {name: loss, goal: minimize}
early_terminate: {type: hyperband, min_iter: 2, eta: 2}
parameters:
  good: {values: [0, 4]}
  rep: {values: [1, 2]}
command: >-
  for s in 1 2 3 4 5 6; do
  awk -v g="$APP_PARAM_GOOD" -v s="$s" 'BEGIN { printf "{\"step\": %d, \"loss\": %.17g}\n", s, g + 1 / s }'
  >> "$APP_METRICS_FILE"; sleep 0.3; done
"#;
    server.submit(yaml).await;
    let jobs = all_finished(&server, "page-halving", 4).await;
    let stopped = jobs.iter().find(|job| job.stopped_early.is_some()).expect("a run was stopped early");
    let screenshots = screenshot_dir("search");
    let stopped_id = stopped.id.to_string();
    let output = tokio::process::Command::new("node")
        .arg(testkit::repo("tests/browser/search.mjs"))
        .arg(&server.url)
        .arg(&screenshots)
        .env("SWEEP", "page-halving")
        .env("STOPPED_JOB", &stopped_id)
        .env("CHROMIUM", std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(LONG, output).await.expect("the browser checks finish").expect("node runs");
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "the browser checks failed: {said}");
    assert_eq!(said.matches("ok: ").count(), 3, "{said}");
}
