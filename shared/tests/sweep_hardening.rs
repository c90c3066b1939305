//! Hostile or careless sweep files: alias bombs, crafted texts that used to take quadratic
//! time, values that must survive the shell and YAML 1.1 readers, and checks that used to
//! let a bad file through.

use std::process::Command;
use std::time::{Duration, Instant};

use shared::sweep::{ExpandOptions, Sweep, SweepError};

/// A time bound: as written for optimised builds, eight times longer for the unoptimised test
/// build (the YAML scanner is a dependency built at opt-level 1 there). The release figures
/// are measured by `app bench-search --hostile`.
fn bound(seconds: u64) -> Duration {
    Duration::from_secs(if cfg!(debug_assertions) { seconds * 8 } else { seconds })
}

fn parse(yaml: &str) -> Result<Sweep, SweepError> {
    Sweep::parse(yaml, &ExpandOptions::default())
}

/// Parses `yaml` and returns the result with the time it took (printed, for the record).
fn timed(label: &str, yaml: &str) -> (Result<Sweep, SweepError>, Duration) {
    let started = Instant::now();
    let result = parse(yaml);
    let elapsed = started.elapsed();
    eprintln!("{label}: {elapsed:?}");
    (result, elapsed)
}

fn invalid(result: Result<Sweep, SweepError>) -> (String, String) {
    match result {
        Err(SweepError::Invalid { path, message }) => (path, message),
        Err(other) => panic!("expected an Invalid error, got {other:?}"),
        Ok(sweep) => panic!("expected an error, got a sweep of {} jobs", sweep.count()),
    }
}

fn command_of(yaml: &str, index: u64) -> String {
    let sweep = parse(yaml).unwrap_or_else(|error| panic!("{error}\n{yaml}"));
    sweep.job(index).expect("job exists").command
}

/// Runs `command` with `sh -c` and returns its standard output.
fn shell_output(command: &str) -> String {
    let output = Command::new("sh").arg("-c").arg(command).output().expect("sh runs");
    assert!(output.status.success(), "{command}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

// --- 1. Aliases ---------------------------------------------------------------------------

#[test]
fn aliases_that_multiply_the_document_are_refused_at_once() {
    let n = 6000;
    let zeros = vec!["0"; n].join(",");
    let aliases = vec!["*a"; n].join(",");
    let yaml = format!("command: run\nx: &a [{zeros}]\ny: [{aliases}]\n");
    assert!(yaml.len() < 40_000);
    let (result, elapsed) = timed("alias fan-out (6000 x 6000)", &yaml);
    let (path, message) = invalid(result);
    assert_eq!(path, "(root)");
    assert!(message.contains("more than 200000 YAML nodes"), "{message}");
    assert!(elapsed < bound(2), "took {elapsed:?}");
}

#[test]
fn billion_laughs_is_refused() {
    let mut yaml = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for level in b'b'..=b'i' {
        let previous = (level - 1) as char;
        let level = level as char;
        let items = vec![format!("*{previous}"); 9].join(", ");
        yaml.push_str(&format!("{level}: &{level} [{items}]\n"));
    }
    let (result, elapsed) = timed("billion laughs", &yaml);
    assert!(result.is_err(), "a billion laughs was accepted");
    assert!(elapsed < bound(2), "took {elapsed:?}");
}

#[test]
fn a_long_anchored_string_cannot_be_repeated_into_gigabytes() {
    let long = "x".repeat(200_000);
    let aliases = vec!["*s"; 5000].join(",");
    let yaml = format!("command: run\ns: &s {long}\nl: [{aliases}]\n");
    let (result, elapsed) = timed("string fan-out (200 KB x 5000)", &yaml);
    let (path, message) = invalid(result);
    assert_eq!(path, "(root)");
    assert!(message.contains("aliases"), "{message}");
    assert!(elapsed < bound(2), "took {elapsed:?}");
}

#[test]
fn list_looking_strings_share_the_budget() {
    // The CVLab form parses each `"[...]"` string as a list: 3000 copies of a 500-element one.
    let list = format!("\"[{}]\"", vec!["0"; 500].join(","));
    let yaml = format!("s: &s {list}\nv: [{}]\n", vec!["*s"; 3000].join(", "));
    let (result, elapsed) = timed("list-looking string fan-out (500 x 3000)", &yaml);
    let (path, message) = invalid(result);
    assert_eq!(path, "(root)");
    assert!(message.contains("YAML nodes"), "{message}");
    assert!(elapsed < bound(2), "took {elapsed:?}");
}

#[test]
fn ordinary_anchors_and_merges_still_work() {
    let yaml = "command: run {lr}\nbase: &b [0.1, 0.2]\ngrid: {lr: *b}\n";
    let error = parse(yaml).unwrap_err();
    // `base` is not a native key: the alias itself was fine.
    assert!(matches!(error, SweepError::Invalid { ref path, .. } if path == "base"), "{error:?}");
    let cvlab = "defaults: &d {lr: [0.1, 0.2], depth: 3}\nrun:\n  <<: *d\n  depth: [1, 2]\n";
    let sweep = parse(cvlab).unwrap();
    assert_eq!(sweep.count(), 8);
}

// --- 2. Slot markers ----------------------------------------------------------------------

#[test]
fn marker_choice_is_linear_in_crafted_text() {
    let crafted = format!("__app_slot_{}", "x_".repeat(40_000));
    let yaml = format!("note: \"{crafted}\"\nlr: [0.1, 0.2]\n");
    let (result, elapsed) = timed("crafted __app_slot_ (CVLab)", &yaml);
    let sweep = result.unwrap();
    assert!(elapsed < bound(1), "took {elapsed:?}");
    let config = sweep.job(1).unwrap().config.unwrap();
    let config: serde_norway::Value = serde_norway::from_str(&config).unwrap();
    assert_eq!(config["note"].as_str(), Some(crafted.as_str()));
    assert_eq!(config["lr"].as_f64(), Some(0.2));

    let train = format!("train: {{note: \"{crafted}\", lr: 1}}\ngrid: {{lr: [0.5]}}\n");
    let (result, elapsed) = timed("crafted __app_slot_ (train)", &train);
    let config = result.unwrap().job(0).unwrap().config.unwrap();
    assert!(elapsed < bound(1), "took {elapsed:?}");
    assert!(config.contains("lr: 0.5"), "{config}");
}

// --- 3. CVLab duplicates and count ----------------------------------------------------------

#[test]
fn an_over_limit_cvlab_file_is_refused_before_anything_quadratic() {
    // 30,000 axes (150,000 YAML nodes): refused for its count.
    let yaml: String = (0..30_000).map(|key| format!("k{key}: [1, 2]\n")).collect();
    let (result, elapsed) = timed("CVLab 30000 axes", &yaml);
    assert!(matches!(result, Err(SweepError::TooManyJobs { limit: 100_000, .. })), "{:?}", result.err());
    assert!(elapsed < bound(1), "took {elapsed:?}");
    // 100,000 axes: past the node budget (200,000) before it is even counted.
    let yaml: String = (0..100_000).map(|key| format!("k{key}: [1, 2]\n")).collect();
    let (result, elapsed) = timed("CVLab 100000 axes", &yaml);
    let (path, message) = invalid(result);
    assert_eq!(path, "(root)");
    assert!(message.contains("200000 YAML nodes"), "{message}");
    assert!(elapsed < bound(1), "took {elapsed:?}");
}

#[test]
fn cvlab_duplicate_parameter_names_are_still_refused() {
    let (path, message) = invalid(parse("a.b: [1, 2]\na: {b: [3, 4]}\n"));
    assert_eq!(path, "a.b");
    assert!(message.contains("two keys make the same parameter name"), "{message}");
}

// --- 4. Saturated counts ------------------------------------------------------------------

#[test]
fn a_saturated_count_reads_as_more_than_ten_to_the_38() {
    let axes: String = (0..40).map(|axis| format!("  p{axis}: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]\n")).collect();
    let error = parse(&format!("command: run\ngrid:\n{axes}")).unwrap_err();
    assert_eq!(error, SweepError::TooManyJobs { count: u128::MAX, limit: 100_000 });
    assert_eq!(error.to_string(), "sweep expands to more than 10^38 jobs, over the limit of 100000");
}

// --- 5. Floats in resolved configs ----------------------------------------------------------

#[test]
fn resolved_configs_write_floats_yaml_1_1_reads_as_floats() {
    let yaml = "eps: 1.0e-6\nbig: 2.5e+20\nratio: 0.001\nwhole: 3.0\nlr: [1.0e-7, 2.0]\nscale: [1.5e300, -4.0]\n";
    let sweep = parse(yaml).unwrap();
    let config = sweep.job(0).unwrap().config.unwrap();
    for expected in ["eps: 1.0e-06", "big: 2.5e+20", "ratio: 0.001", "whole: 3.0", "lr: 1.0e-07", "scale: 1.5e+300"] {
        assert!(config.contains(expected), "`{expected}` missing from\n{config}");
    }
    let last = sweep.job(3).unwrap().config.unwrap();
    assert!(last.contains("lr: 2.0") && last.contains("scale: -4.0"), "{last}");
    // And YAML 1.2 (serde_norway) still reads them as the same numbers.
    let value: serde_norway::Value = serde_norway::from_str(&config).unwrap();
    assert_eq!(value["eps"].as_f64(), Some(1.0e-6));
    assert_eq!(value["big"].as_f64(), Some(2.5e20));

    let train = parse("train: {eps: 1.0e-6}\ngrid: {lr: [1.0e-7], nested: [{a: 1.0e+25}]}\n").unwrap();
    let config = train.job(0).unwrap().config.unwrap();
    for expected in ["eps: 1.0e-06", "lr: 1.0e-07", "{a: 1.0e+25}"] {
        assert!(config.contains(expected), "`{expected}` missing from\n{config}");
    }
}

// --- 6. Quote contexts --------------------------------------------------------------------

const AWKWARD: [&str; 8] = ["my run", "$(echo pwned)", "it's", "a\"b\\c", "`echo pwned`", "x$HOME", "*", "[128,64]"];

#[test]
fn values_survive_every_quote_context_of_the_command() {
    let values: Vec<String> = AWKWARD.iter().map(|value| serde_json::to_string(value).unwrap()).collect();
    let yaml = format!(
        "command: printf '%s|%s|%s|%s\\n' {{tag}} \"{{tag}}\" '{{tag}}' --x=\"pre {{tag}} post\"\ngrid:\n  tag: [{}]\n",
        values.join(", ")
    );
    for (index, value) in AWKWARD.iter().enumerate() {
        let command = command_of(&yaml, index as u64);
        let printed = shell_output(&command);
        assert_eq!(printed, format!("{value}|{value}|{value}|--x=pre {value} post\n"), "{command}");
    }
}

#[test]
fn values_inside_command_substitutions_and_escaped_quotes() {
    // Quoting restarts inside $(...) in double quotes; `\"` does not end a double-quoted word.
    let yaml = "command: echo \"[\\\"{v}\\\"] $(printf '%s' '{v}') $(printf %s {v})\"\ngrid: {v: ['a b', \"it's\"]}\n";
    assert_eq!(shell_output(&command_of(yaml, 0)), "[\"a b\"] a b a b\n");
    assert_eq!(shell_output(&command_of(yaml, 1)), "[\"it's\"] it's it's\n");
}

#[test]
fn list_values_are_quoted_against_globbing() {
    let command = command_of("command: run --hidden {h}\ngrid: {h: [[128, 64]]}\n", 0);
    assert_eq!(command, "run --hidden '[128,64]'");
    let wandb = command_of("method: grid\nprogram: t.py\nparameters: {h: {values: [[128, 64]]}}\n", 0);
    // W&B passes Python's str() of a list: `[128, 64]`.
    assert_eq!(wandb, "/usr/bin/env python t.py '--h=[128, 64]'");
}

#[test]
fn wandb_macros_respect_the_quote_context() {
    let yaml = "method: grid\nprogram: t.py\ncommand: printf '%s\\n' \"${args}\" '${args_json}'\n\
                parameters: {a: {values: [\"it's $(x)\"]}}\n";
    let command = command_of(yaml, 0);
    assert_eq!(shell_output(&command), "--a=it's $(x)\n{\"a\": \"it's $(x)\"}\n", "{command}");
}

#[test]
fn config_and_sweep_references_work_in_every_context() {
    let command = command_of("command: cat {config} \"{config}\" '{config}'\n", 0);
    assert_eq!(command, "cat \"$APP_CONFIG\" \"${APP_CONFIG}\" ''\"$APP_CONFIG\"''");
}

// --- 7. Validation ------------------------------------------------------------------------

fn wandb_random(parameter: &str) -> String {
    format!("method: random\nrun_cap: 3\nprogram: x\nparameters:\n  p: {parameter}\n")
}

#[test]
fn distributions_whose_draws_overflow_are_refused() {
    let cases = [
        ("{distribution: uniform, min: -1e308, max: 1e308}", "parameters.p.max"),
        ("{distribution: q_uniform, min: 0, max: 1e300, q: 1e-300}", "parameters.p.q"),
        ("{distribution: normal, mu: 1.7e308, sigma: 1e307}", "parameters.p.sigma"),
        ("{distribution: normal, mu: 0, sigma: 1e307}", "parameters.p.sigma"),
        ("{distribution: log_normal, mu: 0, sigma: 100}", "parameters.p.sigma"),
        ("{distribution: q_normal, mu: 0, sigma: 1, q: 1e-320}", "parameters.p.q"),
        ("{distribution: q_log_uniform_values, min: 1e-300, max: 1e300, q: 1e-300}", "parameters.p.q"),
    ];
    for (parameter, expected) in cases {
        let (path, message) = invalid(parse(&wandb_random(parameter)));
        assert_eq!(path, expected, "{parameter}: {message}");
    }
    for fine in [
        "{distribution: uniform, min: -1e300, max: 1e300}",
        "{distribution: normal, mu: 3, sigma: 2}",
        "{distribution: log_normal, mu: 0, sigma: 2}",
        "{distribution: q_log_uniform_values, min: 1, max: 1000, q: 1}",
    ] {
        let sweep = parse(&wandb_random(fine)).unwrap_or_else(|error| panic!("{fine}: {error}"));
        assert!(sweep.jobs().all(|job| !job.params.contains("null")), "{fine}");
    }
}

#[test]
fn integers_too_large_name_their_key() {
    let (path, message) = invalid(parse("command: x\ngrid:\n  seed: [1, 99999999999999999999999999]\n"));
    assert_eq!(path, "grid.seed.1");
    assert!(message.contains("99999999999999999999999999"), "{message}");
    let (path, _) = invalid(parse("method: grid\nprogram: x\nseed: -99999999999999999999999999\nparameters: {}\n"));
    assert_eq!(path, "seed");
}

#[test]
fn grid_must_be_a_mapping_or_nothing() {
    assert_eq!(parse("command: x\ngrid:\n").unwrap().count(), 1);
    assert_eq!(parse("command: x\ngrid: null\n").unwrap().count(), 1);
    assert_eq!(invalid(parse("command: x\ngrid: []\n")).0, "grid");
}

#[test]
fn gpu_memory_beyond_any_gpu_is_refused() {
    for memory in ["9223372036854775807", "16000000TB", "5000000TiB", "20000000TB"] {
        let (path, message) = invalid(parse(&format!("command: x\nresources: {{gpu_memory: {memory}}}\n")));
        assert_eq!(path, "resources.gpu_memory", "{memory}");
        assert!(message.contains("larger than any GPU") || message.contains("too large"), "{memory}: {message}");
    }
    let fine = parse("command: x\nresources: {gpu_memory: 80GiB}\n").unwrap();
    assert_eq!(fine.resources.gpu_memory, Some(80 << 30));
}

// --- 8. Unknown placeholders --------------------------------------------------------------

#[test]
fn unknown_placeholders_are_refused_with_the_parameter_names() {
    let (path, message) = invalid(parse("command: run --lr {lr} --typo {lrr}\ngrid: {lr: [1], batch_size: [2]}\n"));
    assert_eq!(path, "command");
    assert!(message.contains("unknown placeholder `{lrr}`"), "{message}");
    assert!(message.contains("lr, batch_size"), "{message}");
    let cvlab = Sweep::parse(
        "optim: {lr: [1, 2]}\n",
        &ExpandOptions { max_jobs: 10, command: Some("python x.py {optim.lrr}".into()), ..ExpandOptions::default() },
    );
    assert_eq!(invalid(cvlab).0, "command");
}

#[test]
fn braces_that_are_not_placeholders_stay() {
    let command = command_of(
        "command: >-\n  awk '{print $1}' ${HOME} ${lrr} '{lrr}' {1..3} {a,b} '{\"k\": 1}' {} {x y} {lr}\ngrid: {lr: [5]}\n",
        0,
    );
    assert_eq!(command, "awk '{print $1}' ${HOME} ${lrr} '{lrr}' {1..3} {a,b} '{\"k\": 1}' {} {x y} 5");
}

#[test]
fn quickstart_still_expands() {
    let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/quickstart.yaml")).unwrap();
    let sweep = parse(&yaml).unwrap();
    assert_eq!(sweep.count(), 6);
    let command = sweep.job(0).unwrap().command;
    assert!(command.contains("print 1 / (0.1 * 1000 + 2)"), "{command}");
    assert!(command.starts_with("echo \"lr=0.1 layers=2\""), "{command}");
}

#[test]
fn every_example_config_parses() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|ext| ext == "yaml") {
            let yaml = std::fs::read_to_string(&path).unwrap();
            let sweep = parse(&yaml).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
            let expected = yaml.lines().find_map(|line| line.strip_prefix("# jobs: ")).map(|n| n.parse().unwrap());
            assert_eq!(Some(sweep.count()), expected, "{}", path.display());
        }
    }
}
