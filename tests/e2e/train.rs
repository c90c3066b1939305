//! End-to-end tests of `app train`: a `train:` sweep through a real server and worker, the
//! one-line errors of bad input, and data parallelism over real rank processes (two Gloo ranks
//! against one process, and a rank killed mid-run). Built with `--features torch`; without it,
//! the verbs explain how to get the trainer.

#[cfg(not(feature = "torch"))]
#[test]
fn without_the_feature_train_and_bench_say_how_to_enable_it() {
    use testkit::app;
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
    use shared::api::{JobQuery, LogQuery, SubmitQuery};
    use shared::job::JobStatus;
    use std::path::Path;
    use std::time::Duration;
    use testkit::{app, repo, wait_until, ServerProcess, WorkerProcess};

    /// Jobs run `sh -c "app train ..."` and find `app` on PATH: the binary under test comes
    /// first on the worker's PATH (its jobs inherit its environment). Set on the worker alone:
    /// under `cargo test` this process runs every end-to-end test at once.
    fn app_first_on_path() -> String {
        let bin = Path::new(env!("CARGO_BIN_EXE_app")).parent().unwrap();
        format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_four_job_train_sweep_runs_on_a_worker_and_ranks_by_val_loss() {
        let server = ServerProcess::start();
        let path = app_first_on_path();
        let _worker =
            WorkerProcess::start_with_env_args(&server.url, "trainer-box", &[("PATH", &path)], &["--max-jobs", "2"]);
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
        train_with_env(sets, &[])
    }

    fn train_with_env(sets: &[&str], env: &[(&str, &str)]) -> (bool, String) {
        let out = tempfile::tempdir().unwrap();
        let mut command = app();
        command.envs(env.iter().copied());
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
            (vec!["device=cuda".into()], "at device:", "CUDA unavailable: "),
            (
                vec!["device=cpu".into(), "ddp=2".into(), "model.batch_norm=true".into(), "batch_size=3".into()],
                "at batch_size:",
                "batch norm needs at least 2 rows",
            ),
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
        // torchrun's variables are checked too, naming the variable.
        let (ok, stderr) = train_with_env(&["device=cpu"], &[("RANK", "1")]);
        assert!(!ok && stderr.lines().count() == 1, "{stderr}");
        assert!(stderr.starts_with("error: at WORLD_SIZE: RANK is set"), "{stderr}");
        let (ok, stderr) = train_with_env(&["device=cpu", "ddp=3"], &[("WORLD_SIZE", "2")]);
        assert!(!ok && stderr.starts_with("error: at ddp: 3 rank(s) per machine"), "{stderr}");

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
        // What a worker gives a CPU job: an empty CUDA_VISIBLE_DEVICES, which `device: auto`
        // names as its reason for the CPU.
        let output = app()
            .args(["train", "--config"])
            .arg(repo("configs/train-mlp.yaml"))
            .args(["--set", "epochs=2", "--set", "data.samples=2048", "--out"])
            .arg(out.path().join("run"))
            .env("APP_METRICS_FILE", &metrics)
            .env("CUDA_VISIBLE_DEVICES", "")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
        assert!(stdout.contains("done: 2 epochs on CPU"), "{stdout}");
        assert!(
            stdout.starts_with("device CPU (CUDA unavailable: CUDA_VISIBLE_DEVICES is empty (a CPU job))"),
            "{stdout}"
        );
        assert_eq!(std::fs::read_to_string(&metrics).unwrap().lines().count(), 2);

        let output = app()
            .args(["bench", "--config"])
            .arg(repo("configs/train-mlp.yaml"))
            .args(["--batch-sizes", "64,1099511627776", "--amp", "off,bf16", "--steps", "2", "--warmup", "1", "--json"])
            // Some VMs report AMX but fault on it; oneDNN's bf16 would die with SIGILL there.
            .env("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        let statuses: Vec<&str> =
            report["rows"].as_array().unwrap().iter().map(|row| row["status"].as_str().unwrap()).collect();
        assert_eq!(statuses, vec!["ok", "oom", "ok", "oom"], "{report}");
        assert_eq!(report["recommended"]["batch_size"], 64);
    }

    /// Trains on the CPU with overrides into `out`; panics with the output on failure.
    fn train_into(out: &Path, sets: &[&str], env: &[(&str, &str)]) -> String {
        let mut command = app();
        command.args(["train", "--out"]).arg(out).env_remove("APP_METRICS_FILE").envs(env.iter().copied());
        for set in sets {
            command.args(["--set", set]);
        }
        let output = command.output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "{sets:?}: {stdout}{}", String::from_utf8_lossy(&output.stderr));
        stdout
    }

    const DDP_RUN: [&str; 8] = [
        "device=cpu",
        "data={samples: 1200, features: 12, classes: 3}",
        "model={hidden_dims: [32, 16]}",
        "optimizer={name: sgd, lr: 0.05, momentum: 0.9}",
        "batch_size=100",
        "epochs=2",
        "checkpoint_every=1",
        "seed=3",
    ];

    #[test]
    fn two_gloo_rank_processes_end_with_the_weights_of_one_process() {
        // 960 training rows in steps of 100: 20 steps over the two epochs. Each rank trains on
        // its half of every step's batch and the Reducer averages the gradients, which must give
        // what one process gets from the full batches.
        let dir = tempfile::tempdir().unwrap();
        let single = train_into(&dir.path().join("single"), &DDP_RUN, &[]);
        let mut sets = DDP_RUN.to_vec();
        sets.push("ddp=2");
        let ranks = train_into(&dir.path().join("ranks"), &sets, &[]);
        assert!(single.contains("done: 2 epochs on CPU, best"), "{single}");
        assert!(ranks.contains("done: 2 epochs on CPU x 2 ranks (Gloo), best"), "{ranks}");
        assert!(ranks.contains("2 ranks over Gloo (this is rank 0)"), "{ranks}");

        for epoch in ["model_epoch_001.pt", "model_epoch_002.pt"] {
            let one = trainer::torch::checkpoint::read(&dir.path().join("single").join(epoch)).unwrap();
            let two = trainer::torch::checkpoint::read(&dir.path().join("ranks").join(epoch)).unwrap();
            assert_eq!(one.len(), 6);
            for (name, weight) in &one {
                assert!(weight.allclose(&two[name], 1e-4, 1e-5, false), "{epoch} {name}: {weight} vs {}", two[name]);
            }
        }
        let history = |run: &str| -> Vec<serde_json::Value> {
            serde_json::from_str(&std::fs::read_to_string(dir.path().join(run).join("training_history.json")).unwrap())
                .unwrap()
        };
        for (one, two) in history("single").iter().zip(history("ranks")) {
            let (a, b) = (one["val_loss"].as_f64().unwrap(), two["val_loss"].as_f64().unwrap());
            assert!((a - b).abs() < 1e-4, "val_loss {a} vs {b}");
        }
    }

    /// SIGTERM to the whole group (a preemption) stops both Gloo ranks after the same epoch,
    /// saved for the next attempt, and the launcher exits with 143 as they do.
    #[test]
    fn sigterm_to_a_two_rank_run_saves_one_epoch_and_every_process_exits_with_143() {
        use std::os::unix::process::CommandExt;
        let (dir, checkpoints) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let metrics = dir.path().join("metrics.jsonl");
        let mut command = app();
        command.args(["train", "--out"]).arg(dir.path().join("out")).arg("--metrics-file").arg(&metrics);
        for set in DDP_RUN.iter().filter(|set| !set.starts_with("epochs=")).chain(&["ddp=2", "epochs=100000"]) {
            command.args(["--set", set]);
        }
        let child = command
            .env("APP_CHECKPOINT_DIR", checkpoints.path())
            .process_group(0)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while std::fs::read_to_string(&metrics).map_or(0, |text| text.lines().count()) < 2 {
            assert!(std::time::Instant::now() < deadline, "no epoch done in two minutes");
            std::thread::sleep(Duration::from_millis(20));
        }
        let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
        nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGTERM).unwrap();
        let output = child.wait_with_output().unwrap();
        let log = String::from_utf8_lossy(&output.stdout).to_string() + &String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(143), "{log}");
        let saved: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(checkpoints.path().join("last.json")).unwrap()).unwrap();
        let epoch = saved["epoch"].as_u64().unwrap();
        assert!(log.contains(&format!("stopped by SIGTERM after epoch {epoch}, which is saved")), "{log}");
        assert!(!log.contains("died"), "no rank counted as dead: {log}");
    }

    /// The pids of `parent`'s children.
    fn children(parent: u32) -> Vec<u32> {
        let tasks = std::fs::read_dir(format!("/proc/{parent}/task")).map(|dir| dir.flatten().collect::<Vec<_>>());
        tasks
            .unwrap_or_default()
            .iter()
            .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
            .flat_map(|text| text.split_whitespace().filter_map(|pid| pid.parse().ok()).collect::<Vec<u32>>())
            .collect()
    }

    fn rank_of(pid: u32) -> Option<String> {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        environ
            .split(|byte| *byte == 0)
            .filter_map(|entry| std::str::from_utf8(entry).ok())
            .find_map(|entry| entry.strip_prefix("RANK=").map(str::to_string))
    }

    #[test]
    fn a_killed_rank_stops_the_run_with_rank_1_died() {
        // A worker's two-rank job: WORLD_SIZE and MASTER_PORT set, no RANK. Once training runs,
        // rank 1 is killed; the launcher stops rank 0 and fails within seconds, naming rank 1.
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("training.log");
        // MASTER_PORT is a port found free a moment before; beside the PostgreSQL clusters
        // other tests start, it can be taken in between: a launcher that exits before training
        // starts is tried again on another port (at most three times, saying why each time).
        let mut early = Vec::new();
        let mut launcher = loop {
            assert!(early.len() < 3, "the launcher exited early three times:\n{}", early.join("\n---\n"));
            let port = testkit::free_port().to_string();
            let mut command = app();
            command
                .args(["train", "--out"])
                .arg(dir.path())
                .args(["--set", "device=cpu", "--set", "epochs=1000", "--set", "data={samples: 4096, features: 64}"])
                .args(["--set", "model={hidden_dims: [256, 256]}"])
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env_remove("APP_METRICS_FILE")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped());
            let mut launcher = command.spawn().unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            let started = loop {
                if std::fs::read_to_string(&log).is_ok_and(|text| text.contains("epoch 1 ")) {
                    break true;
                }
                assert!(std::time::Instant::now() < deadline, "training did not start");
                if launcher.try_wait().unwrap().is_some() {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(100));
            };
            if started {
                break launcher;
            }
            let mut said = String::new();
            std::io::Read::read_to_string(&mut launcher.stderr.take().unwrap(), &mut said).unwrap();
            early.push(format!("MASTER_PORT {port}: {said}"));
        };
        let ranks = children(launcher.id());
        assert_eq!(ranks.len(), 2, "two rank processes: {ranks:?}");
        let rank_one = *ranks.iter().find(|pid| rank_of(**pid).as_deref() == Some("1")).expect("rank 1");
        let killed = std::time::Instant::now();
        std::process::Command::new("kill").args(["-KILL", &rank_one.to_string()]).status().unwrap();

        let status = testkit::wait_exit(&mut launcher, Duration::from_secs(30));
        assert!(killed.elapsed() < Duration::from_secs(30));
        let mut stderr = String::new();
        std::io::Read::read_to_string(launcher.stderr.as_mut().unwrap(), &mut stderr).unwrap();
        assert!(!status.success());
        let last = stderr.lines().last().unwrap_or("");
        assert_eq!(last, "error: rank 1 died (killed by SIGKILL)", "{stderr}");
        for pid in ranks {
            assert!(!testkit::alive(pid), "rank process {pid} outlived the run");
        }
    }
}
