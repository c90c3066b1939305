//! Properties of grid expansion over random grids: the count, the exact cartesian product in
//! order, determinism, the end of the sweep, and agreement between the three forms.

use std::collections::HashSet;

use proptest::prelude::*;
use serde_json::{json, Value as Json};
use shared::sweep::{ExpandOptions, JobSpec, Sweep};

/// One axis value, written in YAML and expected back in JSON.
#[derive(Debug, Clone)]
struct AxisValue {
    yaml: String,
    json: Json,
}

/// Distinct values of one kind: integers, floats, strings (some needing shell quoting) or lists.
fn axis_values() -> impl Strategy<Value = Vec<AxisValue>> {
    (0..4u8, prop::collection::btree_set(-50i32..50, 1..=6)).prop_map(|(kind, numbers)| {
        numbers
            .into_iter()
            .map(|n| match kind {
                0 => AxisValue { yaml: n.to_string(), json: json!(n) },
                // Quarters are exact in binary, so JSON parsing cannot blur them.
                1 => AxisValue { yaml: format!("{:?}", f64::from(n) / 4.0), json: json!(f64::from(n) / 4.0) },
                2 if n % 2 == 0 => AxisValue { yaml: format!("'v {n}'"), json: json!(format!("v {n}")) },
                2 => AxisValue { yaml: format!("v{n}"), json: json!(format!("v{n}")) },
                _ => AxisValue { yaml: format!("[{n}, 1]"), json: json!([n, 1]) },
            })
            .collect()
    })
}

fn grid() -> impl Strategy<Value = (Vec<(String, Vec<AxisValue>)>, Option<u64>)> {
    let names = prop::collection::btree_set("[a-z][a-z0-9_]{0,5}", 1..=5)
        // `device` is never an axis in the CVLab form, `seed` is the CVLab file's fixed key,
        // and the others are not string keys in YAML.
        .prop_filter("reserved name", |names| {
            !["device", "seed", "true", "false", "null"].iter().any(|reserved| names.contains(*reserved))
        });
    let axes = names.prop_flat_map(|names| {
        let count = names.len();
        (Just(names.into_iter().collect::<Vec<_>>()), prop::collection::vec(axis_values(), count))
    });
    let axes = axes.prop_map(|(names, values)| names.into_iter().zip(values).collect::<Vec<_>>());
    (axes, prop::option::of(1u64..200))
}

fn native_yaml(axes: &[(String, Vec<AxisValue>)], max_runs: Option<u64>) -> String {
    let placeholders: Vec<String> = axes.iter().map(|(name, _)| format!("--{name} {{{name}}}")).collect();
    let mut yaml = format!("command: run {}\ngrid:\n", placeholders.join(" "));
    for (name, values) in axes {
        let texts: Vec<&str> = values.iter().map(|value| value.yaml.as_str()).collect();
        yaml.push_str(&format!("  {name}: [{}]\n", texts.join(", ")));
    }
    if let Some(cap) = max_runs {
        yaml.push_str(&format!("max_runs: {cap}\n"));
    }
    yaml
}

fn wandb_yaml(axes: &[(String, Vec<AxisValue>)], run_cap: Option<u64>) -> String {
    let mut yaml = "method: grid\nprogram: train.py\nparameters:\n".to_owned();
    for (name, values) in axes {
        let texts: Vec<&str> = values.iter().map(|value| value.yaml.as_str()).collect();
        yaml.push_str(&format!("  {name}: {{values: [{}]}}\n", texts.join(", ")));
    }
    if let Some(cap) = run_cap {
        yaml.push_str(&format!("run_cap: {cap}\n"));
    }
    yaml
}

fn cvlab_yaml(axes: &[(String, Vec<AxisValue>)]) -> String {
    let mut yaml = "seed: 1\n".to_owned();
    for (name, values) in axes {
        let texts: Vec<&str> = values.iter().map(|value| value.yaml.as_str()).collect();
        yaml.push_str(&format!("{name}: [{}]\n", texts.join(", ")));
    }
    yaml
}

/// The cartesian product in order, first axis slowest, as JSON objects.
fn product(axes: &[(String, Vec<AxisValue>)]) -> Vec<Json> {
    let mut combinations = vec![serde_json::Map::new()];
    for (name, values) in axes {
        combinations = combinations
            .into_iter()
            .flat_map(|combination| {
                values.iter().map(move |value| {
                    let mut next = combination.clone();
                    next.insert(name.clone(), value.json.clone());
                    next
                })
            })
            .collect();
    }
    combinations.into_iter().map(Json::Object).collect()
}

fn parse(yaml: &str) -> Sweep {
    Sweep::parse(yaml, &ExpandOptions::default()).unwrap_or_else(|error| panic!("{error}\n{yaml}"))
}

fn params(job: &JobSpec) -> Json {
    serde_json::from_str(&job.params).unwrap()
}

proptest! {
    #[test]
    fn grid_count_order_and_end((axes, max_runs) in grid()) {
        let full: u64 = axes.iter().map(|(_, values)| values.len() as u64).product();
        let sweep = parse(&native_yaml(&axes, max_runs));
        let expected_count = max_runs.map_or(full, |cap| cap.min(full));
        prop_assert_eq!(sweep.count(), expected_count);

        let jobs: Vec<JobSpec> = sweep.jobs().collect();
        let expected: Vec<Json> = product(&axes).into_iter().take(expected_count as usize).collect();
        prop_assert_eq!(jobs.iter().map(params).collect::<Vec<_>>(), expected);
        let distinct: HashSet<&str> = jobs.iter().map(|job| job.params.as_str()).collect();
        prop_assert_eq!(distinct.len(), jobs.len());
        for job in &jobs {
            let keys: Vec<&str> = axes.iter().map(|(name, _)| name.as_str()).collect();
            let order: Vec<usize> = keys.iter().map(|key| job.params.find(&format!("\"{key}\":")).unwrap()).collect();
            prop_assert!(order.windows(2).all(|pair| pair[0] < pair[1]), "keys out of order: {}", job.params);
        }

        prop_assert_eq!(&jobs, &parse(&native_yaml(&axes, max_runs)).jobs().collect::<Vec<_>>());
        prop_assert_eq!(sweep.job(expected_count), None);
        prop_assert_eq!(sweep.job(u64::MAX), None);
    }

    #[test]
    fn the_three_forms_agree((axes, max_runs) in grid()) {
        let native = parse(&native_yaml(&axes, max_runs));
        let wandb = parse(&wandb_yaml(&axes, max_runs));
        prop_assert_eq!(native.count(), wandb.count());
        for (native_job, wandb_job) in native.jobs().zip(wandb.jobs()) {
            prop_assert_eq!(&native_job.params, &wandb_job.params);
        }

        let cvlab = parse(&cvlab_yaml(&axes));
        let full: u64 = axes.iter().map(|(_, values)| values.len() as u64).product();
        prop_assert_eq!(cvlab.count(), full);
        let uncapped = parse(&native_yaml(&axes, None));
        for (native_job, cvlab_job) in uncapped.jobs().zip(cvlab.jobs()) {
            // The CVLab form drops one-value lists from the params: they are not axes.
            let mut expected = params(&native_job);
            for (name, values) in &axes {
                if values.len() == 1 {
                    expected.as_object_mut().unwrap().remove(name);
                }
            }
            prop_assert_eq!(params(&cvlab_job), expected);
            // Its config is the file with every list resolved to this job's value.
            let config: serde_norway::Value = serde_norway::from_str(cvlab_job.config.as_deref().unwrap()).unwrap();
            let config: Json = serde_json::to_value(config).unwrap();
            let mut resolved = params(&native_job);
            resolved.as_object_mut().unwrap().insert("seed".into(), json!(1));
            prop_assert_eq!(config, resolved);
        }
    }

    #[test]
    fn random_search_is_a_function_of_seed_and_index(seed in any::<u64>(), run_cap in 1u64..40) {
        let yaml = format!(
            "method: random\nseed: {seed}\nrun_cap: {run_cap}\nprogram: t.py\nparameters:\n  \
             x: {{distribution: q_uniform, min: -3, max: 3, q: 0.5}}\n  y: {{values: [a, b], probabilities: [0.3, 0.7]}}\n  \
             z: {{distribution: int_uniform, min: 1, max: 4}}\n"
        );
        let sweep = parse(&yaml);
        prop_assert_eq!(sweep.count(), run_cap);
        let jobs: Vec<JobSpec> = sweep.jobs().collect();
        prop_assert_eq!(&jobs, &parse(&yaml).jobs().collect::<Vec<_>>());
        for job in &jobs {
            let values = params(job);
            let x = values["x"].as_f64().unwrap();
            prop_assert!((-3.25..=3.25).contains(&x) && (x * 2.0).fract() == 0.0, "{}", x);
            prop_assert!(values["y"] == "a" || values["y"] == "b");
            prop_assert!((1..=4).contains(&values["z"].as_i64().unwrap()));
            // Job i alone gives the same job as the full expansion.
            prop_assert_eq!(Some(job.clone()), sweep.job(job.index));
        }
        prop_assert_eq!(sweep.job(run_cap), None);
    }
}
