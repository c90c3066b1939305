//! The W&B form as W&B's agent runs it: the command it builds, the values it passes, the
//! params file for `wandb.config` readers, and what it refuses. Expected texts follow W&B's
//! documented behaviour (sweep configuration and command macros pages) and its agent's
//! `create_sweep_command_args`: `--name=str(value)`.

use proptest::prelude::*;
use shared::sweep::{wandb_params_file, ExpandOptions, Sweep, SweepError};

fn parse(yaml: &str) -> Result<Sweep, SweepError> {
    Sweep::parse(yaml, &ExpandOptions::default())
}

fn first_command(yaml: &str) -> String {
    parse(yaml).unwrap_or_else(|error| panic!("{error}\n{yaml}")).job(0).unwrap().command
}

/// The argv `sh -c` gives the program for `command`.
fn argv(command: &str) -> Vec<String> {
    let script = format!("for a in {command}; do printf '%s\\n' \"$a\"; done");
    let output = std::process::Command::new("sh").arg("-c").arg(script).output().unwrap();
    String::from_utf8(output.stdout).unwrap().lines().map(str::to_owned).collect()
}

#[test]
fn values_are_rendered_as_python_str() {
    let yaml = "method: grid\nprogram: t.py\nparameters:\n  flag: {values: [true]}\n  n: {values: [128]}\n  \
                lr: {values: [1.0e-5]}\n  dims: {values: [[a, b]]}\n  none: {values: [null]}\n  s: {values: ['x y']}\n";
    assert_eq!(
        argv(&first_command(yaml))[3..],
        ["--flag=True", "--n=128", "--lr=1e-05", "--dims=['a', 'b']", "--none=None", "--s=x y"]
    );
}

#[test]
fn an_integer_q_passes_integers_and_a_float_q_floats() {
    let yaml = "method: random\nrun_cap: 20\nprogram: t.py\nparameters:\n  \
                bs: {distribution: q_uniform, min: 16, max: 512, q: 16}\n  \
                d: {distribution: q_uniform, min: 0, max: 1, q: 0.25}\n  \
                w: {distribution: q_log_uniform_values, min: 32, max: 1024}\n";
    for job in parse(yaml).unwrap().jobs() {
        let args = argv(&job.command);
        let bs: i64 = args[3].strip_prefix("--bs=").unwrap().parse().expect("an integer, not 128.0");
        assert_eq!(bs % 16, 0);
        assert!(args[4].strip_prefix("--d=").unwrap().contains('.'), "{}", args[4]);
        args[5].strip_prefix("--w=").unwrap().parse::<i64>().expect("W&B's default q is the integer 1");
    }
}

#[test]
fn every_new_distribution_is_accepted_and_stays_in_range() {
    let yaml = "method: random\nrun_cap: 50\nprogram: t.py\nparameters:\n  \
                a: {distribution: inv_log_uniform_values, min: 0.001, max: 0.1}\n  \
                b: {distribution: inv_log_uniform, min: 1, max: 5}\n  \
                c: {distribution: beta, a: 2, b: 3}\n  \
                d: {distribution: q_beta, a: 1, b: 1, q: 0.1}\n";
    for job in parse(yaml).unwrap().jobs() {
        let params: serde_json::Value = serde_json::from_str(&job.params).unwrap();
        let value = |name: &str| params[name].as_f64().unwrap();
        assert!((0.001..=0.1).contains(&value("a")));
        assert!(((-5f64).exp()..=(-1f64).exp()).contains(&value("b")));
        assert!((0.0..=1.0).contains(&value("c")) && (0.0..=1.0).contains(&value("d")));
    }
}

#[test]
fn ignored_keys_are_listed_as_warnings() {
    let sweep = parse(
        "method: grid\nprogram: t.py\nproject: p\nentity: e\ncontroller: {type: local}\ndescription: d\n\
         parameters: {a: {value: 1}}\n",
    )
    .unwrap();
    assert_eq!(sweep.warnings.len(), 4, "{:?}", sweep.warnings);
    assert!(sweep.warnings.iter().any(|warning| warning.contains("`controller`")));
}

#[test]
fn bayes_and_open_random_are_adaptive() {
    let bayes = parse(
        "method: bayes\nprogram: t.py\nmetric: {name: loss, target: 0.1}\nrun_cap: 30\n\
         early_terminate: {type: hyperband, min_iter: 3}\nparameters: {lr: {min: 0.0001, max: 0.1}}\n",
    )
    .unwrap();
    assert_eq!(
        bayes.search,
        shared::search::Search::Bayes { seed: 0, run_cap: Some(30), sampler: shared::search::Sampler::Auto }
    );
    assert_eq!(bayes.metric_target, Some(0.1));
    assert_eq!(bayes.count(), 0);
    // One dimension: the GP alone; from three, every third run is TPE's, and a categorical
    // parameter is one-hot in the GP, a dimension per choice (lr and two choices: three).
    assert_eq!(bayes.search.describe(&bayes.space()).as_deref(), Some("adaptive (bayes, GP): up to 30 runs"));
    assert!(bayes.early_stop.is_some());
    let mixed = parse(
        "method: bayes\nprogram: t.py\nmetric: {name: loss}\nrun_cap: 30\n\
         parameters: {lr: {min: 0.0001, max: 0.1}, opt: {values: [adam, sgd]}}\n",
    )
    .unwrap();
    assert_eq!(mixed.search.describe(&mixed.space()).as_deref(), Some("adaptive (bayes, GP and TPE): up to 30 runs"));
    let wide = parse(
        "method: bayes\nprogram: t.py\nmetric: {name: loss}\nrun_cap: 30\n\
         parameters: {arch: {values: [a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p]}, opt: {values: [adam, sgd, lamb, lion, adamw]}}\n",
    )
    .unwrap();
    // 16 + 5 one-hot dimensions are more than the GP models.
    assert_eq!(wide.search.describe(&wide.space()).as_deref(), Some("adaptive (bayes, TPE): up to 30 runs"));
}

#[test]
fn bad_inputs_name_their_key() {
    let error_path = |yaml: &str| match parse(yaml) {
        Err(SweepError::Invalid { path, .. }) => path,
        other => panic!("{yaml}: {:?}", other.map(|sweep| sweep.count())),
    };
    assert_eq!(error_path("method: grid\nprogram: t.py\nparameters: {a: {values: []}}"), "parameters.a.values");
    assert_eq!(error_path("method: grid\ncommand: [x, '${whatever}']\nparameters: {a: {value: 1}}"), "command.1");
    assert_eq!(
        error_path("method: bayes\nprogram: t.py\nmetric: {name: l}\nearly_terminate: {type: hyperband, min_iter: 3, eta: 1}\nparameters: {a: {value: 1}}"),
        "early_terminate.eta"
    );
    assert_eq!(error_path("method: bayes\nprogram: t.py\nparameters: {a: {value: 1}}"), "metric.name");
    assert_eq!(error_path("model: {lr: {grid_search: [1, 2]}}"), "model.lr");
    assert_eq!(error_path("hydra: {run: {dir: x}}\nlr: [1, 2]"), "hydra");
}

#[test]
fn the_params_file_is_what_wandb_init_reads() {
    let sweep = parse(
        "method: grid\nprogram: t.py\nparameters:\n  lr: {value: 0.001}\n  opt: {parameters: {name: {value: adam}}}\n",
    )
    .unwrap();
    let file = wandb_params_file(&sweep.job(0).unwrap().params).unwrap();
    assert_eq!(file, "wandb_version: 1\n\nlr:\n  value: 0.001\nopt:\n  value:\n    name: adam\n");
}

proptest! {
    /// Any float value reaches the params JSON and the command bit for bit.
    #[test]
    fn floats_round_trip_through_params_and_command(value in proptest::num::f64::NORMAL | proptest::num::f64::SUBNORMAL) {
        let yaml = format!("method: grid\nprogram: t.py\nparameters: {{x: {{values: [{value:e}]}}}}\n");
        let job = parse(&yaml).unwrap().job(0).unwrap();
        let params: serde_json::Value = serde_json::from_str(&job.params).unwrap();
        prop_assert_eq!(params["x"].as_f64().unwrap().to_bits(), value.to_bits());
        let argument = job.command.rsplit(' ').next().unwrap().trim_matches('\'').strip_prefix("--x=").unwrap().to_owned();
        prop_assert_eq!(argument.parse::<f64>().unwrap().to_bits(), value.to_bits(), "{}", argument);
    }
}
