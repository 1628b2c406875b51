//! Schema migrations of sagaflow.
//!
//! The engine runs [`Migrator::up`] on start. Applied migrations are recorded in the table
//! [`MIGRATION_TABLE`], never in sea-orm's default `seaql_migrations`, so an embedding
//! application can keep its own migrator on the same database. Only forward migrations are
//! offered: `fresh()`/`refresh()` would drop every table of the host database and are not
//! re-exported.
//!
//! Migrations are plain SQL per backend. They never import the engine's entity structs, so an
//! old migration keeps meaning what it meant when it shipped.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

mod m0001_initial;
mod m0002_hot_path;
mod m0003_outcomes_and_instances;
mod m0004_leader_progress;

/// Name of the table that records applied sagaflow migrations.
pub const MIGRATION_TABLE: &str = "sagaflow_migrations";

/// Applies sagaflow's schema migrations.
#[derive(Debug, Clone, Copy, Default)]
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m0001_initial::Migration),
            Box::new(m0002_hot_path::Migration),
            Box::new(m0003_outcomes_and_instances::Migration),
            Box::new(m0004_leader_progress::Migration),
        ]
    }

    fn migration_table_name() -> DynIden {
        Alias::new(MIGRATION_TABLE).into_iden()
    }
}

/// Brings the database schema up to date.
///
/// # Errors
/// Any database error raised while applying a migration.
pub async fn migrate(db: &sea_orm_migration::sea_orm::DatabaseConnection) -> Result<(), DbErr> {
    Migrator::up(db, None).await
}

/// Runs a list of SQL statements, choosing the PostgreSQL or SQLite variant.
async fn run_all(
    manager: &SchemaManager<'_>,
    postgres: &[&str],
    sqlite: &[&str],
) -> Result<(), DbErr> {
    let stmts = match manager.get_database_backend() {
        DbBackend::Postgres => postgres,
        DbBackend::Sqlite => sqlite,
        other => {
            return Err(DbErr::Migration(format!(
                "sagaflow does not support the {other:?} backend"
            )));
        }
    };
    let conn = manager.get_connection();
    for sql in stmts {
        conn.execute_unprepared(sql).await?;
    }
    Ok(())
}
