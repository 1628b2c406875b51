//! Rewriting a run's stored data by hand: an operator's corrected input. The transition
//! module decides what changes; these statements only write it, in the caller's unit of
//! work, on a run it locked.

use sea_orm::Value;
use uuid::Uuid;

use super::StoreTx;
use super::row::Exec;
use crate::Result;

impl StoreTx<'_> {
    /// Replaces the stored input of run `id` (locked by this transaction).
    ///
    /// # Errors
    /// [`crate::Error::Db`].
    pub async fn run_set_input(&mut self, id: Uuid, input: &str) -> Result<()> {
        let s = self.store;
        let sql = "UPDATE sagaflow_runs SET input = $1, updated_at = {now} WHERE id = $2";
        let values: Vec<Value> = vec![input.into(), id.into()];
        self.txn.execute(s.stmt(sql, values)).await?;
        Ok(())
    }
}
