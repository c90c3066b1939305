//! End-to-end tests of code shipping: `app submit` run inside a git project packs it, two
//! workers whose work directories are elsewhere run exactly that code (each attempt on a fresh
//! copy), the snapshot's digest, commit and dirty flag are recorded; an unchanged resubmission
//! uploads nothing; a damaged snapshot is fetched again and never run; and bad projects (over
//! the cap, a link out of the project, an unreadable file or directory) are refused or left
//! out with a warning.

use shared::api::{Job, JobQuery, LogQuery};
use shared::job::JobStatus;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;
use testkit::{app, wait_until, ServerProcess, WorkerProcess};

const LONG: Duration = Duration::from_secs(60);

fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["-c", "user.email=test@example.com", "-c", "user.name=test", "-c", "commit.gpgsign=false"])
        .args(args)
        .output()
        .unwrap();
    assert!(output.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// `app submit ARGS --url URL`, run in `dir`.
fn submit_in(dir: &Path, url: &str, args: &[&str]) -> Output {
    app().current_dir(dir).arg("submit").args(args).args(["--url", url]).env_remove("COLUMNS").output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).to_string()
}

async fn log_of(server: &ServerProcess, job: &Job) -> String {
    server.client().log(job.id, &LogQuery::default()).await.map(|chunk| chunk.text).unwrap_or_default()
}

async fn finished(server: &ServerProcess, sweep: &str) -> Vec<Job> {
    wait_until(&format!("every job of {sweep} finished"), LONG, || async {
        let query = JobQuery { sweep: Some(sweep.into()), limit: Some(100), ..JobQuery::default() };
        let jobs = server.client().jobs(&query).await.ok()?.jobs;
        (!jobs.is_empty() && jobs.iter().all(|job| job.status.is_terminal())).then_some(jobs)
    })
    .await
}

/// A git project: a training script that reads its data file and lists the files it sees, a
/// file `.appignore` leaves out, one git ignores, and an untracked one (so the tree is dirty).
fn project() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    std::fs::create_dir_all(root.join("data")).unwrap();
    std::fs::create_dir_all(root.join("experiments")).unwrap();
    std::fs::write(
        root.join("train.py"),
        "import os, sys, hashlib, time\n\
         files = sorted(os.path.relpath(os.path.join(d, f), '..') for d, _, fs in os.walk('..') for f in fs)\n\
         print('seen:', ' '.join(files))\n\
         print('data:', open('../data/small.csv').read().strip(), 'i:', sys.argv[1])\n\
         print('me:', hashlib.sha256(open('../train.py', 'rb').read()).hexdigest()[:16])\n\
         open('../train.py', 'a').write('# changed by the job\\n')\n\
         time.sleep(0.3)\n",
    )
    .unwrap();
    std::fs::write(root.join("data/small.csv"), "a,b\n1,2\n").unwrap();
    std::fs::write(root.join("data/huge.bin"), vec![7u8; 64 << 10]).unwrap();
    std::fs::write(root.join(".appignore"), "data/huge.bin\n").unwrap();
    std::fs::write(root.join(".gitignore"), "*.log\n").unwrap();
    std::fs::write(root.join("debug.log"), "ignored by git\n").unwrap();
    std::fs::write(
        root.join("experiments/sweep.yaml"),
        "name: shipped\ncommand: python3 ../train.py {i}\nresources: {gpus: 0}\ngrid:\n  i: [0, 1, 2, 3, 4, 5]\n",
    )
    .unwrap();
    git(&root, &["init", "-q"]);
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-q", "-m", "first"]);
    std::fs::write(root.join("notes.txt"), "untracked, not ignored\n").unwrap();
    (dir, root)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_from_a_git_project_runs_that_code_on_two_workers_and_records_commit_and_state() {
    let server = ServerProcess::start();
    let _a = WorkerProcess::start(&server.url, "box-a", &["--max-jobs", "1"]);
    let _b = WorkerProcess::start(&server.url, "box-b", &["--max-jobs", "1"]);
    let (_dir, root) = project();
    let head = git(&root, &["rev-parse", "HEAD"]);
    let experiments = root.join("experiments");

    let output = submit_in(&experiments, &server.url, &["sweep.yaml", "--wait"]);
    assert!(output.status.success(), "{}{}", text(&output.stdout), text(&output.stderr));
    let said = text(&output.stdout);
    assert!(said.contains("code: 6 files") && said.contains(&format!("at {} (dirty)", &head[..12])), "{said}");
    assert!(said.contains("uploaded"), "{said}");

    let jobs = finished(&server, "shipped").await;
    let workers: std::collections::BTreeSet<_> = jobs.iter().filter_map(|job| job.worker.clone()).collect();
    assert_eq!(workers.len(), 2, "both workers ran jobs: {workers:?}");
    let mut fingerprints = std::collections::BTreeSet::new();
    for job in &jobs {
        let log = log_of(&server, job).await;
        assert_eq!(job.status, JobStatus::Succeeded, "{log}");
        assert!(log.contains(&format!("data: a,b\n1,2 i: {}", job.index)), "{log}");
        let seen = log.lines().find_map(|line| line.strip_prefix("seen: ")).unwrap();
        assert_eq!(
            seen, ".appignore .gitignore data/small.csv experiments/sweep.yaml notes.txt train.py",
            "tracked and untracked files; not what .appignore or .gitignore leave out"
        );
        fingerprints.extend(log.lines().filter_map(|line| line.strip_prefix("me: ")).map(String::from));
    }
    assert_eq!(fingerprints.len(), 1, "every attempt starts from a fresh copy, whatever the last one wrote");

    let version = server.client().results(jobs[0].id).await.unwrap().pop().unwrap();
    let code = version.record.code.clone().expect("the record names the code it ran");
    assert_eq!((code.commit.as_deref(), code.dirty, code.dir.as_str()), (Some(head.as_str()), true, "experiments"));
    assert_eq!(version.record.git_commit.as_deref(), Some(head.as_str()));
    let stored = server.data_dir().join("code").join(format!("{}.tar.zst", code.digest));
    assert!(stored.is_file());
    page_shows_the_snapshot(&server, jobs[0].id, &code.digest, &head).await;

    // Unchanged: nothing is uploaded again. Committed: the same snapshot, clean.
    let again = submit_in(&experiments, &server.url, &["sweep.yaml"]);
    assert!(text(&again.stdout).contains("already on the server"), "{}", text(&again.stdout));
    git(&root, &["add", "notes.txt"]);
    git(&root, &["commit", "-q", "-m", "notes"]);
    let clean = submit_in(&root, &server.url, &["experiments/sweep.yaml", "--json"]);
    let answer: serde_json::Value = serde_json::from_slice(&clean.stdout).unwrap();
    assert_eq!(answer["code"]["snapshot"]["digest"], code.digest.as_str(), "same files, same snapshot");
    assert_eq!(answer["code"]["snapshot"]["dirty"], false);
    assert_eq!(answer["code"]["snapshot"]["dir"], "", "jobs start where app submit ran");
    assert_eq!(answer["code"]["uploaded_bytes"], serde_json::Value::Null);
    assert_eq!(std::fs::read_dir(server.data_dir().join("code")).unwrap().count(), 1);
}

/// The job page names the snapshot (checked in headless Chromium by tests/browser/code.mjs).
async fn page_shows_the_snapshot(server: &ServerProcess, job: shared::api::JobId, digest: &str, commit: &str) {
    let screenshots = testkit::repo("target/browser-screenshots/code");
    let output = tokio::process::Command::new("node")
        .arg(testkit::repo("tests/browser/code.mjs"))
        .arg(&server.url)
        .arg(&screenshots)
        .env("JOB", job.to_string())
        .env("DIGEST", digest)
        .env("COMMIT", commit)
        .env("CHROMIUM", std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()))
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(90), output)
        .await
        .expect("the browser check finishes")
        .expect("node runs");
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success() && said.contains("ok: "), "the browser check failed: {said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_is_downloaded_again_and_one_damaged_on_the_server_never_runs() {
    let server = ServerProcess::start();
    let worker = WorkerProcess::start(&server.url, "box", &[]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("plain");
    std::fs::create_dir_all(&root).unwrap();
    let ran = dir.path().join("ran");
    std::fs::write(root.join("job.sh"), format!("echo running; echo {{}} >> {}\n", ran.display())).unwrap();
    std::fs::write(root.join("sweep.yaml"), "name: cached\ncommand: sh job.sh\ngrid:\n  i: [0]\n").unwrap();
    let first = submit_in(&root, &server.url, &["sweep.yaml", "--wait"]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    // The cache holds the snapshot unpacked, its tree; the archive went once it was checked.
    let cache = worker.dir.path().join("work/code-cache");
    // Beside the tree lies its `.made` mark; the directory's order is the file system's.
    let entries: Vec<PathBuf> = std::fs::read_dir(&cache).unwrap().map(|entry| entry.unwrap().path()).collect();
    let trees: Vec<&PathBuf> =
        entries.iter().filter(|path| path.extension().is_some_and(|ext| ext == "tree")).collect();
    assert_eq!(trees.len(), 1, "one unpacked tree and no archive left: {entries:?}");
    let tree = trees[0].clone();
    let digest = tree.file_stem().unwrap().to_string_lossy().into_owned();
    assert!(!entries.iter().any(|path| path.extension().is_some_and(|ext| ext == "zst")), "{entries:?}");
    let on_server = server.data_dir().join("code").join(format!("{digest}.tar.zst"));

    // A download damaged on the worker's disk before it was unpacked: downloaded again, and the
    // job runs on good code.
    std::fs::remove_dir_all(&tree).unwrap();
    let cached = cache.join(format!("{digest}.tar.zst"));
    std::fs::copy(&on_server, &cached).unwrap();
    flip_bytes(&cached);
    let second = submit_in(&root, &server.url, &["sweep.yaml", "--wait"]);
    assert!(second.status.success(), "{}{}", text(&second.stdout), text(&second.stderr));
    let job = finished(&server, "cached-2").await.remove(0);
    let log = log_of(&server, &job).await;
    assert!(log.contains("was damaged; downloaded it again") && log.contains("running"), "{log}");
    assert_eq!(std::fs::read_to_string(&ran).unwrap().lines().count(), 2);

    // Damaged on the server: downloaded again, still wrong: the job fails and never ran.
    flip_bytes(&on_server);
    std::fs::remove_dir_all(&tree).unwrap();
    let third = submit_in(&root, &server.url, &["sweep.yaml", "--wait"]);
    assert!(!third.status.success());
    let job = finished(&server, "cached-3").await.remove(0);
    assert_eq!(job.status, JobStatus::Failed);
    let reason = job.reason.clone().unwrap_or_default();
    assert!(reason.contains(&format!("code snapshot {digest} cannot be unpacked")), "{reason}");
    assert_eq!(std::fs::read_to_string(&ran).unwrap().lines().count(), 2, "the damaged code never ran");
}

/// Flips bytes in the middle of a file (its length unchanged).
fn flip_bytes(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let (middle, end) = (bytes.len() / 2, (bytes.len() / 2 + 8).min(bytes.len()));
    for byte in &mut bytes[middle..end] {
        *byte ^= 0xff;
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_project_over_the_cap_is_refused_naming_its_largest_files_and_nothing_is_stored() {
    let server = ServerProcess::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("weights.pt"), vec![1u8; 3 << 20]).unwrap();
    std::fs::write(dir.path().join("data.csv"), vec![b'x'; 1 << 20]).unwrap();
    std::fs::write(dir.path().join("sweep.yaml"), "name: big\ncommand: 'true'\n").unwrap();
    let output = submit_in(dir.path(), &server.url, &["sweep.yaml", "--max-code-size", "2MiB"]);
    assert!(!output.status.success());
    let error = text(&output.stderr);
    assert_eq!(error.trim().lines().count(), 1, "{error}");
    assert!(error.contains("over the 2.0 MiB cap"), "{error}");
    let (big, small) = (error.find("weights.pt (3.0 MiB)").unwrap(), error.find("data.csv (1.0 MiB)").unwrap());
    assert!(big < small, "largest first: {error}");
    assert!(!server.data_dir().join("code").exists(), "nothing uploaded");
    let sweeps = app().args(["sweeps", "ls", "--url", &server.url]).output().unwrap();
    assert!(!text(&sweeps.stdout).contains("big"), "nothing submitted: {}", text(&sweeps.stdout));
    // The dry run says the same without a server.
    let dry = submit_in(dir.path(), "http://127.0.0.1:9", &["sweep.yaml", "--dry-run", "--max-code-size", "2MiB"]);
    assert!(!dry.status.success() && text(&dry.stderr).contains("weights.pt"), "{}", text(&dry.stderr));
    let fits = submit_in(dir.path(), "http://127.0.0.1:9", &["sweep.yaml", "--dry-run"]);
    assert!(text(&fits.stdout).contains("code: 3 files, 4.0 MiB"), "{}", text(&fits.stdout));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_out_of_the_project_are_never_followed_and_unreadable_files_are_left_out_with_a_warning() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "box", &[]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    std::fs::create_dir_all(root.join("locked")).unwrap();
    std::fs::write(dir.path().join("secret.txt"), "outside the project").unwrap();
    std::fs::write(root.join("data.txt"), "inside\n").unwrap();
    std::fs::write(root.join("unreadable.txt"), "nobody may read me").unwrap();
    std::fs::write(root.join("locked/sweep.yaml"), "name: locked\ncommand: 'true'\n").unwrap();
    std::os::unix::fs::symlink("../secret.txt", root.join("leak")).unwrap();
    std::os::unix::fs::symlink("data.txt", root.join("alias")).unwrap();
    std::fs::write(root.join("sweep.yaml"), "name: links\ncommand: 'ls; cat alias; cat leak || true'\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    for (path, mode) in [(dir.path(), 0o755), (root.as_path(), 0o755), (&root.join("unreadable.txt"), 0o000)] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::set_permissions(root.join("locked"), std::fs::Permissions::from_mode(0o311)).unwrap();
    // Permissions do not stop root: submit as `nobody` where the test runs as root.
    let uid = Command::new("id").arg("-u").output().unwrap();
    let as_nobody = text(&uid.stdout).trim() == "0";
    let mut submit = Command::new(if as_nobody { "setpriv" } else { env!("CARGO_BIN_EXE_app") });
    if as_nobody {
        submit.args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_app")]);
    }
    let output =
        submit.current_dir(&root).args(["submit", "sweep.yaml", "--wait", "--url", &server.url]).output().unwrap();
    let (said, warned) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{said}{warned}");
    assert!(warned.contains("not shipped: leak (a symlink leading outside the project"), "{warned}");
    assert!(warned.contains("unreadable.txt (unreadable"), "{warned}");
    assert!(warned.contains("locked"), "{warned}");
    let job = finished(&server, "links").await.remove(0);
    let log = log_of(&server, &job).await;
    let listed: Vec<&str> = log.lines().take_while(|line| *line != "inside").collect();
    assert_eq!(listed, ["alias", "data.txt", "sweep.yaml"], "{log}");
    assert!(log.contains("inside") && !log.contains("outside the project"), "{log}");

    // A sweep file whose directory cannot be read: refused, saying so.
    if as_nobody {
        let output = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", env!("CARGO_BIN_EXE_app"), "submit"])
            .arg(root.join("locked/sweep.yaml"))
            .args(["--url", &server.url])
            .output()
            .unwrap();
        let error = text(&output.stderr);
        assert!(!output.status.success());
        assert!(error.contains("cannot read") && error.contains("--no-code"), "{error}");
    }
}

/// `app` (server and local worker) started in `dir` with its defaults: its data in
/// `dir/app-data`, its attempts in `dir/app-work`, as a new user runs it in their project.
struct EmbeddedApp {
    child: std::process::Child,
    url: String,
}

impl EmbeddedApp {
    fn start_in(dir: &Path) -> EmbeddedApp {
        let port = testkit::free_port();
        let child = app()
            .current_dir(dir)
            .args(["--bind", &format!("127.0.0.1:{port}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Serving, not only bound: the port takes connections before the data directory is
        // opened and marked as app's, and a snapshot taken in between would not know it.
        testkit::wait_until_sync("app serves", LONG, || health_answers(port));
        EmbeddedApp { child, url: format!("http://127.0.0.1:{port}") }
    }
}

/// Whether `GET /api/health` on `port` answers 200 within a second.
fn health_answers(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"GET /api/health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.ends_with(b" 200")
}

impl Drop for EmbeddedApp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The paths in the code snapshot `digest` stored in `data_dir`.
fn snapshot_paths(data_dir: &Path, digest: &str) -> Vec<String> {
    let unpacked = tempfile::tempdir().unwrap();
    let file = std::fs::File::open(data_dir.join("code").join(format!("{digest}.tar.zst"))).unwrap();
    archive::unpack_verified(file, Some(digest), unpacked.path(), u64::MAX).unwrap();
    let mut paths: Vec<String> =
        archive::list_tree(unpacked.path()).unwrap().iter().map(|path| path.display().to_string()).collect();
    paths.sort();
    paths
}

/// Submits `sweep.yaml` in `dir` to `url` with `--json`; the snapshot's digest and what was
/// left out, as `app submit --json` says.
fn submit_json(dir: &Path, url: &str) -> (String, Vec<String>) {
    let output = submit_in(dir, url, &["sweep.yaml", "--json"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let digest = answer["code"]["snapshot"]["digest"].as_str().unwrap().to_string();
    let left_out = answer["code"]["left_out"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| format!("{} ({})", entry["path"].as_str().unwrap(), entry["why"].as_str().unwrap()))
        .collect();
    (digest, left_out)
}

/// The project `app` keeps its data in, submitted to three times: the first snapshot only is
/// uploaded (app's files changing between the submissions change nothing), and none of app's
/// files are in it; with git (`app-data/` untracked, not ignored) or without.
async fn resubmitting_where_app_keeps_its_data_ships_the_same_code(with_git: bool) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(root.join("train.py"), "print('trained', __import__('sys').argv[1])\n").unwrap();
    std::fs::write(root.join("sweep.yaml"), "name: here\ncommand: python3 train.py {i}\ngrid:\n  i: [1, 2]\n").unwrap();
    // The client's own files beside the code: a token file and an app config.
    std::fs::write(root.join("worker-token"), "not-for-jobs-0123456789abcdef\n").unwrap();
    std::fs::write(root.join("app.toml"), "[worker]\nmax_jobs = 2\n").unwrap();
    if with_git {
        git(&root, &["init", "-q"]);
        git(&root, &["add", "train.py", "sweep.yaml"]);
        git(&root, &["commit", "-q", "-m", "code"]);
    }
    let app_here = EmbeddedApp::start_in(&root);
    let mut digests = Vec::new();
    let mut answers = Vec::new();
    for round in 0..3 {
        let output = app()
            .current_dir(&root)
            .args(["submit", "sweep.yaml", "--json", "--url", &app_here.url, "--token-file", "worker-token"])
            .output()
            .unwrap();
        // No server token is needed here: the flag only names the client's token file.
        assert!(output.status.success(), "round {round}: {}", text(&output.stderr));
        let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        digests.push(answer["code"]["snapshot"]["digest"].as_str().unwrap().to_string());
        let uploaded = &answer["code"]["uploaded_bytes"];
        assert_eq!(
            uploaded.is_null(),
            round > 0,
            "round {round} uploads only the first time: {answer} after {answers:#?}"
        );
        answers.push(answer.clone());
        let left: Vec<String> = answer["code"]["left_out"]
            .as_array()
            .unwrap()
            .iter()
            .map(|entry| format!("{} ({})", entry["path"].as_str().unwrap(), entry["why"].as_str().unwrap()))
            .collect();
        if round > 0 {
            // app-work exists once the local worker ran something.
            assert!(left.contains(&"app-data/ (app's data)".to_string()), "{left:?}");
            assert!(left.contains(&"app-work/ (attempt directories)".to_string()), "{left:?}");
        }
        assert!(left.contains(&"worker-token (app's token or config)".to_string()), "{left:?}");
        assert!(left.contains(&"app.toml (app's config)".to_string()), "{left:?}");
        // Each submission is a sweep of its own (here, here-2, ...).
        let name = answer["name"].as_str().unwrap().to_string();
        let jobs = wait_until("the sweep ran", LONG, || async {
            let client = client::Client::new(&app_here.url).ok()?;
            let query = JobQuery { sweep: Some(name.clone()), limit: Some(100), ..JobQuery::default() };
            let jobs = client.jobs(&query).await.ok()?.jobs;
            (jobs.len() == 2 && jobs.iter().all(|job| job.status.is_terminal())).then_some(jobs)
        })
        .await;
        assert!(jobs.iter().all(|job| job.status == JobStatus::Succeeded), "{name}: {jobs:#?}");
    }
    assert!(digests.iter().all(|digest| *digest == digests[0]), "{digests:?}");
    // (With git, app-data/ and app-work/ are untracked and not ignored: git would list them.)
    let paths = snapshot_paths(&root.join("app-data"), &digests[0]);
    assert_eq!(paths, ["sweep.yaml", "train.py"], "the snapshot holds the project's code only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resubmitting_where_app_keeps_its_data_ships_the_first_snapshot_only_without_git() {
    resubmitting_where_app_keeps_its_data_ships_the_same_code(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resubmitting_where_app_keeps_its_data_ships_the_first_snapshot_only_in_git() {
    resubmitting_where_app_keeps_its_data_ships_the_same_code(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_outputs_stay_home_outside_git_unless_appignore_puts_them_back() {
    let server = ServerProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(root.join("train.py"), "print(1)\n").unwrap();
    std::fs::write(root.join("sweep.yaml"), "name: gen\ncommand: python3 train.py\n").unwrap();
    for generated in [
        "wandb/run-1",
        "mlruns/0",
        "lightning_logs/version_0",
        "runs/exp",
        "outputs/2026-11-27",
        "multirun/x",
        "pkg/__pycache__",
        ".ipynb_checkpoints",
    ] {
        std::fs::create_dir_all(root.join(generated)).unwrap();
        std::fs::write(root.join(generated).join("f"), "generated").unwrap();
    }
    std::fs::create_dir_all(root.join("pkg")).unwrap();
    std::fs::write(root.join("pkg/model.py"), "layers = 2\n").unwrap();
    std::fs::create_dir_all(root.join("venv/bin")).unwrap();
    std::fs::write(root.join("venv/pyvenv.cfg"), "home = /usr/bin\n").unwrap();
    std::fs::write(root.join("venv/bin/python"), "").unwrap();
    std::fs::write(root.join("big.ckpt"), vec![0u8; 11 << 20]).unwrap();
    std::fs::write(root.join("small.pt"), vec![0u8; 1 << 20]).unwrap();
    let (digest, left_out) = submit_json(&root, &server.url);
    for expected in [
        "wandb/ (W&B run files)",
        "mlruns/ (MLflow runs)",
        "lightning_logs/ (Lightning logs)",
        "runs/ (TensorBoard runs)",
        "outputs/ (Hydra outputs)",
        "multirun/ (Hydra multiruns)",
        "pkg/__pycache__/ (Python caches)",
        ".ipynb_checkpoints/ (notebook checkpoints)",
        "venv/ (a virtual environment)",
        "big.ckpt (11 MiB of weights)",
    ] {
        assert!(left_out.contains(&expected.to_string()), "{expected} not in {left_out:?}");
    }
    let paths = snapshot_paths(&server.data_dir(), &digest);
    assert_eq!(paths, ["pkg/model.py", "small.pt", "sweep.yaml", "train.py"]);
    // The line a person reads.
    let output = submit_in(&root, &server.url, &["sweep.yaml", "--dry-run"]);
    assert!(text(&output.stdout).contains("left out: "), "{}", text(&output.stdout));
    // `!pattern` in .appignore puts them back.
    std::fs::write(root.join(".appignore"), "!wandb/\n!venv/\n!big.ckpt\n").unwrap();
    let (digest, left_out) = submit_json(&root, &server.url);
    let paths = snapshot_paths(&server.data_dir(), &digest);
    for back in ["wandb/run-1/f", "venv/pyvenv.cfg", "big.ckpt"] {
        assert!(paths.contains(&back.to_string()), "{back} not put back: {paths:?}");
    }
    assert!(!left_out.iter().any(|entry| entry.starts_with("wandb/") || entry.starts_with("venv/")), "{left_out:?}");
}

#[test]
fn a_project_that_is_apps_data_directory_is_refused_and_special_files_are_skipped_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(root.join(".app-instance"), "0123\n").unwrap();
    std::fs::write(root.join("sweep.yaml"), "name: x\ncommand: 'true'\n").unwrap();
    let output = submit_in(&root, "http://127.0.0.1:9", &["sweep.yaml", "--dry-run"]);
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("holds app's data, not a project's code"), "{}", text(&output.stderr));
    // A FIFO in a project: skipped, said.
    let project = tempfile::tempdir().unwrap();
    let root = project.path().canonicalize().unwrap();
    std::fs::write(root.join("sweep.yaml"), "name: x\ncommand: 'true'\n").unwrap();
    nix::unistd::mkfifo(&root.join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let server = ServerProcess::start();
    let output = submit_in(&root, &server.url, &["sweep.yaml"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("warning: not shipped: pipe (a FIFO)"), "{}", text(&output.stderr));
}

/// Every entry under `dir` with its mode, size, modification time and content: what a write
/// through a shared file would change.
fn tree_state(dir: &Path) -> Vec<(PathBuf, u32, u64, std::time::SystemTime, Vec<u8>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut state = Vec::new();
    for path in archive::list_tree(dir).unwrap() {
        let full = dir.join(&path);
        let metadata = std::fs::symlink_metadata(&full).unwrap();
        let content = if metadata.is_file() { std::fs::read(&full).unwrap() } else { Vec::new() };
        state.push((path, metadata.permissions().mode(), metadata.len(), metadata.modified().unwrap(), content));
    }
    state
}

/// A job that rewrites, appends to, truncates, chmods and deletes files of its working copy,
/// and adds one, under a worker laying copies out by `code_copy`: the cached tree is as it was
/// (its digest too), and the next attempt sees the snapshot's files again.
async fn a_jobs_writes_never_reach_the_cached_code(code_copy: &str) {
    let server = ServerProcess::start();
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), format!("[worker]\ncode_copy = \"{code_copy}\"\n")).unwrap();
    let worker =
        WorkerProcess::start(&server.url, "cow", &["--max-jobs", "1", "--config", config.path().to_str().unwrap()]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    for name in ["rewrite.txt", "append.txt", "truncate.txt", "chmod.txt", "delete.txt"] {
        std::fs::write(root.join(name), format!("{name} as shipped\n")).unwrap();
    }
    std::fs::create_dir_all(root.join("pkg")).unwrap();
    std::fs::write(root.join("pkg/keep.py"), "x = 1\n").unwrap();
    let script =
        "cat rewrite.txt append.txt; echo rewritten > rewrite.txt; echo more >> append.txt; : > truncate.txt; \
                  chmod 755 chmod.txt; rm delete.txt; echo new > new.txt; rm -r pkg; echo done";
    std::fs::write(
        root.join("sweep.yaml"),
        format!("name: cow\ncommand: {}\ngrid:\n  i: [1, 2]\n", serde_json::to_string(script).unwrap()),
    )
    .unwrap();
    let output = submit_in(&root, &server.url, &["sweep.yaml", "--json"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let digest = answer["code"]["snapshot"]["digest"].as_str().unwrap().to_string();
    let jobs = finished(&server, "cow").await;
    for job in &jobs {
        assert_eq!(job.status, JobStatus::Succeeded, "{job:#?}");
        // Each attempt saw the snapshot as shipped, whatever the one before did to its copy.
        let log = log_of(&server, job).await;
        assert!(log.contains("rewrite.txt as shipped") && log.contains("append.txt as shipped\ndone"), "{log}");
    }
    let tree = worker.dir.path().join("work").join("code-cache").join(format!("{digest}.tree"));
    let paths = archive::list_tree(&tree).unwrap();
    assert_eq!(archive::digest_of(&tree, &paths).unwrap().digest, digest, "the cached tree is the snapshot still");
    let unpacked = tempfile::tempdir().unwrap();
    let file = std::fs::File::open(server.data_dir().join("code").join(format!("{digest}.tar.zst"))).unwrap();
    archive::unpack_verified(file, Some(&digest), unpacked.path(), u64::MAX).unwrap();
    let cached: Vec<_> =
        tree_state(&tree).into_iter().map(|(path, mode, size, _, content)| (path, mode, size, content)).collect();
    let shipped: Vec<_> = tree_state(unpacked.path())
        .into_iter()
        .map(|(path, mode, size, _, content)| (path, mode, size, content))
        .collect();
    assert_eq!(cached, shipped, "the cached tree's files, modes and contents are the snapshot's");
    assert!(
        worker.log().contains(&format!("code_copy=\"{code_copy}\""))
            || worker.log().contains(&format!("code_copy={code_copy}")),
        "{}",
        worker.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_writes_never_reach_the_cached_code_with_copies() {
    a_jobs_writes_never_reach_the_cached_code("copy").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_writes_never_reach_the_cached_code_with_overlays() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: mounting overlays needs root");
        return;
    }
    a_jobs_writes_never_reach_the_cached_code("overlay").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_apps_own_files_are_left_out_never_a_projects_look_alikes() {
    let server = ServerProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(root.join("sweep.yaml"), "name: alike\ncommand: 'true'\n").unwrap();
    // The project's own `queue.db` and its own TOML with `[server]`: code, shipped.
    std::fs::create_dir_all(root.join("store")).unwrap();
    std::fs::write(root.join("store/queue.db"), "the project's own database").unwrap();
    std::fs::write(root.join("serving.toml"), "[server]\nport = 8080\nworkers = 4\n").unwrap();
    // An app config in the project, and the token and key files it names: left out.
    std::fs::create_dir_all(root.join("deploy")).unwrap();
    std::fs::write(
        root.join("deploy/app.toml"),
        "[server]\nuser_token_file = \"user-tokens\"\ntls_key = \"../server.key\"\n",
    )
    .unwrap();
    std::fs::write(root.join("deploy/user-tokens"), "secret-user-token-0123456789\n").unwrap();
    std::fs::write(root.join("server.key"), "-----BEGIN PRIVATE KEY-----\n").unwrap();
    let (digest, left_out) = submit_json(&root, &server.url);
    let paths = snapshot_paths(&server.data_dir(), &digest);
    assert_eq!(paths, ["serving.toml", "store/queue.db", "sweep.yaml"], "{left_out:?}");
    for expected in [
        "deploy/app.toml (app's config)",
        "deploy/user-tokens (app's token or config)",
        "server.key (app's token or config)",
    ] {
        assert!(left_out.contains(&expected.to_string()), "{expected} not in {left_out:?}");
    }
}

#[test]
fn a_dry_run_names_the_closest_file_to_a_misspelt_script() {
    let project = tempfile::tempdir().unwrap();
    let root = project.path().canonicalize().unwrap();
    std::fs::create_dir(root.join("exp")).unwrap();
    std::fs::write(root.join("exp/train.py"), "print('hi')\n").unwrap();
    std::fs::write(root.join("exp/sweep.yaml"), "name: x\ncommand: python3 trian.py --lr {lr}\ngrid: {lr: [1, 2]}\n")
        .unwrap();
    let output = submit_in(&root.join("exp"), "http://127.0.0.1:9", &["sweep.yaml", "--dry-run"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let said = text(&output.stderr);
    assert!(
        said.contains("warning: `trian.py` is not in the code that would be shipped; did you mean `train.py`?"),
        "{said}"
    );
    // W&B's `program`, spelt right: nothing to say.
    let wandb = "program: train.py\nmethod: grid\nparameters:\n  lr: {values: [1, 2]}\n";
    std::fs::write(root.join("exp/sweep.yaml"), wandb).unwrap();
    let output = submit_in(&root.join("exp"), "http://127.0.0.1:9", &["sweep.yaml", "--dry-run"]);
    assert!(!text(&output.stderr).contains("not in the code"), "{}", text(&output.stderr));
    std::fs::write(root.join("exp/sweep.yaml"), wandb.replace("train.py", "trian.py")).unwrap();
    let output = submit_in(&root.join("exp"), "http://127.0.0.1:9", &["sweep.yaml", "--dry-run", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let warnings = json["warnings"].to_string();
    assert!(warnings.contains("`trian.py` is not in the code") && warnings.contains("`train.py`"), "{warnings}");
}
