//! Unchanged training scripts in adaptive sweeps: a script that reports only through
//! `wandb.log` (app's built-in module, and the real `wandb` package), only through
//! TensorBoard's `SummaryWriter`, or only through Lightning's `CSVLogger` runs as a bayes sweep
//! with hyperband, and its leaderboard and rung decisions use those metrics. Real server and
//! worker processes; the real packages come from `.venv-torch` (scripts/setup-torch.sh).

use shared::api::Job;
use shared::job::JobStatus;
use std::path::{Path, PathBuf};
use std::time::Duration;
use testkit::{wait_until, ServerProcess, WorkerProcess};

const LONG: Duration = Duration::from_secs(240);

/// The interpreter with torch, wandb, tensorboard and lightning installed.
fn venv_python() -> PathBuf {
    let python = testkit::repo(".venv-torch/bin/python");
    assert!(python.exists(), "{} is missing: run scripts/setup-torch.sh --full", python.display());
    python
}

/// Every run reports `10 (x - 0.3)^2 + 1/step` for ten steps, 0.3 s apart: runs far from 0.3
/// are behind at every rung, and a rung's decision has seconds to arrive.
fn sweep(name: &str, metric: &str, command: &str, run_cap: u64) -> String {
    format!(
        r#"name: {name}
method: bayes
seed: 5
run_cap: {run_cap}
metric: {{name: "{metric}", goal: minimize}}
early_terminate: {{type: hyperband, min_iter: 2, eta: 2}}
parameters:
  x: {{min: -1.0, max: 1.0}}
command: {command}
"#
    )
}

fn script(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

/// Runs `yaml` to its end on a worker that runs one job at a time and has no W&B credentials
/// (an empty home); checks that the metric arrived from every run, ranked the leaderboard and
/// stopped a run at a rung; returns the jobs.
async fn run_adaptive(name: &str, metric: &str, yaml: &str, run_cap: usize) -> (ServerProcess, Vec<Job>) {
    let server = ServerProcess::start();
    let home = tempfile::tempdir().unwrap();
    let home_path = home.path().to_string_lossy().into_owned();
    let worker = WorkerProcess::start_with_env_args(
        &server.url,
        "box",
        &[("HOME", home_path.as_str()), ("WANDB_API_KEY", ""), ("NETRC", "/nonexistent")],
        &["--max-jobs", "1"],
    );
    server.submit(yaml).await;
    let jobs = wait_until(&format!("{run_cap} runs of {name} finished"), LONG, || async {
        let jobs = server.jobs_of(name).await;
        (jobs.len() >= run_cap && jobs.iter().all(|job| job.status.is_terminal())).then_some(jobs)
    })
    .await;
    for job in &jobs {
        let log = server.client().log(job.id, &Default::default()).await.map(|chunk| chunk.text).unwrap_or_default();
        assert!(
            matches!(job.status, JobStatus::Succeeded | JobStatus::Cancelled),
            "job {} {:?}: {log}\nworker: {}",
            job.id,
            job.status,
            worker.log()
        );
        assert!(job.metrics.contains_key(metric), "job {} reported {metric}: {:?}\n{log}", job.id, job.metrics);
        assert!(!log.contains("capture is off"), "{log}");
    }
    let stopped: Vec<&Job> = jobs.iter().filter(|job| job.stopped_early.is_some()).collect();
    assert!(!stopped.is_empty(), "hyperband stopped a run at a rung: {jobs:#?}");
    for job in &stopped {
        assert!(job.reason.as_deref().unwrap_or_default().starts_with("stopped early: at step"), "{job:?}");
    }
    let detail = server.client().sweep(name).await.unwrap();
    assert_eq!(detail.metric_missing, None);
    let notes = detail.search.unwrap().notes;
    assert!(notes.iter().all(|note| !note.contains(metric)), "the model saw the metric: {notes:?}");
    let board = server.client().summary(name, None).await.unwrap();
    let ranked: Vec<f64> = board.rows.iter().filter(|row| row.rank.is_some()).filter_map(|row| row.score).collect();
    assert!(!ranked.is_empty() && ranked.windows(2).all(|pair| pair[0] <= pair[1]), "ranked by {metric}: {ranked:?}");
    (server, jobs)
}

const WANDB_SCRIPT: &str = r#"
import time
import wandb
print("wandb", wandb.__version__, flush=True)
run = wandb.init(project="capture", config={"x": 123.0, "unused": 1})
x = wandb.config.x
assert wandb.config.unused == 1
for step in range(1, 11):
    wandb.log({"loss": 10 * (x - 0.3) ** 2 + 1 / step, "media": "not a number"})
    time.sleep(0.3)
wandb.finish()
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_that_only_calls_wandb_log_drives_bayes_and_hyperband_without_wandb_installed() {
    let scripts = tempfile::tempdir().unwrap();
    let has_wandb = std::process::Command::new("python3").args(["-c", "import wandb"]).output().unwrap();
    assert!(!has_wandb.status.success(), "this test needs a python3 without wandb");
    let command = format!("python3 {}", script(scripts.path(), "train.py", WANDB_SCRIPT));
    let yaml = sweep("builtin-wandb", "loss", &command, 6);
    let (server, jobs) = run_adaptive("builtin-wandb", "loss", &yaml, 6).await;
    let log = server.client().log(jobs[0].id, &Default::default()).await.unwrap().text;
    assert!(log.contains("wandb 0.0.0+app"), "app's own module ran: {log}");
    // wandb.config held the run's x, not the script's default.
    let x = jobs[0].params["x"].as_f64().unwrap();
    let first = jobs[0].metrics["loss"].min;
    assert!(first >= 10.0 * (x - 0.3f64).powi(2) && first < 10.0 * (x - 0.3f64).powi(2) + 1.0, "{first} for x = {x}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_that_only_calls_wandb_log_drives_bayes_and_hyperband_with_the_real_wandb_offline() {
    let scripts = tempfile::tempdir().unwrap();
    let command = format!("{} {}", venv_python().display(), script(scripts.path(), "train.py", WANDB_SCRIPT));
    let yaml = sweep("real-wandb", "loss", &command, 4);
    let (server, jobs) = run_adaptive("real-wandb", "loss", &yaml, 4).await;
    let log = server.client().log(jobs[0].id, &Default::default()).await.unwrap().text;
    assert!(!log.contains("0.0.0+app"), "the real package ran: {log}");
    assert!(log.to_lowercase().contains("offline"), "no credentials: W&B ran offline: {log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_that_only_uses_summary_writer_drives_bayes_and_hyperband() {
    let scripts = tempfile::tempdir().unwrap();
    let text = r#"
import os, time
from torch.utils.tensorboard import SummaryWriter
x = float(os.environ["APP_PARAM_X"])
writer = SummaryWriter()
for step in range(1, 11):
    writer.add_scalar("val/loss", 10 * (x - 0.3) ** 2 + 1 / step, step)
    writer.flush()
    time.sleep(0.3)
writer.close()
"#;
    let command = format!("{} {}", venv_python().display(), script(scripts.path(), "train.py", text));
    let yaml = sweep("tensorboard", "val/loss", &command, 5);
    let (_server, jobs) = run_adaptive("tensorboard", "val/loss", &yaml, 5).await;
    let finished = jobs.iter().find(|job| job.status == JobStatus::Succeeded).expect("a run trained to its end");
    assert_eq!(finished.metrics["val/loss"].step, Some(10), "tags keep their names and steps");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_that_only_uses_lightning_s_csv_logger_drives_bayes_and_hyperband() {
    let scripts = tempfile::tempdir().unwrap();
    let text = r#"
import os, time, warnings
import torch
import lightning as L
from lightning.pytorch.loggers import CSVLogger
warnings.filterwarnings("ignore")
x = float(os.environ["APP_PARAM_X"])

class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
    def training_step(self, batch, index):
        return ((self.w - x) ** 2).sum()
    def validation_step(self, batch, index):
        self.log("val_loss", 10 * (x - 0.3) ** 2 + 1 / (self.current_epoch + 1))
    def on_validation_epoch_end(self):
        time.sleep(0.3)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(4, 1)), batch_size=2)
trainer = L.Trainer(max_epochs=10, logger=CSVLogger("logs", flush_logs_every_n_steps=1), accelerator="cpu",
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    num_sanity_val_steps=0, log_every_n_steps=1)
trainer.fit(Model(), data, data)
"#;
    let command = format!("{} {}", venv_python().display(), script(scripts.path(), "train.py", text));
    let yaml = sweep("lightning", "val_loss", &command, 5);
    run_adaptive("lightning", "val_loss", &yaml, 5).await;
}

/// A script that only prints, with `metrics_regex:`; a pattern that does not compile is
/// refused at submit time, naming it; a job that writes 200,000 points at once is thinned to
/// the documented budget, keeps its latest value, and the server keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn printed_lines_become_metrics_bad_patterns_are_refused_and_a_flood_is_bounded() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "box", &["--max-jobs", "2"]);
    let refused =
        server.client().submit("name: bad\ncommand: 'true'\nmetrics_regex: '(unclosed'\n", &Default::default()).await;
    let said = refused.unwrap_err().to_string();
    assert!(said.contains("metrics_regex") && said.contains("(unclosed"), "{said}");

    let printing = r#"name: printing
metric: {name: val_loss, goal: minimize}
metrics_regex: 'epoch (?P<step>\d+) .*val_loss=(?P<val_loss>[0-9.e+-]+)'
command: "for e in 1 2 3; do echo \"epoch $e train_loss=9 val_loss=0.$e\"; done"
grid: {i: [1]}
"#;
    server.submit(printing).await;
    let flood = r#"name: flood
command: >-
  python3 -c 'import os; f = open(os.environ["APP_METRICS_FILE"], "w");
  [f.write("{\"step\": %d, \"loss\": %d}\n" % (i, i)) for i in range(200000)]'
grid: {i: [1]}
"#;
    server.submit(flood).await;
    let done = |sweep: &'static str| {
        let server = &server;
        async move {
            wait_until(&format!("{sweep} finished"), LONG, || async {
                let jobs = server.jobs_of(sweep).await;
                jobs.first().filter(|job| job.status.is_terminal()).cloned()
            })
            .await
        }
    };
    let printed = done("printing").await;
    assert_eq!(printed.status, JobStatus::Succeeded);
    let val_loss = printed.metrics["val_loss"];
    assert_eq!((val_loss.last, val_loss.step, val_loss.count), (0.3, Some(3), 3), "{val_loss:?}");
    let flooded = done("flood").await;
    let loss = flooded.metrics["loss"];
    assert_eq!((loss.last, loss.step), (199_999.0, Some(199_999)), "the latest value is kept");
    // The budget: a burst of 20,000, then 1,000 a second for as long as the job ran (a loaded
    // machine makes the job slower, and the budget larger with it).
    let ran_ms = flooded.finished_at.unwrap_or_default() - flooded.started_at.unwrap_or_default();
    let budget = 20_000 + (ran_ms.max(0) as u64 + 2_000);
    assert!(loss.count < 200_000 && loss.count <= budget, "thinned to the budget {budget}: {} points", loss.count);
    let log = server.client().log(flooded.id, &Default::default()).await.unwrap().text;
    assert!(log.contains("faster than 1000 points a second"), "{log}");
}
