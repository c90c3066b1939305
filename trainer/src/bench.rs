//! The pure half of `app bench`: one result row per (batch size, amp) setting, the
//! recommendation, and the largest-batch search. The measuring is in `torch::bench`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    pub batch_size: usize,
    pub amp: String,
    /// `ok`, or `oom` (with `error` saying what ran out).
    pub status: BenchStatus,
    pub error: Option<String>,
    /// Medians over the measured steps, in milliseconds.
    pub data_ms: f64,
    pub forward_ms: f64,
    pub backward_ms: f64,
    pub optimizer_ms: f64,
    pub step_ms: f64,
    pub samples_per_s: f64,
    /// Peak memory of the setting: bytes allocated on the GPU, or the process's peak resident
    /// set on a CPU.
    pub peak_memory_bytes: Option<u64>,
    /// Mean GPU utilisation (NVML) while it ran, in percent.
    pub gpu_utilization: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchStatus {
    Ok,
    Oom,
}

impl BenchRow {
    pub fn oom(batch_size: usize, amp: &str, error: String) -> BenchRow {
        BenchRow {
            batch_size,
            amp: amp.to_string(),
            status: BenchStatus::Oom,
            error: Some(error),
            data_ms: f64::NAN,
            forward_ms: f64::NAN,
            backward_ms: f64::NAN,
            optimizer_ms: f64::NAN,
            step_ms: f64::NAN,
            samples_per_s: 0.0,
            peak_memory_bytes: None,
            gpu_utilization: None,
        }
    }
}

/// The index of the row with the highest throughput whose peak memory stays within
/// `safety * capacity` (when both are known); OOM rows never win.
pub fn recommend(rows: &[BenchRow], capacity_bytes: Option<u64>, safety: f64) -> Option<usize> {
    let fits = |row: &BenchRow| match (row.peak_memory_bytes, capacity_bytes) {
        (Some(peak), Some(capacity)) => peak as f64 <= safety * capacity as f64,
        _ => true,
    };
    rows.iter()
        .enumerate()
        .filter(|(_, row)| row.status == BenchStatus::Ok && row.samples_per_s.is_finite() && fits(row))
        .max_by(|(_, a), (_, b)| a.samples_per_s.total_cmp(&b.samples_per_s))
        .map(|(index, _)| index)
}

/// The largest batch size in `1..=max` for which `fits` holds, assuming it holds for every
/// size below one that fits: doubling from `start` until a size fails (or `max`), then a binary
/// search between the last fit and the first failure, to within `granularity` samples.
/// `None` when not even 1 fits. Every probe is one call to `fits`.
pub fn largest_fitting_batch(
    start: usize,
    max: usize,
    granularity: usize,
    mut fits: impl FnMut(usize) -> bool,
) -> Option<usize> {
    let granularity = granularity.max(1);
    let max = max.max(1);
    let mut candidate = start.clamp(1, max);
    let (mut good, mut bad) = if fits(candidate) {
        loop {
            if candidate == max {
                return Some(max);
            }
            let next = (candidate * 2).min(max);
            if fits(next) {
                candidate = next;
            } else {
                break (candidate, next);
            }
        }
    } else {
        // Halve until something fits, then search upwards from there.
        loop {
            if candidate == 1 {
                return None;
            }
            let next = candidate / 2;
            if fits(next) {
                break (next, candidate);
            }
            candidate = next;
        }
    };
    while bad - good > granularity {
        let middle = good + (bad - good) / 2;
        if fits(middle) {
            good = middle;
        } else {
            bad = middle;
        }
    }
    Some(good)
}

pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    }
}

/// `1.5 GiB`-style sizes for the table.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(batch_size: usize, samples_per_s: f64, peak: Option<u64>) -> BenchRow {
        BenchRow {
            status: BenchStatus::Ok,
            error: None,
            samples_per_s,
            peak_memory_bytes: peak,
            ..BenchRow::oom(batch_size, "off", String::new())
        }
    }

    #[test]
    fn recommends_the_fastest_setting_within_the_memory_safety_factor() {
        let rows = vec![
            row(256, 1000.0, Some(10)),
            row(1024, 3000.0, Some(80)),
            row(4096, 5000.0, Some(95)),
            BenchRow::oom(8192, "off", "out of memory".into()),
        ];
        assert_eq!(recommend(&rows, Some(100), 0.9), Some(1));
        assert_eq!(recommend(&rows, Some(100), 1.0), Some(2));
        assert_eq!(recommend(&rows, None, 0.9), Some(2), "no capacity known: throughput alone");
        assert_eq!(recommend(&rows[3..], Some(100), 0.9), None);
    }

    #[test]
    fn the_search_finds_the_largest_fitting_batch_with_few_probes() {
        for limit in [1, 2, 3, 100, 1000, 4096, 5000, 65_535] {
            let mut probes = 0;
            let found = largest_fitting_batch(64, 1 << 20, 1, |batch| {
                probes += 1;
                batch <= limit
            });
            assert_eq!(found, Some(limit), "limit {limit}");
            assert!(probes <= 40, "{probes} probes for {limit}");
        }
    }

    #[test]
    fn the_search_stops_at_max_and_reports_nothing_when_even_one_fails() {
        assert_eq!(largest_fitting_batch(64, 500, 1, |_| true), Some(500));
        assert_eq!(largest_fitting_batch(64, 500, 1, |_| false), None);
        let found = largest_fitting_batch(256, 1 << 20, 64, |batch| batch <= 10_000).unwrap();
        assert!(found <= 10_000 && found > 10_000 - 64, "{found}");
    }

    proptest::proptest! {
        #[test]
        fn the_search_is_exact_for_any_limit_and_start(limit in 1usize..100_000, start in 1usize..5000) {
            proptest::prop_assert_eq!(largest_fitting_batch(start, 1 << 20, 1, |batch| batch <= limit), Some(limit));
        }
    }

    #[test]
    fn medians_and_sizes() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&mut []).is_nan());
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
    }
}
