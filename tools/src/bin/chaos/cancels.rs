//! Operators' cancels: one run at a time, and bulk cancels of a batch of runs at once, of
//! any unfinished run, at any point of it: before anything acted (the run compensates what
//! little it did), halfway (it compensates), while its pivot runs or after it completed (the
//! cancel came too late: the run goes forward and completes, or, when the pivot's outcome is
//! unknown, stops in `error` with an alert). Single cancels take orders, bulk cancels every
//! kind.
//!
//! The engine's bulk action is an HTTP route (`POST /api/v1/runs/actions/cancel` with
//! filters), which takes the same operator action on each run of a page; the coordinator
//! has no API server, so a bulk cancel here is that action on a batch picked in one query,
//! taken on every run of it concurrently.

use sagaflow::internals::operator::{self, Audit};
use sagaflow::internals::store::Store;
use sagaflow::sea_orm::{ConnectionTrait, Statement};
use uuid::Uuid;

use super::mix::{FLOW_WORKFLOW, PAIR_WORKFLOW};

/// Unfinished runs, at most `n`, picked at random (orders only, or runs of every kind).
async fn pick(store: &Store, n: u32, orders_only: bool) -> Vec<Uuid> {
    let conn = store.connection();
    let kinds = if orders_only {
        "r.workflow = 'order'".to_owned()
    } else {
        format!("r.workflow IN ('order', '{PAIR_WORKFLOW}', '{FLOW_WORKFLOW}')")
    };
    let sql = format!(
        "SELECT r.id AS run_id FROM sagaflow_runs r \
         WHERE r.state IN ('pending', 'running') AND {kinds} ORDER BY random() LIMIT {n}"
    );
    let Ok(rows) = conn
        .query_all_raw(Statement::from_string(conn.get_database_backend(), sql))
        .await
    else {
        return Vec::new();
    };
    rows.iter()
        .filter_map(|r| r.try_get::<Uuid>("", "run_id").ok())
        .collect()
}

/// An operator cancels one unfinished order; its id when cancelled.
pub(crate) async fn cancel_one(store: Store) -> Option<Uuid> {
    let id = *pick(&store, 1, true).await.first()?;
    let audit = Audit::new("chaos", "the customer cancelled");
    operator::cancel(&store, id, &audit).await.ok().map(|_| id)
}

/// An operator cancels up to `n` runs of every kind at once: the ids cancelled, and how many
/// the engine refused (a run that moved on meanwhile).
pub(crate) async fn cancel_batch(store: Store, n: u32) -> (Vec<Uuid>, u64) {
    let ids = pick(&store, n, false).await;
    let mut tasks = tokio::task::JoinSet::new();
    for id in ids {
        let store = store.clone();
        tasks.spawn(async move {
            let audit = Audit::new("chaos", "bulk cancel");
            operator::cancel(&store, id, &audit).await.ok().map(|_| id)
        });
    }
    let (mut done, mut refused) = (Vec::new(), 0);
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Some(id)) => done.push(id),
            _ => refused += 1,
        }
    }
    (done, refused)
}

/// The instance id of the current supervisor leader, read from its lease row.
pub(crate) async fn leader(store: &Store) -> Option<String> {
    let name = sagaflow::internals::SupervisorConfig::new("chaos").lease_name;
    store
        .leader_current(&name)
        .await
        .ok()
        .flatten()
        .map(|f| f.holder)
}
