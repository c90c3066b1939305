//! A statement's arguments: typed, so that PostgreSQL (which types every parameter) gets what
//! it expects, and bound to SQLite by number.

use super::*;

/// What an argument is when it is NULL: PostgreSQL types every parameter.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Int,
    Real,
    Bool,
    Text,
    Blob,
}

/// An argument, as bound.
#[derive(Debug, Clone)]
pub enum Arg<'q> {
    Int(i64),
    Real(f64),
    Bool(bool),
    Text(Cow<'q, str>),
    Blob(Cow<'q, [u8]>),
    Null(Kind),
}

/// A value that can be bound: integers (as 64-bit), floats, booleans, text, bytes and their
/// `Option`s.
pub trait Encode<'q> {
    const KIND: Kind;
    fn encode(self) -> Arg<'q>;
}

macro_rules! encode_int {
    ($($ty:ty),*) => {$(
        impl<'q> Encode<'q> for $ty {
            const KIND: Kind = Kind::Int;
            fn encode(self) -> Arg<'q> {
                Arg::Int(i64::from(self))
            }
        }
    )*};
}
encode_int!(i64, i32, u32, i16, u16, u8);

impl<'q> Encode<'q> for f64 {
    const KIND: Kind = Kind::Real;
    fn encode(self) -> Arg<'q> {
        Arg::Real(self)
    }
}

impl<'q> Encode<'q> for bool {
    const KIND: Kind = Kind::Bool;
    fn encode(self) -> Arg<'q> {
        Arg::Bool(self)
    }
}

impl<'q> Encode<'q> for &'q str {
    const KIND: Kind = Kind::Text;
    fn encode(self) -> Arg<'q> {
        Arg::Text(Cow::Borrowed(self))
    }
}

impl<'q> Encode<'q> for &'q String {
    const KIND: Kind = Kind::Text;
    fn encode(self) -> Arg<'q> {
        Arg::Text(Cow::Borrowed(self))
    }
}

impl<'q> Encode<'q> for String {
    const KIND: Kind = Kind::Text;
    fn encode(self) -> Arg<'q> {
        Arg::Text(Cow::Owned(self))
    }
}

impl<'q> Encode<'q> for &'q [u8] {
    const KIND: Kind = Kind::Blob;
    fn encode(self) -> Arg<'q> {
        Arg::Blob(Cow::Borrowed(self))
    }
}

impl<'q> Encode<'q> for Vec<u8> {
    const KIND: Kind = Kind::Blob;
    fn encode(self) -> Arg<'q> {
        Arg::Blob(Cow::Owned(self))
    }
}

impl<'q, T: Encode<'q>> Encode<'q> for Option<T> {
    const KIND: Kind = T::KIND;
    fn encode(self) -> Arg<'q> {
        match self {
            Some(value) => value.encode(),
            None => Arg::Null(T::KIND),
        }
    }
}

impl Arg<'_> {
    pub(super) fn into_owned(self) -> Arg<'static> {
        match self {
            Arg::Int(value) => Arg::Int(value),
            Arg::Real(value) => Arg::Real(value),
            Arg::Bool(value) => Arg::Bool(value),
            Arg::Text(text) => Arg::Text(Cow::Owned(text.into_owned())),
            Arg::Blob(bytes) => Arg::Blob(Cow::Owned(bytes.into_owned())),
            Arg::Null(kind) => Arg::Null(kind),
        }
    }
}

impl rusqlite::ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, Value, ValueRef};
        Ok(match self {
            Arg::Int(value) => ToSqlOutput::Owned(Value::Integer(*value)),
            Arg::Real(value) => ToSqlOutput::Owned(Value::Real(*value)),
            Arg::Bool(value) => ToSqlOutput::Owned(Value::Integer(i64::from(*value))),
            Arg::Text(text) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
            Arg::Blob(bytes) => ToSqlOutput::Borrowed(ValueRef::Blob(bytes)),
            Arg::Null(_) => ToSqlOutput::Owned(Value::Null),
        })
    }
}
