//! The database the demo runs on: its own fresh SQLite file, or the URL it was given.

pub(crate) use sagaflow_workflows::database::Database;

use super::DemoResult;

/// Uses the URL given, or deletes and recreates the demo's own SQLite file.
pub(crate) fn prepare_database(arg: Option<&str>) -> DemoResult<Database> {
    sagaflow_workflows::database::prepare(arg, "sagaflow-demo")
}
