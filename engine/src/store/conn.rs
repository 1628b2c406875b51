//! The connection the store's own statements run on: the sqlx pool (PostgreSQL, or SQLite
//! when the store wraps an existing connection), or the SQLite fast path (`lite/`). Both
//! implement [`Exec`], so every statement of the store is written once.

use sea_orm::{
    AccessMode, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, IsolationLevel,
    Statement, TransactionTrait,
};

use super::lite::{LiteDb, LiteTx};
use super::row::{Exec, Row};

/// Where the store's statements run.
#[derive(Debug, Clone)]
pub enum Db {
    /// Through sea-orm's sqlx pool.
    Pool(DatabaseConnection),
    /// On the SQLite fast path.
    Lite(LiteDb),
}

/// An open transaction of a [`Db`].
#[derive(Debug)]
pub enum Txn {
    /// Through sea-orm's sqlx pool.
    Pool(DatabaseTransaction),
    /// On the SQLite fast path.
    Lite(LiteTx),
}

impl Db {
    /// The database behind it.
    pub fn backend(&self) -> DbBackend {
        match self {
            Self::Pool(db) => db.get_database_backend(),
            Self::Lite(_) => DbBackend::Sqlite,
        }
    }

    /// Begins a transaction.
    ///
    /// # Errors
    /// The database's error.
    pub async fn begin(&self) -> Result<Txn, DbErr> {
        Ok(match self {
            Self::Pool(db) => Txn::Pool(db.begin().await?),
            Self::Lite(db) => Txn::Lite(db.begin().await?),
        })
    }
}

impl Db {
    /// Begins a transaction that only reads, all of it from one snapshot: `REPEATABLE READ,
    /// READ ONLY` on PostgreSQL (a standby serves it too); on SQLite a deferred transaction,
    /// on a reader of the fast path, which fixes its snapshot at its first read and never
    /// takes the write lock. End it with a rollback (`Txn::end` keeping nothing).
    ///
    /// # Errors
    /// The database's error.
    pub async fn begin_read(&self) -> Result<Txn, DbErr> {
        Ok(match self {
            Self::Pool(db) if db.get_database_backend() == DbBackend::Postgres => Txn::Pool(
                db.begin_with_config(
                    Some(IsolationLevel::RepeatableRead),
                    Some(AccessMode::ReadOnly),
                )
                .await?,
            ),
            Self::Pool(db) => Txn::Pool(db.begin().await?),
            Self::Lite(db) => Txn::Lite(db.begin_read().await?),
        })
    }
}

impl Txn {
    /// Ends the transaction by the result of its work: commits an `Ok` that `keep` says to
    /// keep, rolls back any other `Ok`, and rolls back after an error (whose report matters
    /// more than the rollback's).
    ///
    /// # Errors
    /// The work's error, or the commit's or rollback's.
    pub(crate) async fn end<T>(
        self,
        result: crate::Result<T>,
        keep: impl FnOnce(&T) -> bool,
    ) -> crate::Result<T> {
        match result {
            Ok(v) if keep(&v) => {
                self.commit().await?;
                Ok(v)
            }
            Ok(v) => {
                self.rollback().await?;
                Ok(v)
            }
            Err(e) => {
                let _ = self.rollback().await;
                Err(e)
            }
        }
    }

    /// Commits.
    ///
    /// # Errors
    /// The database's error; nothing is committed then.
    pub async fn commit(self) -> Result<(), DbErr> {
        match self {
            Self::Pool(t) => t.commit().await,
            Self::Lite(t) => t.commit().await,
        }
    }

    /// Rolls back.
    ///
    /// # Errors
    /// The database's error.
    pub async fn rollback(self) -> Result<(), DbErr> {
        match self {
            Self::Pool(t) => t.rollback().await,
            Self::Lite(t) => t.rollback(),
        }
    }
}

#[async_trait::async_trait]
impl Exec for Db {
    async fn execute(&self, stmt: Statement) -> Result<u64, DbErr> {
        match self {
            Self::Pool(db) => Exec::execute(db, stmt).await,
            Self::Lite(db) => db.execute(&stmt).await,
        }
    }

    async fn execute_unprepared(&self, sql: &str) -> Result<u64, DbErr> {
        match self {
            Self::Pool(db) => Exec::execute_unprepared(db, sql).await,
            Self::Lite(db) => db.execute_unprepared(sql).await,
        }
    }

    async fn query_all(&self, stmt: Statement) -> Result<Vec<Row>, DbErr> {
        match self {
            Self::Pool(db) => Exec::query_all(db, stmt).await,
            Self::Lite(db) => db.query(&stmt).await,
        }
    }
}

#[async_trait::async_trait]
impl Exec for Txn {
    async fn execute(&self, stmt: Statement) -> Result<u64, DbErr> {
        match self {
            Self::Pool(t) => Exec::execute(t, stmt).await,
            Self::Lite(t) => t.execute(&stmt).await,
        }
    }

    async fn execute_unprepared(&self, sql: &str) -> Result<u64, DbErr> {
        match self {
            Self::Pool(t) => Exec::execute_unprepared(t, sql).await,
            Self::Lite(t) => t.execute_unprepared(sql).await,
        }
    }

    async fn query_all(&self, stmt: Statement) -> Result<Vec<Row>, DbErr> {
        match self {
            Self::Pool(t) => Exec::query_all(t, stmt).await,
            Self::Lite(t) => t.query(&stmt).await,
        }
    }
}
