//! Published workflow definitions: each engine records, on start, the description of every
//! workflow it registered ([`WorkflowDescription`]), one row per `name@version`.
//!
//! A description is compared as text. The same text is recorded again with the newest
//! publisher; a different text under the same version replaces the stored one (the code that
//! runs is what executes), and when runs of that version are unfinished it also raises a
//! `definition_changed` alert: those runs were accepted under another graph, and a changed
//! graph wants a new version.

use serde::Serialize;

use super::Store;
use super::alerts::{NewAlert, insert_alert};
use super::row::{Exec, Row};
use crate::definition::{WorkflowDescription, workflow_key};
use crate::model::{Alert, AlertKind, Timestamp, timestamp};
use crate::{Error, Result};

/// A published definition, as stored.
///
/// Serialized as the HTTP API and the `sagaflow` command answer it: the description, or
/// `null` and the reason in `description_error` when it does not decode.
#[derive(Debug, Clone, PartialEq)]
pub struct PublishedDefinition {
    /// `name@version`.
    pub key: String,
    /// The workflow's name.
    pub name: String,
    /// Its version.
    pub version: i32,
    /// The description, or why the stored text does not decode (a row edited by hand, or
    /// written by a newer release in a form this one does not read).
    pub description: std::result::Result<WorkflowDescription, String>,
    /// The instance id of the engine that published it last.
    pub published_by: String,
    /// When (database clock).
    pub published_at: Timestamp,
}

/// One published definition: a workflow version some engine published, with its graph,
/// policies and input schema.
#[derive(Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
struct PublishedDefinitionJson<'a> {
    /// `name@version`.
    key: &'a str,
    /// The workflow's name.
    name: &'a str,
    /// Its version.
    version: i32,
    /// Its graph, policies and input schema; `null` when the stored text does not decode.
    description: Option<&'a WorkflowDescription>,
    /// Why the stored description does not decode, when it does not.
    description_error: Option<&'a str>,
    /// The instance id of the engine that published it last.
    published_by: &'a str,
    /// When (database clock).
    #[cfg_attr(feature = "openapi", schema(value_type = chrono::DateTime<chrono::Utc>))]
    published_at: Timestamp,
}

impl<'a> From<&'a PublishedDefinition> for PublishedDefinitionJson<'a> {
    fn from(d: &'a PublishedDefinition) -> Self {
        Self {
            key: &d.key,
            name: &d.name,
            version: d.version,
            description: d.description.as_ref().ok(),
            description_error: d.description.as_ref().err().map(String::as_str),
            published_by: &d.published_by,
            published_at: d.published_at,
        }
    }
}

impl Serialize for PublishedDefinition {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        PublishedDefinitionJson::from(self).serialize(s)
    }
}

/// The schema of the JSON above.
#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for PublishedDefinition {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        <PublishedDefinitionJson<'static> as utoipa::PartialSchema>::schema()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for PublishedDefinition {
    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        <PublishedDefinitionJson<'static> as utoipa::ToSchema>::schemas(schemas);
    }
}

impl Store {
    /// Publishes the descriptions of an engine's workflows, in one transaction (see the
    /// module documentation). Returns the `definition_changed` alerts it raised.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn definitions_publish(
        &self,
        descriptions: &[WorkflowDescription],
        publisher: &str,
    ) -> Result<Vec<Alert>> {
        // Rows are written in key order, whatever order the caller's registry gave: two
        // engines starting at once then lock them in the same order, and cannot deadlock.
        let mut ordered: Vec<&WorkflowDescription> = descriptions.iter().collect();
        ordered.sort_by(|a, b| (&a.name, a.version).cmp(&(&b.name, b.version)));
        let txn = self.exec.begin().await?;
        let mut alerts = Vec::new();
        for d in ordered {
            let key = workflow_key(&d.name, d.version);
            let text = serde_json::to_string(d).map_err(|e| Error::InvalidDefinition {
                workflow: d.name.clone(),
                reason: format!("its description does not serialise: {e}"),
            })?;
            let values = vec![
                key.clone().into(),
                d.name.clone().into(),
                d.version.into(),
                text.clone().into(),
                publisher.to_owned().into(),
            ];
            // The row is made if it is missing, else locked and read: an engine publishing
            // the same version at once (its row not yet committed) is waited for and its
            // text compared, never overwritten unseen. (Read before the write, as it was, two
            // engines publishing a version's first row at once each saw no row, and the
            // second overwrote the first's graph without an alert while runs of it began.)
            let inserted = txn
                .execute(self.stmt(
                    "INSERT INTO sagaflow_definitions \
                       (workflow_key, name, version, description, published_by, published_at) \
                     VALUES ($1, $2, $3, $4, $5, {now}) ON CONFLICT (workflow_key) DO NOTHING",
                    values,
                ))
                .await?;
            if inserted == 1 {
                continue;
            }
            let stored = txn
                .query_one(self.stmt(
                    &format!(
                        "SELECT description FROM sagaflow_definitions WHERE workflow_key = $1{}",
                        self.dialect().row_lock
                    ),
                    vec![key.clone().into()],
                ))
                .await?
                .map(|r| r.try_get::<String>("", "description"))
                .transpose()?;
            // The same text is recorded again with the newest publisher; another replaces it
            // (the code that runs is what executes).
            txn.execute(self.stmt(
                "UPDATE sagaflow_definitions SET description = $2, published_by = $3, \
                   published_at = {now} WHERE workflow_key = $1",
                vec![
                    key.clone().into(),
                    text.clone().into(),
                    publisher.to_owned().into(),
                ],
            ))
            .await?;
            if stored.is_none_or(|stored| stored == text) {
                continue;
            }
            let unfinished: i64 = txn
                .query_one(self.stmt(
                    "SELECT COUNT(*) AS n FROM sagaflow_runs \
                     WHERE workflow_key = $1 AND finished_at IS NULL",
                    vec![key.clone().into()],
                ))
                .await?
                .map(|r| r.try_get::<i64>("", "n"))
                .transpose()?
                .unwrap_or(0);
            tracing::warn!(
                workflow = %d.name,
                version = d.version,
                unfinished,
                "published a changed definition under an unchanged version"
            );
            if unfinished == 0 {
                continue;
            }
            let alert = NewAlert {
                run_id: None,
                step: None,
                kind: AlertKind::DefinitionChanged,
                reason: format!(
                    "workflow `{}` version {} was started with another step graph or other \
                     policies while {unfinished} run(s) of it are unfinished: they continue \
                     under the new definition, and a step they had that it lacks sets them aside",
                    d.name, d.version
                ),
                attempts: 0,
                actions: vec![
                    "give a changed workflow a new version and redeploy; the old version's code \
                     finishes the runs started under it"
                        .into(),
                    "resolve_alert once the runs of the old definition have finished".into(),
                ],
                open_key: Some(format!("definition_changed:{key}")),
            };
            alerts.extend(insert_alert(self, &txn, &alert).await?);
        }
        txn.commit().await?;
        Ok(alerts)
    }

    /// Every published definition, by name and version.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn definition_list(&self) -> Result<Vec<PublishedDefinition>> {
        let rows = self
            .exec
            .query_all(self.stmt(
                &format!(
                    "SELECT {DEFINITION_COLS} FROM sagaflow_definitions ORDER BY name, version"
                ),
                vec![],
            ))
            .await?;
        rows.iter().map(decode).collect()
    }

    /// The published definition of `name@version`, if it is published.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn definition_get(
        &self,
        name: &str,
        version: i32,
    ) -> Result<Option<PublishedDefinition>> {
        let row = self
            .exec
            .query_one(self.stmt(
                &format!(
                    "SELECT {DEFINITION_COLS} FROM sagaflow_definitions WHERE workflow_key = $1"
                ),
                vec![workflow_key(name, version).into()],
            ))
            .await?;
        row.as_ref().map(decode).transpose()
    }

    /// The newest published version of the workflow `name`, if any is published.
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn definition_latest(&self, name: &str) -> Result<Option<PublishedDefinition>> {
        let row = self
            .exec
            .query_one(self.stmt(
                &format!(
                    "SELECT {DEFINITION_COLS} FROM sagaflow_definitions WHERE name = $1 \
                     ORDER BY version DESC LIMIT 1"
                ),
                vec![name.to_owned().into()],
            ))
            .await?;
        row.as_ref().map(decode).transpose()
    }
}

const DEFINITION_COLS: &str =
    "workflow_key, name, version, description, published_by, published_at";

fn decode(r: &Row) -> Result<PublishedDefinition> {
    let text: String = r.try_get("", "description")?;
    Ok(PublishedDefinition {
        key: r.try_get("", "workflow_key")?,
        name: r.try_get("", "name")?,
        version: r.try_get("", "version")?,
        description: serde_json::from_str(&text).map_err(|e| e.to_string()),
        published_by: r.try_get("", "published_by")?,
        published_at: timestamp(r.try_get("", "published_at")?),
    })
}
