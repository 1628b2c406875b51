//! Result rows and statement execution over both paths of the store: sea-orm's pool
//! (PostgreSQL, and SQLite through sqlx) and the SQLite fast path (`lite/`).
//!
//! sea-orm's rows cannot be built outside its own drivers, so the store reads rows through
//! [`Row`]: a sea-orm row, or a row of the fast path. A column is decoded as the type the
//! reader asks for ([`Cell`]), from either kind of row, with the same errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sea_orm::{ConnectionTrait, DbErr, QueryResult, Statement, TryGetable};
use uuid::Uuid;

/// A row of the fast path: the statement's column names (shared by its rows) and the values
/// as SQLite holds them.
#[derive(Debug)]
pub struct LiteRow {
    pub(super) columns: Arc<[String]>,
    pub(super) values: Vec<rusqlite::types::Value>,
    /// Where the search for the next column read starts: one past the last column found.
    /// Readers decode columns in the order they selected them, so the first name compared
    /// is nearly always the one asked for (a scan of every name per cell was 3% of the
    /// SQLite profile's instructions).
    pub(super) next: AtomicUsize,
}

impl LiteRow {
    pub(super) fn new(columns: Arc<[String]>, values: Vec<rusqlite::types::Value>) -> Self {
        Self {
            columns,
            values,
            next: AtomicUsize::new(0),
        }
    }

    /// The index of column `col`, searched from where the last read ended, wrapping around.
    fn position(&self, col: &str) -> Option<usize> {
        let n = self.columns.len();
        let start = self.next.load(Ordering::Relaxed).min(n);
        let i = (start..n)
            .chain(0..start)
            .find(|&i| self.columns[i] == col)?;
        self.next.store(i + 1, Ordering::Relaxed);
        Some(i)
    }
}

impl Clone for LiteRow {
    fn clone(&self) -> Self {
        Self::new(Arc::clone(&self.columns), self.values.clone())
    }
}

/// One result row.
#[derive(Debug)]
pub enum Row {
    /// From sea-orm's pool.
    Pool(QueryResult),
    /// From the SQLite fast path.
    Lite(LiteRow),
}

impl Row {
    /// Column `col` decoded as `T` (`pre` is a column-name prefix, as in sea-orm).
    ///
    /// # Errors
    /// [`DbErr::Type`] naming the column when it is missing or holds another type, or a
    /// NULL where `T` is not an `Option`.
    pub fn try_get<T: Cell>(&self, pre: &str, col: &str) -> Result<T, DbErr> {
        match self {
            Self::Pool(r) => r.try_get(pre, col),
            Self::Lite(r) => {
                let name;
                let col = if pre.is_empty() {
                    col
                } else {
                    name = format!("{pre}{col}");
                    &name
                };
                let i = r
                    .position(col)
                    .ok_or_else(|| DbErr::Type(format!("no column `{col}` in the row")))?;
                T::from_lite(&r.values[i])
                    .map_err(|reason| DbErr::Type(format!("column `{col}`: {reason}")))
            }
        }
    }
}

/// A type a column can be read as, from either kind of [`Row`].
pub trait Cell: TryGetable + Sized {
    /// Reads the value SQLite holds.
    ///
    /// # Errors
    /// Why the value is not a `Self`.
    fn from_lite(v: &rusqlite::types::Value) -> Result<Self, String>;
}

use rusqlite::types::Value as L;

fn mismatch<T>(want: &str, v: &L) -> Result<T, String> {
    Err(match v {
        L::Null => format!("NULL where {want} is required"),
        other => format!("{:?} where {want} is required", other.data_type()),
    })
}

impl Cell for i64 {
    fn from_lite(v: &L) -> Result<Self, String> {
        match v {
            L::Integer(i) => Ok(*i),
            other => mismatch("an integer", other),
        }
    }
}

impl Cell for i32 {
    fn from_lite(v: &L) -> Result<Self, String> {
        match v {
            L::Integer(i) => i32::try_from(*i).map_err(|_| format!("{i} is out of range")),
            other => mismatch("an integer", other),
        }
    }
}

impl Cell for bool {
    fn from_lite(v: &L) -> Result<Self, String> {
        match v {
            L::Integer(i) => Ok(*i != 0),
            other => mismatch("a boolean", other),
        }
    }
}

impl Cell for String {
    fn from_lite(v: &L) -> Result<Self, String> {
        match v {
            L::Text(s) => Ok(s.clone()),
            other => mismatch("text", other),
        }
    }
}

impl Cell for Uuid {
    fn from_lite(v: &L) -> Result<Self, String> {
        match v {
            L::Blob(b) => Uuid::from_slice(b).map_err(|e| format!("not a UUID: {e}")),
            other => mismatch("a UUID", other),
        }
    }
}

impl<T: Cell> Cell for Option<T> {
    fn from_lite(v: &L) -> Result<Self, String> {
        match v {
            L::Null => Ok(None),
            other => T::from_lite(other).map(Some),
        }
    }
}

/// Implements [`FromRow`] for a struct whose fields are read by name, each as its type
/// ([`Cell`]), or through a function of the row and the column name (`field: function`).
macro_rules! from_row {
    ($t:ident { $($field:ident $(: $via:path)?),* $(,)? }) => {
        impl $crate::store::FromRow for $t {
            fn from_row(r: &$crate::store::Row) -> ::std::result::Result<Self, ::sea_orm::DbErr> {
                Ok(Self { $($field: $crate::store::from_row!(@cell r, $field $(, $via)?),)* })
            }
        }
    };
    (@cell $r:ident, $field:ident) => {
        $r.try_get("", stringify!($field))?
    };
    (@cell $r:ident, $field:ident, $via:path) => {
        $via($r, stringify!($field))?
    };
}
pub(crate) use from_row;

/// A value read from a whole row.
pub trait FromRow: Sized {
    /// Reads it.
    ///
    /// # Errors
    /// As [`Row::try_get`].
    fn from_row(r: &Row) -> Result<Self, DbErr>;
}

/// Where the store's statements run: sea-orm's connections and transactions, and those of
/// the fast path.
#[async_trait::async_trait]
pub trait Exec: Sync {
    /// Runs a statement; returns the rows it changed.
    ///
    /// # Errors
    /// The database's error.
    async fn execute(&self, stmt: Statement) -> Result<u64, DbErr>;

    /// Runs statements without parameters.
    ///
    /// # Errors
    /// The database's error.
    async fn execute_unprepared(&self, sql: &str) -> Result<u64, DbErr>;

    /// Runs a query; returns its rows.
    ///
    /// # Errors
    /// The database's error.
    async fn query_all(&self, stmt: Statement) -> Result<Vec<Row>, DbErr>;

    /// Runs a query; returns its first row.
    ///
    /// # Errors
    /// The database's error.
    async fn query_one(&self, stmt: Statement) -> Result<Option<Row>, DbErr> {
        Ok(self.query_all(stmt).await?.into_iter().next())
    }
}

#[async_trait::async_trait]
impl<C: ConnectionTrait> Exec for C {
    async fn execute(&self, stmt: Statement) -> Result<u64, DbErr> {
        Ok(self.execute_raw(stmt).await?.rows_affected())
    }

    async fn execute_unprepared(&self, sql: &str) -> Result<u64, DbErr> {
        Ok(ConnectionTrait::execute_unprepared(self, sql)
            .await?
            .rows_affected())
    }

    async fn query_all(&self, stmt: Statement) -> Result<Vec<Row>, DbErr> {
        Ok(self
            .query_all_raw(stmt)
            .await?
            .into_iter()
            .map(Row::Pool)
            .collect())
    }

    async fn query_one(&self, stmt: Statement) -> Result<Option<Row>, DbErr> {
        Ok(self.query_one_raw(stmt).await?.map(Row::Pool))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_decoded_as_the_reader_asks_and_refused_otherwise() {
        let u = Uuid::now_v7();
        assert_eq!(i64::from_lite(&L::Integer(1 << 40)), Ok(1 << 40));
        assert_eq!(i32::from_lite(&L::Integer(7)), Ok(7));
        assert!(
            i32::from_lite(&L::Integer(1 << 40)).is_err(),
            "out of range"
        );
        assert_eq!(bool::from_lite(&L::Integer(1)), Ok(true));
        assert_eq!(bool::from_lite(&L::Integer(0)), Ok(false));
        assert_eq!(Uuid::from_lite(&L::Blob(u.as_bytes().to_vec())), Ok(u));
        assert!(
            Uuid::from_lite(&L::Blob(vec![1, 2, 3])).is_err(),
            "not 16 bytes"
        );
        assert_eq!(Option::<String>::from_lite(&L::Null), Ok(None));
        assert_eq!(
            Option::<String>::from_lite(&L::Text("x".into())),
            Ok(Some("x".into()))
        );
        // A NULL or another type where a value is required names what was found.
        assert_eq!(
            String::from_lite(&L::Null),
            Err("NULL where text is required".into())
        );
        assert!(String::from_lite(&L::Integer(3)).is_err());
        assert!(i64::from_lite(&L::Text("3".into())).is_err());
    }

    #[test]
    fn a_lite_row_reads_columns_by_name_and_names_what_is_wrong() {
        let row = Row::Lite(LiteRow::new(
            vec!["id".to_owned(), "state".to_owned()].into(),
            vec![L::Integer(5), L::Text("ready".into())],
        ));
        assert_eq!(row.try_get::<i64>("", "id").ok(), Some(5));
        assert_eq!(
            row.try_get::<String>("", "state").ok().as_deref(),
            Some("ready")
        );
        // Out of order and again: the search wraps around from where the last read ended.
        assert_eq!(row.try_get::<i64>("", "id").ok(), Some(5));
        assert_eq!(row.try_get::<i64>("", "id").ok(), Some(5));
        let missing = row.try_get::<i64>("", "nope").expect_err("no such column");
        assert!(
            missing.to_string().contains("no column `nope`"),
            "{missing}"
        );
        let wrong = row
            .try_get::<i64>("", "state")
            .expect_err("text is no integer");
        assert!(wrong.to_string().contains("column `state`"), "{wrong}");
    }
}
