//! Tests of the per-job accounting: shares, memory, GPU time, the idle flag and the timeline.

use super::*;

const GIB: u64 = 1 << 30;

fn attempt(job: i64) -> JobAttempt {
    JobAttempt { job_id: job.into(), attempt: 1 }
}

fn gpu(index: u32, utilization: u32, used: u64) -> GpuSample {
    GpuSample {
        index,
        uuid: format!("GPU-{index}"),
        name: "g".into(),
        memory_total: 80 * GIB,
        memory_used: used,
        utilization: Some(utilization),
        temperature: None,
        power_watts: None,
        at: 0,
    }
}

fn process(gpu: u32, memory: u64, job: Option<i64>) -> Attributed {
    Attributed { gpu, memory: Some(memory), attempt: job.map(attempt) }
}

#[test]
fn a_gpu_shared_by_two_jobs_splits_its_utilisation_and_its_hours() {
    let mut accounting = Accounting::default();
    accounting.begin(attempt(1), &[0], 0);
    accounting.begin(attempt(2), &[0], 0);
    // One hour at 80% busy, each job's processes holding its own memory.
    let processes = [process(0, 3 * GIB, Some(1)), process(0, 5 * GIB, Some(2)), process(0, GIB, None)];
    accounting.record(3_600_000, &[gpu(0, 80, 9 * GIB)], &processes);
    let first = accounting.end(attempt(1), 3_600_000).unwrap();
    assert_eq!(first.usage.utilization_mean, Some(40.0));
    assert_eq!(first.usage.memory_peak, Some(3 * GIB));
    assert!((first.usage.gpu_hours - 0.5).abs() < 1e-9, "{}", first.usage.gpu_hours);
    // Alone from then on: the second half hour counts whole.
    accounting.record(5_400_000, &[gpu(0, 80, 5 * GIB)], &processes[1..2]);
    let second = accounting.end(attempt(2), 5_400_000).unwrap();
    assert_eq!(second.usage.utilization_mean, Some(60.0));
    assert_eq!(second.usage.utilization_p95, Some(80.0));
    assert!((second.usage.gpu_hours - 1.0).abs() < 1e-9, "{}", second.usage.gpu_hours);
    assert_eq!(second.usage.samples, 2);
}

#[test]
fn memory_sums_over_gpus_and_falls_back_to_the_gpu_where_nvml_lists_no_process() {
    let mut accounting = Accounting::default();
    accounting.begin(attempt(1), &[0, 1], 0);
    // GPU 0 lists the job's two ranks; GPU 1 lists nothing (as in a container).
    let processes = [process(0, 2 * GIB, Some(1)), process(0, GIB, Some(1))];
    accounting.record(1_000, &[gpu(0, 90, 3 * GIB), gpu(1, 70, 4 * GIB)], &processes);
    accounting.record(2_000, &[gpu(0, 90, GIB), gpu(1, 70, GIB)], &[]);
    let ended = accounting.end(attempt(1), 2_000).unwrap();
    assert_eq!(ended.usage.memory_peak, Some(7 * GIB));
    assert_eq!(ended.usage.utilization_mean, Some(80.0));
    assert!((ended.usage.gpu_hours - 2.0 * 2_000.0 / 3_600_000.0).abs() < 1e-12);
    assert_eq!(ended.note, None);
}

#[test]
fn a_gpu_mostly_idle_over_enough_readings_is_flagged() {
    let mut accounting = Accounting::default();
    accounting.begin(attempt(1), &[0, 1], 0);
    for second in 1..=MIN_READINGS_FOR_IDLE as i64 {
        accounting.record(second * 1000, &[gpu(0, 12, GIB), gpu(1, 95, GIB)], &[]);
    }
    let ended = accounting.end(attempt(1), 6_000).unwrap();
    assert_eq!(ended.usage.idle_gpus, vec![0]);
    let note = ended.note.unwrap();
    assert!(note.starts_with("GPU mostly idle: input-bound? GPU 0 averaged 12% busy"), "{note}");
    // Too few readings say nothing.
    accounting.begin(attempt(2), &[0], 0);
    accounting.record(1_000, &[gpu(0, 3, 0)], &[]);
    assert!(accounting.end(attempt(2), 1_000).unwrap().usage.idle_gpus.is_empty());
}

#[test]
fn cpu_jobs_and_unknown_attempts_have_no_account() {
    let mut accounting = Accounting::default();
    accounting.begin(attempt(1), &[], 0);
    assert!(!accounting.is_active());
    assert_eq!(accounting.end(attempt(1), 10), None);
    // A job ended without any reading is charged its GPUs for its wall time.
    accounting.begin(attempt(2), &[3], 0);
    let ended = accounting.end(attempt(2), 1_800_000).unwrap();
    assert_eq!((ended.usage.samples, ended.usage.utilization_mean, ended.usage.memory_peak), (0, None, None));
    assert!((ended.usage.gpu_hours - 0.5).abs() < 1e-9);
}

#[test]
fn a_long_run_keeps_a_bounded_timeline() {
    let mut accounting = Accounting::default();
    accounting.begin(attempt(1), &[0], 0);
    for second in 1..=5_000i64 {
        accounting.record(second * 1000, &[gpu(0, (second % 100) as u32, second as u64)], &[]);
    }
    let ended = accounting.end(attempt(1), 5_000_000).unwrap();
    assert!(ended.timeline.len() <= MAX_POINTS && ended.timeline.len() > MAX_POINTS / 4, "{}", ended.timeline.len());
    assert_eq!(ended.usage.samples, 5_000);
    // Merged points keep the first time and the most memory.
    assert_eq!(ended.timeline[0].at, 1_000);
    assert_eq!(ended.timeline.last().unwrap().memory, Some(5_000));
    assert!(ended.timeline.windows(2).all(|pair| pair[0].at < pair[1].at));
}

#[test]
fn percentiles_take_the_nearest_rank() {
    let values: Vec<f64> = (1..=20).map(f64::from).collect();
    assert_eq!(percentile(&values, 0.95), Some(19.0));
    assert_eq!(percentile(&[7.0], 0.95), Some(7.0));
    assert_eq!(percentile(&[], 0.95), None);
}
