//! The web page in a real browser: the `app` binary as server and CPU-only worker, sweeps
//! submitted through the typed client, a worker speaking through the client that finishes a GPU
//! job with its measured GPU use, a "ghost" worker that claims a GPU job, reports GPU
//! readings and vanishes (so the job is requeued by the reaper), then `tests/browser/pages.mjs`
//! drives headless Chromium (playwright-core) through every view at 1440x900 and at 390x844,
//! with one check per defect the page had, and fails on any console error. Screenshots of each
//! view at both sizes, light and dark, land in `target/browser-screenshots/`.
//!
//! Needs Debian's chromium and `npm ci` in tests/browser: `scripts/install-test-deps.sh`
//! installs both. Without them this test fails, on purpose, rather than skip.

use shared::api::{
    AttemptRecord, ClaimRequest, FinishRequest, GpuPoint, GpuSample, GpuUsage, HeartbeatRequest, InlineResult,
    JobAttempt, RegisterRequest, SubmitQuery,
};
use shared::job::{JobStatus, Outcome};
use shared::placement::{Capacity, GpuSlot};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use testkit::{repo, wait_until, ServerProcess, WorkerProcess};

const WORKER: &str = "web-worker";
const GHOST: &str = "ghost-gpu-box";
const ACCOUNTANT: &str = "measured-gpu-box";
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(480);

/// Four jobs held at a gate (a file the script creates once it has seen them queued or
/// running), then a log line, a `<script>` line, metrics and a result file; the job with the
/// smallest lr then fails. Metrics: `loss` (the sweep's, minimised), `acc` (peaks at step 4,
/// so its best, last and min differ), `lr` (a metric named like a parameter, direction
/// unknown) and `test_acc` (written once). `wd` is a 17-digit value; the `tag` parameter
/// would run script if the page ever rendered it as HTML.
fn smoke_sweep(gate: &Path) -> String {
    format!(
        r#"name: web-smoke
command: |
  until [ -e '{gate}' ]; do sleep 0.1; done
  echo "hello from web-smoke job {{index}}"
  echo '<script>window.__xss = 1</script>'
  for s in 1 2 3 4 5 6; do
    a=$(awk -v s=$s 'BEGIN{{print (s <= 4 ? s / 10 : (8 - s) / 10)}}')
    printf '{{"step": %d, "loss": %s, "acc": %s, "lr": %s}}\n' $s "$(awk -v s=$s -v lr={{lr}} 'BEGIN{{print 1/(s*(1+100*lr))}}')" "$a" "$(awk -v s=$s -v lr={{lr}} 'BEGIN{{print lr/s}}')" >> "$APP_METRICS_FILE"
  done
  echo '{{"step": 6, "test_acc": 0.91}}' >> "$APP_METRICS_FILE"
  echo done > "$APP_OUTPUT_DIR/result.txt"
  [ "{{lr}}" != "0.0001" ] || exit 3
metric: {{name: loss, goal: minimize}}
grid:
  lr: [0.1, 0.01, 0.001, 0.0001]
  wd: [0.00026057902620338835]
  tag: ["<img src=x onerror=window.__xss=2>"]
"#,
        gate = gate.display()
    )
}

/// Jobs that need a GPU: the CPU-only worker never claims them, so they stay queued until
/// the page cancels them.
const BLOCKED_SWEEP: &str = "name: web-blocked\ncommand: echo never\nresources: {gpus: 1}\ngrid:\n  i: [1, 2, 3]\n";

/// One GPU job, claimed by the ghost worker and requeued when it goes silent.
const REQUEUE_SWEEP: &str = "name: web-requeue\ncommand: echo lost\nresources: {gpus: 1}\ngrid:\n  i: [1]\n";

/// One GPU job, run by a worker speaking through the client that reports its GPU use.
const GPU_SWEEP: &str = "name: web-gpu\ncommand: echo measured\nresources: {gpus: 1}\n";

/// A W&B random sweep for the analysis views: the loss follows lr (and a little dropout),
/// batch size and optimizer do not matter; 8 steps each.
const ANALYSIS_SWEEP: &str = r#"name: web-analysis
method: random
run_cap: 24
seed: 7
metric: {name: val_loss, goal: minimize}
command: >-
  awk -v lr="$APP_PARAM_LR" -v d="$APP_PARAM_DROPOUT" -v seed="$APP_JOB_ID"
  'BEGIN { srand(seed); for (s = 1; s <= 8; s++) { loss = (log(lr) / log(10) + 2.5) ^ 2 * 0.3 + d * 0.4 + 0.2 + 1.5 / s + rand() * 0.05;
  printf "{\"step\": %d, \"val_loss\": %.5f, \"val_acc\": %.5f}\n", s, loss, 1 - loss / 4 } }' >> "$APP_METRICS_FILE"
resources: {gpus: 0}
parameters:
  lr: {distribution: log_uniform_values, min: 0.0001, max: 0.1}
  dropout: {distribution: uniform, min: 0.0, max: 0.5}
  batch_size: {values: [32, 64, 128]}
  optimizer: {values: [adam, sgd]}
"#;

fn chromium() -> PathBuf {
    PathBuf::from(std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()))
}

/// Panics with what to run when the browser, node or the script's packages are missing.
fn check_prerequisites() {
    let fix =
        "run scripts/install-test-deps.sh (it installs Debian's chromium and runs `npm ci --prefix tests/browser`)";
    assert!(chromium().exists(), "no Chromium at {}: {fix}", chromium().display());
    let node = std::process::Command::new("node").arg("--version").output();
    assert!(node.is_ok_and(|output| output.status.success()), "node is not on PATH: {fix}");
    assert!(
        repo("tests/browser/node_modules/playwright-core/package.json").exists(),
        "tests/browser/node_modules has no playwright-core: {fix}"
    );
}

/// `target/browser-screenshots/<name>`, emptied (each test has its own, as they run at once).
fn screenshot_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap().join("browser-screenshots").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn server_log(server: &ServerProcess) -> String {
    std::fs::read_dir(server.dir.path())
        .unwrap()
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|extension| extension == "log"))
        .map(|path| std::fs::read_to_string(path).unwrap_or_default())
        .collect()
}

fn ghost_reading(index: u32, utilization: u32) -> GpuSample {
    GpuSample {
        index,
        uuid: format!("GPU-ghost-{index}"),
        name: "Ghost GPU".into(),
        memory_total: 16 << 30,
        memory_used: (2 + u64::from(utilization) / 10) << 30,
        utilization: Some(utilization),
        temperature: Some(60),
        power_watts: Some(150.0),
        at: 0,
    }
}

/// A worker with one GPU, speaking through the client, claims the `web-gpu` job and finishes it
/// with what its accounting measured, as a real worker sends it: six readings of a mostly idle
/// GPU (the job page draws them, the leaderboard flags the run). Answers the job's id.
async fn accountant_finishes_a_measured_job(server: &ServerProcess) -> shared::api::JobId {
    let client = server.client();
    client.submit(GPU_SWEEP, &SubmitQuery::default()).await.unwrap();
    let slot =
        GpuSlot { index: 0, memory_total: 16 << 30, memory_free: 16 << 30, exclusive_held: false, shared_jobs: 0 };
    let capacity = Capacity { job_slots: 1, gpus: vec![slot], ..Capacity::default() };
    let register = RegisterRequest {
        name: ACCOUNTANT.into(),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: capacity.clone(),
        holding: vec![],
    };
    let worker = client.register(&register).await.unwrap().worker_id;
    let job = client
        .claim(worker, &ClaimRequest { capacity, wait_ms: 0, reserve: 0 })
        .await
        .unwrap()
        .jobs
        .pop()
        .expect("the web-gpu job");
    let start = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 - 60_000;
    let busy = [5.0, 12.0, 8.0, 20.0, 10.0, 7.0];
    let timeline: Vec<GpuPoint> = (0..busy.len())
        .map(|at| GpuPoint {
            at: start + at as i64 * 10_000,
            utilization: Some(busy[at]),
            memory: Some((2 + at as u64) << 30),
        })
        .collect();
    let usage = GpuUsage {
        gpus: vec![0],
        samples: 6,
        utilization_mean: Some(10.3),
        utilization_p95: Some(20.0),
        memory_peak: Some(7 << 30),
        gpu_hours: 60.0 / 3600.0,
        idle_gpus: vec![0],
    };
    let record = AttemptRecord {
        exit_code: Some(0),
        outcome: "exited with code 0".into(),
        started_at: start,
        finished_at: start + 60_000,
        worker: ACCOUNTANT.into(),
        gpus: vec!["Ghost GPU".into()],
        gpu_usage: Some(usage),
        gpu_timeline: timeline,
        ..AttemptRecord::default()
    };
    let finish = FinishRequest {
        result: Some(InlineResult { files: vec![], streamed: vec![], record }),
        notes: vec![format!("{} GPU 0 averaged 10% busy over the run (under 30%)", shared::api::IDLE_NOTE)],
        ..FinishRequest::outcome(job.id, job.attempt, Outcome::Exited { code: 0 })
    };
    client.finish(worker, &finish).await.unwrap();
    job.id
}

/// A worker with two GPUs that claims the requeue sweep's job, sends a few heartbeats with GPU
/// readings and then goes silent: the reaper requeues the job when its lease runs out. Answers
/// the job's id once it is queued again.
async fn ghost_claims_and_vanishes(server: &ServerProcess) -> shared::api::JobId {
    let client = server.client();
    let capacity = Capacity::idle_gpus(1, 2, 16 << 30);
    let register = RegisterRequest {
        name: GHOST.into(),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: capacity.clone(),
        holding: vec![],
    };
    let ghost = client.register(&register).await.unwrap().worker_id;
    let claimed = client.claim(ghost, &ClaimRequest { capacity, wait_ms: 0, reserve: 0 }).await.unwrap().jobs;
    let job = claimed.first().expect("the ghost claims the requeue job");
    assert_eq!(job.sweep, "web-requeue");
    let held = vec![JobAttempt { job_id: job.id, attempt: job.attempt }];
    for utilization in [30, 70, 90] {
        let beat = HeartbeatRequest {
            running: held.clone(),
            gpus: vec![ghost_reading(0, utilization), ghost_reading(1, 5)],
            saves: Vec::new(),
        };
        client.heartbeat(ghost, &beat).await.unwrap();
        // Readings are stamped by the server as they arrive: let the clock move between them.
        let sent = std::time::Instant::now();
        wait_until("the clock moves on", Duration::from_secs(2), || async {
            (sent.elapsed() >= Duration::from_millis(150)).then_some(())
        })
        .await;
    }
    wait_until("the ghost's job is requeued", Duration::from_secs(30), || async {
        let stored = client.job(job.id).await.ok()?;
        (stored.status == JobStatus::Queued && stored.attempt == 1).then_some(job.id)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_page_follows_the_queue_live_and_its_actions_reach_the_api() {
    check_prerequisites();
    let server = ServerProcess::start();
    let client = server.client();
    // Before the requeue sweep, so that each speaking worker claims the one job meant for it.
    let measured = accountant_finishes_a_measured_job(&server).await;
    // First, so that the ghost's claim finds this job and nothing else.
    client.submit(REQUEUE_SWEEP, &SubmitQuery::default()).await.unwrap();
    let requeued = ghost_claims_and_vanishes(&server).await;
    let worker = WorkerProcess::start(&server.url, WORKER, &["--max-jobs", "3"]);
    wait_until("the worker registered", Duration::from_secs(30), || async {
        client.workers().await.ok().filter(|workers| workers.iter().any(|w| w.name == WORKER))
    })
    .await;
    let gate = server.dir.path().join("gate");
    client.submit(&smoke_sweep(&gate), &SubmitQuery::default()).await.unwrap();
    client.submit(BLOCKED_SWEEP, &SubmitQuery::default()).await.unwrap();
    client.submit(ANALYSIS_SWEEP, &SubmitQuery::default()).await.unwrap();

    let screenshots = screenshot_dir("pages");
    let gate_env = gate.to_string_lossy().into_owned();
    let requeued_env = requeued.to_string();
    let measured_env = measured.to_string();
    let env = [
        ("GATE_FILE", gate_env.as_str()),
        ("WORKER_NAME", WORKER),
        ("GHOST_WORKER", GHOST),
        ("REQUEUED_JOB", requeued_env.as_str()),
        ("MEASURED_JOB", measured_env.as_str()),
        // What the worker's card says about the trainer depends on how this binary was built.
        ("WORKER_TRAINER", if cfg!(feature = "torch") { "yes" } else { "no" }),
    ];
    let output = run_script("pages.mjs", &server.url, &screenshots, &env).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    if !output.status.success() {
        eprintln!("--- server log (tail) ---\n{}", tail(&server_log(&server), 40));
        eprintln!("--- worker log (tail) ---\n{}", tail(&worker.log(), 40));
        panic!("the browser checks failed ({}); screenshots in {}", output.status, screenshots.display());
    }
    for page in ["queue", "sweep", "analysis", "job", "requeued", "workers", "submit"] {
        for variant in ["desktop-light", "desktop-dark", "phone-light", "phone-dark"] {
            let shot = screenshots.join(format!("{page}-{variant}.png"));
            assert!(shot.exists(), "no screenshot of the {page} page at {}", shot.display());
        }
    }
}

/// Runs `node tests/browser/<script> URL SCREENSHOTS` with `env` and the browser's path, within
/// the time limit; answers its output.
async fn run_script(script: &str, url: &str, screenshots: &Path, env: &[(&str, &str)]) -> std::process::Output {
    let child = tokio::process::Command::new("node")
        .arg(repo(&format!("tests/browser/{script}")))
        .arg(url)
        .arg(screenshots)
        .envs(env.iter().copied())
        .env("CHROMIUM", chromium())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|error| panic!("starting node tests/browser/{script}: {error}"));
    tokio::time::timeout(SCRIPT_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("tests/browser/{script} did not finish within {SCRIPT_TIMEOUT:?}"))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_tokens_asks_the_page_for_one_once_per_browser_session() {
    check_prerequisites();
    const TOKEN: &str = "browser-user-token-0123456789";
    let tokens = tempfile::tempdir().unwrap();
    let user_file = tokens.path().join("user");
    std::fs::write(&user_file, TOKEN).unwrap();
    let server = ServerProcess::start_with(&format!("user_token_file = {user_file:?}\n"));
    let options = client::ClientOptions { token: Some(TOKEN.into()), ca_pem: None };
    let client = client::Client::with_options(&server.url, &options).unwrap();
    client.submit("name: behind-a-token\ncommand: echo hi\n", &SubmitQuery::default()).await.unwrap();
    let screenshots = screenshot_dir("signin");
    let env = [("USER_TOKEN", TOKEN), ("SWEEP", "behind-a-token")];
    let output = run_script("signin.mjs", &server.url, &screenshots, &env).await;
    println!("{}", String::from_utf8_lossy(&output.stdout));
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    if !output.status.success() {
        eprintln!("--- server log (tail) ---\n{}", tail(&server_log(&server), 40));
        panic!("the sign-in checks failed ({}); screenshots in {}", output.status, screenshots.display());
    }
    assert!(screenshots.join("signin.png").exists());
}
