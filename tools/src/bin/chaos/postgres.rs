//! The database of one chaos run, on a private cluster (`sagaflow_testkit::PgCluster`) or on
//! the server given.

use sagaflow::sea_orm::{ConnectionTrait, Database};
use sagaflow_tools::Error;

/// A database created for one chaos run.
#[derive(Debug)]
pub(crate) struct ChaosDb {
    admin_url: String,
    /// Its name.
    pub(crate) name: String,
    /// Its URL.
    pub(crate) url: String,
}

impl ChaosDb {
    /// Creates `sagaflow_chaos_<id>` on the server of `admin_url`. With `sync_commit`, the
    /// database gets `synchronous_commit = on` whatever the server's default: an immediate
    /// restart (a crash, for PostgreSQL) loses the commits that were acknowledged but not yet
    /// written when `synchronous_commit` is `off` (as on scripts/pg.sh clusters), and an
    /// engine that acted on a lost commit (dispatched the next step) cannot be consistent.
    /// `fsync = off` does no harm here: the written WAL survives in the OS page cache.
    pub(crate) async fn create(admin_url: &str, sync_commit: bool) -> Result<Self, Error> {
        let name = format!(
            "sagaflow_chaos_{}",
            &uuid::Uuid::now_v7().simple().to_string()[20..]
        );
        let (base, query) = match admin_url.split_once('?') {
            Some((b, q)) => (b, Some(q)),
            None => (admin_url, None),
        };
        let Some((server, _)) = base.rsplit_once('/').filter(|(s, _)| s.contains("://")) else {
            return Err(Error::Usage(format!(
                "database URL {} must name a database: postgres://user@host:port/db",
                sagaflow::redact_url(admin_url)
            )));
        };
        let url = match query {
            Some(q) => format!("{server}/{name}?{q}"),
            None => format!("{server}/{name}"),
        };
        let conn = Database::connect(admin_url)
            .await
            .map_err(Error::sql("connect", admin_url))?;
        let mut created = conn
            .execute_unprepared(&format!("CREATE DATABASE {name}"))
            .await
            .map(|_| ())
            .map_err(Error::sql(format!("CREATE DATABASE {name}"), admin_url));
        if created.is_ok() && sync_commit {
            created = conn
                .execute_unprepared(&format!(
                    "ALTER DATABASE {name} SET synchronous_commit = on"
                ))
                .await
                .map(|_| ())
                .map_err(Error::sql(
                    format!("ALTER DATABASE {name} SET synchronous_commit"),
                    admin_url,
                ));
        }
        let _ = conn.close().await;
        created?;
        Ok(Self {
            admin_url: admin_url.to_owned(),
            name,
            url,
        })
    }

    /// Drops the database (every connection to it must be gone, or is forced off).
    pub(crate) async fn drop_db(&self) -> Result<(), Error> {
        let conn = Database::connect(self.admin_url.as_str())
            .await
            .map_err(Error::sql("connect", &self.admin_url))?;
        let mut res = conn
            .execute_unprepared(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await;
        if res.is_err() {
            // Before PostgreSQL 13 there is no FORCE.
            res = conn
                .execute_unprepared(&format!("DROP DATABASE IF EXISTS {}", self.name))
                .await;
        }
        let _ = conn.close().await;
        res.map(|_| ()).map_err(Error::sql(
            format!("DROP DATABASE {}", self.name),
            &self.admin_url,
        ))
    }
}
