//! Sweep files as users write them, in each of the three forms, and every way one is refused.

use std::time::{Duration, Instant};

use serde_json::json;
use shared::sweep::{ExpandOptions, Goal, JobSpec, Metric, Sweep, SweepError, SweepForm};

const NATIVE: &str = r#"
name: vaep-grid
command: python train.py --lr {lr} --batch_size {batch_size} --hidden {hidden_dims} --horizon {horizon}
resources: {gpus: 1, gpu_memory: 8GiB}
metric: {name: val_loss, goal: minimize}
grid:
  lr: [0.001, 0.0005, 0.0001]
  batch_size: [2048, 4096, 8192]
  hidden_dims: [[128, 64], [256, 128], [256, 128, 64], [512, 256, 128]]
  horizon: [10, 15, 20]
"#;

const CVLAB: &str = r#"
model: {name: resnet18, hidden_dims: [[64, 32], [128, 64]], dropout: [0.1]}
optimizer: {lr: [0.1, 0.01, 0.001], betas: !!python/tuple [0.9, 0.999]}
data: {root: ./data, size: "[224, 224]", tags: []}
device: [0, 1]
epochs: 10
"#;

const WANDB_RANDOM: &str = r#"
method: random
run_cap: 30
program: train.py
parameters:
  lr: {distribution: log_uniform_values, min: 1e-5, max: 1e-1}
  batch_size: {values: [32, 64, 128]}
  dropout: {distribution: uniform, min: 0.0, max: 0.5}
  epochs: {value: 10}
"#;

fn parse(yaml: &str) -> Result<Sweep, SweepError> {
    Sweep::parse(yaml, &ExpandOptions::default())
}

fn params(job: &JobSpec) -> serde_json::Value {
    serde_json::from_str(&job.params).expect("params are a JSON object")
}

/// The key path of an `Invalid` error, or a panic naming what came instead.
fn error_path(yaml: &str) -> String {
    match parse(yaml) {
        Err(SweepError::Invalid { path, .. }) => path,
        Err(other) => panic!("expected an Invalid error, got {other:?}"),
        Ok(sweep) => panic!("expected an error, got a sweep of {} jobs", sweep.count()),
    }
}

fn error_message(yaml: &str) -> String {
    parse(yaml).map(|sweep| sweep.count()).expect_err("the sweep must be refused").to_string()
}

#[test]
fn native_grid_expands_first_axis_slowest() {
    let sweep = parse(NATIVE).unwrap();
    assert_eq!(sweep.form, SweepForm::Native);
    assert_eq!(sweep.count(), 108);
    assert_eq!(sweep.name.as_deref(), Some("vaep-grid"));
    assert_eq!(sweep.metric, Some(Metric { name: "val_loss".into(), goal: Goal::Minimize }));
    assert_eq!((sweep.resources.gpus, sweep.resources.gpu_memory), (Some(1), Some(8 << 30)));

    let first = sweep.job(0).unwrap();
    assert_eq!(first.params, r#"{"lr":0.001,"batch_size":2048,"hidden_dims":[128,64],"horizon":10}"#);
    assert_eq!(first.command, "python train.py --lr 0.001 --batch_size 2048 --hidden '[128,64]' --horizon 10");
    assert_eq!(first.config, None);
    assert_eq!(params(&sweep.job(1).unwrap())["horizon"], 15);
    let fourth = params(&sweep.job(3).unwrap());
    assert_eq!((fourth["hidden_dims"].clone(), fourth["horizon"].clone()), (json!([256, 128]), json!(10)));
    let last = params(&sweep.job(107).unwrap());
    assert_eq!(last, json!({"lr": 0.0001, "batch_size": 8192, "hidden_dims": [512, 256, 128], "horizon": 20}));
    assert_eq!(sweep.job(108), None);
    let jobs: Vec<JobSpec> = sweep.jobs().collect();
    assert_eq!(jobs.len(), 108);
    assert!(jobs.iter().enumerate().all(|(index, job)| job.index == index as u64));
}

#[test]
fn max_runs_keeps_the_first_jobs_in_order() {
    let capped = parse(&format!("{NATIVE}max_runs: 20\n")).unwrap();
    let full = parse(NATIVE).unwrap();
    assert_eq!(capped.count(), 20);
    assert_eq!(capped.jobs().collect::<Vec<_>>(), full.jobs().take(20).collect::<Vec<_>>());
    assert_eq!(capped.job(20), None);
}

#[test]
fn native_shared_keys_and_placeholders() {
    let sweep = parse(
        "command: echo {name} {index} {config} {sweep} ${HOME} awk '{print $1}' '{missing}'\n\
         priority: 5\nretries: 2\ntimeout: 1h30m\ngrid:\n  name: ['a b', plain, \"it's\"]\n",
    )
    .unwrap();
    assert_eq!((sweep.priority, sweep.retries, sweep.timeout_secs), (5, 2, Some(5400)));
    let commands: Vec<String> = sweep.jobs().map(|job| job.command).collect();
    assert_eq!(commands[0], "echo 'a b' 0 \"$APP_CONFIG\" \"$APP_SWEEP\" ${HOME} awk '{print $1}' '{missing}'");
    assert!(commands[1].starts_with("echo plain 1 "));
    assert!(commands[2].starts_with("echo \"it's\" 2 "));
    // Outside single quotes, a placeholder that names no parameter is a typo.
    assert_eq!(error_path("command: echo {name} {missing}\ngrid: {name: [a]}\n"), "command");
    assert!(error_message("command: echo {nmae}\ngrid: {name: [a]}\n").contains("unknown placeholder `{nmae}`"));
}

#[test]
fn native_without_grid_is_one_job() {
    let sweep = parse("command: python train.py").unwrap();
    assert_eq!(sweep.count(), 1);
    assert_eq!(sweep.job(0).unwrap().params, "{}");
}

#[test]
fn native_train_form_overrides_the_config() {
    let sweep = parse(
        "train: {model: mlp, optim: {name: adam, lr: 0.1}, epochs: 5}\n\
         grid: {optim.lr: [0.01, 0.001], hidden: [[64, 32]], epochs: [1, 2]}\n",
    )
    .unwrap();
    assert_eq!(sweep.count(), 4);
    let job = sweep.job(3).unwrap();
    assert_eq!(job.command, "app train --config \"$APP_CONFIG\"");
    assert_eq!(params(&job), json!({"optim.lr": 0.001, "hidden": [64, 32], "epochs": 2}));
    let config: serde_norway::Value = serde_norway::from_str(job.config.as_deref().unwrap()).unwrap();
    let expected: serde_norway::Value =
        serde_norway::from_str("{model: mlp, optim: {name: adam, lr: 0.001}, epochs: 2, hidden: [64, 32]}").unwrap();
    assert_eq!(config, expected);
}

#[test]
fn cvlab_config_sweeps_every_list_leaf() {
    let sweep = parse(CVLAB).unwrap();
    assert_eq!(sweep.form, SweepForm::Cvlab);
    assert_eq!(sweep.count(), 6);
    assert_eq!((sweep.name.clone(), sweep.metric.clone()), (None, None));
    let job = sweep.job(0).unwrap();
    assert_eq!(job.params, r#"{"model.hidden_dims":[64,32],"optimizer.lr":0.1}"#);
    assert_eq!(job.command, "python main.py --config \"$APP_CONFIG\"");
    let config = job.config.expect("the CVLab form has a config");
    assert!(config.contains("!!python/tuple"), "tag lost:\n{config}");
    let config: serde_norway::Value = serde_norway::from_str(&config).unwrap();
    assert_eq!(config["model"]["dropout"], serde_norway::Value::from(0.1));
    assert_eq!(config["model"]["hidden_dims"], serde_norway::from_str::<serde_norway::Value>("[64, 32]").unwrap());
    assert_eq!(config["optimizer"]["lr"], serde_norway::Value::from(0.1));
    assert_eq!(config["data"]["size"], serde_norway::from_str::<serde_norway::Value>("[224, 224]").unwrap());
    assert_eq!(config["data"]["tags"], serde_norway::Value::Sequence(vec![]));
    assert_eq!(config["device"], serde_norway::from_str::<serde_norway::Value>("[0, 1]").unwrap());
    assert_eq!(config["epochs"], serde_norway::Value::from(10));
    let last = params(&sweep.job(5).unwrap());
    assert_eq!(last, json!({"model.hidden_dims": [128, 64], "optimizer.lr": 0.001}));
}

#[test]
fn cvlab_command_option_and_short_placeholders() {
    let options = ExpandOptions {
        max_jobs: 100,
        command: Some("python run.py {lr} {optimizer.lr} {index}".into()),
        ..ExpandOptions::default()
    };
    let sweep = Sweep::parse(CVLAB, &options).unwrap();
    assert_eq!(sweep.job(4).unwrap().command, "python run.py 0.01 0.01 4");
    let plain = parse("lr: 0.1\nname: x").unwrap();
    assert_eq!((plain.count(), plain.job(0).unwrap().params.as_str()), (1, "{}"));
}

#[test]
fn wandb_random_is_reproducible_and_seeded() {
    let first = parse(WANDB_RANDOM).unwrap();
    assert_eq!(first.form, SweepForm::Wandb);
    assert_eq!(first.count(), 30);
    let jobs: Vec<JobSpec> = first.jobs().collect();
    assert_eq!(jobs, parse(WANDB_RANDOM).unwrap().jobs().collect::<Vec<_>>());
    for job in &jobs {
        let values = params(job);
        let lr = values["lr"].as_f64().unwrap();
        let dropout = values["dropout"].as_f64().unwrap();
        assert!((1e-5..=1e-1).contains(&lr) && (0.0..0.5).contains(&dropout), "{values}");
        assert!([32, 64, 128].contains(&values["batch_size"].as_i64().unwrap()));
        assert_eq!(values["epochs"], 10);
        // The command carries the params' values to the last bit, written as Python's
        // `str()` (`1e-05`), as the W&B agent writes them.
        let arguments: Vec<&str> = job.command.split(' ').skip(3).collect();
        let argument = |name: &str| {
            let prefix = format!("--{name}=");
            arguments.iter().find_map(|argument| argument.strip_prefix(prefix.as_str())).unwrap().to_owned()
        };
        assert_eq!(argument("lr").parse::<f64>().unwrap().to_bits(), lr.to_bits(), "{}", job.command);
        assert_eq!(argument("dropout").parse::<f64>().unwrap().to_bits(), dropout.to_bits());
        assert_eq!(argument("batch_size"), values["batch_size"].to_string());
        assert_eq!(argument("epochs"), "10");
    }
    let distinct: std::collections::HashSet<&str> = jobs.iter().map(|job| job.params.as_str()).collect();
    assert_eq!(distinct.len(), 30);
    let reseeded: Vec<JobSpec> = parse(&format!("{WANDB_RANDOM}seed: 42\n")).unwrap().jobs().collect();
    assert_ne!(reseeded, jobs);
}

#[test]
fn wandb_grid_nests_parameters_and_expands_macros() {
    let sweep = parse(
        "method: grid\nprogram: train.py\nrun_cap: 5\nmetric: {name: acc, goal: maximize}\n\
         command: ['${env}', '${interpreter}', '${program}', '${args}', --json, '${args_json}', '${args_json_file}']\n\
         parameters:\n  a: {values: [1, 2, 3]}\n  opt: {parameters: {lr: {values: [0.1, 0.2]}, kind: {value: 'sgd m'}}}\n",
    )
    .unwrap();
    assert_eq!(sweep.count(), 5);
    assert_eq!(sweep.metric.as_ref().map(|metric| metric.goal), Some(Goal::Maximize));
    let job = sweep.job(1).unwrap();
    assert_eq!(job.params, r#"{"a":1,"opt":{"lr":0.2,"kind":"sgd m"}}"#);
    assert_eq!(
        job.command,
        // W&B's agent: `--name=str(value)` (a nested parameter is a Python dict), and
        // `json.dumps` for `${args_json}`; every argument one shell word.
        r#"/usr/bin/env python train.py --a=1 "--opt={'lr': 0.2, 'kind': 'sgd m'}" --json '{"a": 1, "opt": {"lr": 0.2, "kind": "sgd m"}}' "$APP_CONFIG""#
    );
    let no_hyphens =
        parse("method: grid\ncommand: run ${args_no_hyphens}\nparameters: {x: {values: [a, 'b c']}}\n").unwrap();
    let commands: Vec<String> = no_hyphens.jobs().map(|job| job.command).collect();
    assert_eq!(commands, ["run x=a", "run 'x=b c'"]);
}

#[test]
fn malformed_yaml_reports_line_and_column() {
    let error = parse("name: x\ngrid:\n  lr: [0.1, 0.2\n  bs: [1]\n").unwrap_err();
    let SweepError::Syntax { line, column, .. } = error else { panic!("{error:?}") };
    assert!(line >= 3 && column >= 1, "line {line} column {column}");
    assert!(matches!(parse("a: b: c"), Err(SweepError::Syntax { line: 1, column: 5, .. })));
    assert_eq!(error_path("- just\n- a list\n"), "(root)");
    assert_eq!(error_path(""), "(root)");
}

#[test]
fn native_errors_name_the_key() {
    assert_eq!(error_path("command: x\nfoo: 1"), "foo");
    let message = error_message("command: x\nfoo: 1");
    assert!(message.contains("unknown key `foo`") && message.contains("allowed: name"), "{message}");
    assert_eq!(error_path("command: x\ngrid: {lr: []}"), "grid.lr");
    assert!(error_message("command: x\ngrid: {lr: []}").contains("empty axis"));
    assert_eq!(error_path("command: x\ngrid: {lr: 0.1}"), "grid.lr");
    assert!(error_message("command: x\ngrid: {lr: 0.1}").contains("expected a list of values"));
    assert_eq!(error_path("command: x\ngrid: [1, 2]"), "grid");
    assert_eq!(error_path("command: x\ngrid: {1: [1, 2]}"), "grid.1");
    assert_eq!(error_path("grid: {lr: [1]}"), "command");
    assert_eq!(error_path("command: x\ntrain: {a: 1}"), "train");
    assert_eq!(error_path("command: x\nmax_runs: 0"), "max_runs");
    assert_eq!(error_path("command: x\nresources: {gpu_memory: 8GiB, vram: 1}"), "resources.vram");
    assert_eq!(error_path("command: x\nresources: {gpu_memory: many}"), "resources.gpu_memory");
    assert_eq!(error_path("command: x\nmetric: {name: loss, goal: lower}"), "metric.goal");
    assert_eq!(error_path("command: x\ntimeout: soon"), "timeout");
    assert_eq!(error_path("command: x\ngrid: {v: [.nan]}"), "grid.v");
}

#[test]
fn wandb_errors_name_the_key() {
    assert_eq!(error_path("method: bayes\nparameters: {}\nprogram: x"), "metric.name");
    assert!(error_message("method: bayes\nparameters: {}\nprogram: x").contains("bayes needs metric.name"));
    assert_eq!(error_path("method: grid\nparameters: {}\nprogram: x\nfoo: 1"), "foo");
    let ignored = "method: grid\nparameters: {}\nprogram: x\nentity: e\nproject: p\nmetric: {name: l}\n\
                   early_terminate: {type: hyperband, min_iter: 3}";
    assert_eq!(parse(ignored).unwrap().warnings.len(), 2);
    assert_eq!(error_path("method: grid\nparameters: {}\nprogram: x\nearly_terminate: {}"), "early_terminate.type");
    let continuous = "method: grid\nprogram: x\nparameters: {lr: {distribution: uniform, min: 0, max: 1}}";
    assert_eq!(error_path(continuous), "parameters.lr");
    assert!(error_message(continuous).contains("grid search needs `values` or `value`; `lr` has distribution uniform"));
    let nested = "method: grid\nprogram: x\nparameters: {o: {parameters: {lr: {min: 1, max: 3}}}}";
    assert_eq!(error_path(nested), "parameters.o.parameters.lr");
    // W&B runs random search without run_cap until it is stopped: adaptive, no jobs up front.
    let open = parse("method: random\nprogram: x\nparameters: {a: {values: [1]}}").unwrap();
    assert_eq!((open.count(), open.search.is_adaptive()), (0, true));
    assert_eq!(error_path("method: grid\nparameters: {a: {values: [1]}}"), "program");
    assert_eq!(error_path("method: grid\ncommand: ${program} x\nparameters: {}"), "command");
    assert_eq!(error_path("method: grid\nprogram: x"), "parameters");
    assert_eq!(error_path("parameters: {}\nprogram: x"), "method");
    let bounds = "method: random\nrun_cap: 3\nprogram: x\nparameters: {lr: {distribution: uniform, min: 1, max: 0.5}}";
    assert_eq!(error_path(bounds), "parameters.lr.max");
    let log =
        "method: random\nrun_cap: 3\nprogram: x\nparameters: {lr: {distribution: log_uniform_values, min: 0, max: 1}}";
    assert_eq!(error_path(log), "parameters.lr.min");
    let unknown = "method: random\nrun_cap: 3\nprogram: x\nparameters: {lr: {distribution: zipf, min: 0, max: 1}}";
    assert!(error_message(unknown).contains("known: constant, categorical, uniform"));
}

#[test]
fn oversized_grid_is_refused_at_once() {
    let axes: String = (0..30).map(|axis| format!("  p{axis}: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n")).collect();
    let yaml = format!("command: run\ngrid:\n{axes}");
    let started = Instant::now();
    let error = parse(&yaml).unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(200), "took {:?}", started.elapsed());
    assert_eq!(error, SweepError::TooManyJobs { count: 10u128.pow(30), limit: 100_000 });

    let capped = parse(&format!("{yaml}max_runs: 20\n")).unwrap();
    assert_eq!(capped.count(), 20);
    assert_eq!(params(&capped.job(19).unwrap())["p29"], 9);
    assert_eq!(params(&capped.job(19).unwrap())["p28"], 1);

    let options = ExpandOptions { max_jobs: 100, ..ExpandOptions::default() };
    let too_many_runs = Sweep::parse("method: random\nrun_cap: 101\nprogram: x\nparameters: {}", &options);
    assert_eq!(too_many_runs.unwrap_err(), SweepError::TooManyJobs { count: 101, limit: 100 });
    let cvlab = Sweep::parse("a: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]\nb: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]", &options);
    assert_eq!(cvlab.unwrap_err(), SweepError::TooManyJobs { count: 110, limit: 100 });
}

/// Flow collections laid out as PyYAML reads them (and CVLab-Kit, Hydra and W&B users write
/// them): a closing bracket at its block's own column, with or without a trailing comma and
/// with comments (CVLab-Kit's `config/ssl/curriculum_adaptive_ssl_ablation.yaml`), items at
/// that column, nested under a mapping, a flow mapping closed at the column of its key.
#[test]
fn flow_collections_closed_at_their_blocks_column_read_as_pyyaml_reads_them() {
    let curriculum = "model: wideresnet\nablation_name: [\n  \"fixed\",  # the baseline\n  \"adaptive\"\n]\nlr: 0.03\n";
    let sweep = parse(curriculum).unwrap();
    assert_eq!(sweep.form, SweepForm::Cvlab);
    assert_eq!(sweep.count(), 2);
    assert_eq!(params(&sweep.job(1).unwrap()), json!({"ablation_name": "adaptive"}));
    let trailing = "ablation_name: [\n  \"a\",\n  \"b\",\n]\n";
    assert_eq!(parse(trailing).unwrap().count(), 2);
    let items_at_column = "seeds: [\n1,\n2,\n3\n]\n";
    assert_eq!(parse(items_at_column).unwrap().count(), 3);
    let nested = "optim:\n  lr: [\n    0.1,\n    0.01,\n  ]\n  batch: 32\n";
    let sweep = parse(nested).unwrap();
    assert_eq!(sweep.count(), 2);
    assert_eq!(params(&sweep.job(0).unwrap()), json!({"optim.lr": 0.1}));
    let wandb = "method: grid\nparameters:\n  lr: {\n    values: [0.1, 0.01]\n  }\nprogram: train.py\n";
    let sweep = parse(wandb).unwrap();
    assert_eq!((sweep.form, sweep.count()), (SweepForm::Wandb, 2));
    // A file that is wrong for another reason still says so, at its line.
    let broken = "a: [\n  1,\n]\nb: : c\n";
    assert!(parse(broken).is_err());
}
