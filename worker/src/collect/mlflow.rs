//! MLflow's local file store (`mlruns/<experiment>/<run>/metrics/<name>`, the default
//! tracking URI of MLflow 2 with no server): one file per metric, a line per logged value,
//! `<timestamp ms> <value> <step>`. A name with `/` (`val/loss`) is a nested path there.

use shared::api::MetricPoint;
use std::path::{Component, Path};

/// The metric a file of MLflow's store holds, when `path` is one: what follows
/// `mlruns/<experiment>/<run>/metrics/`.
pub fn metric_name(path: &Path) -> Option<String> {
    let parts: Vec<&str> = path
        .components()
        .filter_map(|part| if let Component::Normal(part) = part { part.to_str() } else { None })
        .collect();
    let store = parts.iter().rposition(|part| *part == "mlruns")?;
    let rest = parts.get(store + 1..)?;
    (rest.len() >= 4 && rest[2] == "metrics").then(|| rest[3..].join("/"))
}

/// The points of whole lines of a metric file.
pub fn points(name: &str, bytes: &[u8]) -> Vec<MetricPoint> {
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_timestamp, value) = (fields.next()?, fields.next()?.parse::<f64>().ok()?);
            let step = fields.next().and_then(|step| step.parse::<i64>().ok());
            value.is_finite().then(|| MetricPoint { step, name: name.to_string(), value })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_s_layout_names_the_metric_and_lines_give_points() {
        assert_eq!(metric_name(Path::new("/w/mlruns/0/abc123/metrics/val/loss")).as_deref(), Some("val/loss"));
        assert_eq!(metric_name(Path::new("/w/mlruns/0/abc123/params/lr")), None);
        assert_eq!(metric_name(Path::new("/w/mlruns/0/metrics")), None);
        let got = points("loss", b"1700000000000 0.5 0\n1700000000100 0.25 1\ngarbage\n1700000000200 nan 2\n");
        assert_eq!(
            got,
            [
                MetricPoint { step: Some(0), name: "loss".into(), value: 0.5 },
                MetricPoint { step: Some(1), name: "loss".into(), value: 0.25 }
            ]
        );
    }
}
