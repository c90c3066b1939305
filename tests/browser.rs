//! The web page in a real browser: the `app` binary as server and CPU-only worker, two sweeps
//! submitted through the typed client, then `tests/browser/pages.mjs` drives headless
//! Chromium (playwright-core) through every page and fails on any console error. Screenshots
//! of each page, light and dark, land in `target/browser-screenshots/`.
//!
//! Needs Debian's chromium and `npm ci` in tests/browser: `scripts/install-test-deps.sh`
//! installs both. Without them this test fails, on purpose, rather than skip.

mod common;

use common::{repo, wait_until, ServerProcess, WorkerProcess};
use shared::api::SubmitQuery;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

const WORKER: &str = "web-worker";
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(240);

/// Three jobs held at a gate (a file the script creates once it has seen them queued or
/// running), then a log line, a `<script>` line, metrics and a result file. The `tag`
/// parameter would run script if the page ever rendered it as HTML.
fn smoke_sweep(gate: &Path) -> String {
    format!(
        r#"name: web-smoke
command: |
  until [ -e '{gate}' ]; do sleep 0.1; done
  echo "hello from web-smoke job {{index}}"
  echo '<script>window.__xss = 1</script>'
  for s in 1 2 3 4 5 6; do printf '{{"step": %d, "loss": %s, "acc": 0.%d}}\n' $s "$(awk -v s=$s -v lr={{lr}} 'BEGIN{{print 1/(s*(1+100*lr))}}')" $s >> "$APP_METRICS_FILE"; done
  echo done > "$APP_OUTPUT_DIR/result.txt"
metric: {{name: loss, goal: minimize}}
grid:
  lr: [0.1, 0.01, 0.001]
  tag: ["<img src=x onerror=window.__xss=2>"]
"#,
        gate = gate.display()
    )
}

/// Jobs that need a GPU: the CPU-only worker never claims them, so they stay queued until
/// the page cancels them.
const BLOCKED_SWEEP: &str = "name: web-blocked\ncommand: echo never\nresources: {gpus: 1}\ngrid:\n  i: [1, 2, 3]\n";

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_page_follows_the_queue_live_and_its_actions_reach_the_api() {
    check_prerequisites();
    let server = ServerProcess::start();
    let worker = WorkerProcess::start(&server.url, WORKER, &["--max-jobs", "3"]);
    let client = server.client();
    wait_until("the worker registered", Duration::from_secs(30), || async {
        client.workers().await.ok().filter(|workers| !workers.is_empty())
    })
    .await;
    let gate = server.dir.path().join("gate");
    client.submit(&smoke_sweep(&gate), &SubmitQuery::default()).await.unwrap();
    client.submit(BLOCKED_SWEEP, &SubmitQuery::default()).await.unwrap();

    let screenshots = screenshot_dir("pages");
    let gate_env = gate.to_string_lossy().into_owned();
    let env = [("GATE_FILE", gate_env.as_str()), ("WORKER_NAME", WORKER)];
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
    for page in ["queue", "sweep", "job", "workers", "submit"] {
        let shot = screenshots.join(format!("{page}.png"));
        assert!(shot.exists(), "no screenshot of the {page} page at {}", shot.display());
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
