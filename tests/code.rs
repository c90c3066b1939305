//! End-to-end tests of code shipping: `app submit` run inside a git project packs it, two
//! workers whose work directories are elsewhere run exactly that code (each attempt on a fresh
//! copy), the snapshot's digest, commit and dirty flag are recorded; an unchanged resubmission
//! uploads nothing; a damaged snapshot is fetched again and never run; and bad projects (over
//! the cap, a link out of the project, an unreadable file or directory) are refused or left
//! out with a warning.

mod common;

use common::{app, wait_until, ServerProcess, WorkerProcess};
use shared::api::{Job, JobQuery, LogQuery};
use shared::job::JobStatus;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

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
    let screenshots = common::repo("target/browser-screenshots/code");
    let output = tokio::process::Command::new("node")
        .arg(common::repo("tests/browser/code.mjs"))
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
    let cache = worker.dir.path().join("work/code-cache");
    let cached = std::fs::read_dir(&cache).unwrap().next().unwrap().unwrap().path();

    // Damaged on the worker's disk: downloaded again, and the job runs on good code.
    flip_bytes(&cached);
    let second = submit_in(&root, &server.url, &["sweep.yaml", "--wait"]);
    assert!(second.status.success(), "{}{}", text(&second.stdout), text(&second.stderr));
    let job = finished(&server, "cached-2").await.remove(0);
    let log = log_of(&server, &job).await;
    assert!(log.contains("was damaged; downloaded it again") && log.contains("running"), "{log}");
    assert_eq!(std::fs::read_to_string(&ran).unwrap().lines().count(), 2);

    // Damaged on the server: downloaded again, still wrong: the job fails and never ran.
    let digest = cached.file_name().unwrap().to_string_lossy().replace(".tar.zst", "");
    flip_bytes(&server.data_dir().join("code").join(format!("{digest}.tar.zst")));
    let _ = std::fs::remove_file(&cached);
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
