//! The bench: out-of-memory settings become rows, the batch-size search, and a panic inside a
//! step while the utilisation sampler runs.

use super::config;
use std::sync::mpsc;
use std::time::Duration;
use trainer::bench::{BenchStatus, Precision};
use trainer::torch::bench::{Bench, BenchOptions};

#[test]
fn bench_marks_out_of_memory_settings_and_goes_on() {
    let config = config("data: {samples: 512, features: 8}\nmodel: {hidden_dims: [16]}\ndevice: cpu\n");
    let options = BenchOptions { steps: 3, warmup: 1, memory_limit: None };
    let bench = Bench::new(&config, options.clone()).unwrap();
    let absurd = bench.measure(1 << 40, Precision::Fp32).unwrap();
    assert_eq!(absurd.status, BenchStatus::Oom, "{absurd:?}");
    let fine = bench.measure(64, Precision::Fp32).unwrap();
    assert_eq!(fine.status, BenchStatus::Ok, "{fine:?}");
    assert!(fine.samples_per_s > 0.0 && fine.step_ms > 0.0 && fine.forward_ms >= 0.0);
    assert!(fine.peak_memory_bytes.unwrap() > 1 << 20);
    assert!(fine.tflops.unwrap() > 0.0);
    for (precision, why) in
        [(Precision::Fp16, "fp16 needs a CUDA device"), (Precision::Tf32, "tf32 needs a CUDA device")]
    {
        let row = bench.measure(64, precision).unwrap();
        assert_eq!(row.status, BenchStatus::Unsupported);
        assert!(row.error.unwrap().contains(why));
    }

    // A memory cap below what any setting needs: every setting is out of memory.
    let capped = Bench::new(&config, BenchOptions { memory_limit: Some(1 << 20), ..options }).unwrap();
    let row = capped.measure(64, Precision::Fp32).unwrap();
    assert_eq!(row.status, BenchStatus::Oom);
    assert!(row.error.unwrap().contains("over the limit"));
    let (largest, probes) = capped.auto_batch_size(Precision::Fp32, 1024, 0.9).unwrap();
    assert_eq!(largest, None);
    assert!(!probes.is_empty());
}

#[test]
fn a_panic_inside_a_step_with_the_sampler_running_ends_the_setting() {
    // The forward pass of a 2^20-wide layer on 2^20 rows needs 4 TiB: the allocation fails
    // inside the first step, after the sampler thread has started (on a CPU it samples the
    // process's CPU time). Before the stop flag was set by a guard, this never returned.
    let config = config("data: {samples: 64, features: 8}\nmodel: {hidden_dims: [1048576]}\ndevice: cpu\n");
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let bench = Bench::new(&config, BenchOptions { steps: 2, warmup: 1, memory_limit: None }).unwrap();
        let _ = sender.send(bench.measure(1 << 20, Precision::Fp32).map_err(|error| error.to_string()));
    });
    let row = receiver.recv_timeout(Duration::from_secs(120)).expect("the bench returned").unwrap();
    assert_eq!(row.status, BenchStatus::Oom, "{row:?}");
    assert!(row.error.as_deref().unwrap_or("").contains("allocate"), "{row:?}");
}

#[test]
fn cpu_settings_report_cpu_use() {
    // Steps of some 50 ms each, so the measured phase spans many 50 ms samples.
    let config =
        config("data: {samples: 2048, features: 64}\nmodel: {hidden_dims: [1024, 1024]}\ndevice: cpu\nthreads: 1\n");
    let bench = Bench::new(&config, BenchOptions { steps: 20, warmup: 2, memory_limit: None }).unwrap();
    let row = bench.measure(1024, Precision::Fp32).unwrap();
    assert!(row.step_ms * 20.0 > 250.0, "long enough to sample: {row:?}");
    let use_percent = row.cpu_utilization.expect("sampled");
    assert!(use_percent > 10.0 && use_percent < 150.0, "{row:?}");
    assert!(row.gpu_utilization.is_none());
}

#[test]
fn auto_batch_size_finds_the_largest_batch_under_the_cap() {
    // The cap is between the measured peaks of batch 32 and 4096: the search must land between.
    let config = config(
        "data: {samples: 2048, features: 512}\nmodel: {hidden_dims: [1024, 1024]}\ndevice: cpu\nbatch_size: 32\n",
    );
    let options = BenchOptions { steps: 1, warmup: 1, memory_limit: None };
    let probe = Bench::new(&config, options.clone()).unwrap();
    let small = probe.measure(32, Precision::Fp32).unwrap().peak_memory_bytes.unwrap();
    let big = probe.measure(4096, Precision::Fp32).unwrap().peak_memory_bytes.unwrap();
    assert!(big > small + (32 << 20), "a big batch needs visibly more memory: {small} vs {big}");
    let limit = small + (big - small) / 2;
    let capped = Bench::new(&config, BenchOptions { memory_limit: Some(limit), ..options }).unwrap();
    let (largest, probes) = capped.auto_batch_size(Precision::Fp32, 1 << 14, 1.0).unwrap();
    let largest = largest.unwrap();
    assert!(largest > 32 && largest < 4096, "{largest}");
    // The answer is a batch the search saw fit, and it saw a larger one not fit. (A CPU peak
    // is the process's resident set, which keeps some freed memory: a fresh measurement of a
    // smaller batch after the search can read higher than the search did, so only the search's
    // own probes are compared, and well outside the cap.)
    let status = |batch: usize| probes.iter().find(|row| row.batch_size == batch).map(|row| row.status);
    assert_eq!(status(largest), Some(BenchStatus::Ok), "{probes:?}");
    assert!(probes.iter().any(|row| row.batch_size > largest && row.status == BenchStatus::Oom), "{probes:?}");
    assert_eq!(capped.measure((largest * 2).min(4096), Precision::Fp32).unwrap().status, BenchStatus::Oom);
}
