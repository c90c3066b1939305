//! A Gaussian process on the unit box, for the GP sampler ([`super::gp_sampler`]): a Matérn-5/2
//! kernel with one length scale per dimension (ARD), a signal variance and a noise variance,
//! fitted to standardized observations by the largest marginal likelihood times the priors
//! Optuna's `GPSampler` uses (on each inverse squared length scale `exp(-0.1/λ - 0.1λ)`, on the
//! signal `Gamma(2, 1)`, on the noise `Gamma(1.1, 30)`), in log coordinates by L-BFGS.
//!
//! Linear algebra is nalgebra's (Cholesky factor, solves, inverse). A fit costs one Cholesky
//! factor and one inverse per evaluation of the likelihood: O(n³); the sampler keeps `n`
//! bounded.

use nalgebra::{Cholesky, DMatrix, DVector, Dyn};

const SQRT5: f64 = 2.236_067_977_499_79;
/// Added to the diagonal beyond the fitted noise, so that a factor exists for duplicates.
const JITTER: f64 = 1e-8;
/// Bounds of the log parameters: length scales, signal, noise.
const LOG_LENGTH: (f64, f64) = (-6.9, 6.9);
const LOG_SIGNAL: (f64, f64) = (-6.9, 4.6);
const LOG_NOISE: (f64, f64) = (-13.8, 2.3);
/// L-BFGS iterations of a fit.
const FIT_ITERATIONS: usize = 40;

/// The kernel's parameters, in logs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Hyper {
    pub(crate) log_lengths: Vec<f64>,
    pub(crate) log_signal: f64,
    pub(crate) log_noise: f64,
}

impl Hyper {
    /// Where a fit starts: length scales of half the box, the standardized variance, little noise.
    pub(crate) fn start(dims: usize) -> Hyper {
        Hyper { log_lengths: vec![0.5f64.ln(); dims], log_signal: 0.0, log_noise: 1e-2f64.ln() }
    }

    fn to_vec(&self) -> Vec<f64> {
        let mut theta = self.log_lengths.clone();
        theta.extend([self.log_signal, self.log_noise]);
        theta
    }

    fn from_vec(theta: &[f64]) -> Hyper {
        let dims = theta.len() - 2;
        Hyper { log_lengths: theta[..dims].to_vec(), log_signal: theta[dims], log_noise: theta[dims + 1] }
    }

    fn bounds(dims: usize) -> Vec<(f64, f64)> {
        let mut bounds = vec![LOG_LENGTH; dims];
        bounds.extend([LOG_SIGNAL, LOG_NOISE]);
        bounds
    }
}

/// `(1 + √5 r + 5r²/3) exp(-√5 r)`.
fn matern52(r: f64) -> f64 {
    let s = SQRT5 * r;
    (1.0 + s + s * s / 3.0) * (-s).exp()
}

/// The scaled distance between two points.
fn distance(a: &[f64], b: &[f64], inverse_lengths: &[f64]) -> f64 {
    a.iter().zip(b).zip(inverse_lengths).map(|((a, b), inverse)| ((a - b) * inverse).powi(2)).sum::<f64>().sqrt()
}

/// A process conditioned on observations.
pub(crate) struct Gp {
    points: Vec<Vec<f64>>,
    hyper: Hyper,
    inverse_lengths: Vec<f64>,
    signal: f64,
    factor: Cholesky<f64, Dyn>,
    alpha: DVector<f64>,
}

impl Gp {
    /// The process with `hyper`, conditioned on `values` at `points`; `None` when the kernel
    /// matrix has no factor (which the jitter makes rare).
    pub(crate) fn condition(points: &[Vec<f64>], values: &[f64], hyper: Hyper) -> Option<Gp> {
        let inverse_lengths: Vec<f64> = hyper.log_lengths.iter().map(|log| (-log).exp()).collect();
        let signal = hyper.log_signal.exp();
        let noise = hyper.log_noise.exp() + JITTER;
        let n = points.len();
        let kernel = DMatrix::from_fn(n, n, |i, j| {
            signal * matern52(distance(&points[i], &points[j], &inverse_lengths)) + if i == j { noise } else { 0.0 }
        });
        let factor = kernel.cholesky()?;
        let alpha = factor.solve(&DVector::from_column_slice(values));
        Some(Gp { points: points.to_vec(), hyper, inverse_lengths, signal, factor, alpha })
    }

    /// Fits the kernel's parameters to `values` at `points` (standardized), from `start`, then
    /// conditions on them.
    pub(crate) fn fit(points: &[Vec<f64>], values: &[f64], start: Hyper) -> Option<Gp> {
        let dims = start.log_lengths.len();
        let objective = |theta: &[f64]| negative_log_posterior(points, values, &Hyper::from_vec(theta));
        let theta = super::lbfgs::minimize(objective, start.to_vec(), &Hyper::bounds(dims), FIT_ITERATIONS);
        Gp::condition(points, values, Hyper::from_vec(&theta))
            .or_else(|| Gp::condition(points, values, Hyper::start(dims)))
    }

    pub(crate) fn hyper(&self) -> &Hyper {
        &self.hyper
    }

    /// The posterior mean and variance of the latent function at `point`.
    pub(crate) fn predict(&self, point: &[f64]) -> (f64, f64) {
        let cross = DVector::from_iterator(
            self.points.len(),
            self.points.iter().map(|seen| self.signal * matern52(distance(point, seen, &self.inverse_lengths))),
        );
        let mean = cross.dot(&self.alpha);
        // (The triangular solve reads only the factor's lower part, which `l_dirty` has right.)
        let mut solved = cross;
        self.factor.l_dirty().solve_lower_triangular_mut(&mut solved);
        let variance = (self.signal - solved.norm_squared()).max(1e-12);
        (mean, variance)
    }
}

impl Gp {
    /// [`Gp::predict`] with the gradients of the mean and the variance in `point`.
    pub(crate) fn predict_with_gradient(&self, point: &[f64]) -> (f64, f64, Vec<f64>, Vec<f64>) {
        let n = self.points.len();
        let dims = point.len();
        let mut cross = DVector::zeros(n);
        // ∂k(x, xᵢ)/∂x_m = -(5/3) s² (1 + √5 r) e^{-√5 r} (x_m - xᵢ_m) / l_m², row i.
        let mut slopes = DMatrix::zeros(n, dims);
        for (i, seen) in self.points.iter().enumerate() {
            let r = distance(point, seen, &self.inverse_lengths);
            cross[i] = self.signal * matern52(r);
            let shared = -(5.0 / 3.0) * self.signal * (1.0 + SQRT5 * r) * (-SQRT5 * r).exp();
            for m in 0..dims {
                slopes[(i, m)] = shared * (point[m] - seen[m]) * self.inverse_lengths[m].powi(2);
            }
        }
        let mean = cross.dot(&self.alpha);
        let mut solved = cross;
        self.factor.l_dirty().solve_lower_triangular_mut(&mut solved);
        let variance = (self.signal - solved.norm_squared()).max(1e-12);
        // ∂σ²/∂x = -2 (L⁻ᵀ L⁻¹ k)ᵀ ∂k/∂x.
        let mut back = solved;
        self.factor.l_dirty().tr_solve_lower_triangular_mut(&mut back);
        let mean_slope = (0..dims).map(|m| slopes.column(m).dot(&self.alpha)).collect();
        let variance_slope = (0..dims).map(|m| -2.0 * slopes.column(m).dot(&back)).collect();
        (mean, variance, mean_slope, variance_slope)
    }
}

/// The negative log marginal likelihood minus the log priors, and its gradient in the log
/// parameters; infinite where the kernel matrix has no factor.
fn negative_log_posterior(points: &[Vec<f64>], values: &[f64], hyper: &Hyper) -> (f64, Vec<f64>) {
    let dims = hyper.log_lengths.len();
    let n = points.len();
    let inverse_lengths: Vec<f64> = hyper.log_lengths.iter().map(|log| (-log).exp()).collect();
    let (signal, noise) = (hyper.log_signal.exp(), hyper.log_noise.exp());
    let mut unit = DMatrix::zeros(n, n);
    for i in 0..n {
        for j in 0..=i {
            let value = matern52(distance(&points[i], &points[j], &inverse_lengths));
            unit[(i, j)] = value;
            unit[(j, i)] = value;
        }
    }
    let mut kernel = &unit * signal;
    for i in 0..n {
        kernel[(i, i)] += noise + JITTER;
    }
    let Some(factor) = kernel.cholesky() else { return (f64::INFINITY, vec![0.0; dims + 2]) };
    let y = DVector::from_column_slice(values);
    let alpha = factor.solve(&y);
    let log_det: f64 = factor.l_dirty().diagonal().iter().map(|d| d.ln()).sum();
    let mut value = 0.5 * y.dot(&alpha) + log_det + 0.5 * n as f64 * (2.0 * std::f64::consts::PI).ln();
    // W = K⁻¹ - ααᵀ; the gradient of the NLL in θ is ½ tr(W ∂K/∂θ).
    let mut w = factor.inverse();
    w.ger(-1.0, &alpha, &alpha, 1.0);
    let mut gradient = vec![0.0; dims + 2];
    for i in 0..n {
        for j in 0..i {
            let weight = w[(i, j)]; // Each off-diagonal pair counts twice; ½ · 2.
            let r = distance(&points[i], &points[j], &inverse_lengths);
            let shared = weight * (5.0 / 3.0) * signal * (1.0 + SQRT5 * r) * (-SQRT5 * r).exp();
            for (m, inverse) in inverse_lengths.iter().enumerate() {
                gradient[m] += shared * ((points[i][m] - points[j][m]) * inverse).powi(2);
            }
            gradient[dims] += weight * signal * unit[(i, j)];
        }
        gradient[dims] += 0.5 * w[(i, i)] * signal;
        gradient[dims + 1] += 0.5 * w[(i, i)] * noise;
    }
    // The priors (subtracted: this is minimised).
    for (m, log) in hyper.log_lengths.iter().enumerate() {
        let (squared, inverse_squared) = ((2.0 * log).exp(), (-2.0 * log).exp());
        value += 0.1 * squared + 0.1 * inverse_squared;
        gradient[m] += 0.2 * squared - 0.2 * inverse_squared;
    }
    value -= hyper.log_signal - signal;
    gradient[dims] -= 1.0 - signal;
    value -= 0.1 * hyper.log_noise - 30.0 * noise;
    gradient[dims + 1] -= 0.1 - 30.0 * noise;
    (value, gradient)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_points() -> (Vec<Vec<f64>>, Vec<f64>) {
        let points: Vec<Vec<f64>> =
            (0..12).map(|i| vec![(i as f64 * 0.37) % 1.0, (i as f64 * 0.61 + 0.1) % 1.0]).collect();
        let values = points.iter().map(|p| (6.0 * p[0]).sin() + 0.3 * p[1]).collect();
        (points, values)
    }

    #[test]
    fn the_gradient_agrees_with_finite_differences() {
        let (points, values) = sample_points();
        let hyper = Hyper { log_lengths: vec![-1.0, 0.3], log_signal: 0.2, log_noise: -3.0 };
        let theta = hyper.to_vec();
        let (_, gradient) = negative_log_posterior(&points, &values, &hyper);
        for k in 0..theta.len() {
            let step = 1e-5;
            let (mut up, mut down) = (theta.clone(), theta.clone());
            up[k] += step;
            down[k] -= step;
            let numeric = (negative_log_posterior(&points, &values, &Hyper::from_vec(&up)).0
                - negative_log_posterior(&points, &values, &Hyper::from_vec(&down)).0)
                / (2.0 * step);
            assert!((numeric - gradient[k]).abs() < 1e-4 * (1.0 + numeric.abs()), "θ{k}: {numeric} vs {}", gradient[k]);
        }
    }

    #[test]
    fn a_fitted_process_interpolates_what_it_saw_and_is_unsure_far_from_it() {
        let (points, values) = sample_points();
        let gp = Gp::fit(&points, &values, Hyper::start(2)).unwrap();
        let start = negative_log_posterior(&points, &values, &Hyper::start(2)).0;
        let fitted = negative_log_posterior(&points, &values, gp.hyper()).0;
        assert!(fitted < start, "the fit made the posterior worse: {fitted} vs {start}");
        for (point, value) in points.iter().zip(&values) {
            let (mean, variance) = gp.predict(point);
            assert!((mean - value).abs() < 0.1, "at {point:?}: {mean} vs {value}");
            assert!(variance < 0.05);
        }
        let at = [0.41, 0.77];
        let (mean, variance, mean_slope, variance_slope) = gp.predict_with_gradient(&at);
        assert_eq!((mean, variance), gp.predict(&at));
        for m in 0..2 {
            let (mut up, mut down) = (at, at);
            up[m] += 1e-6;
            down[m] -= 1e-6;
            let ((mean_up, variance_up), (mean_down, variance_down)) = (gp.predict(&up), gp.predict(&down));
            assert!(((mean_up - mean_down) / 2e-6 - mean_slope[m]).abs() < 1e-4 * (1.0 + mean_slope[m].abs()));
            let numeric = (variance_up - variance_down) / 2e-6;
            assert!(
                (numeric - variance_slope[m]).abs() < 1e-4 * (1.0 + numeric.abs()),
                "{numeric} vs {variance_slope:?}"
            );
        }
        let (_, far) = gp.predict(&[3.0, 3.0]);
        assert!(far > 0.5 * gp.hyper().log_signal.exp(), "far away the variance is the prior's: {far}");
    }
}
