//! End-to-end tests of `app train`: a `train:` sweep through a real server and worker, and the
//! one-line errors of bad input. Built with `--features torch`; without it, the verbs explain
//! how to get the trainer.

mod common;

#[cfg(not(feature = "torch"))]
#[test]
fn without_the_feature_train_and_bench_say_how_to_enable_it() {
    use common::app;
    for verb in ["train", "bench"] {
        let output = app().arg(verb).output().unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains("scripts/setup-torch.sh") && stderr.contains("--features torch"), "{stderr}");
    }
}

#[cfg(feature = "torch")]
mod with_torch {
    use super::common::{app, repo, wait_until, ServerProcess, WorkerProcess};
    use shared::api::{JobQuery, LogQuery, SubmitQuery};
    use shared::job::JobStatus;
    use std::path::Path;
    use std::time::Duration;

    /// Jobs run `sh -c "app train ..."` and find `app` on PATH: put the binary under test first,
    /// for the worker this test process starts (its jobs inherit its environment).
    fn app_first_on_path() {
        let bin = Path::new(env!("CARGO_BIN_EXE_app")).parent().unwrap();
        let path = std::env::var("PATH").unwrap_or_default();
        if !path.starts_with(&*bin.to_string_lossy()) {
            std::env::set_var("PATH", format!("{}:{path}", bin.display()));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_four_job_train_sweep_runs_on_a_worker_and_ranks_by_val_loss() {
        app_first_on_path();
        let server = ServerProcess::start();
        let _worker = WorkerProcess::start(&server.url, "trainer-box", &["--max-jobs", "2"]);
        let client = server.client();
        let yaml = std::fs::read_to_string(repo("configs/train-sweep.yaml")).unwrap();
        let sweep = client.submit(&yaml, &SubmitQuery::default()).await.unwrap().name;
        let query = JobQuery { sweep: Some(sweep.clone()), ..JobQuery::default() };
        let jobs = wait_until("the train sweep finished", Duration::from_secs(300), || async {
            let jobs = client.jobs(&query).await.unwrap().jobs;
            jobs.iter().all(|job| job.status.is_terminal()).then_some(jobs)
        })
        .await;
        assert_eq!(jobs.len(), 4);
        for job in &jobs {
            if job.status != JobStatus::Succeeded {
                let log = client.log(job.id, &LogQuery::default()).await.map(|chunk| chunk.text).unwrap_or_default();
                panic!("job {} {:?}: {log}", job.id, job.status);
            }
        }

        let summary = client.summary(&sweep, None).await.unwrap();
        assert_eq!(summary.rows.len(), 4);
        let scores: Vec<f64> = summary.rows.iter().map(|row| row.score.expect("every run has a val_loss")).collect();
        assert!(scores.windows(2).all(|pair| pair[0] <= pair[1]), "ranked by val_loss: {scores:?}");
        assert_eq!(summary.rows[0].rank, Some(1));
        for row in &summary.rows {
            let val_loss = &row.metrics["val_loss"];
            assert_eq!(val_loss.count, 3, "one val_loss per epoch");
            assert_eq!(row.score, Some(val_loss.min));
            for metric in ["train_loss", "val_accuracy", "samples_per_s", "lr"] {
                assert!(row.metrics.contains_key(metric), "{metric} in {:?}", row.metrics.keys());
            }
        }
        // The larger learning rate learns this data in three epochs; the tiny one does not.
        let best_lr = summary.rows[0].params["optimizer.lr"].as_f64().unwrap();
        assert_eq!(best_lr, 0.01, "{:?}", summary.rows.iter().map(|row| (&row.params, row.score)).collect::<Vec<_>>());

        // The run's outputs were uploaded, with the resolved config the grid asked for.
        let job = summary.rows[0].job_id;
        let version = client.results(job).await.unwrap().pop().expect("a result version");
        let names: Vec<&str> = version.files.iter().map(|file| file.path.as_str()).collect();
        for file in ["model_best.pt", "config.json", "training_history.json", "training.log"] {
            assert!(names.contains(&file), "{file} in {names:?}");
        }
        let destination = tempfile::NamedTempFile::new().unwrap();
        client.download_file(job, version.attempt, "config.json", destination.path()).await.unwrap();
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(destination.path()).unwrap()).unwrap();
        assert_eq!(config["optimizer"]["lr"], 0.01);
        assert_eq!(config["model"]["hidden_dims"], summary.rows[0].params["model.hidden_dims"]);
    }

    /// Runs `app train` with overrides; returns (exit ok, stderr).
    fn train(sets: &[&str]) -> (bool, String) {
        let out = tempfile::tempdir().unwrap();
        let mut command = app();
        command.arg("train").arg("--out").arg(out.path()).env_remove("APP_METRICS_FILE");
        for set in sets {
            command.args(["--set", set]);
        }
        let output = command.output().unwrap();
        (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
    }

    #[test]
    fn bad_input_is_a_one_line_error_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("data.csv");
        std::fs::write(&csv, "a,b,label\n1,2,0\n3,NaN,1\n").unwrap();
        let csv_source = format!("data={{source: csv, path: {}}}", csv.display());
        let cases: Vec<(Vec<String>, &str, &str)> = vec![
            (vec!["data={source: csv, path: /nonexistent/data.csv}".into()], "at data.path:", "/nonexistent/data.csv"),
            (vec![csv_source.clone(), "data.label=target".into()], "at data.label:", "no column `target`"),
            (vec![csv_source, "device=cpu".into()], "at data.path:", "NaN in row 2, column `b`"),
            (vec!["batch_size=0".into()], "at batch_size:", "at least 1"),
            (vec!["model.name=transformer".into()], "at model.name:", "unknown variant `transformer`"),
            (vec!["optimizer.name=lion".into()], "at optimizer.name:", "unknown variant `lion`"),
            (vec!["amp=fp16".into(), "device=cpu".into()], "at amp:", "fp16 needs a CUDA device"),
            (vec!["epochs".into()], "at --set:", "expected key=value"),
        ];
        for (sets, key, detail) in cases {
            let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
            let (ok, stderr) = train(&sets);
            assert!(!ok, "{sets:?} should fail");
            assert_eq!(stderr.lines().count(), 1, "{sets:?}: {stderr}");
            assert!(stderr.starts_with(&format!("error: {key}")), "{sets:?}: {stderr}");
            assert!(stderr.contains(detail), "{sets:?}: {stderr}");
            assert!(!stderr.contains("panicked"), "{stderr}");
        }
        let output = app().args(["train", "--config", "/nonexistent/train.yaml"]).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && stderr.lines().count() == 1 && stderr.contains("/nonexistent/train.yaml"),
            "{stderr}"
        );
    }

    #[test]
    fn train_and_bench_on_the_sample_config() {
        let out = tempfile::tempdir().unwrap();
        let metrics = out.path().join("metrics.jsonl");
        let output = app()
            .args(["train", "--config"])
            .arg(repo("configs/train-mlp.yaml"))
            .args(["--set", "epochs=2", "--set", "data.samples=2048", "--out"])
            .arg(out.path().join("run"))
            .env("APP_METRICS_FILE", &metrics)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
        assert!(stdout.contains("done: 2 epochs on CPU"), "{stdout}");
        assert_eq!(std::fs::read_to_string(&metrics).unwrap().lines().count(), 2);

        let output = app()
            .args(["bench", "--config"])
            .arg(repo("configs/train-mlp.yaml"))
            .args(["--batch-sizes", "64,1099511627776", "--amp", "off,bf16", "--steps", "2", "--warmup", "1", "--json"])
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let statuses: Vec<&str> =
            report["rows"].as_array().unwrap().iter().map(|row| row["status"].as_str().unwrap()).collect();
        assert_eq!(statuses, vec!["ok", "oom", "ok", "oom"], "{report}");
        assert_eq!(report["recommended"]["batch_size"], 64);
    }
}
