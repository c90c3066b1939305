//! The metric as the GP sees it: a Yeo-Johnson power transform, its λ the one under which the
//! transformed metrics look most like a normal sample (as HEBO warps its outputs, and as
//! scikit-learn's `PowerTransformer` fits λ). A metric whose bad runs are far worse than its
//! good ones differ (a loss that explodes in a corner of the space) is compressed there, so
//! that the GP, whose prior is smooth and normal, is not fitted to a few huge values at the
//! cost of the differences among the good runs. The order of the runs is kept: the transform
//! is increasing.

/// λ is searched on this grid (the likelihood is smooth in λ; a grid keeps it deterministic).
const LAMBDAS: (f64, f64, usize) = (-2.0, 3.0, 100);
/// The likelihood of λ is computed on at most this many metrics (an even spread of them).
const LIKELIHOOD_POINTS: usize = 1000;

/// The Yeo-Johnson transform of `value` with `lambda`: `((y + 1)^λ - 1) / λ` for `y ≥ 0`,
/// `-((1 - y)^(2-λ) - 1) / (2 - λ)` below, and their logarithmic limits.
fn yeo_johnson(value: f64, lambda: f64) -> f64 {
    if value >= 0.0 {
        match lambda.abs() < 1e-9 {
            true => value.ln_1p(),
            false => ((value + 1.0).powf(lambda) - 1.0) / lambda,
        }
    } else {
        match (lambda - 2.0).abs() < 1e-9 {
            true => -(-value).ln_1p(),
            false => -((1.0 - value).powf(2.0 - lambda) - 1.0) / (2.0 - lambda),
        }
    }
}

/// The log likelihood of `lambda` for `values`: of a normal sample after the transform, with
/// the transform's Jacobian (up to a constant).
fn log_likelihood(values: &[f64], lambda: f64) -> f64 {
    let transformed: Vec<f64> = values.iter().map(|value| yeo_johnson(*value, lambda)).collect();
    let variance = spread(&transformed).powi(2);
    let jacobian: f64 = values.iter().map(|value| value.signum() * value.abs().ln_1p()).sum();
    -0.5 * values.len() as f64 * variance.ln() + (lambda - 1.0) * jacobian
}

/// The population standard deviation.
fn spread(values: &[f64]) -> f64 {
    let count = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / count;
    (values.iter().map(|value| (value - mean).powi(2)).sum::<f64>() / count).sqrt()
}

/// `values` (finite) warped: divided by their standard deviation, then transformed by the λ of
/// largest likelihood. Unchanged when they are all alike or the transform overflows.
pub(crate) fn warp(values: &[f64]) -> Vec<f64> {
    let scale = spread(values);
    if !(scale > 1e-12 && scale.is_finite()) {
        return values.to_vec();
    }
    let scaled: Vec<f64> = values.iter().map(|value| value / scale).collect();
    let sample: Vec<f64> = match scaled.len() > LIKELIHOOD_POINTS {
        true => (0..LIKELIHOOD_POINTS).map(|k| scaled[k * scaled.len() / LIKELIHOOD_POINTS]).collect(),
        false => scaled.clone(),
    };
    let (low, high, steps) = LAMBDAS;
    let lambda = (0..=steps)
        .map(|k| low + (high - low) * k as f64 / steps as f64)
        .map(|lambda| (lambda, log_likelihood(&sample, lambda)))
        .filter(|(_, likelihood)| likelihood.is_finite())
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(1.0, |(lambda, _)| lambda);
    let warped: Vec<f64> = scaled.iter().map(|value| yeo_johnson(*value, lambda)).collect();
    match warped.iter().all(|value| value.is_finite()) {
        true => warped,
        false => values.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_transform_is_increasing_and_continuous_at_its_branches() {
        for lambda in [-2.0, -0.5, 0.0, 1e-10, 0.5, 1.0, 2.0, 2.0 - 1e-10, 3.0] {
            let values: Vec<f64> = (-400..=400).map(|k| k as f64 / 40.0).collect();
            let warped: Vec<f64> = values.iter().map(|value| yeo_johnson(*value, lambda)).collect();
            assert!(warped.windows(2).all(|pair| pair[1] > pair[0]), "λ = {lambda}");
            assert!(yeo_johnson(1e-12, lambda).abs() < 1e-9 && yeo_johnson(-1e-12, lambda).abs() < 1e-9);
        }
        // λ = 1 is the identity.
        assert!((yeo_johnson(3.5, 1.0) - 3.5).abs() < 1e-12 && (yeo_johnson(-3.5, 1.0) + 3.5).abs() < 1e-12);
    }

    #[test]
    fn a_metric_with_a_long_tail_of_bad_runs_is_compressed_there_and_a_normal_one_is_not() {
        // Losses like Rosenbrock's: most runs small, a few enormous.
        let losses: Vec<f64> = (1..=60).map(|k| (k as f64 / 6.0).powi(5)).collect();
        let warped = warp(&losses);
        let order = |values: &[f64]| {
            let mut order: Vec<usize> = (0..values.len()).collect();
            order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
            order
        };
        assert_eq!(order(&warped), order(&losses), "the order of the runs is kept");
        // The worst run is far less of an outlier after the warp.
        let outlier = |values: &[f64]| {
            let mean = values.iter().sum::<f64>() / values.len() as f64;
            (values.iter().cloned().fold(f64::MIN, f64::max) - mean) / spread(values)
        };
        assert!(outlier(&losses) > 3.0 && outlier(&warped) < 2.5, "{} {}", outlier(&losses), outlier(&warped));
        // An evenly spread metric is left nearly linear: its λ is near 1.
        let even: Vec<f64> = (0..60).map(|k| k as f64 / 10.0 - 3.0).collect();
        let warped = warp(&even);
        let scale = spread(&even);
        let linear = warped.iter().zip(&even).all(|(warped, value)| (warped - value / scale).abs() < 0.5);
        assert!(linear, "{warped:?}");
    }

    #[test]
    fn alike_or_single_metrics_are_left_as_they_are() {
        assert_eq!(warp(&[2.0; 5]), vec![2.0; 5]);
        assert_eq!(warp(&[7.0]), vec![7.0]);
        assert_eq!(warp(&[]), Vec::<f64>::new());
        let huge = warp(&[1e300, -1e300, 0.0, 5.0]);
        assert!(huge.iter().all(|value| value.is_finite()));
    }
}
