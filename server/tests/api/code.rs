//! Code snapshots (stored once under the digest the server computes, named by submissions,
//! carried by claimed jobs) and checkpoints (fenced uploads, the newest kept, restored to the
//! next attempt only).

use shared::api::{CodeSnapshot, ReportRequest, SubmitQuery, Workspace};
use shared::job::Outcome;
use std::path::{Path, PathBuf};
use testkit::{sweep_of, TestApp};

/// A small project packed as `app submit` packs it: its digest and the compressed file.
fn packed_project(dir: &Path) -> (String, PathBuf) {
    let root = dir.join("project");
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("train.py"), "print('training')\n").unwrap();
    std::fs::write(root.join("src/model.py"), "layers = 3\n").unwrap();
    let entries = archive::list_tree(&root).unwrap();
    let archive_path = dir.join("project.tar.zst");
    let (packed, _) = archive::pack_to(&root, &entries, std::fs::File::create(&archive_path).unwrap()).unwrap();
    (packed.digest, archive_path)
}

async fn open(path: &Path) -> tokio::fs::File {
    tokio::fs::File::open(path).await.unwrap()
}

fn stored_snapshots(app: &TestApp) -> Vec<String> {
    match std::fs::read_dir(app.data_path().join("code")) {
        Ok(entries) => entries.map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

#[tokio::test]
async fn a_snapshot_is_stored_once_under_its_digest_and_every_claimed_job_carries_its_workspace() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let (digest, archive_path) = packed_project(dir.path());
    let missing = app.client.code_info(&digest).await.unwrap_err();
    assert_eq!(missing.status(), Some(404), "{missing}");

    let stored = app.client.upload_code(open(&archive_path).await).await.unwrap();
    assert_eq!(stored.digest, digest, "the server names it by the digest of its tar stream");
    assert_eq!(stored.packed_bytes, std::fs::metadata(&archive_path).unwrap().len());
    assert_eq!(app.client.code_info(&digest).await.unwrap(), stored);
    // The same code again changes nothing.
    assert_eq!(app.client.upload_code(open(&archive_path).await).await.unwrap().digest, digest);
    assert_eq!(stored_snapshots(&app), [format!("{digest}.tar.zst")]);

    let yaml = "name: shipped\ncommand: python train.py --i {i}\nenv: {OMP_NUM_THREADS: 2}\nsetup: source env.sh\n\
                capture: none\nmetrics_regex: 'loss=(?P<loss>\\S+)'\ngrid:\n  i: [0, 1]\n";
    let query = SubmitQuery {
        code: Some(digest.clone()),
        code_dir: Some("src".into()),
        code_commit: Some("a".repeat(40)),
        code_dirty: true,
        ..SubmitQuery::default()
    };
    app.client.submit(yaml, &query).await.unwrap();
    let expected = Workspace {
        code: Some(CodeSnapshot {
            digest: digest.clone(),
            dir: "src".into(),
            commit: Some("a".repeat(40)),
            dirty: true,
        }),
        workdir: None,
        env: vec![("OMP_NUM_THREADS".into(), "2".into())],
        setup: Some("source env.sh".into()),
        capture_off: true,
        metrics_regex: vec![r"loss=(?P<loss>\S+)".into()],
    };
    assert_eq!(app.client.sweep_workspace("shipped").await.unwrap(), expected);
    let worker = app.register("code-w", 2).await;
    let jobs = app.claim(worker, 2).await;
    assert_eq!(jobs.len(), 2);
    assert!(jobs.iter().all(|job| job.workspace == expected), "{:?}", jobs[0].workspace);

    // The worker downloads exactly what was uploaded.
    let downloaded = dir.path().join("downloaded.tar.zst");
    app.client.download_code(worker, &digest, &downloaded).await.unwrap();
    assert_eq!(std::fs::read(&downloaded).unwrap(), std::fs::read(&archive_path).unwrap());

    // A sweep without code, and one whose file says `code: none`, run in an empty directory.
    app.submit(&sweep_of("plain", 1)).await;
    let none = format!("{}code: none\n", sweep_of("none", 1));
    app.client.submit(&none, &query).await.unwrap();
    let workspaces =
        (app.client.sweep_workspace("plain").await.unwrap(), app.client.sweep_workspace("none").await.unwrap());
    assert_eq!((workspaces.0.code, workspaces.1.code), (None, None));
}

#[tokio::test]
async fn a_bad_snapshot_or_a_submission_naming_one_the_server_lacks_is_refused_and_nothing_is_stored() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, b"not a zstd stream at all").unwrap();
    let refused = app.client.upload_code(open(&garbage).await).await.unwrap_err();
    assert_eq!(refused.status(), Some(400), "{refused}");
    assert!(refused.to_string().contains("not a zstd-compressed code snapshot"), "{refused}");
    assert!(stored_snapshots(&app).is_empty(), "{:?}", stored_snapshots(&app));

    let (digest, _) = packed_project(dir.path());
    let submit = |query: SubmitQuery| {
        let client = app.client.clone();
        async move { client.submit(&sweep_of("refused", 1), &query).await.unwrap_err() }
    };
    let unknown = submit(SubmitQuery { code: Some(digest.clone()), ..SubmitQuery::default() }).await;
    assert_eq!(unknown.status(), Some(400));
    assert!(unknown.to_string().contains(&format!("code snapshot {digest} is not on the server")), "{unknown}");
    let malformed = submit(SubmitQuery { code: Some("abc".into()), ..SubmitQuery::default() }).await;
    assert!(malformed.to_string().contains("not a snapshot digest"), "{malformed}");
    assert!(app.client.sweeps().await.unwrap().is_empty(), "nothing stored");
    assert_eq!(app.client.code_info("../../etc").await.unwrap_err().status(), Some(400));

    let (_, archive_path) = packed_project(&dir.path().join("again"));
    app.client.upload_code(open(&archive_path).await).await.unwrap();
    let escaping =
        submit(SubmitQuery { code: Some(digest), code_dir: Some("../up".into()), ..SubmitQuery::default() }).await;
    assert!(escaping.to_string().starts_with("code_dir: "), "{escaping}");
    assert!(app.client.sweeps().await.unwrap().is_empty());
}

#[tokio::test]
async fn checkpoints_are_fenced_by_attempt_the_newest_is_kept_and_the_next_attempt_gets_it() {
    let app = TestApp::spawn().await;
    let (first_worker, job) = app.start_one("ckpt").await;
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let (older, newer) = (file("older", b"epoch 1"), file("newer", b"epoch 2 weights"));
    assert_eq!(app.client.checkpoint_info(job.id).await.unwrap_err().status(), Some(404));
    app.client.upload_checkpoint(job.id, job.attempt, first_worker, open(&older).await).await.unwrap();
    let kept = app.client.upload_checkpoint(job.id, job.attempt, first_worker, open(&newer).await).await.unwrap();
    assert_eq!((kept.attempt, kept.size), (1, 15));
    assert_eq!(app.client.checkpoint_info(job.id).await.unwrap(), kept);
    let on_disk: Vec<_> = std::fs::read_dir(app.data_path().join(format!("checkpoints/{}", job.id))).unwrap().collect();
    assert_eq!(on_disk.len(), 1, "only the newest is kept");

    // Another worker cannot write into this attempt.
    let stranger = app.register("stranger", 1).await;
    let refused = app.client.upload_checkpoint(job.id, job.attempt, stranger, open(&older).await).await.unwrap_err();
    assert_eq!(refused.status(), Some(409), "{refused}");

    // The attempt is lost; the next one, elsewhere, gets the checkpoint of attempt 1.
    let report = ReportRequest { worker_id: first_worker, attempt: job.attempt, outcome: Outcome::Abandoned };
    app.client.report(job.id, &report).await.unwrap();
    let second_worker = app.register("second", 1).await;
    let next = app.claim(second_worker, 1).await.pop().expect("requeued and claimed");
    assert_eq!(next.attempt, 2);
    let restored = dir.path().join("restored");
    let (from, sha256) =
        app.client.download_checkpoint(next.id, next.attempt, second_worker, &restored).await.unwrap().unwrap();
    assert_eq!((from, sha256), (1, kept.sha256.clone()));
    assert_eq!(std::fs::read(&restored).unwrap(), b"epoch 2 weights");
    // The stale attempt may neither replace it nor read it as its own.
    let late = app.client.upload_checkpoint(job.id, 1, first_worker, open(&older).await).await.unwrap_err();
    assert_eq!(late.status(), Some(409), "{late}");
    let stale = app.client.download_checkpoint(job.id, 1, first_worker, &dir.path().join("stale")).await.unwrap_err();
    assert_eq!(stale.status(), Some(409), "{stale}");
    assert_eq!(app.client.checkpoint_info(job.id).await.unwrap(), kept, "unchanged by the refused upload");

    // A job without a checkpoint: none to restore.
    let (worker, fresh) = app.start_one("fresh").await;
    let none = app.client.download_checkpoint(fresh.id, fresh.attempt, worker, &dir.path().join("none")).await.unwrap();
    assert_eq!(none, None);
}

#[tokio::test]
async fn a_removed_sweep_takes_its_jobs_checkpoint_files_with_it() {
    let app = TestApp::spawn().await;
    let (worker, job) = app.start_one("kept-weights").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weights");
    std::fs::write(&path, b"epoch 3").unwrap();
    app.client.upload_checkpoint(job.id, job.attempt, worker, open(&path).await).await.unwrap();
    let files = app.data_path().join(format!("checkpoints/{}", job.id));
    assert!(files.is_dir());
    let report = ReportRequest { worker_id: worker, attempt: job.attempt, outcome: Outcome::Exited { code: 0 } };
    app.client.report(job.id, &report).await.unwrap();
    app.client.delete_sweep("kept-weights").await.unwrap();
    assert!(!files.exists(), "no checkpoint file outlives its job");
    assert_eq!(app.client.checkpoint_info(job.id).await.unwrap_err().status(), Some(404));
}

/// One raw tar entry: path, type, link target, data.
type RawEntry<'a> = (&'a str, tar::EntryType, &'a str, &'a [u8]);

/// A compressed tar stream of raw entries, written byte by byte so that it may hold what no
/// honest packer writes.
fn hostile_archive(entries: &[RawEntry]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, kind, target, data) in entries {
        let mut header = tar::Header::new_gnu();
        let bytes = header.as_old_mut();
        bytes.name[..path.len()].copy_from_slice(path.as_bytes());
        bytes.linkname[..target.len()].copy_from_slice(target.as_bytes());
        header.set_entry_type(*kind);
        header.set_mode(0o644);
        header.set_size(data.len() as u64);
        header.set_cksum();
        builder.append(&header, *data).unwrap();
    }
    zstd::encode_all(&builder.into_inner().unwrap()[..], 3).unwrap()
}

#[tokio::test]
async fn a_snapshot_with_an_entry_leaving_the_project_is_refused_by_name_and_nothing_is_stored() {
    use tar::EntryType::{Block, Char, Fifo, Link, Regular, Symlink};
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let fine: RawEntry = ("train.py", Regular, "", b"print(1)\n");
    let cases: [(RawEntry, &str); 9] = [
        (("../escape.py", Regular, "", b"x"), "`..`"),
        (("src/../../escape.py", Regular, "", b"x"), "`..`"),
        (("/etc/cron.d/evil", Regular, "", b"x"), "absolute path"),
        (("passwd", Symlink, "/etc/passwd", b""), "absolute path"),
        (("up", Symlink, "../../outside", b""), "leading outside"),
        (("hard", Link, "/etc/shadow", b""), "hard link"),
        (("pipe", Fifo, "", b""), "FIFO"),
        (("null", Char, "", b""), "device"),
        (("disk", Block, "", b""), "device"),
    ];
    for (hostile, reason) in cases {
        let path = dir.path().join("hostile.tar.zst");
        std::fs::write(&path, hostile_archive(&[fine, hostile])).unwrap();
        let refused = app.client.upload_code(open(&path).await).await.unwrap_err();
        assert_eq!(refused.status(), Some(400), "{}: {refused}", hostile.0);
        let message = refused.to_string();
        assert!(message.contains(&format!("`{}`", hostile.0)), "names the entry: {message}");
        assert!(message.contains(reason), "says why ({reason}): {message}");
        assert!(stored_snapshots(&app).is_empty(), "{} was stored", hostile.0);
    }
    // Links inside the project and the same files without the hostile entry are fine.
    let path = dir.path().join("fine.tar.zst");
    std::fs::write(&path, hostile_archive(&[fine, ("src/data", Symlink, "../train.py", b"")])).unwrap();
    let stored = app.client.upload_code(open(&path).await).await.unwrap();
    assert_eq!(stored_snapshots(&app), [format!("{}.tar.zst", stored.digest)]);
    // Nothing was left behind by the refusals either: no received upload remains.
    let incoming = app.data_path().join("results/.staging/.incoming");
    let left: Vec<_> = std::fs::read_dir(&incoming).into_iter().flatten().flatten().map(|entry| entry.path()).collect();
    assert!(left.is_empty(), "{left:?}");
}
