//! How many metric points an attempt ships: at most [`RATE`] a second on average, in bursts
//! of up to [`BURST`]. A job that logs faster (10,000 points a second from a tight loop) is
//! thinned, not queued: each metric keeps evenly spaced points and always its latest value,
//! so curves keep their shape and the value a sweep ranks by is the newest. The job's log
//! says so once.

use shared::api::MetricPoint;
use std::collections::HashMap;
use std::time::Instant;

/// Points a second, sustained.
pub const RATE: f64 = 1_000.0;
/// Points at once, after a quiet spell.
pub const BURST: f64 = 20_000.0;

#[derive(Debug)]
pub struct Budget {
    tokens: f64,
    last: Instant,
    warned: bool,
}

impl Default for Budget {
    fn default() -> Budget {
        Budget { tokens: BURST, last: Instant::now(), warned: false }
    }
}

impl Budget {
    /// Gives back what [`Budget::admit`] took for points the server did not take (a failed
    /// send is sent again, and must not pay twice).
    pub fn refund(&mut self, points: usize) {
        self.tokens = (self.tokens + points as f64).min(BURST);
    }

    /// `points` as the budget allows, and the note to log the first time it thins them.
    pub fn admit(&mut self, points: Vec<MetricPoint>) -> (Vec<MetricPoint>, Option<String>) {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * RATE).min(BURST);
        self.last = now;
        let allowed = self.tokens.max(0.0) as usize;
        if points.len() <= allowed {
            self.tokens -= points.len() as f64;
            return (points, None);
        }
        let kept = thin(points, allowed);
        self.tokens -= kept.len() as f64;
        let note = (!self.warned).then(|| {
            format!(
                "metrics arrive faster than {RATE} points a second: each metric keeps evenly spaced points and its latest value"
            )
        });
        self.warned = true;
        (kept, note)
    }
}

/// About `keep` of `points`, in order: `keep` evenly spaced ones, and each name's last.
pub fn thin(points: Vec<MetricPoint>, keep: usize) -> Vec<MetricPoint> {
    let length = points.len();
    let mut kept = vec![false; length];
    for pick in 0..keep.min(length) {
        kept[pick * length / keep.max(1)] = true;
    }
    let mut last: HashMap<&str, usize> = HashMap::new();
    for (index, point) in points.iter().enumerate() {
        last.insert(point.name.as_str(), index);
    }
    for index in last.into_values() {
        kept[index] = true;
    }
    points.into_iter().zip(kept).filter(|(_, kept)| *kept).map(|(point, _)| point).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, count: i64) -> Vec<MetricPoint> {
        (0..count).map(|step| MetricPoint { step: Some(step), name: name.into(), value: step as f64 }).collect()
    }

    #[test]
    fn thinning_keeps_the_shape_and_every_metric_s_latest_value() {
        let mut points = series("loss", 10_000);
        points.extend(series("acc", 3));
        let kept = thin(points, 1_000);
        assert!((1_000..=1_002).contains(&kept.len()), "{}", kept.len());
        assert_eq!(
            thin(series("x", 1_001), 1_000).len(),
            1_001,
            "`keep` evenly spaced, and the last: not half of them"
        );
        assert_eq!(kept.iter().rfind(|point| point.name == "loss").unwrap().step, Some(9_999));
        assert_eq!(kept.iter().filter(|point| point.name == "acc").count(), 1, "only its last survives");
        assert!(kept.windows(2).all(|pair| pair[0].name != pair[1].name || pair[0].step < pair[1].step), "in order");
    }

    #[test]
    fn a_burst_passes_whole_and_a_flood_is_thinned_with_one_note() {
        let mut budget = Budget::default();
        let (kept, note) = budget.admit(series("loss", 15_000));
        assert_eq!((kept.len(), note), (15_000, None));
        let (kept, note) = budget.admit(series("loss", 50_000));
        assert!(kept.len() < 6_000, "{}", kept.len());
        assert!(note.unwrap().contains("faster than"));
        assert_eq!(budget.admit(series("loss", 50_000)).1, None, "said once");
        // A batch the server did not take is sent again at the same price.
        let mut budget = Budget::default();
        let (kept, _) = budget.admit(series("loss", 15_000));
        budget.refund(kept.len());
        assert_eq!(budget.admit(series("loss", 15_000)).0.len(), 15_000);
    }
}
