//! The metric as the GP sees it: a Yeo-Johnson power transform, its λ the one under which the
//! transformed metrics look most like a normal sample (the largest likelihood on a grid of λ),
//! as HEBO warps its outputs. A metric whose bad runs are far worse than its good ones differ
//! (a loss that explodes in a corner of the space) is compressed there, so that the GP, whose
//! prior is smooth and normal, is not fitted to a few huge values at the cost of the
//! differences among the good runs. The transform is increasing: a better run stays better.
//!
//! The metrics are divided by their standard deviation first, keeping 0 where it is: whether a
//! loss is near 0 or a reward crosses it is part of its shape. A metric far from 0 for its
//! spread (a negative log-likelihood summed over a dataset) is centred on its median first:
//! there every λ is nearly affine and would only lose digits.
//!
//! A positive metric whose random start spans decades ([`spans_decades`]: a loss that is 10 in
//! good runs and 1e4 in bad ones) is Box-Cox transformed instead, which can reach the
//! logarithm: its differences are relative, and Yeo-Johnson, log-like only far from 0, would
//! flatten the good runs' (decision 0091). A metric of one order of magnitude (Branin's
//! valleys) keeps Yeo-Johnson, whose sharper log near 0 would make it all peaks. The random
//! start decides, not every run: a loss that the search drives towards 0 comes to span decades
//! because it converges, and its logarithm, a funnel, would make the GP explore (decision 0090).

/// λ is searched on this grid (the likelihood is smooth in λ; a grid keeps it deterministic).
const LAMBDAS: (f64, f64, usize) = (-2.0, 3.0, 100);
/// The likelihood of λ is computed on at most this many metrics (an even spread of them).
const LIKELIHOOD_POINTS: usize = 1000;
/// A metric whose median is more standard deviations from 0 than this is centred first.
const FAR_FROM_ZERO: f64 = 10.0;
/// A positive metric whose upper quartile is more than 10 to this power times its lower one is
/// Box-Cox transformed.
const BOX_COX_DECADES: f64 = 1.5;

/// The Yeo-Johnson transform of `value` with `lambda`: `((y + 1)^λ - 1) / λ` for `y ≥ 0`,
/// `-((1 - y)^(2-λ) - 1) / (2 - λ)` below, and their logarithmic limits (written with
/// `ln_1p` and `exp_m1`, exact near 0).
fn yeo_johnson(value: f64, lambda: f64) -> f64 {
    let power = |magnitude: f64, exponent: f64| match exponent.abs() < 1e-9 {
        true => magnitude.ln_1p(),
        false => (exponent * magnitude.ln_1p()).exp_m1() / exponent,
    };
    match value >= 0.0 {
        true => power(value, lambda),
        false => -power(-value, 2.0 - lambda),
    }
}

/// The Box-Cox transform of `value` (> 0) with `lambda`: `(y^λ - 1) / λ`, `ln y` at 0.
fn box_cox(value: f64, lambda: f64) -> f64 {
    match lambda.abs() < 1e-9 {
        true => value.ln(),
        false => (lambda * value.ln()).exp_m1() / lambda,
    }
}

/// The log likelihood of `lambda` for `values` under `transform`: of a normal sample after the
/// transform, with the transform's Jacobian (up to a constant). `jacobian` is Σ g(y) over the
/// values, where the logarithm of the transform's slope at y is (λ - 1) g(y).
fn log_likelihood(values: &[f64], lambda: f64, transform: fn(f64, f64) -> f64, jacobian: f64) -> f64 {
    let transformed: Vec<f64> = values.iter().map(|value| transform(*value, lambda)).collect();
    let variance = spread(&transformed).powi(2);
    -0.5 * values.len() as f64 * variance.ln() + (lambda - 1.0) * jacobian
}

/// `values` transformed by the λ of the grid under which they look most like a normal sample
/// (the likelihood on at most [`LIKELIHOOD_POINTS`] of them, evenly spread), 1 if none is
/// finite. `log_slope` is g above.
fn most_normal(values: &[f64], transform: fn(f64, f64) -> f64, log_slope: fn(f64) -> f64) -> Vec<f64> {
    let sample: Vec<f64> = match values.len() > LIKELIHOOD_POINTS {
        true => (0..LIKELIHOOD_POINTS).map(|k| values[k * values.len() / LIKELIHOOD_POINTS]).collect(),
        false => values.to_vec(),
    };
    let jacobian: f64 = sample.iter().map(|value| log_slope(*value)).sum();
    let (low, high, steps) = LAMBDAS;
    let lambda = (0..=steps)
        .map(|k| low + (high - low) * k as f64 / steps as f64)
        .map(|lambda| (lambda, log_likelihood(&sample, lambda, transform, jacobian)))
        .filter(|(_, likelihood)| likelihood.is_finite())
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(1.0, |(lambda, _)| lambda);
    values.iter().map(|value| transform(*value, lambda)).collect()
}

/// Whether `values` (a sweep's random start) are positive and their upper quartile is more
/// than [`BOX_COX_DECADES`] powers of ten above their lower one: a metric compared by ratios.
pub(crate) fn spans_decades(values: &[f64]) -> bool {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let quartile = |q: usize| sorted[(sorted.len() - 1) * q / 4];
    !sorted.is_empty() && quartile(0) > 0.0 && quartile(3) > quartile(1) * 10f64.powf(BOX_COX_DECADES)
}

/// Whether `warped` orders the values as `values` do (`order` sorts `values`), no two apart
/// made equal.
fn keeps_order(values: &[f64], warped: &[f64], order: &[usize]) -> bool {
    order.windows(2).all(|pair| values[pair[0]] == values[pair[1]] || warped[pair[0]] < warped[pair[1]])
}

/// The population standard deviation.
pub(super) fn spread(values: &[f64]) -> f64 {
    let count = values.len().max(1) as f64;
    let mean = values.iter().sum::<f64>() / count;
    (values.iter().map(|value| (value - mean).powi(2)).sum::<f64>() / count).sqrt()
}

/// `values` (finite) warped: divided by their standard deviation (centred on their median when
/// it is far from 0), then Yeo-Johnson transformed by the λ of largest likelihood; `by_ratios`
/// and all positive, Box-Cox transformed instead ([`spans_decades`] tells). Unchanged when they
/// are all alike.
pub(crate) fn warp(values: &[f64], by_ratios: bool) -> Vec<f64> {
    // In units of the largest magnitude, so that no sum or square overflows (metrics near
    // f64::MAX, a failure's placeholder, are finite and may be there).
    let largest = values.iter().fold(0.0f64, |largest, value| largest.max(value.abs()));
    if !(largest > 0.0 && largest.is_finite()) {
        return values.to_vec();
    }
    let unit: Vec<f64> = values.iter().map(|value| value / largest).collect();
    let scale = spread(&unit);
    if scale.is_nan() || scale <= 1e-12 {
        return values.to_vec();
    }
    let mut order: Vec<usize> = (0..unit.len()).collect();
    order.sort_by(|&a, &b| unit[a].total_cmp(&unit[b]));
    if by_ratios && unit[order[0]] > 0.0 {
        // Box-Cox is scale-free: the metrics in units of the largest are as good as any. A λ
        // that overflows on a metric its likelihood did not sample, or one that rounds the
        // smallest metrics together, falls back to Yeo-Johnson.
        let warped = most_normal(&unit, box_cox, f64::ln);
        if warped.iter().all(|value| value.is_finite()) && keeps_order(&unit, &warped, &order) {
            return warped;
        }
    }
    let median = unit[order[order.len() / 2]];
    let centre = if median.abs() > FAR_FROM_ZERO * scale { median } else { 0.0 };
    let scaled: Vec<f64> = unit.iter().map(|value| (value - centre) / scale).collect();
    most_normal(&scaled, yeo_johnson, |value| value.signum() * value.abs().ln_1p())
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
        let warped = warp(&losses, false);
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
        let warped = warp(&even, false);
        let scale = spread(&even);
        let linear = warped.iter().zip(&even).all(|(warped, value)| (warped - value / scale).abs() < 0.5);
        assert!(linear, "{warped:?}");
    }

    #[test]
    fn a_positive_metric_over_decades_is_compared_by_ratios_and_one_over_a_decade_is_not() {
        // Where the warped values of y and 2y differ, for a metric whose runs include both.
        let gap = |values: &[f64], warped: &[f64], y: f64| {
            let at = |target: f64| warped[values.iter().position(|value| *value == target).unwrap()];
            at(2.0 * y) - at(y)
        };
        // A loss from 0.001 to 1000 (a learning rate's divergent corner): a run at 0.01 is
        // as much better than one at 0.02 as 10 is than 20, as under the logarithm.
        let mut decades: Vec<f64> = (0..60).map(|k| 10f64.powf(-3.0 + 6.0 * k as f64 / 59.0)).collect();
        decades.extend([0.01, 0.02, 10.0, 20.0]);
        let warped = warp(&decades, true);
        assert!(strictly_increasing_with(&decades, &warped));
        let ratio = gap(&decades, &warped, 0.01) / gap(&decades, &warped, 10.0);
        assert!((ratio - 1.0).abs() < 0.05, "{ratio}");
        let warped = warp(&decades, false);
        let yeo_johnson_ratio = gap(&decades, &warped, 0.01) / gap(&decades, &warped, 10.0);
        assert!(yeo_johnson_ratio < 0.5, "Yeo-Johnson flattens the good runs: {yeo_johnson_ratio}");
        // A metric of one decade (Branin's runs, 0.4 to 4 in the middle half) keeps its absolute
        // differences: 2 to 4 is still a larger step than 0.4 to 0.8.
        let mut decade: Vec<f64> = (0..60).map(|k| 0.2 + 20.0 * (k as f64 / 59.0).powi(2)).collect();
        decade.extend([0.4, 0.8, 2.0, 4.0]);
        let warped = warp(&decade, false);
        assert!(strictly_increasing_with(&decade, &warped));
        let ratio = gap(&decade, &warped, 0.4) / gap(&decade, &warped, 2.0);
        assert!(ratio < 0.7, "{ratio}");
        // Which metrics are compared by ratios: over 1.5 decades in the middle half, all > 0.
        let spaced =
            |low: f64, high: f64| -> Vec<f64> { (0..41).map(|k| low * (high / low).powf(k as f64 / 40.0)).collect() };
        assert!(spans_decades(&spaced(1e-3, 1e3)) && spans_decades(&spaced(1.0, 2000.0)));
        assert!(
            !spans_decades(&spaced(1.0, 10.0)) && !spans_decades(&spaced(1.0, 500.0)),
            "1.35 decades in the middle half"
        );
        assert!(
            !spans_decades(&[-1.0, 1e-3, 1.0, 1e3]) && !spans_decades(&[0.0, 1e-3, 1.0, 1e3]) && !spans_decades(&[])
        );
        assert!(!spans_decades(&[1e-3, 1e3]), "two runs have one quartile");
        // One non-positive run and the metric is not Box-Cox's: still finite and in order.
        decades[0] = 0.0;
        let warped = warp(&decades, true);
        assert!(warped.iter().all(|value| value.is_finite()) && strictly_increasing_with(&decades, &warped));
    }

    #[test]
    fn the_order_check_sees_runs_a_large_lambda_rounds_together() {
        // Runs near the largest and two a billionth of it: λ = 3 would make both -1/3. (The
        // likelihood, whose Jacobian weighs the tiny runs' logarithms, picks a small λ here:
        // the check is a guard, and the warp keeps them apart either way.)
        let mut values: Vec<f64> = (0..40).map(|k| 0.9 + 0.1 * k as f64 / 39.0).collect();
        values.extend([1e-9, 2e-9]);
        let order: Vec<usize> = {
            let mut order: Vec<usize> = (0..values.len()).collect();
            order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
            order
        };
        let rounded: Vec<f64> = values.iter().map(|value| box_cox(*value, 3.0)).collect();
        assert!(!keeps_order(&values, &rounded, &order), "λ = 3 rounds 1e-9 and 2e-9 together");
        let warped = warp(&values, true);
        assert!(strictly_increasing_with(&values, &warped), "{warped:?}");
        assert!(keeps_order(&values, &values, &order) && keeps_order(&[1.0, 1.0], &[5.0, 5.0], &[0, 1]));
    }

    #[test]
    fn alike_or_single_metrics_are_left_as_they_are() {
        assert_eq!(warp(&[2.0; 5], false), vec![2.0; 5]);
        assert_eq!(warp(&[2.0; 5], true), vec![2.0; 5]);
        assert_eq!(warp(&[7.0], false), vec![7.0]);
        assert_eq!(warp(&[], false), Vec::<f64>::new());
        assert_eq!(warp(&[0.0; 3], false), vec![0.0; 3]);
    }

    fn strictly_increasing_with(values: &[f64], warped: &[f64]) -> bool {
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
        order.windows(2).all(|pair| warped[pair[1]] > warped[pair[0]])
    }

    #[test]
    fn huge_tiny_and_far_from_zero_metrics_keep_every_difference() {
        // Near f64::MAX (a failure's placeholder): finite, and still in order.
        let huge = [f64::MAX, -f64::MAX, 0.0, 5.0, 1e300];
        let warped = warp(&huge, false);
        assert!(warped.iter().all(|value| value.is_finite()) && strictly_increasing_with(&huge, &warped), "{warped:?}");
        // Tiny and far from 0 for their spread (a summed negative log-likelihood): no ties.
        for (centre, width) in [(1e-14, 1e-15), (1.5e6, 10.0), (-1.5e6, 1e-3), (1e4, 1e-2)] {
            let values: Vec<f64> = (0..60).map(|k| centre + width * ((k * 37 % 60) as f64 / 60.0 - 0.5)).collect();
            let warped = warp(&values, false);
            assert!(strictly_increasing_with(&values, &warped), "{centre} ± {width}: {warped:?}");
            assert!(warped.iter().all(|value| value.is_finite()));
        }
    }
}
