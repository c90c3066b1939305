//! `app-bench` runs, small: the benchmarks are not in the shipped binary any more, so this is
//! what keeps them from rotting unnoticed. It checks that they run and measure, not how fast.

use std::process::Command;

fn bench(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_app-bench")).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "app-bench {args:?}: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    stdout
}

#[test]
fn the_queue_benchmark_submits_claims_and_finishes_against_its_own_server() {
    let args = ["--grid-jobs", "300", "--batches", "0", "--rounds", "0", "--seconds", "1", "--samples", "3"];
    let out = bench(&[&["queue", "--workers", "4"], &args[..]].concat());
    assert!(out.contains("300-job grid: server side"), "{out}");
    let cycles = out
        .lines()
        .find_map(|line| line.split("over 1 s: ").nth(1)?.split(' ').next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no claim+finish line: {out}"));
    assert!(cycles > 0, "{out}");
    assert!(out.contains("dispatch latency over"), "{out}");
}

#[test]
fn hostile_sweep_files_are_refused_with_a_reason() {
    let out = bench(&["search", "--hostile"]);
    assert!(out.contains("more than 64 lev") && out.contains("more than 200000 YAML nodes"), "{out}");
}
