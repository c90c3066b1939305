//! How an epoch's rows become optimizer steps: consecutive batches of `batch_size` rows, each
//! shared among the data-parallel ranks and cut into `grad_accum` micro-batches per rank.
//!
//! Every piece must hold a row (a rank with no rows would average over nothing), and with
//! batch norm two: the variance of a single row is undefined, and batch norm would write NaN
//! into its running variance, which poisons every later evaluation. A short last batch is
//! therefore merged into the one before it, as `drop_last` would lose rows.

use crate::config::{config_error, ConfigError};
use std::ops::Range;

/// The fewest rows one optimizer step needs.
pub fn min_rows_per_step(ranks: usize, grad_accum: usize, batch_norm: bool) -> usize {
    ranks.max(1) * grad_accum.max(1) * if batch_norm { 2 } else { 1 }
}

/// Refuses a batch size that leaves some rank's micro-batch too few rows.
pub fn check_step_rows(
    batch_size: usize,
    ranks: usize,
    grad_accum: usize,
    batch_norm: bool,
) -> Result<(), ConfigError> {
    let needed = min_rows_per_step(ranks, grad_accum, batch_norm);
    if batch_size >= needed {
        return Ok(());
    }
    let pieces = format!("{} rank(s) x {} micro-batch(es)", ranks.max(1), grad_accum.max(1));
    let why = if batch_norm {
        "batch norm needs at least 2 rows in each (one row gives a NaN running variance)"
    } else {
        "each needs at least 1 row"
    };
    Err(config_error("batch_size", format!("{batch_size} rows per step over {pieces}: {why}; use at least {needed}")))
}

/// The row ranges of one epoch over `rows` rows: `batch_size` each, the last one merged into
/// the one before it when it is shorter than `min_rows`. Errors when there are fewer rows in
/// all than one step needs.
pub fn epoch_batches(rows: usize, batch_size: usize, min_rows: usize) -> Result<Vec<Range<usize>>, ConfigError> {
    let batch_size = batch_size.max(1);
    if rows < min_rows.max(1) {
        return Err(config_error(
            "data",
            format!("the training split has {rows} row(s), fewer than the {min_rows} one step needs"),
        ));
    }
    let mut batches: Vec<Range<usize>> =
        (0..rows).step_by(batch_size).map(|start| start..(start + batch_size).min(rows)).collect();
    if batches.len() > 1 && batches.last().is_some_and(|last| last.len() < min_rows) {
        let last = batches.pop().expect("checked above");
        batches.last_mut().expect("more than one batch").end = last.end;
    }
    Ok(batches)
}

/// `total` split into `parts` sizes as even as possible, larger first.
pub fn split_sizes(total: usize, parts: usize) -> Vec<usize> {
    let parts = parts.max(1);
    (0..parts).map(|index| total / parts + usize::from(index < total % parts)).collect()
}

/// Rank `rank`'s share of `rows` rows (offsets within them), as `split_sizes` cuts them.
pub fn share(rows: usize, ranks: usize, rank: usize) -> Range<usize> {
    let sizes = split_sizes(rows, ranks);
    let start: usize = sizes[..rank.min(sizes.len())].iter().sum();
    start..start + sizes.get(rank).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_row_tail_is_merged_into_the_batch_before_it() {
        assert_eq!(epoch_batches(33, 16, 2).unwrap(), vec![0..16, 16..33]);
        assert_eq!(epoch_batches(34, 16, 2).unwrap(), vec![0..16, 16..32, 32..34]);
        assert_eq!(epoch_batches(32, 16, 2).unwrap(), vec![0..16, 16..32]);
        // Two ranks with batch norm need four rows; a tail of three is merged.
        assert_eq!(epoch_batches(35, 16, 4).unwrap(), vec![0..16, 16..35]);
        // One batch shorter than a step: nothing to merge into, it is the whole epoch.
        assert_eq!(epoch_batches(5, 16, 4).unwrap(), vec![0..5]);
        assert_eq!(epoch_batches(1, 16, 2).unwrap_err().key, "data");
    }

    #[test]
    fn every_piece_of_every_step_gets_enough_rows() {
        for rows in 4..200 {
            for batch_size in 4..40 {
                for (ranks, accum, norm) in [(1, 1, true), (2, 1, true), (2, 2, false), (3, 1, false), (1, 2, true)] {
                    let min = min_rows_per_step(ranks, accum, norm);
                    if batch_size < min || rows < min {
                        continue;
                    }
                    let batches = epoch_batches(rows, batch_size, min).unwrap();
                    assert_eq!(batches.iter().map(Range::len).sum::<usize>(), rows);
                    for batch in batches {
                        for rank in 0..ranks {
                            for micro in split_sizes(share(batch.len(), ranks, rank).len(), accum) {
                                assert!(micro >= if norm { 2 } else { 1 }, "{rows} {batch_size} {ranks} {accum}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn shares_cover_the_batch_in_rank_order() {
        assert_eq!(share(10, 3, 0), 0..4);
        assert_eq!(share(10, 3, 1), 4..7);
        assert_eq!(share(10, 3, 2), 7..10);
        assert_eq!(share(5, 1, 0), 0..5);
    }

    #[test]
    fn a_batch_too_small_for_batch_norm_is_refused_naming_batch_size() {
        let error = check_step_rows(3, 2, 1, true).unwrap_err();
        assert_eq!(error.key, "batch_size");
        assert!(error.message.contains("use at least 4"), "{error}");
        assert!(check_step_rows(1, 1, 1, false).is_ok());
        assert_eq!(check_step_rows(1, 1, 1, true).unwrap_err().key, "batch_size");
    }
}
