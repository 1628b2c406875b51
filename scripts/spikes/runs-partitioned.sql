-- A measurement, not a migration: turns a migrated database's `sagaflow_runs` into a table
-- range-partitioned on `id` (a UUIDv7), one partition per UTC day from `past` days ago to two
-- days ahead, plus a default one, with the indexes it had; the unique index on
-- `(workflow, active_key)`, which a partitioned table cannot keep, becomes a plain one.
-- Used by `runs-partitioned.sh` (docs/adr/0007-history-by-the-day.md).
--
--   psql "$URL" -v ON_ERROR_STOP=1 -v past=14 -f scripts/spikes/runs-partitioned.sql
BEGIN;
SELECT set_config('spike.past', :'past', true);
ALTER TABLE sagaflow_runs RENAME TO sagaflow_runs_old;
ALTER TABLE sagaflow_runs_old RENAME CONSTRAINT sagaflow_runs_pkey TO sagaflow_runs_old_pkey;
DO $$
DECLARE r record;
BEGIN
  FOR r IN SELECT indexname FROM pg_indexes WHERE tablename = 'sagaflow_runs_old' AND indexname <> 'sagaflow_runs_old_pkey' LOOP
    EXECUTE format('ALTER INDEX %I RENAME TO %I', r.indexname, r.indexname || '_old');
  END LOOP;
END $$;
CREATE TABLE sagaflow_runs (LIKE sagaflow_runs_old INCLUDING DEFAULTS) PARTITION BY RANGE (id);
CREATE OR REPLACE FUNCTION spike_floor(ms bigint) RETURNS uuid LANGUAGE sql IMMUTABLE AS $f$
  SELECT (substr(lpad(to_hex(ms),12,'0'),1,8) || '-' || substr(lpad(to_hex(ms),12,'0'),9,4) || '-0000-0000-000000000000')::uuid
$f$;
DO $$
DECLARE past int := current_setting('spike.past')::int;
        today bigint := (extract(epoch from date_trunc('day', now() at time zone 'utc')) * 1000)::bigint;
        d int;
        lo bigint; hi bigint;
BEGIN
  FOR d IN -past..2 LOOP
    lo := today + d::bigint * 86400000; hi := lo + 86400000;
    EXECUTE format('CREATE TABLE sagaflow_runs_p%s PARTITION OF sagaflow_runs FOR VALUES FROM (%L) TO (%L) WITH (fillfactor=85, autovacuum_vacuum_scale_factor=0.02, autovacuum_analyze_scale_factor=0.02)',
      d + 100, spike_floor(lo), spike_floor(hi));
  END LOOP;
END $$;
CREATE TABLE sagaflow_runs_default PARTITION OF sagaflow_runs DEFAULT WITH (fillfactor=85);
ALTER TABLE sagaflow_runs ADD CONSTRAINT sagaflow_runs_pkey PRIMARY KEY (id);
CREATE INDEX sagaflow_runs_active_key ON sagaflow_runs (workflow, active_key) WHERE active_key IS NOT NULL;
CREATE INDEX sagaflow_runs_business_key ON sagaflow_runs USING btree (workflow, business_key) WHERE (business_key IS NOT NULL);
CREATE INDEX sagaflow_runs_created ON sagaflow_runs USING btree (created_at, id);
CREATE INDEX sagaflow_runs_dirty ON sagaflow_runs USING btree (workflow_key) WHERE dirty;
CREATE INDEX sagaflow_runs_failed ON sagaflow_runs USING btree (failed_attempts, created_at, id) WHERE (failed_attempts > 0);
CREATE INDEX sagaflow_runs_finished ON sagaflow_runs USING btree (finished_at) WHERE (finished_at IS NOT NULL);
CREATE INDEX sagaflow_runs_key_created ON sagaflow_runs USING btree (business_key, created_at, id) WHERE (business_key IS NOT NULL);
CREATE INDEX sagaflow_runs_parent ON sagaflow_runs USING btree (parent_step) WHERE (parent_step IS NOT NULL);
CREATE INDEX sagaflow_runs_state_created ON sagaflow_runs USING btree (state, created_at, id);
CREATE INDEX sagaflow_runs_unfinished ON sagaflow_runs USING btree (workflow_key) WHERE (finished_at IS NULL);
CREATE INDEX sagaflow_runs_workflow_created ON sagaflow_runs USING btree (workflow, created_at, id);
INSERT INTO sagaflow_runs SELECT * FROM sagaflow_runs_old;
DROP TABLE sagaflow_runs_old;
COMMIT;
ANALYZE sagaflow_runs;
