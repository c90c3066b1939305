//! The test problems search is measured on (the comparison tests here, `app-bench search`):
//! Branin (2 dimensions, minimum 0.397887) and Hartmann-6 (6 dimensions, minimum -3.32237),
//! as the optimisation literature and Optuna's benchmarks define them.

/// Branin on `[-5, 10] x [0, 15]`.
pub fn branin(x: &[f64]) -> f64 {
    let pi = std::f64::consts::PI;
    let (b, c, t) = (5.1 / (4.0 * pi * pi), 5.0 / pi, 1.0 / (8.0 * pi));
    (x[1] - b * x[0] * x[0] + c * x[0] - 6.0).powi(2) + 10.0 * (1.0 - t) * x[0].cos() + 10.0
}

/// Hartmann-6 on `[0, 1]^6`.
pub fn hartmann6(x: &[f64]) -> f64 {
    const ALPHA: [f64; 4] = [1.0, 1.2, 3.0, 3.2];
    const A: [[f64; 6]; 4] = [
        [10.0, 3.0, 17.0, 3.5, 1.7, 8.0],
        [0.05, 10.0, 17.0, 0.1, 8.0, 14.0],
        [3.0, 3.5, 1.7, 10.0, 17.0, 8.0],
        [17.0, 8.0, 0.05, 10.0, 0.1, 14.0],
    ];
    const P: [[f64; 6]; 4] = [
        [1312.0, 1696.0, 5569.0, 124.0, 8283.0, 5886.0],
        [2329.0, 4135.0, 8307.0, 3736.0, 1004.0, 9991.0],
        [2348.0, 1451.0, 3522.0, 2883.0, 3047.0, 6650.0],
        [4047.0, 8828.0, 8732.0, 5743.0, 1091.0, 381.0],
    ];
    -(0..4)
        .map(|i| ALPHA[i] * (-(0..6).map(|j| A[i][j] * (x[j] - P[i][j] * 1e-4).powi(2)).sum::<f64>()).exp())
        .sum::<f64>()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_known_minima_are_where_the_literature_puts_them() {
        assert!((super::branin(&[std::f64::consts::PI, 2.275]) - 0.397887).abs() < 1e-6);
        let optimum = [0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573];
        assert!((super::hartmann6(&optimum) + 3.32237).abs() < 1e-4);
    }
}
