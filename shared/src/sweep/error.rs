//! The one error type of sweep parsing, and the constructor every form uses for key errors.

use thiserror::Error;

/// Why a sweep file was refused. Messages are for people: they name the key path
/// (`grid.lr`) or the line and column of a syntax error.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SweepError {
    #[error("invalid YAML at line {line} column {column}: {message}")]
    Syntax { line: usize, column: usize, message: String },
    #[error("at `{path}`: {message}")]
    Invalid { path: String, message: String },
    /// `count` saturates at `u128::MAX` (written "more than 10^38").
    #[error("sweep expands to {} jobs, over the limit of {limit}", job_count(*.count))]
    TooManyJobs { count: u128, limit: u64 },
}

/// A job count for people: counts are multiplied with saturation, so `u128::MAX` stands for
/// any count too large to hold, and printing its 39 digits would claim a precision it lacks.
fn job_count(count: u128) -> String {
    if count == u128::MAX {
        "more than 10^38".to_owned()
    } else {
        count.to_string()
    }
}

/// A [`SweepError::Invalid`] about the key at `path` (dotted, e.g. `grid.lr`).
pub(crate) fn invalid(path: impl Into<String>, message: impl Into<String>) -> SweepError {
    SweepError::Invalid { path: path.into(), message: message.into() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_place() {
        let syntax = SweepError::Syntax { line: 3, column: 7, message: "unexpected end".into() };
        assert_eq!(syntax.to_string(), "invalid YAML at line 3 column 7: unexpected end");
        assert_eq!(invalid("grid.lr", "empty axis").to_string(), "at `grid.lr`: empty axis");
        let too_many = SweepError::TooManyJobs { count: 1 << 70, limit: 10 };
        assert_eq!(too_many.to_string(), "sweep expands to 1180591620717411303424 jobs, over the limit of 10");
        let saturated = SweepError::TooManyJobs { count: u128::MAX, limit: 10 };
        assert_eq!(saturated.to_string(), "sweep expands to more than 10^38 jobs, over the limit of 10");
    }
}
