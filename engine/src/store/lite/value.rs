//! Bound parameters of the fast path, stored as the sqlx driver stores them, so that one
//! file can be used by both.

use rusqlite::types::{ToSqlOutput, ValueRef};
use sea_orm::Value;

/// A bound parameter, written as the sqlx driver writes it: booleans as integers, UUIDs as
/// 16-byte blobs, JSON as text.
pub(super) struct Param<'a>(pub(super) &'a Value);

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        use rusqlite::types::Value as L;
        let owned = |v: L| Ok(ToSqlOutput::Owned(v));
        match self.0 {
            Value::Bool(Some(b)) => owned(L::Integer(i64::from(*b))),
            Value::TinyInt(Some(i)) => owned(L::Integer(i64::from(*i))),
            Value::SmallInt(Some(i)) => owned(L::Integer(i64::from(*i))),
            Value::Int(Some(i)) => owned(L::Integer(i64::from(*i))),
            Value::BigInt(Some(i)) => owned(L::Integer(*i)),
            Value::TinyUnsigned(Some(i)) => owned(L::Integer(i64::from(*i))),
            Value::SmallUnsigned(Some(i)) => owned(L::Integer(i64::from(*i))),
            Value::Unsigned(Some(i)) => owned(L::Integer(i64::from(*i))),
            Value::BigUnsigned(Some(i)) => i64::try_from(*i)
                .map(|i| ToSqlOutput::Owned(L::Integer(i)))
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e))),
            Value::Float(Some(f)) => owned(L::Real(f64::from(*f))),
            Value::Double(Some(f)) => owned(L::Real(*f)),
            Value::String(Some(s)) => Ok(ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes()))),
            Value::Char(Some(c)) => owned(L::Text(c.to_string())),
            Value::Bytes(Some(b)) => Ok(ToSqlOutput::Borrowed(ValueRef::Blob(b))),
            Value::Json(Some(j)) => owned(L::Text(j.to_string())),
            Value::Uuid(Some(u)) => Ok(ToSqlOutput::Borrowed(ValueRef::Blob(u.as_bytes()))),
            Value::Bool(None)
            | Value::TinyInt(None)
            | Value::SmallInt(None)
            | Value::Int(None)
            | Value::BigInt(None)
            | Value::TinyUnsigned(None)
            | Value::SmallUnsigned(None)
            | Value::Unsigned(None)
            | Value::BigUnsigned(None)
            | Value::Float(None)
            | Value::Double(None)
            | Value::String(None)
            | Value::Char(None)
            | Value::Bytes(None)
            | Value::Json(None)
            | Value::Uuid(None) => Ok(ToSqlOutput::Borrowed(ValueRef::Null)),
            other => Err(rusqlite::Error::ToSqlConversionFailure(
                format!("a parameter of type {other:?} is not supported on SQLite").into(),
            )),
        }
    }
}
