-- A measurement, not a migration (ADR 0007): the runs table as the engine has it (whole),
-- and beside it `sagaflow_runs_done`, a table of finished runs partitioned by day of run start
-- (UUIDv7 ids), into which the second design moves a run's row at its end. Both hold the
-- same `:finished` finished runs of the past week to begin with: in the first design in the
-- runs table, in the second in the partitioned one. Used by `finished-runs-table.sh`.
SET client_min_messages = warning;
DROP TABLE IF EXISTS sagaflow_runs, sagaflow_runs_done CASCADE;
CREATE OR REPLACE FUNCTION spike_uuid7(ms bigint) RETURNS uuid LANGUAGE sql VOLATILE AS $f$
  SELECT (lpad(to_hex(ms), 12, '0') || '7' || substr(md5(random()::text), 1, 19))::uuid
$f$;
CREATE OR REPLACE FUNCTION spike_now_ms() RETURNS bigint LANGUAGE sql VOLATILE AS $f$
  SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
$f$;
CREATE OR REPLACE FUNCTION spike_floor(ms bigint) RETURNS uuid LANGUAGE sql IMMUTABLE AS $f$
  SELECT (lpad(to_hex(ms), 12, '0') || '00000000000000000000')::uuid
$f$;
-- The runs table of the engine's schema (migrations m0001 to m0024), with its indexes.
CREATE TABLE sagaflow_runs (
    id uuid NOT NULL, workflow text NOT NULL, version integer NOT NULL, workflow_key text NOT NULL,
    business_key text, active_key text, state text NOT NULL, input text NOT NULL, output text,
    error text, dirty boolean DEFAULT false NOT NULL, created_at bigint NOT NULL,
    updated_at bigint NOT NULL, finished_at bigint, failed_attempts integer DEFAULT 0 NOT NULL,
    priority integer DEFAULT 0 NOT NULL, start_at bigint, notify boolean DEFAULT false NOT NULL,
    trace_parent text, trace_state text, flow_key text, parent_step bigint, restarted_from uuid,
    restarted_as uuid
) WITH (fillfactor = 85, autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE sagaflow_runs ADD CONSTRAINT sagaflow_runs_pkey PRIMARY KEY (id);
CREATE UNIQUE INDEX sagaflow_runs_active_key ON sagaflow_runs (workflow, active_key);
CREATE INDEX sagaflow_runs_business_key ON sagaflow_runs (workflow, business_key) WHERE business_key IS NOT NULL;
CREATE INDEX sagaflow_runs_created ON sagaflow_runs (created_at, id);
CREATE INDEX sagaflow_runs_dirty ON sagaflow_runs (workflow_key) WHERE dirty;
CREATE INDEX sagaflow_runs_failed ON sagaflow_runs (failed_attempts, created_at, id) WHERE failed_attempts > 0;
CREATE INDEX sagaflow_runs_finished ON sagaflow_runs (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX sagaflow_runs_key_created ON sagaflow_runs (business_key, created_at, id) WHERE business_key IS NOT NULL;
CREATE INDEX sagaflow_runs_parent ON sagaflow_runs (parent_step) WHERE parent_step IS NOT NULL;
CREATE INDEX sagaflow_runs_state_created ON sagaflow_runs (state, created_at, id);
CREATE INDEX sagaflow_runs_unfinished ON sagaflow_runs (workflow_key) WHERE finished_at IS NULL;
CREATE INDEX sagaflow_runs_workflow_created ON sagaflow_runs (workflow, created_at, id);
-- Finished runs by day: the indexes a finished run is looked up and listed by.
CREATE TABLE sagaflow_runs_done (LIKE sagaflow_runs INCLUDING DEFAULTS) PARTITION BY RANGE (id);
DO $$
DECLARE today bigint := (extract(epoch FROM date_trunc('day', now() AT TIME ZONE 'utc')) * 1000)::bigint;
        lo bigint;
BEGIN
  FOR d IN -8..2 LOOP
    lo := today + d::bigint * 86400000;
    EXECUTE format('CREATE TABLE sagaflow_runs_done_%s PARTITION OF sagaflow_runs_done FOR VALUES FROM (%L) TO (%L)',
      d + 100, spike_floor(lo), spike_floor(lo + 86400000));
  END LOOP;
END $$;
CREATE TABLE sagaflow_runs_done_default PARTITION OF sagaflow_runs_done DEFAULT;
ALTER TABLE sagaflow_runs_done ADD CONSTRAINT sagaflow_runs_done_pkey PRIMARY KEY (id);
CREATE INDEX sagaflow_runs_done_business_key ON sagaflow_runs_done (workflow, business_key) WHERE business_key IS NOT NULL;
CREATE INDEX sagaflow_runs_done_created ON sagaflow_runs_done (created_at, id);
CREATE INDEX sagaflow_runs_done_failed ON sagaflow_runs_done (failed_attempts, created_at, id) WHERE failed_attempts > 0;
CREATE INDEX sagaflow_runs_done_finished ON sagaflow_runs_done (finished_at);
CREATE INDEX sagaflow_runs_done_key_created ON sagaflow_runs_done (business_key, created_at, id) WHERE business_key IS NOT NULL;
CREATE INDEX sagaflow_runs_done_parent ON sagaflow_runs_done (parent_step) WHERE parent_step IS NOT NULL;
CREATE INDEX sagaflow_runs_done_state_created ON sagaflow_runs_done (state, created_at, id);
CREATE INDEX sagaflow_runs_done_workflow_created ON sagaflow_runs_done (workflow, created_at, id);
-- The week of finished runs, in the table the design keeps them in.
INSERT INTO sagaflow_runs (id, workflow, version, workflow_key, state, input, output, created_at, updated_at, finished_at)
SELECT spike_uuid7(spike_now_ms() - 86400000 - i * (6 * 86400000 / :finished)), 'order', 1, 'order@1',
       'completed', '{"order_id":"o","qty":1}', '{"ok":true}', 0, 0, 0
FROM generate_series(1, :finished) AS i;
INSERT INTO sagaflow_runs_done SELECT * FROM sagaflow_runs WHERE :'design' = 'move';
DELETE FROM sagaflow_runs WHERE :'design' = 'move';
VACUUM ANALYZE sagaflow_runs;
VACUUM ANALYZE sagaflow_runs_done;
