//! Lightning's `CSVLogger` (`lightning_logs/version_<n>/metrics.csv`, or
//! `<save_dir>/<name>/version_<n>/metrics.csv`): a header of metric names and one row per
//! logging step, a cell empty where a metric was not logged at that step. The `step` column is
//! the step; every other numeric cell is a point (`epoch` too).
//!
//! Lightning appends rows, but rewrites the whole file with a wider header when a new metric
//! first appears (a validation loss after the first epoch). Rows keep their order in the
//! rewrite, so a changed header means: read again from the top, skipping the rows already
//! taken.

use super::{complete_lines, read_range};
use shared::api::MetricPoint;
use std::path::Path;

/// The longest header read.
const MAX_HEADER: u64 = 64 * 1024;
/// Bytes of rows read per pass.
const BUDGET: u64 = 4 << 20;

#[derive(Debug, Default)]
pub struct CsvState {
    header: Vec<String>,
    /// Where the next row starts.
    offset: u64,
    /// Rows taken since the file began.
    taken: usize,
    /// Rows of a rewritten file still to pass over (they were taken before the rewrite).
    skip: usize,
}

impl CsvState {
    /// Adds the rows written since the last call to `points`, at most [`BUDGET`] bytes of
    /// them; whether it got anywhere (another call may get further).
    pub fn read(&mut self, path: &Path, final_pass: bool, points: &mut Vec<MetricPoint>) -> Result<bool, String> {
        let head = read_range(path, 0, MAX_HEADER);
        let Some(end) = head.iter().position(|byte| *byte == b'\n') else {
            return match head.len() as u64 >= MAX_HEADER {
                true => Err("a CSV header longer than 64 KiB; not read".to_string()),
                false => Ok(false), // not written yet
            };
        };
        let header = parse_record(&head[..end]);
        let length = super::open_plain(path).and_then(|file| file.metadata()).map(|meta| meta.len()).unwrap_or(0);
        if header != self.header || length < self.offset {
            // New, or rewritten with new columns: from the top, past the rows already taken.
            self.header = header;
            self.offset = end as u64 + 1;
            self.skip = self.taken;
        }
        let step_column = self.header.iter().position(|name| name == "step");
        let bytes = read_range(path, self.offset, BUDGET);
        let complete = complete_lines(&bytes, final_pass && (bytes.len() as u64) < BUDGET);
        for line in bytes[..complete].split(|byte| *byte == b'\n') {
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            if self.skip > 0 {
                self.skip -= 1;
                continue;
            }
            self.taken += 1;
            let cells = parse_record(line);
            let step =
                step_column.and_then(|column| cells.get(column)).and_then(|cell| number(cell)).map(|step| step as i64);
            for (column, cell) in cells.iter().enumerate() {
                let Some(name) = self.header.get(column).filter(|_| Some(column) != step_column) else { continue };
                if let Some(value) = number(cell) {
                    points.push(MetricPoint { step, name: name.clone(), value });
                }
            }
        }
        self.offset += complete as u64;
        Ok(complete > 0)
    }
}

/// One CSV record's cells (quoted cells as the csv crate reads them).
fn parse_record(line: &[u8]) -> Vec<String> {
    let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(line);
    let mut record = csv::StringRecord::new();
    match reader.read_record(&mut record) {
        Ok(true) => record.iter().map(|cell| cell.trim().to_string()).collect(),
        _ => Vec::new(),
    }
}

fn number(cell: &str) -> Option<f64> {
    cell.trim().parse::<f64>().ok().filter(|value| value.is_finite())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(points: &[MetricPoint]) -> Vec<(Option<i64>, &str, f64)> {
        points.iter().map(|point| (point.step, point.name.as_str(), point.value)).collect()
    }

    #[test]
    fn rows_become_points_and_a_rewrite_with_new_columns_repeats_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        std::fs::write(&path, "epoch,step,train_loss\n0,9,0.9\n0,19,0.8\n0,29,0.7").unwrap();
        let mut state = CsvState::default();
        let mut points = Vec::new();
        assert!(state.read(&path, false, &mut points).unwrap());
        assert_eq!(
            names(&points),
            [
                (Some(9), "epoch", 0.0),
                (Some(9), "train_loss", 0.9),
                (Some(19), "epoch", 0.0),
                (Some(19), "train_loss", 0.8)
            ],
            "the last row has no newline yet: not taken"
        );
        // Lightning rewrites the file when val_loss first appears.
        std::fs::write(&path, "epoch,step,train_loss,val_loss\n0,9,0.9,\n0,19,0.8,\n0,29,0.7,\n0,29,,0.75\n").unwrap();
        points.clear();
        assert!(state.read(&path, false, &mut points).unwrap());
        assert_eq!(
            names(&points),
            [
                (Some(29), "epoch", 0.0),
                (Some(29), "train_loss", 0.7),
                (Some(29), "epoch", 0.0),
                (Some(29), "val_loss", 0.75)
            ]
        );
        // Appended rows.
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("1,39,0.6,\n");
        std::fs::write(&path, text).unwrap();
        points.clear();
        assert!(state.read(&path, true, &mut points).unwrap());
        assert_eq!(names(&points), [(Some(39), "epoch", 1.0), (Some(39), "train_loss", 0.6)]);
    }

    #[test]
    fn an_empty_or_headless_file_gives_nothing_and_no_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        std::fs::write(&path, "").unwrap();
        let mut points = Vec::new();
        assert!(!CsvState::default().read(&path, true, &mut points).unwrap());
        std::fs::write(&path, "a,b").unwrap();
        assert!(!CsvState::default().read(&path, false, &mut points).unwrap());
        assert!(points.is_empty());
        std::fs::write(&path, "x".repeat(70_000)).unwrap();
        assert!(CsvState::default().read(&path, true, &mut points).unwrap_err().contains("64 KiB"));
    }
}
