//! The claim: many concurrent claimers, every step claimed exactly once (AT-3, AT-7, SAS-7).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use sagaflow::advanced::store;
use sagaflow::sea_orm::TransactionTrait;
use sagaflow::{StepContext, StepError, Store, Workflow};
use sagaflow_tests::backends;
use uuid::Uuid;

const STEPS: usize = 10_000;
const CLAIMERS: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_steps_fifty_claimers_each_step_claimed_exactly_once() {
    for db in backends().await {
        let wf = Workflow::builder("claim", 1)
            .step("only", |_ctx: StepContext| async { Ok::<_, StepError>(()) })
            .build()
            .expect("valid");
        let store = Store::connect(&db.url, Some(60)).await.expect("connect");
        // Submit every run in one transaction; each run's only step is queued at insert.
        let txn = store.connection().begin().await.expect("begin");
        let mut ids = Vec::with_capacity(STEPS);
        for _ in 0..STEPS {
            let id = Uuid::now_v7();
            let run = store::NewRun {
                id,
                workflow: "claim".into(),
                version: 1,
                business_key: None,
                input: "null".into(),
                steps: vec![store::NewStep {
                    name: "only".into(),
                    max_failures: 3,
                    deadline_ms: 600_000,
                    deadline_cap_ms: 600_000,
                    idempotency_key: format!("{id}:only"),
                    ready: true,
                }],
            };
            store.run_insert(&txn, &run).await.expect("insert");
            ids.push(id);
        }
        txn.commit().await.expect("commit");
        assert_eq!(store.step_queue_depth().await.expect("depth"), STEPS as i64);

        let keys = Arc::new(vec![wf.key()]);
        let mut claimers = Vec::new();
        for c in 0..CLAIMERS {
            let (store, keys) = (store.clone(), keys.clone());
            claimers.push(tokio::spawn(async move {
                let owner = format!("claimer-{c}");
                let mut log = Vec::new();
                loop {
                    let batch = store.step_claim(&owner, &keys, 25).await.expect("claim");
                    if batch.is_empty() {
                        return log;
                    }
                    for s in batch {
                        assert_eq!(s.attempt, 1, "claimed twice: step {}", s.id);
                        log.push(s.id);
                    }
                }
            }));
        }
        let mut all = Vec::with_capacity(STEPS);
        let mut busy = 0;
        for c in claimers {
            let log = tokio::time::timeout(Duration::from_secs(300), c)
                .await
                .expect("claimers finish")
                .expect("claimer");
            busy += usize::from(!log.is_empty());
            all.extend(log);
        }
        let unique: HashSet<i64> = all.iter().copied().collect();
        assert_eq!(all.len(), STEPS, "[{}] claims logged", db.backend);
        assert_eq!(
            unique.len(),
            STEPS,
            "[{}] a step was claimed twice",
            db.backend
        );
        assert!(
            busy > 1,
            "[{}] claims were spread over claimers",
            db.backend
        );
        assert_eq!(store.step_queue_depth().await.expect("depth"), 0);
    }
}
