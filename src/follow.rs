//! Following a run: its history from a position on, then each new event and each step's
//! progress as they come, from any instance of a fleet, until the run finishes.
//!
//! What is durable and what is best effort:
//! - **History events are durable and resumable.** They are the run's history rows, read
//!   in order; each carries its position (`"<row id>.<index>"`: the events folded into one
//!   row share its id). A follower that reconnects with the last position it saw gets the
//!   events after it, none twice and none skipped: a run's rows are written by units of work
//!   that hold the run's lock, so they commit in id order.
//! - **Progress is best effort.** Only each step's latest report is kept (on its row); a
//!   follower is sent a step's progress when it differs from the last one it was sent, so
//!   it may miss intermediate values, and after a reconnect it is sent the current ones.
//!   A finished run's steps, and their progress, are gone.
//!
//! Changes made by this instance wake the follower at once; those of other instances are
//! found by reading again every [`FOLLOW_POLL`].

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use futures_util::Stream;
use sagaflow_engine::signals::RunEvent;
use sagaflow_engine::{Error, HistoryEvent, Result};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::broadcast;
use uuid::Uuid;

use crate::Engine;

/// How often a follower reads the run again, for changes made by other instances.
pub const FOLLOW_POLL: Duration = Duration::from_secs(1);

/// History rows read at once.
const ROWS_PER_READ: i64 = 200;

/// What a follower of a run is sent ([`Engine::follow`]).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunUpdate {
    /// An event of the run's history: durable, in order; `position` is where to resume
    /// after it.
    Event {
        /// The event's position: `"<history row id>.<index within the row>"`.
        position: String,
        /// The event.
        event: HistoryEvent,
    },
    /// The latest progress a step's attempt reported: best effort.
    Progress {
        /// The step.
        step: String,
        /// What its attempt last reported.
        #[schema(value_type = Object)]
        progress: Value,
    },
}

/// A position in a run's history: after the event `index` of row `row`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Position {
    row: i64,
    index: usize,
}

impl Position {
    /// `"<row>.<index>"`, or a bare row id (after the whole row).
    fn parse(text: &str) -> Option<Self> {
        match text.split_once('.') {
            Some((row, index)) => Some(Self {
                row: row.parse().ok()?,
                index: index.parse().ok()?,
            }),
            None => Some(Self {
                row: text.parse().ok()?,
                index: usize::MAX,
            }),
        }
    }
}

/// A follower's state between two reads.
struct Follower {
    engine: Engine,
    run_id: Uuid,
    after: Position,
    progress: HashMap<String, Value>,
    queue: VecDeque<RunUpdate>,
    events: broadcast::Receiver<RunEvent>,
    done: bool,
    first: bool,
}

impl Follower {
    /// Reads what is new; `true` when the run is finished and everything was read.
    async fn read(&mut self) -> Result<bool> {
        // Where display reads go: a read replica, when one is configured.
        let store = self.engine.reads();
        // The run's state first, from the same server as its history: a run seen finished
        // has written its last rows there.
        let finished = match store.run_get(self.run_id).await? {
            Some(run) => run.state.is_final(),
            // A replica that has not yet received a run the primary has: nothing to read yet.
            None if store.is_replica()
                && self
                    .engine
                    .inner
                    .store
                    .run_get(self.run_id)
                    .await?
                    .is_some() =>
            {
                return Ok(false);
            }
            None => return Err(Error::RunNotFound(self.run_id)),
        };
        let from = if self.after.index == usize::MAX {
            self.after.row
        } else {
            self.after.row - 1
        };
        let events = store
            .run_history_after(self.run_id, from.max(0), ROWS_PER_READ)
            .await?;
        let rows: std::collections::BTreeSet<i64> = events.iter().map(|e| e.id).collect();
        let full = i64::try_from(rows.len()).unwrap_or(i64::MAX) >= ROWS_PER_READ;
        let mut index = 0;
        let mut row = None;
        for event in events {
            if row != Some(event.id) {
                row = Some(event.id);
                index = 0;
            } else {
                index += 1;
            }
            let at = Position {
                row: event.id,
                index,
            };
            if at.row == self.after.row
                && (self.after.index == usize::MAX || at.index <= self.after.index)
            {
                continue;
            }
            self.after = at;
            self.queue.push_back(RunUpdate::Event {
                position: format!("{}.{}", at.row, at.index),
                event,
            });
        }
        if !finished {
            for step in store.run_steps(self.run_id).await? {
                let Some(text) = step.progress else { continue };
                let Ok(value) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                if self.progress.get(&step.name) != Some(&value) {
                    self.progress.insert(step.name.clone(), value.clone());
                    self.queue.push_back(RunUpdate::Progress {
                        step: step.name,
                        progress: value,
                    });
                }
            }
        }
        Ok(finished && !full)
    }

    /// Waits for a change of the run made here, or for the next poll; `false` when the
    /// engine shuts down (the stream ends, so a graceful shutdown does not wait for it).
    async fn wait(&mut self) -> bool {
        let poll = tokio::time::sleep(FOLLOW_POLL);
        tokio::pin!(poll);
        let cancel = self.engine.inner.cancel.clone();
        loop {
            tokio::select! {
                () = &mut poll => return true,
                () = cancel.cancelled() => return false,
                e = self.events.recv() => match e {
                    Ok(e) if e.run_id == self.run_id => return true,
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return false,
                },
            }
        }
    }
}

impl Engine {
    /// Follows a run: the events of its history after `after` (a position a previous
    /// [`RunUpdate::Event`] gave; `None`: from its start), then each new event and each
    /// step's progress as they come, until the run is `completed` or `compensated` and
    /// every event was sent, when the stream ends (a run in `error` or `paused` stays
    /// followed: an operator may move it). Events are durable and resumable from their
    /// position; progress is best effort, its latest value per step (see
    /// `docs/operations.md`). Works on any instance: changes made elsewhere arrive within
    /// [`FOLLOW_POLL`].
    ///
    /// ```no_run
    /// # async fn demo(engine: sagaflow::Engine, run: sagaflow::Uuid) -> sagaflow::Result<()> {
    /// use futures_util::StreamExt;
    /// use sagaflow::RunUpdate;
    /// let updates = engine.follow(run, None).await?;
    /// futures_util::pin_mut!(updates);
    /// while let Some(update) = updates.next().await {
    ///     match update? {
    ///         RunUpdate::Event { position, event } => println!("{position}: {}", event.kind),
    ///         RunUpdate::Progress { step, progress } => println!("{step}: {progress}"),
    ///         _ => {}
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::RunNotFound`]; [`Error::InvalidQuery`] for a position that is not one;
    /// [`Error::Db`], [`Error::CorruptRow`] (also as items of the stream, which then ends).
    pub async fn follow(
        &self,
        run_id: Uuid,
        after: Option<&str>,
    ) -> Result<impl Stream<Item = Result<RunUpdate>> + Send + use<>> {
        let after = match after {
            None => Position::default(),
            Some(text) => Position::parse(text).ok_or_else(|| {
                Error::InvalidQuery(format!(
                    "`{text}` is not a position in a run's history (`<row>.<index>`)"
                ))
            })?,
        };
        // Subscribed before the first read, so that no change falls between the two.
        let events = self.subscribe();
        if self.run(run_id).await?.is_none() {
            return Err(Error::RunNotFound(run_id));
        }
        let follower = Follower {
            engine: self.clone(),
            run_id,
            after,
            progress: HashMap::new(),
            queue: VecDeque::new(),
            events,
            done: false,
            first: true,
        };
        Ok(futures_util::stream::unfold(follower, |mut f| async move {
            loop {
                if let Some(update) = f.queue.pop_front() {
                    return Some((Ok(update), f));
                }
                if f.done {
                    return None;
                }
                if !f.first && !f.wait().await {
                    return None;
                }
                f.first = false;
                match f.read().await {
                    Ok(finished) => f.done = finished,
                    Err(e) => {
                        f.done = true;
                        return Some((Err(e), f));
                    }
                }
            }
        }))
    }
}
