//! What the engine does for a running step beyond its inputs ([`StepServices`]): callback
//! tokens, signed with the database's key and registered on the attempt's row, and the undo
//! of a child run when its parent's step is compensated.

use uuid::Uuid;

use crate::definition::StepServices;
use crate::operator::{Audit, ChildUndo, child_undo};
use crate::{Result, Store};

/// The engine's [`StepServices`], over its store.
#[derive(Debug, Clone)]
pub(crate) struct Services(pub(crate) Store);

#[async_trait::async_trait]
impl StepServices for Services {
    async fn callback_token(
        &self,
        run_id: Uuid,
        step_id: i64,
        attempt: i32,
    ) -> Result<Option<String>> {
        let token = self.0.callback_key().await?.issue(run_id);
        let hash = crate::wait::token_hash(&token);
        let stored = self.0.callback_register(step_id, attempt, &hash).await?;
        Ok(stored.then_some(token))
    }

    async fn progress(&self, step_id: i64, attempt: i32, progress: &str) -> Result<bool> {
        self.0.step_set_progress(step_id, attempt, progress).await
    }

    async fn undo_child(&self, step_id: i64, actor: String, reason: String) -> Result<bool> {
        let audit = Audit::new(actor, reason);
        Ok(matches!(
            child_undo(&self.0, step_id, &audit).await?,
            ChildUndo::Done
        ))
    }
}
