//! Rows of either driver, read by column name or position ([`DbRow`]), and typed rows
//! ([`FromRow`]).

use super::*;

/// A row of SQLite's: the statement's column names and the row's values.
#[derive(Debug, Clone)]
pub struct SqliteRow {
    pub(super) columns: Arc<[String]>,
    pub(super) values: Vec<rusqlite::types::Value>,
}

/// A row of either engine.
#[derive(Debug)]
pub enum Row {
    Sqlite(SqliteRow),
    Postgres(PgRow),
}

/// A value both engines decode: what rusqlite reads from SQLite and sqlx from PostgreSQL
/// (integers, floats, booleans, text, bytes, their `Option`s and PostgreSQL's arrays).
pub trait Decodable:
    rusqlite::types::FromSql + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>
{
}

impl<T> Decodable for T where
    T: rusqlite::types::FromSql + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>
{
}

/// A row read by column name or position.
///
/// Columns are read the way both backends store them: SQLite's INTEGER is PostgreSQL's
/// BIGINT, so unsigned counts and flags are stored as 64-bit integers and converted here
/// (PostgreSQL has no unsigned types, and decodes no BIGINT as a bool).
pub trait DbRow {
    fn get_as<T: Decodable>(&self, column: &str) -> Result<T>;

    fn u32_at(&self, column: &str) -> Result<u32> {
        let value: i64 = self.get_as(column)?;
        u32::try_from(value).map_err(|error| decode_error(column, error))
    }

    fn opt_u32_at(&self, column: &str) -> Result<Option<u32>> {
        let value: Option<i64> = self.get_as(column)?;
        value.map(u32::try_from).transpose().map_err(|error| decode_error(column, error))
    }

    fn flag_at(&self, column: &str) -> Result<bool> {
        let value: i64 = self.get_as(column)?;
        Ok(value != 0)
    }

    fn opt_flag_at(&self, column: &str) -> Result<Option<bool>> {
        let value: Option<i64> = self.get_as(column)?;
        Ok(value.map(|value| value != 0))
    }
}

fn decode_error(column: impl std::fmt::Display, why: impl std::fmt::Display) -> Error {
    Error::Decode { column: column.to_string(), why: why.to_string() }
}

impl SqliteRow {
    fn value<T: rusqlite::types::FromSql>(&self, index: usize, column: &dyn std::fmt::Display) -> Result<T> {
        let value = self.values.get(index).ok_or_else(|| decode_error(column, "no such column"))?;
        T::column_result(value.into()).map_err(|why| decode_error(column, why))
    }
}

impl Row {
    /// The value of the column at `index` (from 0).
    pub fn get_at<T: Decodable>(&self, index: usize) -> Result<T> {
        match self {
            Row::Sqlite(row) => row.value(index, &index),
            Row::Postgres(row) => Ok(sqlx::Row::try_get(row, index)?),
        }
    }
}

impl DbRow for Row {
    fn get_as<T: Decodable>(&self, column: &str) -> Result<T> {
        match self {
            Row::Sqlite(row) => match row.columns.iter().position(|name| name == column) {
                Some(index) => row.value(index, &column),
                None => Err(decode_error(column, "no such column")),
            },
            Row::Postgres(row) => Ok(sqlx::Row::try_get(row, column)?),
        }
    }
}

impl DbRow for PgRow {
    fn get_as<T: Decodable>(&self, column: &str) -> Result<T> {
        Ok(sqlx::Row::try_get(self, column)?)
    }
}

/// A type read from a whole row.
pub trait FromRow: Sized {
    fn from_row(row: &Row) -> Result<Self>;
}

macro_rules! tuple_from_row {
    ($($name:ident $index:tt),+) => {
        impl<$($name: Decodable),+> FromRow for ($($name,)+) {
            fn from_row(row: &Row) -> Result<Self> {
                Ok(($(row.get_at::<$name>($index)?,)+))
            }
        }
    };
}
tuple_from_row!(A 0);
tuple_from_row!(A 0, B 1);
tuple_from_row!(A 0, B 1, C 2);
tuple_from_row!(A 0, B 1, C 2, D 3);
tuple_from_row!(A 0, B 1, C 2, D 3, E 4);
tuple_from_row!(A 0, B 1, C 2, D 3, E 4, F 5);
tuple_from_row!(A 0, B 1, C 2, D 3, E 4, F 5, G 6);
tuple_from_row!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7);
