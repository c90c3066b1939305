//! L-BFGS inside a box, for the GP's kernel fit: the two-loop recursion over the last few
//! steps, a backtracking line search (Armijo), and each step's point clamped into the bounds.
//! Small problems only (a dozen variables); a step that makes no progress ends it.

/// Steps remembered.
const MEMORY: usize = 6;

/// Minimises `objective` (value and gradient) from `start` within `bounds`, in at most
/// `iterations` steps; returns the best point seen.
pub(crate) fn minimize(
    mut objective: impl FnMut(&[f64]) -> (f64, Vec<f64>),
    start: Vec<f64>,
    bounds: &[(f64, f64)],
    iterations: usize,
) -> Vec<f64> {
    let clamp =
        |x: Vec<f64>| -> Vec<f64> { x.iter().zip(bounds).map(|(x, (low, high))| x.clamp(*low, *high)).collect() };
    let mut x = clamp(start);
    let (mut value, mut gradient) = objective(&x);
    if !value.is_finite() {
        return x;
    }
    let mut history: Vec<(Vec<f64>, Vec<f64>, f64)> = Vec::with_capacity(MEMORY);
    for _ in 0..iterations {
        let mut direction = two_loop(&gradient, &history);
        // Not a descent direction (a curvature pair gone bad): steepest descent instead.
        if dot(&direction, &gradient) >= 0.0 {
            history.clear();
            direction = gradient.iter().map(|g| -g).collect();
        }
        let slope = dot(&direction, &gradient);
        let mut step = if history.is_empty() { 1.0 / norm(&gradient).max(1.0) } else { 1.0 };
        let mut moved = None;
        for _ in 0..20 {
            let candidate = clamp(x.iter().zip(&direction).map(|(x, d)| x + step * d).collect());
            let (new_value, new_gradient) = objective(&candidate);
            if new_value.is_finite() && new_value <= value + 1e-4 * step * slope {
                moved = Some((candidate, new_value, new_gradient));
                break;
            }
            step *= 0.5;
        }
        let Some((next, next_value, next_gradient)) = moved else { break };
        let s: Vec<f64> = next.iter().zip(&x).map(|(a, b)| a - b).collect();
        let y: Vec<f64> = next_gradient.iter().zip(&gradient).map(|(a, b)| a - b).collect();
        let curvature = dot(&s, &y);
        if curvature > 1e-10 {
            if history.len() == MEMORY {
                history.remove(0);
            }
            history.push((s, y, 1.0 / curvature));
        }
        let progress = value - next_value;
        (x, value, gradient) = (next, next_value, next_gradient);
        if progress.abs() < 1e-9 * (1.0 + value.abs()) || norm(&gradient) < 1e-6 {
            break;
        }
    }
    x
}

/// The quasi-Newton direction `-H g` from the remembered steps.
fn two_loop(gradient: &[f64], history: &[(Vec<f64>, Vec<f64>, f64)]) -> Vec<f64> {
    let mut q: Vec<f64> = gradient.to_vec();
    let mut alphas = Vec::with_capacity(history.len());
    for (s, y, rho) in history.iter().rev() {
        let alpha = rho * dot(s, &q);
        q.iter_mut().zip(y).for_each(|(q, y)| *q -= alpha * y);
        alphas.push(alpha);
    }
    if let Some((s, y, _)) = history.last() {
        let scale = dot(s, y) / dot(y, y);
        q.iter_mut().for_each(|q| *q *= scale);
    }
    for ((s, y, rho), alpha) in history.iter().zip(alphas.iter().rev()) {
        let beta = rho * dot(y, &q);
        q.iter_mut().zip(s).for_each(|(q, s)| *q += (alpha - beta) * s);
    }
    q.iter().map(|q| -q).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

fn norm(a: &[f64]) -> f64 {
    dot(a, a).sqrt()
}

#[cfg(test)]
mod tests {
    #[test]
    fn it_finds_the_minimum_of_rosenbrock_and_stays_in_its_box() {
        let rosenbrock = |x: &[f64]| {
            let (a, b) = (x[0], x[1]);
            let value = (1.0 - a).powi(2) + 100.0 * (b - a * a).powi(2);
            (value, vec![-2.0 * (1.0 - a) - 400.0 * a * (b - a * a), 200.0 * (b - a * a)])
        };
        let found = super::minimize(rosenbrock, vec![-1.2, 1.0], &[(-5.0, 5.0), (-5.0, 5.0)], 200);
        assert!((found[0] - 1.0).abs() < 1e-3 && (found[1] - 1.0).abs() < 1e-3, "{found:?}");
        let boxed = super::minimize(rosenbrock, vec![-1.2, 1.0], &[(-5.0, 0.5), (-5.0, 5.0)], 200);
        assert!(boxed[0] <= 0.5 && (boxed[0] - 0.5).abs() < 1e-2, "{boxed:?}");
    }
}
