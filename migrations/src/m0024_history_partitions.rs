//! History partitioned by time on PostgreSQL (issue 32): `sagaflow_history` becomes a table
//! range-partitioned on `run_id` (a UUIDv7, so a range of ids is a range of start times),
//! one partition per UTC day, so that retention drops a day's history whole instead of
//! deleting it row by row (see [`crate::partitions`]).
//!
//! The table as it was, if it holds history, becomes the partition
//! [`HISTORY_BEFORE_PARTITION`], covering every run id up to the next UTC midnight; attaching
//! it reads it once to check that bound, under a lock that holds history writes back for that
//! long. Rows of ids above the bound (none, unless a clock ran ahead) move to the default
//! partition first. An empty one is dropped. The partitions of the days up to two days
//! ahead are made here; the engine makes later ones ahead of time.
//!
//! SQLite keeps one table and row deletes: there is nothing to do there.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{DbBackend, Statement, TryGetable};

use crate::execute;
use crate::partitions::{
    HISTORY_BEFORE_PARTITION, HISTORY_COLUMNS, HISTORY_DEFAULT_PARTITION,
    HISTORY_PARTITION_SPAN_MS, history_partition_create, next_span, uuid_floor,
};

/// The migration.
#[derive(DeriveMigrationName)]
pub(crate) struct Migration;

/// The columns, in the order of the table they replace.
const COLUMNS: &str = HISTORY_COLUMNS;

#[allow(elided_lifetimes_in_paths)] // the trait is declared with a hidden lifetime
#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres || partitioned(manager).await? {
            return Ok(());
        }
        let now = db_now_ms(manager).await?;
        let kept = has_rows(manager).await?;
        // With history to keep, the old table covers the rest of today; without, it goes
        // and today has a partition of its own.
        let first_day = if kept {
            next_span(now)
        } else {
            next_span(now) - HISTORY_PARTITION_SPAN_MS
        };
        let bound = uuid_floor(first_day);
        let mut statements = vec![
            format!("ALTER TABLE sagaflow_history RENAME TO {HISTORY_BEFORE_PARTITION}"),
            format!(
                "ALTER TABLE {HISTORY_BEFORE_PARTITION} RENAME CONSTRAINT sagaflow_history_pkey \
                 TO {HISTORY_BEFORE_PARTITION}_pkey"
            ),
            "CREATE TABLE sagaflow_history (
                id BIGINT NOT NULL DEFAULT nextval('sagaflow_history_id_seq'),
                run_id UUID NOT NULL,
                step TEXT NULL,
                event TEXT NOT NULL,
                from_state TEXT NULL,
                to_state TEXT NULL,
                attempt INTEGER NULL,
                actor TEXT NOT NULL,
                detail TEXT NULL,
                at BIGINT NOT NULL,
                then_states TEXT NULL,
                CONSTRAINT sagaflow_history_pkey PRIMARY KEY (run_id, id)
            ) PARTITION BY RANGE (run_id)"
                .to_owned(),
            // The sequence now belongs to the partitioned table: dropping the old partition
            // must not take it along.
            "ALTER SEQUENCE sagaflow_history_id_seq OWNED BY sagaflow_history.id".to_owned(),
            format!(
                "CREATE TABLE {HISTORY_DEFAULT_PARTITION} PARTITION OF sagaflow_history DEFAULT"
            ),
            // As m0002 set it on the table this replaces: the purge looks runs up in the
            // default partition by `run_id = ANY(…)`.
            format!(
                "ALTER TABLE {HISTORY_DEFAULT_PARTITION} ALTER COLUMN run_id SET (n_distinct = -0.05)"
            ),
        ];
        if kept {
            statements.extend([
                format!(
                    "INSERT INTO {HISTORY_DEFAULT_PARTITION} ({COLUMNS}) SELECT {COLUMNS} \
                     FROM {HISTORY_BEFORE_PARTITION} WHERE run_id >= '{bound}'"
                ),
                format!("DELETE FROM {HISTORY_BEFORE_PARTITION} WHERE run_id >= '{bound}'"),
                format!(
                    "ALTER TABLE sagaflow_history ATTACH PARTITION {HISTORY_BEFORE_PARTITION} \
                     FOR VALUES FROM (MINVALUE) TO ('{bound}')"
                ),
            ]);
        } else {
            statements.push(format!("DROP TABLE {HISTORY_BEFORE_PARTITION}"));
        }
        let mut day = first_day;
        while day < now + 2 * HISTORY_PARTITION_SPAN_MS {
            statements.push(history_partition_create(day));
            day += HISTORY_PARTITION_SPAN_MS;
        }
        for sql in &statements {
            execute(manager, sql).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres || !partitioned(manager).await? {
            return Ok(());
        }
        let statements = [
            "CREATE TABLE sagaflow_history_plain (LIKE sagaflow_history INCLUDING DEFAULTS)".to_owned(),
            format!(
                "INSERT INTO sagaflow_history_plain ({COLUMNS}) SELECT {COLUMNS} FROM sagaflow_history"
            ),
            "ALTER SEQUENCE sagaflow_history_id_seq OWNED BY sagaflow_history_plain.id".to_owned(),
            "DROP TABLE sagaflow_history".to_owned(),
            "ALTER TABLE sagaflow_history_plain RENAME TO sagaflow_history".to_owned(),
            "ALTER TABLE sagaflow_history ADD CONSTRAINT sagaflow_history_pkey PRIMARY KEY (run_id, id)"
                .to_owned(),
        ];
        for sql in &statements {
            execute(manager, sql).await?;
        }
        Ok(())
    }
}

/// Whether `sagaflow_history` is partitioned already (a start over a schema an interrupted
/// run of this migration left is impossible: it runs in one transaction; this keeps it
/// re-runnable all the same).
async fn partitioned(manager: &SchemaManager<'_>) -> Result<bool, DbErr> {
    let sql = "SELECT relkind::text = 'p' AS v FROM pg_class \
               WHERE oid = to_regclass('sagaflow_history')";
    Ok(value::<bool>(manager, sql).await?.unwrap_or(false))
}

/// Whether the history table holds a row.
async fn has_rows(manager: &SchemaManager<'_>) -> Result<bool, DbErr> {
    let sql = "SELECT EXISTS (SELECT 1 FROM sagaflow_history) AS v";
    Ok(value::<bool>(manager, sql).await?.unwrap_or(false))
}

/// The database's clock (AT-2), in epoch milliseconds.
async fn db_now_ms(manager: &SchemaManager<'_>) -> Result<i64, DbErr> {
    let sql = "SELECT (EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT AS v";
    value::<i64>(manager, sql)
        .await?
        .ok_or_else(|| DbErr::Migration("the database did not tell its time".into()))
}

/// The column `v` of the one row `sql` reads, if it reads one.
async fn value<T: TryGetable>(manager: &SchemaManager<'_>, sql: &str) -> Result<Option<T>, DbErr> {
    let row = manager
        .get_connection()
        .query_one_raw(Statement::from_string(DbBackend::Postgres, sql))
        .await?;
    row.map(|r| r.try_get("", "v")).transpose()
}
