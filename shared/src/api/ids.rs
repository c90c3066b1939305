//! Typed ids of jobs, sweeps and workers.
//!
//! All three are database row ids, and as bare `i64`s they swapped silently (a worker id passed
//! where a job id was meant compiles and fails far away). On the wire each is a plain JSON
//! number, and in a path a plain decimal, so the protocol did not change with them.

use serde::{Deserialize, Serialize};

macro_rules! row_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(i64);

        impl $name {
            pub const fn new(raw: i64) -> $name {
                $name(raw)
            }

            /// The row id, for SQL and arithmetic-free uses such as keys in JSON maps.
            pub const fn get(self) -> i64 {
                self.0
            }
        }

        impl From<i64> for $name {
            fn from(raw: i64) -> $name {
                $name(raw)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = std::num::ParseIntError;

            fn from_str(text: &str) -> Result<$name, Self::Err> {
                text.parse().map($name)
            }
        }
    };
}

row_id!(
    /// A job: one run of a sweep, across all its attempts.
    JobId
);
row_id!(
    /// A submitted sweep.
    SweepId
);
row_id!(
    /// A registered worker.
    WorkerId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_plain_numbers_on_the_wire() {
        assert_eq!(serde_json::to_string(&JobId::new(42)).unwrap(), "42");
        assert_eq!(serde_json::from_str::<WorkerId>("7").unwrap(), WorkerId::new(7));
        assert_eq!("12".parse::<SweepId>().unwrap().get(), 12);
        assert!("abc".parse::<JobId>().is_err());
        assert_eq!(JobId::new(3).to_string(), "3");
    }
}
