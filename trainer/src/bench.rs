//! The pure half of `app bench`: one result row per (batch size, precision) setting, the
//! precisions, the model's FLOPs, the recommendation, and the largest-batch search. The
//! measuring is in `torch::bench`.

use crate::config::{config_error, Amp, ConfigError, ModelConfig, ModelName};
use serde::{Deserialize, Serialize};

/// The numeric precision of a bench setting: fp32 with TF32 off or on, or autocast.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Fp32,
    Tf32,
    Bf16,
    Fp16,
}

impl Precision {
    pub fn parse(text: &str) -> Result<Precision, ConfigError> {
        match text.trim() {
            "fp32" | "off" | "none" => Ok(Precision::Fp32),
            "tf32" => Ok(Precision::Tf32),
            "bf16" => Ok(Precision::Bf16),
            "fp16" => Ok(Precision::Fp16),
            other => Err(config_error(
                "--amp",
                format!("unknown precision `{other}`, expected fp32 (or off), tf32, bf16 or fp16"),
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }

    pub fn amp(self) -> Amp {
        match self {
            Precision::Fp32 | Precision::Tf32 => Amp::Off,
            Precision::Bf16 => Amp::Bf16,
            Precision::Fp16 => Amp::Fp16,
        }
    }

    /// TF32 for the fp32 matmuls: on for `tf32`, off for `fp32`, the config's under autocast.
    pub fn tf32(self, configured: bool) -> bool {
        match self {
            Precision::Fp32 => false,
            Precision::Tf32 => true,
            Precision::Bf16 | Precision::Fp16 => configured,
        }
    }
}

/// Floating-point operations of one training step per sample, counted from the layer shapes:
/// a forward pass is 2 FLOPs per multiply-add of the linear and convolution layers, and the
/// backward pass twice the forward (gradients of inputs and of weights). Activations, norms and
/// the optimizer are left out, as model-FLOP utilisation usually counts.
pub fn train_flops_per_sample(model: &ModelConfig, sample_shape: &[i64], outputs: i64) -> f64 {
    let mut multiply_adds = 0.0;
    let mut width: f64 = sample_shape.iter().product::<i64>() as f64;
    if model.name == ModelName::Cnn {
        let (mut channels, mut height, mut image_width) = match *sample_shape {
            [c, h, w] => (c as f64, h as f64, w as f64),
            [h, w] => (1.0, h as f64, w as f64),
            _ => (1.0, 1.0, width),
        };
        for &out in &model.channels {
            multiply_adds += 9.0 * channels * out as f64 * height * image_width;
            if height >= 2.0 && image_width >= 2.0 {
                height = (height / 2.0).floor();
                image_width = (image_width / 2.0).floor();
            }
            channels = out as f64;
        }
        width = channels * height * image_width;
    }
    for &hidden in &model.hidden_dims {
        multiply_adds += width * hidden as f64;
        width = hidden as f64;
    }
    multiply_adds += width * outputs as f64;
    3.0 * 2.0 * multiply_adds
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRow {
    pub batch_size: usize,
    /// The precision: `fp32`, `tf32`, `bf16` or `fp16`.
    pub amp: String,
    /// Whether TF32 was on for fp32 matmuls.
    pub tf32: bool,
    /// `ok`, `oom` (with `error` saying what ran out) or `unsupported` (a precision this
    /// device lacks, or a batch the model cannot take; `error` says why).
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
    /// On a CPU: the process's mean CPU use over its intra-op threads, in percent.
    pub cpu_utilization: Option<f64>,
    /// Model FLOPs per second achieved (`train_flops_per_sample` x samples/s), in TFLOP/s.
    pub tflops: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchStatus {
    Ok,
    Oom,
    Unsupported,
}

impl BenchRow {
    pub fn oom(batch_size: usize, amp: &str, error: String) -> BenchRow {
        BenchRow {
            batch_size,
            amp: amp.to_string(),
            tf32: false,
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
            cpu_utilization: None,
            tflops: None,
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
    fn flops_are_counted_from_the_layer_shapes() {
        // The GPU check's MLP: 4 x 4096 over 4096 features, 10 classes.
        let model = ModelConfig { hidden_dims: vec![4096; 4], ..ModelConfig::default() };
        let multiply_adds = 4096.0 * 4096.0 * 4.0 + 4096.0 * 10.0;
        assert_eq!(train_flops_per_sample(&model, &[4096], 10), 6.0 * multiply_adds);
        let cnn =
            ModelConfig { name: ModelName::Cnn, channels: vec![8], hidden_dims: vec![16], ..ModelConfig::default() };
        // A 3x3 convolution 1 -> 8 channels on 8x8, pooled to 4x4x8 = 128, then 128 -> 16 -> 3.
        let expected = 6.0 * (9.0 * 8.0 * 64.0 + 128.0 * 16.0 + 16.0 * 3.0);
        assert_eq!(train_flops_per_sample(&cnn, &[1, 8, 8], 3), expected);
    }

    #[test]
    fn precisions_parse_and_say_what_they_turn_on() {
        assert_eq!(Precision::parse("off").unwrap(), Precision::Fp32);
        assert_eq!(Precision::parse("tf32").unwrap().amp(), Amp::Off);
        assert!(Precision::Tf32.tf32(false) && !Precision::Fp32.tf32(true) && Precision::Bf16.tf32(true));
        assert_eq!(Precision::parse("fp8").unwrap_err().key, "--amp");
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
