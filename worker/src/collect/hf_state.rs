//! Hugging Face `Trainer`'s `trainer_state.json`: written whole into each
//! `<output_dir>/checkpoint-<step>/` when it saves, and into `<output_dir>/` by
//! `trainer.save_state()`. Its `log_history` is every logged row so far, each with its
//! `step` (`{"loss": 0.41, "learning_rate": 5e-05, "epoch": 0.5, "step": 500}`,
//! `{"eval_loss": 0.38, "epoch": 1.0, "step": 1000}`). A later file repeats the rows of an
//! earlier one, so the collector takes only the rows past those it has.

use shared::api::MetricPoint;
use std::path::Path;

/// The largest state file read (a long run's history is a few MiB).
const MAX_BYTES: u64 = 64 << 20;

/// The points of `log_history` rows from `taken` on, and how many rows the file has.
pub fn read(path: &Path, taken: usize) -> Result<(Vec<MetricPoint>, usize), String> {
    use std::io::Read;
    let file = super::open_plain(path).map_err(|error| error.to_string())?;
    let length = file.metadata().map_err(|error| error.to_string())?.len();
    if length > MAX_BYTES {
        return Err(format!("{length} bytes, more than the {} MiB read", MAX_BYTES >> 20));
    }
    let mut text = Vec::new();
    file.take(MAX_BYTES).read_to_end(&mut text).map_err(|error| error.to_string())?;
    let state: serde_json::Value =
        serde_json::from_slice(&text).map_err(|error| format!("not a whole JSON document ({error})"))?;
    let Some(history) = state.get("log_history").and_then(|history| history.as_array()) else {
        return Ok((Vec::new(), taken));
    };
    let mut points = Vec::new();
    for row in history.iter().skip(taken) {
        let Some(row) = row.as_object() else { continue };
        let step = row.get("step").and_then(|step| step.as_i64().or_else(|| step.as_f64().map(|step| step as i64)));
        for (name, value) in row {
            if name == "step" {
                continue;
            }
            if let Some(value) = value.as_f64().filter(|value| value.is_finite()) {
                points.push(MetricPoint { step, name: name.clone(), value });
            }
        }
    }
    Ok((points, history.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_past_those_taken_become_points_with_their_steps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trainer_state.json");
        let state = r#"{"best_metric": null, "global_step": 1000, "log_history": [
            {"loss": 0.41, "grad_norm": 1.5, "learning_rate": 5e-05, "epoch": 0.5, "step": 500},
            {"eval_loss": 0.38, "eval_runtime": 1.2, "epoch": 1.0, "step": 1000},
            {"train_runtime": 10.0, "total_flos": 1e12, "step": 1000, "note": "x"}]}"#;
        std::fs::write(&path, state).unwrap();
        let (points, rows) = read(&path, 1).unwrap();
        assert_eq!(rows, 3);
        let got: Vec<_> = points.iter().map(|point| (point.step, point.name.as_str())).collect();
        assert_eq!(
            got,
            [
                (Some(1000), "eval_loss"),
                (Some(1000), "eval_runtime"),
                (Some(1000), "epoch"),
                (Some(1000), "train_runtime"),
                (Some(1000), "total_flos")
            ]
        );
        std::fs::write(&path, &state[..40]).unwrap();
        assert!(read(&path, 0).unwrap_err().contains("not a whole JSON"), "caught mid-write");
    }
}
