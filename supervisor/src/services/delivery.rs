//! The delivery service: hands the outbox's notices (alerts, finished runs) to every sink, at
//! least once, from the leader only — so each notice goes out from one instance, and one that
//! a leader could not deliver before it died is delivered by the next.
//!
//! Per pass: the oldest pending notices; for each sink, the notices it has not delivered or
//! given up on and whose next try is due, in order. A failed try is recorded with its next
//! time (exponential backoff, or the receiver's `Retry-After`) and ends that sink's pass, so
//! a receiver that is down is tried about once per pass, not once per pending notice. The
//! last try, or a refusal, dead-letters the notice for that sink and raises one
//! `delivery_dead_lettered` alert per sink, resolved by the sink's next success. A notice
//! every sink delivered or gave up on is done; done notices are purged after a week.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use sagaflow_engine::store::{DeliveryResult, DeliveryTry, NewAlert, PendingNotice};
use sagaflow_engine::{AlertKind, DeliveryState, NoticeSink, Result, Signals};
use tokio::sync::Notify;

use crate::config::SupervisorConfig;
use crate::service::{LeaderContext, MaintenanceService, ServiceReport, millis};

/// Notices read per pass.
const DELIVERY_PAGE: u32 = 100;
/// Done notices (none dead-lettered) are deleted after this long.
const NOTICE_KEEP: Duration = Duration::from_secs(7 * 24 * 3600);
/// Passes between two purges.
const PURGE_EVERY: u64 = 600;

/// Delivers pending notices to the sinks.
#[derive(Debug)]
pub(crate) struct Delivery {
    signals: Arc<Signals>,
    passes: AtomicU64,
}

impl Delivery {
    /// The service, woken by the notices `signals` reports.
    pub(crate) fn new(signals: Arc<Signals>) -> Self {
        Self {
            signals,
            passes: AtomicU64::new(0),
        }
    }
}

/// What one sink's pass did.
#[derive(Debug, Default)]
struct SinkPass {
    delivered: u64,
    failed: u64,
    dead: u64,
}

#[async_trait::async_trait]
impl MaintenanceService for Delivery {
    fn name(&self) -> &'static str {
        "delivery"
    }

    fn interval(&self, config: &SupervisorConfig) -> Duration {
        config.delivery_interval
    }

    fn wake(&self) -> Option<&Notify> {
        Some(self.signals.delivery_wake())
    }

    async fn run_once(&self, ctx: &LeaderContext) -> Result<ServiceReport> {
        let pass = self.passes.fetch_add(1, Ordering::Relaxed);
        let mut purged = 0;
        if pass.is_multiple_of(PURGE_EVERY) {
            purged = ctx
                .store
                .outbox_purge(millis(NOTICE_KEEP), 1000)
                .await
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "purging delivered notices failed");
                    0
                });
        }
        let page = ctx.store.outbox_pending(DELIVERY_PAGE).await?;
        if page.notices.is_empty() {
            return Ok(ServiceReport::default().with("notices_purged", purged));
        }
        let sinks = ctx.signals.sinks();
        let passes = join_all(
            sinks
                .iter()
                .map(|sink| deliver_to(ctx, sink, sinks, &page.notices, page.now_ms)),
        )
        .await;
        let mut report = SinkPass::default();
        let mut finished_by: Vec<HashSet<i64>> = Vec::with_capacity(sinks.len());
        for p in passes {
            let (pass, finished) = p?;
            report.delivered += pass.delivered;
            report.failed += pass.failed;
            report.dead += pass.dead;
            finished_by.push(finished);
        }
        // Done: every sink that takes the notice's topic delivered it or gave up on it.
        let done: Vec<i64> = page
            .notices
            .iter()
            .filter(|p| {
                sinks.iter().zip(&finished_by).all(|(sink, finished)| {
                    !sink.accepts(p.notice.topic) || finished.contains(&p.notice.id)
                })
            })
            .map(|p| p.notice.id)
            .collect();
        ctx.store.outbox_done(&done).await?;
        Ok(ServiceReport::default()
            .with("delivered", report.delivered)
            .with("failed", report.failed)
            .with("dead_lettered", report.dead)
            .with("notices_done", done.len() as u64)
            .with("notices_purged", purged))
    }
}

/// One sink's pass over the page: returns its counts and the notices it is finished with
/// (delivered or dead-lettered, before or during this pass).
async fn deliver_to(
    ctx: &LeaderContext,
    sink: &Arc<dyn NoticeSink>,
    sinks: &[Arc<dyn NoticeSink>],
    notices: &[PendingNotice],
    now_ms: i64,
) -> Result<(SinkPass, HashSet<i64>)> {
    let name = sink.name();
    let policy = sink.policy();
    let mut pass = SinkPass::default();
    let mut finished = HashSet::new();
    for p in notices {
        if !sink.accepts(p.notice.topic) {
            continue;
        }
        let record = p.deliveries.get(name);
        if let Some(r) = record {
            if r.state != DeliveryState::Pending {
                finished.insert(p.notice.id);
                continue;
            }
            if r.next_at > now_ms {
                continue;
            }
        }
        let attempt = record.map_or(0, |r| r.attempts) + 1;
        // The sinks besides this one that must finish the notice before it is done.
        let others: Vec<&str> = sinks
            .iter()
            .filter(|s| s.name() != name && s.accepts(p.notice.topic))
            .map(|s| s.name())
            .collect();
        let try_of = |result| DeliveryTry {
            notice: p.notice.id,
            sink: name,
            attempt,
            result,
            others: &others,
        };
        let tried = tokio::time::timeout(policy.timeout, sink.deliver(&p.notice)).await;
        let failure = match tried {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(sagaflow_engine::DeliveryError::transient(format!(
                "no answer within {:.1} s",
                policy.timeout.as_secs_f64()
            ))),
        };
        let Some(e) = failure else {
            ctx.store
                .delivery_record(&try_of(DeliveryResult::Delivered))
                .await?;
            pass.delivered += 1;
            finished.insert(p.notice.id);
            continue;
        };
        let attempts_left = i64::from(policy.max_attempts) > i64::from(attempt);
        if e.permanent || !attempts_left {
            let error = if e.permanent {
                format!("refused: {}", e.message)
            } else {
                format!("gave up after {attempt} tries: {}", e.message)
            };
            ctx.store
                .delivery_record(&try_of(DeliveryResult::Dead {
                    error: error.clone(),
                }))
                .await?;
            tracing::warn!(sink = name, notice = p.notice.id, %error, "notice dead-lettered");
            dead_letter_alert(ctx, name, p.notice.id, &error).await;
            pass.dead += 1;
            finished.insert(p.notice.id);
            continue;
        }
        let delay = e
            .retry_after
            .unwrap_or_else(|| policy.delay_after(u32::try_from(attempt).unwrap_or(u32::MAX)));
        tracing::debug!(sink = name, notice = p.notice.id, attempt, error = %e, "delivery failed; will try again");
        ctx.store
            .delivery_record(&try_of(DeliveryResult::Retry {
                error: e.message.clone(),
                retry_in_ms: millis(delay),
            }))
            .await?;
        pass.failed += 1;
        // The receiver is failing: the rest waits for the next pass.
        break;
    }
    if pass.delivered > 0 {
        // A sink that delivers again clears its dead-letter alert.
        let resolved = ctx
            .alert_resolve(&dead_letter_key(name), "the sink delivers again")
            .await;
        if let Err(e) = resolved {
            tracing::debug!(error = %e, "could not resolve a dead-letter alert");
        }
    }
    Ok((pass, finished))
}

fn dead_letter_key(sink: &str) -> String {
    format!("delivery_dead_lettered:{sink}")
}

/// One open `delivery_dead_lettered` alert per sink: later dead letters of the same sink
/// add none until it is resolved (so a sink that cannot deliver its own dead-letter alert
/// does not raise alerts about it forever).
async fn dead_letter_alert(ctx: &LeaderContext, sink: &str, notice: i64, error: &str) {
    let alert = NewAlert {
        run_id: None,
        step: None,
        kind: AlertKind::DeliveryDeadLettered,
        reason: format!(
            "sink `{sink}` gave up on notice {notice}: {error}; later notices it cannot deliver are dead-lettered too"
        ),
        attempts: 0,
        actions: vec![
            format!(
                "fix the receiver of `{sink}`, then redeliver the dead-lettered notices (sagaflow alerts redeliver)"
            ),
            "resolve_alert".into(),
        ],
        open_key: Some(dead_letter_key(sink)),
    };
    // Unfenced: the dead letter is recorded already, and a successor would not raise it.
    if let Err(e) = ctx.alert_report(&alert).await {
        tracing::error!(error = %e, reason = %alert.reason, "could not store an alert");
    }
}
