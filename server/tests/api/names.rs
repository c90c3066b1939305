//! Sweep names with a project (`proj/s`, as `app submit` names a file without `name:`): one
//! URL segment (`proj%2Fs`), a suffix on the last part when taken, one flat results directory
//! (`results/proj+s/`) that no other sweep's directory holds or is held by.

use shared::api::{
    AttemptRecord, ClaimedJob, JobQuery, LogAppend, LogQuery, ReportRequest, ResultUpload, SubmitQuery, WorkerId,
};
use shared::job::{JobStatus, Outcome};
use testkit::{sweep_of, TestApp};

/// Uploads `out.txt` as the attempt's result and seals it; the version's path.
async fn seal_a_file(app: &TestApp, worker: WorkerId, job: &ClaimedJob) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.txt");
    std::fs::write(&path, job.sweep.as_bytes()).unwrap();
    let file = tokio::fs::File::open(&path).await.unwrap();
    let entry = app.client.upload_file(job.id, job.attempt, "out.txt", worker, file).await.unwrap();
    let record = AttemptRecord { exit_code: Some(0), outcome: "exited with code 0".into(), ..AttemptRecord::default() };
    let upload = ResultUpload { worker_id: worker, manifest: vec![entry], record };
    app.client.seal_result(job.id, job.attempt, &upload).await.unwrap().path
}

async fn finish(app: &TestApp, worker: WorkerId, job: &ClaimedJob) {
    let report = ReportRequest { worker_id: worker, attempt: job.attempt, outcome: Outcome::Exited { code: 0 } };
    app.client.report(job.id, &report).await.unwrap();
}

#[tokio::test]
async fn a_project_sweep_is_one_url_segment_and_gets_its_suffix_on_the_last_part() {
    let app = TestApp::spawn().await;
    assert_eq!(app.submit(&sweep_of("proj/s", 1)).await.name, "proj/s");
    assert_eq!(app.submit(&sweep_of("proj/s", 1)).await.name, "proj/s-2");
    let given = SubmitQuery { name: Some("proj/s".into()), ..SubmitQuery::default() };
    assert_eq!(app.client.submit("command: 'true'\n", &given).await.unwrap().name, "proj/s-3", "a given name too");

    // Encoded, the name is one segment that the server decodes; unencoded, it is no route.
    for (path, status) in [("proj%2Fs", 200), ("proj%2fs-2", 200), ("proj%2Fs/summary", 200), ("proj/s", 404)] {
        let response = reqwest::get(format!("{}/api/sweeps/{path}", app.url)).await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{path}");
        if path == "proj%2Fs" {
            let detail: serde_json::Value = response.json().await.unwrap();
            assert_eq!((detail["name"].as_str(), detail["counts"]["queued"].as_u64()), (Some("proj/s"), Some(1)));
        }
    }

    // The typed client encodes it in every route that names a sweep.
    let sweep = app.client.sweep("proj/s").await.unwrap();
    assert_eq!((sweep.info.name.as_str(), sweep.info.counts.total()), ("proj/s", 1));
    let jobs = app.client.jobs(&JobQuery { sweep: Some("proj/s-2".into()), ..JobQuery::default() }).await.unwrap();
    assert_eq!((jobs.total, jobs.jobs[0].sweep.as_str()), (1, "proj/s-2"));
    assert_eq!(app.client.summary("proj/s", None).await.unwrap().rows.len(), 1);
    assert!(!app.client.resume_sweep("proj/s").await.unwrap().resumed);
    assert_eq!(app.client.cancel_sweep("proj/s-3").await.unwrap().cancelled, 1);
    assert_eq!(app.client.sweep("proj/s-3").await.unwrap().info.counts.cancelled, 1);
    assert!(app.client.retry_sweep("proj/s-3").await.unwrap().retried.is_empty(), "nothing failed");
    assert_eq!(app.client.sweep("proj/nope").await.unwrap_err().status(), Some(404));

    // Names that are not one or two plain parts are refused, and nothing is stored.
    for bad in ["proj/s/t", "/s", "proj/", "proj/../s", "proj/.s"] {
        let error = app.client.submit(&sweep_of(bad, 1), &SubmitQuery::default()).await.unwrap_err();
        assert_eq!(error.status(), Some(400), "{bad}: {error}");
    }
    assert_eq!(app.client.sweeps().await.unwrap().len(), 3);
}

#[tokio::test]
async fn a_project_sweep_keeps_its_logs_and_results_apart_from_a_sweep_named_like_its_project() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("proj/s", 1)).await;
    app.submit(&sweep_of("proj", 1)).await;
    // A sweep whose last part is an index of `proj`'s: nested directories would mix the two.
    app.submit(&sweep_of("proj/0", 1)).await;
    let worker = app.register("names-w", 3).await;
    let jobs = app.claim(worker, 3).await;
    let names: Vec<&str> = jobs.iter().map(|job| job.sweep.as_str()).collect();
    assert_eq!(names, ["proj/s", "proj", "proj/0"]);

    let at = |job: &ClaimedJob, offset| LogAppend { worker_id: worker, attempt: job.attempt, offset };
    app.client.append_log(jobs[0].id, &at(&jobs[0], 0), b"epoch 1\n".to_vec()).await.unwrap();
    let mut paths = Vec::new();
    for job in &jobs {
        paths.push(seal_a_file(&app, worker, job).await);
        finish(&app, worker, job).await;
    }
    assert_eq!(paths, ["results/proj+s/0/v1", "results/proj/0/v1", "results/proj+0/0/v1"]);
    let listed = app.client.results(jobs[0].id).await.unwrap();
    assert_eq!((listed.len(), listed[0].path.as_str()), (1, "results/proj+s/0/v1"));
    assert_eq!(std::fs::read(app.config.data_dir.join(&paths[0]).join("out.txt")).unwrap(), b"proj/s");
    let log = app.client.log(jobs[0].id, &LogQuery { attempt: None, offset: 0, wait_ms: 0 }).await.unwrap();
    assert_eq!((log.text.as_str(), log.finished), ("epoch 1\n", true));
    let sweep = app.client.sweep("proj/s").await.unwrap();
    assert_eq!(sweep.info.counts.succeeded, 1);

    // Removing `proj` takes `results/proj/` and nothing of the project's sweeps.
    assert_eq!(app.client.delete_sweep("proj").await.unwrap().result_versions, 1);
    assert!(!app.config.data_dir.join("results/proj").exists());
    for kept in [&paths[0], &paths[2]] {
        assert!(app.config.data_dir.join(kept).join("out.txt").is_file(), "{kept} went with `proj`");
    }
    let removed = app.client.delete_sweep("proj/s").await.unwrap();
    assert_eq!((removed.name.as_str(), removed.result_versions), ("proj/s", 1));
    assert!(!app.config.data_dir.join("results/proj+s").exists());
    let left: Vec<String> = std::fs::read_dir(app.config.data_dir.join("results"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with(".staging"))
        .collect();
    assert_eq!(left, ["proj+0"], "nothing set aside is left behind");
    assert_eq!(app.client.job(jobs[2].id).await.unwrap().status, JobStatus::Succeeded);
}
