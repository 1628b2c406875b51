//! PostgreSQL LISTEN/NOTIFY wake-ups: another engine queued steps or marked runs.
//!
//! Each notification's payload says which loop it concerns and who sent it ([`Wake`]): the
//! engine ignores its own (its loops were woken in process), wakes only the loop concerned,
//! and coalesces the notifications already received into one wake-up per loop.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::sqlx::postgres::PgListener;
use tokio_util::sync::CancellationToken;

use super::{Scheduler, pause};
use crate::store::{Backend, READY_CHANNEL, Wake};

/// Pause before reconnecting a listener whose connection failed.
const RECONNECT_PAUSE: Duration = Duration::from_secs(1);

pub(super) async fn run(s: Arc<Scheduler>, cancel: CancellationToken) {
    if s.store.backend() != Backend::Postgres {
        return;
    }
    let pool = s.store.connection().get_postgres_connection_pool().clone();
    // A listener keeps its connection: when the store follows a promoted standby, it must
    // listen there too (an old primary still running would keep it, hearing nothing).
    let mut moves = s.store.primary_moves();
    let mut failures = 0u64;
    'connect: loop {
        if let Some(m) = moves.as_mut() {
            // Moves before this connection are behind it.
            m.borrow_and_update();
        }
        let mut listener = match PgListener::connect_with(&pool).await {
            Ok(l) => l,
            Err(e) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(error = %e, "cannot listen for wake-ups; polling until it can");
                }
                if !pause(&cancel, RECONNECT_PAUSE).await {
                    return;
                }
                continue;
            }
        };
        if let Err(e) = listener.listen(READY_CHANNEL).await {
            tracing::warn!(error = %e, "LISTEN failed; polling until it works");
            if !pause(&cancel, RECONNECT_PAUSE).await {
                return;
            }
            continue;
        }
        if failures > 0 {
            tracing::info!("listening for wake-ups again");
            failures = 0;
        }
        // Catch up on anything queued while not listening.
        s.signals.wake_claimer();
        s.signals.wake_evaluator();
        loop {
            tokio::select! {
                n = listener.try_recv() => match n {
                    Ok(Some(n)) => {
                        let own = s.config.owner.as_str();
                        let mut wake = Wake::heard(n.payload(), own);
                        // Everything already received at once: one wake-up per loop.
                        while let Some(n) = listener.next_buffered() {
                            wake = wake.or(Wake::heard(n.payload(), own));
                        }
                        if wake.claim {
                            s.signals.wake_claimer();
                        }
                        if wake.evaluate {
                            s.signals.wake_evaluator();
                        }
                    }
                    // The connection dropped: the listener reconnects on the next receive;
                    // wake the loops, since notifications may have been missed meanwhile.
                    Ok(None) => {
                        s.signals.wake_claimer();
                        s.signals.wake_evaluator();
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "wake-up listener failed; reconnecting");
                        break;
                    }
                },
                () = moved(moves.as_mut()) => {
                    tracing::info!("the primary moved; listening for wake-ups there");
                    // Back to the pool, which discards a connection older than the move.
                    drop(listener);
                    continue 'connect;
                }
                () = cancel.cancelled() => return,
            }
        }
        if !pause(&cancel, RECONNECT_PAUSE).await {
            return;
        }
    }
}

/// Resolves when the store's pool has moved to another server; never without a watcher.
async fn moved(moves: Option<&mut tokio::sync::watch::Receiver<u64>>) {
    if let Some(m) = moves
        && m.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}
