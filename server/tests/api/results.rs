//! Versioned results: streamed uploads fenced by attempt, sealing against a manifest,
//! immutable versions, downloads of listed files only, and paths that cannot escape.

use client::ClientError;
use sha2::{Digest, Sha256};
use shared::api::{AttemptRecord, ClaimedJob, JobId, ManifestEntry, ReportRequest, ResultUpload, WorkerId};
use shared::job::Outcome;
use std::path::{Path, PathBuf};
use testkit::TestApp;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Writes `bytes` to a temporary file and returns it opened for upload.
async fn file_of(dir: &Path, name: &str, bytes: &[u8]) -> tokio::fs::File {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    tokio::fs::File::open(path).await.unwrap()
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

async fn upload(
    app: &TestApp,
    job: &ClaimedJob,
    worker: WorkerId,
    path: &str,
    bytes: &[u8],
) -> Result<ManifestEntry, ClientError> {
    let dir = tempfile::tempdir().unwrap();
    let file = file_of(dir.path(), "upload", bytes).await;
    app.client.upload_file(job.id, job.attempt, path, worker, file).await
}

fn sealing(worker_id: WorkerId, manifest: Vec<ManifestEntry>) -> ResultUpload {
    let record = AttemptRecord {
        exit_code: Some(0),
        outcome: "exited with code 0".into(),
        worker: "results-w".into(),
        gpus: vec!["NVIDIA H100".into()],
        ..AttemptRecord::default()
    };
    ResultUpload { worker_id, manifest, record }
}

fn version_dir(app: &TestApp, relative: &str) -> PathBuf {
    app.config.data_dir.join(relative)
}

#[tokio::test]
async fn uploaded_files_are_sealed_into_an_immutable_version_and_downloaded_intact() {
    // Far below the model's size: uploads have their own limit.
    let app = TestApp::spawn_with(|config| config.max_body_bytes = 64 << 10).await;
    let (worker, job) = app.start_one("results").await;
    let model: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect();
    let history = br#"{"loss": [0.9, 0.4]}"#;
    let first = upload(&app, &job, worker, "model_best.pt", &model).await.unwrap();
    assert_eq!((first.size, first.sha256.clone()), (model.len() as u64, sha256(&model)));
    let second = upload(&app, &job, worker, "results/history.json", history).await.unwrap();
    assert_eq!(second.path, "results/history.json");
    // A stray file the manifest will not list: removed at the seal, never served.
    upload(&app, &job, worker, "scratch.tmp", b"junk").await.unwrap();

    let version = app
        .client
        .seal_result(job.id, job.attempt, &sealing(worker, vec![first.clone(), second.clone()]))
        .await
        .unwrap();
    assert_eq!(version.path, format!("results/results/0/v{}", job.attempt));
    assert_eq!(version.files, [first.clone(), second.clone()]);
    assert_eq!(version.params["i"], 0);
    assert_eq!(version.record.exit_code, Some(0));
    let listed = app.client.results(job.id).await.unwrap();
    assert_eq!((listed.len(), listed[0].path.as_str()), (1, version.path.as_str()));

    let on_disk = version_dir(&app, &version.path);
    for name in ["model_best.pt", "results/history.json", ".app/manifest.json", ".app/result.json"] {
        assert!(on_disk.join(name).is_file(), "{name} missing from {}", on_disk.display());
    }
    assert!(!on_disk.join("scratch.tmp").exists());
    let manifest: Vec<ManifestEntry> =
        serde_json::from_slice(&std::fs::read(on_disk.join(".app/manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest, version.files);

    let out = tempfile::tempdir().unwrap();
    for entry in [&first, &second] {
        let destination = out.path().join("download");
        let written = app.client.download_file(job.id, job.attempt, &entry.path, &destination).await.unwrap();
        let mut bytes = Vec::new();
        tokio::fs::File::open(&destination).await.unwrap().read_to_end(&mut bytes).await.unwrap();
        assert_eq!((written, sha256(&bytes)), (entry.size, entry.sha256.clone()));
    }
    assert_eq!(std::fs::read(out.path().join("download")).unwrap(), history);
    for unlisted in ["scratch.tmp", ".app/manifest.json", "nothing/here"] {
        let error = app.client.download_file(job.id, job.attempt, unlisted, &out.path().join("x")).await.unwrap_err();
        assert_eq!(error.status(), Some(404), "{unlisted}: {error}");
    }

    // Immutable: a second seal, or another upload, of the same attempt is a conflict.
    let again = app.client.seal_result(job.id, job.attempt, &sealing(worker, vec![first])).await.unwrap_err();
    assert_eq!(again.status(), Some(409));
    assert!(again.to_string().contains("already stored"), "{again}");
    let late = upload(&app, &job, worker, "model_best.pt", b"other").await.unwrap_err();
    assert_eq!(late.status(), Some(409));
    assert_eq!(std::fs::read(on_disk.join("model_best.pt")).unwrap(), model, "nothing was overwritten");
}

#[tokio::test]
async fn a_manifest_that_does_not_match_the_uploads_stores_nothing() {
    let app = TestApp::spawn().await;
    let (worker, job) = app.start_one("mismatch").await;
    let entry = upload(&app, &job, worker, "a.txt", b"hello").await.unwrap();
    let cases = [
        ManifestEntry { sha256: sha256(b"other"), ..entry.clone() },
        ManifestEntry { size: 6, ..entry.clone() },
        ManifestEntry { path: "b.txt".into(), ..entry.clone() },
    ];
    for wrong in cases {
        let error =
            app.client.seal_result(job.id, job.attempt, &sealing(worker, vec![wrong.clone()])).await.unwrap_err();
        assert_eq!(error.status(), Some(400), "{error}");
        assert!(error.to_string().contains(&wrong.path), "the message names the file: {error}");
    }
    let twice = app.client.seal_result(job.id, job.attempt, &sealing(worker, vec![entry.clone(), entry.clone()])).await;
    assert_eq!(twice.unwrap_err().status(), Some(400));
    assert!(app.client.results(job.id).await.unwrap().is_empty());
    assert!(!app.config.data_dir.join("results/mismatch").exists(), "a refused seal left a directory");
    // The uploads are still there: a corrected manifest seals.
    let version = app.client.seal_result(job.id, job.attempt, &sealing(worker, vec![entry])).await.unwrap();
    assert_eq!(version.files.len(), 1);
}

#[tokio::test]
async fn only_the_worker_of_the_running_attempt_may_upload_or_seal() {
    let app = TestApp::spawn().await;
    let (worker, job) = app.start_one("fenced-files").await;
    let dir = tempfile::tempdir().unwrap();
    // Large enough to still be on its way when the refusal is decided: the client must get the
    // 409 all the same, not a broken connection it would retry.
    let big = file_of(dir.path(), "big", &vec![7u8; 3 << 20]).await;
    let stale = app.client.upload_file(job.id, job.attempt + 1, "a", worker, big).await;
    assert_eq!(stale.unwrap_err().status(), Some(409));
    let other = app.register("other", 1).await;
    let foreign = app.client.upload_file(job.id, job.attempt, "a", other, file_of(dir.path(), "a", b"a").await).await;
    assert_eq!(foreign.unwrap_err().status(), Some(409));
    let missing = app
        .client
        .upload_file(JobId::new(job.id.get() + 9), 1, "a", worker, file_of(dir.path(), "a", b"a").await)
        .await;
    assert_eq!(missing.unwrap_err().status(), Some(404));
    let entry = upload(&app, &job, worker, "a", b"a").await.unwrap();
    let report = ReportRequest { worker_id: worker, attempt: job.attempt, outcome: Outcome::Exited { code: 0 } };
    app.client.report(job.id, &report).await.unwrap();
    let ended = app.client.seal_result(job.id, job.attempt, &sealing(worker, vec![entry])).await.unwrap_err();
    assert_eq!(ended.status(), Some(409), "{ended}");
    assert_eq!(app.client.results(JobId::new(job.id.get() + 9)).await.unwrap_err().status(), Some(404));
}

#[tokio::test]
async fn file_paths_that_could_leave_the_result_directory_are_refused() {
    let app = TestApp::spawn().await;
    let (worker, job) = app.start_one("escape").await;
    let http = reqwest::Client::new();
    let base = format!("{}/api/jobs/{}/attempts/{}/files", app.url, job.id, job.attempt);
    // The client encodes each segment; these are sent raw, as a hostile client would.
    for path in ["..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", "/etc/passwd", "a%5C..%5Cb", "a/%00", ".app/result.json"]
    {
        let response = http
            .put(format!("{base}/{path}?worker_id={worker}"))
            .header(shared::api::SESSION_HEADER, app.session_of(worker))
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 400, "{path}: {}", response.text().await.unwrap());
    }
    // A literal `..` straight on the wire, where no URL library tidies it away first.
    let address = app.url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!(
        "PUT /api/jobs/{}/attempts/{}/files/../../etc/passwd?worker_id={worker} HTTP/1.1\r\nHost: {address}\r\n{}: {}\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx",
        job.id,
        job.attempt,
        shared::api::SESSION_HEADER,
        app.session_of(worker)
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let download =
        http.get(format!("{}/api/jobs/{}/results/1/files/..%2Fqueue.db", app.url, job.id)).send().await.unwrap();
    assert_eq!(download.status().as_u16(), 400);
    assert!(!app.config.data_dir.join("etc").exists());
}

#[tokio::test]
async fn an_over_large_or_broken_upload_leaves_nothing_and_can_be_retried() {
    let app = TestApp::spawn_with(|config| config.max_upload_bytes = 1_000).await;
    let (worker, job) = app.start_one("big").await;
    let error = upload(&app, &job, worker, "big.bin", &[0u8; 1_001]).await.unwrap_err();
    assert_eq!(error.status(), Some(413), "{error}");
    let url = format!("{}/api/jobs/{}/attempts/{}/files/part.bin?worker_id={worker}", app.url, job.id, job.attempt);
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = vec![Ok(vec![1u8; 100]), Err(std::io::Error::other("cut"))];
    let broken = reqwest::Client::new().put(url).body(reqwest::Body::wrap_stream(futures_util::stream::iter(chunks)));
    assert!(broken.send().await.map(|response| !response.status().is_success()).unwrap_or(true));
    let incoming = app.config.data_dir.join("results/.staging/.incoming");
    testkit::wait_until("the partial upload is removed", std::time::Duration::from_secs(5), || async {
        (std::fs::read_dir(&incoming).unwrap().count() == 0).then_some(())
    })
    .await;
    let entry = upload(&app, &job, worker, "part.bin", &[1u8; 200]).await.unwrap();
    assert_eq!(entry.size, 200);
}

#[tokio::test]
async fn uploads_of_an_attempt_that_ended_unsealed_are_cleaned_up() {
    // A short telemetry retention makes the reaper's upkeep (which also cleans staging) frequent.
    let app = TestApp::spawn_with(|config| config.telemetry_retention = std::time::Duration::from_millis(500)).await;
    let (worker, job) = app.start_one("abandoned").await;
    upload(&app, &job, worker, "half/done.bin", b"partial work").await.unwrap();
    let staging = app.config.data_dir.join(format!("results/.staging/{}-{}", job.id, job.attempt));
    assert!(staging.join("half/done.bin").is_file());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(staging.exists(), "the staging of a running attempt is kept");
    let report = ReportRequest { worker_id: worker, attempt: job.attempt, outcome: Outcome::Exited { code: 1 } };
    app.client.report(job.id, &report).await.unwrap();
    testkit::wait_until("the unsealed uploads are removed", std::time::Duration::from_secs(10), || async {
        (!staging.exists()).then_some(())
    })
    .await;
    assert!(app.client.results(job.id).await.unwrap().is_empty());
}

#[tokio::test]
async fn an_attempt_may_upload_only_so_much_in_all() {
    let app = TestApp::spawn_with(|config| config.max_attempt_upload_bytes = 1_000).await;
    let (worker, job) = app.start_one("quota").await;
    upload(&app, &job, worker, "a.bin", &[1u8; 600]).await.unwrap();
    let error = upload(&app, &job, worker, "b.bin", &[2u8; 600]).await.unwrap_err();
    assert_eq!(error.status(), Some(413), "{error}");
    assert!(error.to_string().contains("600 bytes stored already"), "{error}");
    // Uploading a file again replaces it, so its old size does not count twice.
    upload(&app, &job, worker, "a.bin", &[3u8; 900]).await.unwrap();
    upload(&app, &job, worker, "c.bin", &[4u8; 100]).await.unwrap();
    let staged = app.config.data_dir.join(format!("results/.staging/{}-{}", job.id, job.attempt));
    assert!(staged.join("c.bin").exists() && !staged.join("b.bin").exists(), "the refused file left nothing");
}
