-- 100 runs started in one statement (as intake batches them), made dirty and evaluated.
WITH r AS (INSERT INTO sagaflow_runs (id, workflow, version, workflow_key, state, input, created_at, updated_at) SELECT spike_uuid7(spike_now_ms()), 'order', 1, 'order@1', 'running', '{"order_id":"o","qty":1}', 0, 0 FROM generate_series(1, 100) RETURNING id) SELECT array_agg(id) AS ids FROM r \gset
UPDATE sagaflow_runs SET dirty = true, updated_at = 1 WHERE id = ANY(':ids'::uuid[]);
UPDATE sagaflow_runs SET dirty = false, updated_at = 2 WHERE id = ANY(':ids'::uuid[]);
-- Their end, moving the rows to the table of finished runs.
WITH m AS (DELETE FROM sagaflow_runs WHERE id = ANY(':ids'::uuid[]) RETURNING *)
INSERT INTO sagaflow_runs_done SELECT id, workflow, version, workflow_key, business_key, NULL, 'completed', input, '{"ok":true}', error, false, created_at, 3, 3, failed_attempts, priority, start_at, notify, trace_parent, trace_state, flow_key, parent_step, restarted_from, restarted_as FROM m;
