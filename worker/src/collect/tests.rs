use super::*;
use std::collections::HashSet;

struct Attempt {
    _dir: tempfile::TempDir,
    cwd: PathBuf,
    stream: PathBuf,
    job_file: PathBuf,
    capture_file: PathBuf,
    log: PathBuf,
}

fn attempt() -> Attempt {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().join("work");
    std::fs::create_dir_all(&cwd).unwrap();
    let (stream, job_file, log) =
        (dir.path().join("stream"), dir.path().join("metrics.jsonl"), dir.path().join("job.log"));
    let capture_file = dir.path().join("capture.jsonl");
    for file in [&job_file, &capture_file, &log] {
        std::fs::write(file, "").unwrap();
    }
    Attempt { cwd, stream, job_file, capture_file, log, _dir: dir }
}

impl Attempt {
    fn collector(&self, sources: Sources) -> Collector {
        let mut collector = Collector::new(
            self.stream.clone(),
            (self.job_file.clone(), self.capture_file.clone()),
            self.log.clone(),
            sources,
        );
        collector.look_before();
        collector
    }

    fn capture(&self) -> Sources {
        Sources { capture: true, roots: vec![self.cwd.clone()], ..Sources::default() }
    }

    /// The stream's points as `(step, name, value)`.
    fn points(&self) -> Vec<(Option<i64>, String, f64)> {
        let text = std::fs::read_to_string(&self.stream).unwrap_or_default();
        text.lines()
            .flat_map(|line| crate::shipper::parse_line(line.as_bytes()).0)
            .map(|point| (point.step, point.name, point.value))
            .collect()
    }

    fn write(&self, relative: &str, text: &str) {
        let path = self.cwd.join(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn append(path: &Path, text: &str) {
        let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        file.write_all(text.as_bytes()).unwrap();
    }
}

#[test]
fn the_job_s_lines_are_copied_whole_and_a_last_one_counts_at_the_end() {
    let at = attempt();
    let mut collector = at.collector(Sources::default());
    Attempt::append(&at.job_file, "{\"step\": 1, \"loss\": 0.5}\n{\"step\": 2, \"lo");
    collector.collect(false);
    assert_eq!(at.points(), [(Some(1), "loss".to_string(), 0.5)]);
    Attempt::append(&at.job_file, "ss\": 0.25}");
    collector.collect(false);
    assert_eq!(at.points().len(), 1, "a line being written waits");
    collector.collect(true);
    assert_eq!(at.points().last().unwrap(), &(Some(2), "loss".to_string(), 0.25));
    assert!(std::fs::read_to_string(&at.stream).unwrap().ends_with('\n'));
}

#[test]
fn loggers_files_are_read_as_they_grow_but_not_those_there_before() {
    let at = attempt();
    at.write("lightning_logs/version_0/metrics.csv", "epoch,step,val_loss\n0,9,0.9\n");
    let mut collector = at.collector(at.capture());
    // Written by the job:
    at.write("lightning_logs/version_1/metrics.csv", "epoch,step,val_loss\n0,9,0.5\n");
    at.write("mlruns/0/abc/metrics/val/acc", "1700000000000 0.75 3\n");
    at.write(
        "out/checkpoint-10/trainer_state.json",
        r#"{"log_history": [{"loss": 2.0, "step": 5}, {"eval_loss": 1.5, "step": 10}]}"#,
    );
    collector.collect(false);
    let mut got = at.points();
    got.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        got,
        [
            (Some(9), "epoch".to_string(), 0.0),
            (Some(10), "eval_loss".to_string(), 1.5),
            (Some(5), "loss".to_string(), 2.0),
            (Some(3), "val/acc".to_string(), 0.75),
            (Some(9), "val_loss".to_string(), 0.5),
        ]
    );
    // A later checkpoint repeats the history: only the new row comes.
    at.write(
        "out/checkpoint-20/trainer_state.json",
        r#"{"log_history": [{"loss": 2.0, "step": 5}, {"eval_loss": 1.5, "step": 10}, {"eval_loss": 1.25, "step": 20}]}"#,
    );
    Attempt::append(&at.cwd.join("mlruns/0/abc/metrics/val/acc"), "1700000000100 0.8 4\n");
    collector.collect(true);
    let got = at.points();
    assert_eq!(got.len(), 7, "{got:?}");
    assert!(got.contains(&(Some(20), "eval_loss".to_string(), 1.25)));
    assert!(got.contains(&(Some(4), "val/acc".to_string(), 0.8)));
}

#[test]
fn capture_none_reads_only_the_job_s_file_and_patterns_read_its_printed_lines() {
    let at = attempt();
    let pattern = MetricPattern::new(r"epoch (?P<step>\d+) val_loss=(?P<val_loss>\S+)").unwrap();
    let sources =
        Sources { capture: false, roots: vec![at.cwd.clone()], patterns: vec![pattern], ..Sources::default() };
    let mut collector = at.collector(sources);
    at.write("lightning_logs/version_0/metrics.csv", "epoch,step,val_loss\n0,9,0.9\n");
    Attempt::append(&at.log, "epoch 1 val_loss=0.5\n[app] epoch 2 val_loss=0.1\nepoch 3 val_loss=");
    collector.collect(false);
    assert_eq!(at.points(), [(Some(1), "val_loss".to_string(), 0.5)], "no CSV, no note of ours, no half line");
    Attempt::append(&at.log, "0.25\n");
    collector.collect(true);
    assert_eq!(at.points().last().unwrap(), &(Some(3), "val_loss".to_string(), 0.25));
}

#[test]
fn a_tensorboard_logdir_outside_the_directory_is_read_and_hidden_or_tool_dirs_are_not() {
    let at = attempt();
    let elsewhere = tempfile::tempdir().unwrap();
    let output = at._dir.path().join("output");
    let relative = |name: &str| (name == "TENSORBOARD_LOGDIR").then(|| "./../tb".to_string());
    let sources = Sources::of(&shared::api::Workspace::default(), (&at.cwd, &output), None, relative);
    assert_eq!(sources.roots[0], at._dir.path().join("tb"), "`..` taken out as written");
    let logdir = |name: &str| (name == "TENSORBOARD_LOGDIR").then(|| elsewhere.path().display().to_string());
    let sources = Sources::of(&shared::api::Workspace::default(), (&at.cwd, &output), None, logdir);
    assert_eq!(sources.roots, [elsewhere.path().to_path_buf(), output, at.cwd.clone()]);
    let mut collector = at.collector(sources);
    std::fs::write(elsewhere.path().join("metrics.csv"), "step,acc\n1,0.5\n").unwrap();
    at.write(".cache/metrics.csv", "step,hidden\n1,1\n");
    at.write("wandb/run-1/metrics.csv", "step,wandb\n1,1\n");
    collector.collect(true);
    assert_eq!(at.points(), [(Some(1), "acc".to_string(), 0.5)]);
}

#[test]
fn a_huge_tree_is_walked_only_so_far_and_the_log_says_so_once() {
    let at = attempt();
    let mut collector = at.collector(at.capture());
    for dir in 0..21 {
        let dir = at.cwd.join(format!("d{dir}"));
        std::fs::create_dir_all(&dir).unwrap();
        for file in 0..1_000 {
            std::fs::write(dir.join(file.to_string()), "").unwrap();
        }
    }
    collector.collect(true);
    collector.collect(true);
    let log = std::fs::read_to_string(&at.log).unwrap();
    assert_eq!(log.matches("more than 20000 files").count(), 1, "{log}");
    assert!(!collector.light(false), "a big tree is walked on a blocking thread");
}

#[test]
fn points_share_a_line_per_step_and_a_metric_called_step_keeps_its_value() {
    let point = |step, name: &str, value| MetricPoint { step, name: name.into(), value };
    let mut out = Vec::new();
    write_points(
        &[point(Some(1), "a", 1.0), point(Some(1), "b", 2.0), point(Some(1), "a", 3.0), point(None, "step", 4.0)],
        &mut out,
    );
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text, "{\"a\":1.0,\"b\":2.0,\"step\":1}\n{\"a\":3.0,\"step\":1}\n{\"step_\":4.0}\n");
}

fn fixture() -> Vec<u8> {
    std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tfevents/scalars.tfevents")).unwrap()
}

#[test]
fn event_files_are_read_as_written_and_damage_is_said_once_without_losing_what_came_before() {
    let at = attempt();
    let mut collector = at.collector(at.capture());
    let bytes = fixture();
    // A torn copy first: what is whole is read, the rest waits for its writer.
    at.write("runs/a/events.out.tfevents.1.host", "");
    std::fs::write(at.cwd.join("runs/a/events.out.tfevents.1.host"), &bytes[..bytes.len() / 2]).unwrap();
    collector.collect(false);
    let half = at.points().len();
    assert!(half > 0);
    std::fs::write(at.cwd.join("runs/a/events.out.tfevents.1.host"), &bytes).unwrap();
    collector.collect(false);
    let whole = at.points();
    assert!(whole.len() > half && whole.iter().any(|point| point.1 == "val/loss"), "{whole:?}");
    // A damaged one: a flipped byte late in the file.
    let mut damaged = bytes.clone();
    let at_byte = damaged.len() - 10;
    damaged[at_byte] ^= 0xff;
    std::fs::create_dir_all(at.cwd.join("runs/b")).unwrap();
    std::fs::write(at.cwd.join("runs/b/events.out.tfevents.2.host"), &damaged).unwrap();
    // A 2 GB file of nothing (sparse): refused at its first record, never read whole.
    let huge = std::fs::File::create(at.cwd.join("runs/b/events.out.tfevents.3.host")).unwrap();
    huge.set_len(2 << 30).unwrap();
    collector.collect(false);
    collector.collect(true);
    let log = std::fs::read_to_string(&at.log).unwrap();
    assert_eq!(log.matches("events.out.tfevents.2.host").count(), 1, "{log}");
    assert_eq!(log.matches("events.out.tfevents.3.host").count(), 1, "{log}");
    assert!(log.contains("crc"), "{log}");
    assert!(at.points().len() > whole.len(), "the damaged file's records before the damage count");
}

#[test]
fn keras_s_train_and_validation_runs_keep_apart_and_add_scalars_series_are_named_by_directory() {
    let at = attempt();
    let mut collector = at.collector(at.capture());
    for dir in ["logs/train", "logs/validation", "runs/x", "runs/x/loss_val"] {
        std::fs::create_dir_all(at.cwd.join(dir)).unwrap();
        std::fs::write(at.cwd.join(dir).join("events.out.tfevents.1.h"), fixture()).unwrap();
    }
    collector.collect(true);
    let names: HashSet<String> = at.points().into_iter().map(|point| point.1).collect();
    for name in ["train/val/loss", "validation/val/loss", "val/loss", "loss_val/val/loss"] {
        assert!(names.contains(name), "{name} in {names:?}");
    }
}

#[test]
fn the_final_pass_reads_a_big_file_to_its_end_and_an_endless_line_never_blocks_it() {
    let at = attempt();
    let mut collector = at.collector(Sources::default());
    let line = "{\"step\": 1, \"loss\": 0.5}\n";
    let mut text = line.repeat((10 << 20) / line.len());
    // A line of 5 MiB with no newline in it, then a last good line.
    text.push_str(&"x".repeat(5 << 20));
    text.push_str("\n{\"step\": 2, \"loss\": 0.25}");
    std::fs::write(&at.job_file, &text).unwrap();
    collector.collect(false);
    let first = std::fs::metadata(&at.stream).unwrap().len();
    assert!(first <= 4 << 20, "one chunk while the job runs: {first}");
    collector.collect(true);
    let points = at.points();
    assert_eq!(points.len(), (10 << 20) / line.len() + 1);
    assert_eq!(points.last().unwrap(), &(Some(2), "loss".to_string(), 0.25));
}

#[test]
fn a_symlink_or_fifo_named_like_a_logger_s_file_is_never_read_through() {
    let at = attempt();
    let mut collector = at.collector(at.capture());
    let secret = at._dir.path().join("secret.csv");
    std::fs::write(&secret, "step,token\n1,424242\n").unwrap();
    std::fs::create_dir_all(at.cwd.join("a")).unwrap();
    std::os::unix::fs::symlink(&secret, at.cwd.join("a/metrics.csv")).unwrap();
    nix::unistd::mkfifo(&at.cwd.join("trainer_state.json"), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    collector.collect(false);
    // Found as a plain file, then swapped for a symlink before it is read.
    at.write("b/metrics.csv", "step,x\n");
    collector.collect(false);
    std::fs::remove_file(at.cwd.join("b/metrics.csv")).unwrap();
    std::os::unix::fs::symlink(&secret, at.cwd.join("b/metrics.csv")).unwrap();
    collector.collect(true);
    assert!(at.points().is_empty(), "{:?}", at.points());
}

#[test]
fn a_file_there_before_that_the_job_rewrites_is_its_own_and_a_name_keeps_its_first_source() {
    let at = attempt();
    let state = |rows: &str| format!(r#"{{"log_history": [{rows}]}}"#);
    at.write("out/checkpoint-10/trainer_state.json", &state(r#"{"eval_loss": 9.0, "step": 10}"#));
    let mut collector = at.collector(at.capture());
    collector.collect(false);
    assert!(at.points().is_empty(), "an earlier run's file");
    // This run saves at the same path.
    at.write("out/checkpoint-10/trainer_state.json", &state(r#"{"eval_loss": 1.5, "loss": 2.0, "step": 10}"#));
    // W&B's mirror reports `loss` first; the state file's `loss` is left out.
    Attempt::append(&at.capture_file, "{\"step\": 0, \"loss\": 3.0}\n");
    collector.collect(true);
    assert_eq!(at.points(), [(Some(0), "loss".to_string(), 3.0), (Some(10), "eval_loss".to_string(), 1.5)]);
}

#[test]
fn a_file_that_is_not_what_its_name_says_is_said_once_and_left() {
    let at = attempt();
    let mut collector = at.collector(at.capture());
    at.write("metrics.csv", &"x".repeat(70_000));
    for _ in 0..3 {
        collector.collect(false);
    }
    collector.collect(true);
    let log = std::fs::read_to_string(&at.log).unwrap();
    assert_eq!(log.matches("64 KiB").count(), 1, "{log}");
}
