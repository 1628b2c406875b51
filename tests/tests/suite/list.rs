//! Listing runs on both backends: failed attempts counted per run, filters, both orders, and
//! keyset pages that cover every run once, whatever the page size.

use std::collections::HashSet;
use std::time::Duration;

use sagaflow::{
    Engine, Error, RetryPolicy, RunOrder, RunQuery, RunState, RunSummary, StartOptions,
    StepContext, StepError, Uuid, Workflow,
};
use sagaflow_testkit::{backends, engine, expect_state};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Flaky {
    /// How many attempts fail before one succeeds.
    fail: u32,
}

/// `flaky@1`: one step that fails its first `fail` attempts (retryably), then succeeds; with
/// `fail` at 9 or more it exhausts its retries and the run gives up.
fn flaky(name: &str) -> Workflow {
    Workflow::builder(name, 1)
        .input::<Flaky>()
        .default_retry(
            RetryPolicy::default()
                .with_max_failures(9)
                .with_backoff(Duration::from_millis(1), Duration::from_millis(5)),
        )
        .step("call", |ctx: StepContext| async move {
            let input: Flaky = ctx.input()?;
            if ctx.attempt() <= input.fail {
                Err(StepError::retryable("flaky", "not this time"))
            } else {
                Ok(())
            }
        })
        .build()
        .expect("valid")
}

/// Every page of `query`, in order.
async fn all_pages(engine: &Engine, mut query: RunQuery) -> Vec<RunSummary> {
    let mut out = Vec::new();
    for _ in 0..100 {
        let page = engine.list_runs(&query).await.expect("list");
        assert!(page.damaged.is_empty(), "{:?}", page.damaged);
        assert!(page.runs.len() <= query.limit as usize);
        out.extend(page.runs);
        match page.next {
            Some(next) => query = query.after(next),
            None => return out,
        }
    }
    panic!("more than 100 pages");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_listed_by_filter_and_order_in_keyset_pages() {
    for db in backends().await {
        let b = db.backend;
        let engine = engine(&db, vec![flaky("flaky"), flaky("other")]).await;
        // Nine runs of `flaky` failing 0, 1, 2 … times (three of each), and four of `other`
        // that succeed at once; keys k0 … k8 on the first.
        let mut ids: Vec<(Uuid, u32)> = Vec::new();
        for i in 0..9u32 {
            let fail = i % 3;
            let options = StartOptions {
                business_key: Some(format!("k{i}")),
                ..StartOptions::default()
            };
            let started = engine
                .start_with("flaky", &serde_json::json!({ "fail": fail }), options)
                .await
                .expect("start");
            ids.push((started.id, fail));
        }
        let mut others = Vec::new();
        for _ in 0..4 {
            others.push(
                engine
                    .start("other", &Flaky { fail: 0 })
                    .await
                    .expect("start"),
            );
        }
        for &(id, fail) in &ids {
            let run = expect_state(&engine, id, RunState::Completed, b).await;
            assert_eq!(run.failed_attempts, i64::from(fail), "[{b}] {id}");
        }
        for &id in &others {
            expect_state(&engine, id, RunState::Completed, b).await;
        }

        // Newest first, pages of 2: every run once, in (created, id) descending order.
        let listed = all_pages(&engine, RunQuery::new().limit(2)).await;
        assert_eq!(listed.len(), 13, "[{b}]");
        let unique: HashSet<Uuid> = listed.iter().map(|r| r.id).collect();
        assert_eq!(unique.len(), 13, "[{b}] a run listed twice");
        for w in listed.windows(2) {
            assert!(
                (w[0].created_at, w[0].id) > (w[1].created_at, w[1].id),
                "[{b}] not newest first: {w:?}"
            );
        }

        // Most failed attempts first, in pages of every size: the runs with 2, then with 1,
        // then the others; each page boundary (inside and between the two parts) loses and
        // repeats nothing.
        for size in 1..=5 {
            let q = RunQuery::new()
                .workflow("flaky")
                .order(RunOrder::Attempts)
                .limit(size);
            let listed = all_pages(&engine, q).await;
            let failed: Vec<i64> = listed.iter().map(|r| r.failed_attempts).collect();
            assert_eq!(
                failed,
                vec![2, 2, 2, 1, 1, 1, 0, 0, 0],
                "[{b}] page size {size}"
            );
            let unique: HashSet<Uuid> = listed.iter().map(|r| r.id).collect();
            assert_eq!(unique.len(), 9, "[{b}] page size {size}");
        }

        // Filters.
        let by_key = all_pages(&engine, RunQuery::new().business_key("k4").limit(10)).await;
        assert_eq!(by_key.len(), 1, "[{b}]");
        assert_eq!(by_key[0].id, ids[4].0);
        assert_eq!(by_key[0].business_key.as_deref(), Some("k4"));
        let other = all_pages(&engine, RunQuery::new().workflow("other").limit(3)).await;
        let mut got: Vec<Uuid> = other.iter().map(|r| r.id).collect();
        got.sort();
        others.sort();
        assert_eq!(got, others, "[{b}]");
        let none = all_pages(&engine, RunQuery::new().state(RunState::Error).limit(5)).await;
        assert!(none.is_empty(), "[{b}] {none:?}");
        let done = all_pages(
            &engine,
            RunQuery::new().state(RunState::Completed).limit(50),
        )
        .await;
        assert_eq!(done.len(), 13, "[{b}]");
        // A time window: everything created from the fifth run on.
        let fifth = engine.run(ids[4].0).await.expect("read").expect("run");
        let since = fifth.created_at.timestamp_millis();
        let window = all_pages(
            &engine,
            RunQuery::new()
                .workflow("flaky")
                .created(Some(since), None)
                .limit(4),
        )
        .await;
        assert!(
            window
                .iter()
                .all(|r| r.created_at.timestamp_millis() >= since)
        );
        assert!(window.iter().any(|r| r.id == ids[4].0), "[{b}]");
        let before = all_pages(
            &engine,
            RunQuery::new()
                .workflow("flaky")
                .created(None, Some(since))
                .limit(4),
        )
        .await;
        assert_eq!(window.len() + before.len(), 9, "[{b}]");

        // A cursor is refused with the other order, or when it is not one of ours.
        let page = engine
            .list_runs(&RunQuery::new().limit(1))
            .await
            .expect("list");
        let next = page.next.expect("more than one run");
        let err = engine
            .list_runs(&RunQuery::new().order(RunOrder::Attempts).after(next))
            .await
            .expect_err("cursor of the other order");
        assert!(matches!(err, Error::InvalidQuery(_)), "[{b}] {err}");
        let err = engine
            .list_runs(&RunQuery::new().after("c.not-a-number.x"))
            .await
            .expect_err("forged cursor");
        assert!(matches!(err, Error::InvalidQuery(_)), "[{b}] {err}");
        engine.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_count_every_failed_attempt_of_a_run_that_gives_up() {
    for db in backends().await {
        let b = db.backend;
        let engine = engine(&db, vec![flaky("flaky")]).await;
        let id = engine
            .start("flaky", &Flaky { fail: 100 })
            .await
            .expect("start");
        // The ninth failure fails the step for good; nothing completed, so nothing is undone.
        let run = expect_state(&engine, id, RunState::Compensated, b).await;
        assert_eq!(run.failed_attempts, 9, "[{b}]");
        let first = engine
            .list_runs(&RunQuery::new().order(RunOrder::Attempts).limit(1))
            .await
            .expect("list");
        assert_eq!(first.runs[0].id, id, "[{b}]");
        assert_eq!(first.runs[0].state, RunState::Compensated);
        assert!(first.runs[0].error.is_some(), "[{b}]");
        engine.shutdown().await;
    }
}
