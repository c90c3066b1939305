//! End-to-end test of the quick start's project (`examples/quickstart`): submitted from inside a
//! copy of it, as `scripts/quickstart.sh` does, its code is shipped to a real worker, every run
//! trains, its per-epoch metrics rank it on the leaderboard, its model is stored as a result,
//! and the job records the snapshot it ran.

use shared::job::JobStatus;
use std::path::Path;
use testkit::{app, repo, ServerProcess, WorkerProcess};

/// The project's files, as a newcomer would have them (no `out/` of a run by hand).
fn copy_project(into: &Path) {
    std::fs::create_dir_all(into).unwrap();
    for name in ["train.py", "sweep.yaml", "README.md", ".gitignore"] {
        std::fs::copy(repo("examples/quickstart").join(name), into.join(name)).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstart_project_runs_from_its_own_directory_with_its_code_shipped() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "laptop", &["--max-jobs", "2"]);
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("quickstart");
    copy_project(&project);

    let output = app()
        .current_dir(&project)
        .args(["submit", "sweep.yaml", "--wait", "--url", &server.url])
        .env_remove("COLUMNS")
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{said}");
    assert!(said.contains("code: 4 files") && said.contains("uploaded"), "the project is shipped: {said}");
    assert!(said.contains("submitted sweep moons"), "{said}");

    let jobs = server.jobs_of("moons").await;
    assert_eq!(jobs.len(), 6, "a 3 x 2 grid");
    for job in &jobs {
        assert_eq!(job.status, JobStatus::Succeeded, "job {} ({:?})", job.id, job.reason);
    }

    let board = server.client().leaderboard("moons", None).await.unwrap();
    assert_eq!(board.summary.rows.len(), 6);
    let scores: Vec<f64> = board.summary.rows.iter().map(|row| row.score.expect("every run has val_loss")).collect();
    assert!(scores.windows(2).all(|pair| pair[0] <= pair[1]), "ranked by val_loss, lowest first: {scores:?}");
    for row in &board.summary.rows {
        let loss = &row.metrics["val_loss"];
        assert_eq!((loss.count, loss.step), (30, Some(30)), "one point per epoch: {row:?}");
        assert!(row.metrics.contains_key("val_accuracy") && row.metrics.contains_key("train_loss"), "{row:?}");
    }
    assert!(
        board.summary.rows[0].metrics["val_accuracy"].last > 0.8,
        "the best run learned the two moons: {:?}",
        board.summary.rows[0]
    );

    let best = board.summary.rows[0].job_id;
    let version = server.client().results(best).await.unwrap().pop().expect("a result version");
    let files: Vec<&str> = version.files.iter().map(|file| file.path.as_str()).collect();
    assert!(files.contains(&"model.json") && files.contains(&"history.json"), "{files:?}");
    let model = dir.path().join("model.json");
    server.client().download_file(best, version.attempt, "model.json", &model).await.unwrap();
    let model: serde_json::Value = serde_json::from_slice(&std::fs::read(&model).unwrap()).unwrap();
    assert!(model["model"]["w1"].is_array() && model["config"]["epochs"] == 30, "{model}");

    let code = version.record.code.clone().expect("the record names the snapshot it ran");
    assert!(archive::is_digest(&code.digest), "{code:?}");
    assert_eq!((code.dir.as_str(), code.commit.as_deref()), ("", None), "outside git, started at the root");
    assert!(server.data_dir().join("code").join(format!("{}.tar.zst", code.digest)).is_file());
    let workspace = server.client().sweep_workspace("moons").await.unwrap();
    assert_eq!(workspace.code.map(|code| code.digest), Some(code.digest));
}
