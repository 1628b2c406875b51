-- 100 runs started in one statement (as intake batches them), made dirty and evaluated.
WITH r AS (INSERT INTO sagaflow_runs (id, workflow, version, workflow_key, state, input, created_at, updated_at) SELECT spike_uuid7(spike_now_ms()), 'order', 1, 'order@1', 'running', '{"order_id":"o","qty":1}', 0, 0 FROM generate_series(1, 100) RETURNING id) SELECT array_agg(id) AS ids FROM r \gset
UPDATE sagaflow_runs SET dirty = true, updated_at = 1 WHERE id = ANY(':ids'::uuid[]);
UPDATE sagaflow_runs SET dirty = false, updated_at = 2 WHERE id = ANY(':ids'::uuid[]);
-- Their end, as the engine writes it: the row stays in the runs table.
UPDATE sagaflow_runs SET state = 'completed', finished_at = 3, updated_at = 3, active_key = NULL, output = '{"ok":true}' WHERE id = ANY(':ids'::uuid[]);
