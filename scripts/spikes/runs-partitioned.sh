#!/bin/bash
# What partitioning the runs table by day costs the hot path (ADR 0007): the benchmark's
# order saga on a fresh database whose runs table is whole, then on one whose runs table is
# partitioned by day (runs-partitioned.sql), alternately, with the same build. That build's
# intake has no `ON CONFLICT (workflow, active_key)` clause, which a partitioned table cannot
# arbitrate (the benchmark starts no run with a business key), so the figures are the cost
# of the partitions alone, before any replacement for the unique index.
#
#   eval "$(bash scripts/pg.sh start)"
#   bash scripts/spikes/runs-partitioned.sh [rounds] [past days]
set -euo pipefail
rounds=${1:-3}
past=${2:-14}
root=$(git rev-parse --show-toplevel)
base=${SAGAFLOW_PG_URL:?start PostgreSQL first: eval "\$(bash scripts/pg.sh start)"}
base=${base%/*}
tree=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$tree" >/dev/null 2>&1 || true' EXIT
git -C "$root" worktree add -q --detach "$tree" HEAD
sed -i 's/ON CONFLICT (workflow, active_key) DO NOTHING RETURNING id, start_at, state/RETURNING id, start_at, state/' \
    "$tree/engine/src/store/intake.rs"
grep -q 'RETURNING id, start_at, state"' "$tree/engine/src/store/intake.rs" || { echo "intake's statement changed: update this script" >&2; exit 1; }
target=${SPIKE_TARGET:-$root/target/spike}
(cd "$tree" && CARGO_TARGET_DIR=$target cargo build -q --release -p sagaflow-tools --bin sagaflow-bench --locked)
bin=$target/release/sagaflow-bench
args="--runs 10000 --latency-runs 50 --submitters 64 --ceiling-secs 0 --console-samples 0"
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(psql "$base/postgres" -Atc 'SHOW server_version')"
for round in $(seq "$rounds"); do
  for which in whole partitioned; do
    db=spike_runs_${which}_$round
    psql "$base/postgres" -qc "DROP DATABASE IF EXISTS $db" 2>/dev/null
    psql "$base/postgres" -qc "CREATE DATABASE $db"
    # A first small run migrates the database.
    "$bin" --database-url "$base/$db" --runs 50 --latency-runs 1 --ceiling-secs 0 --console-samples 0 >/dev/null
    if [ "$which" = partitioned ]; then
      psql "$base/$db" -q -v ON_ERROR_STOP=1 -v past="$past" -f "$root/scripts/spikes/runs-partitioned.sql" >/dev/null
    fi
    parts=$(psql "$base/$db" -Atc "SELECT count(*) FROM pg_inherits WHERE inhparent = 'sagaflow_runs'::regclass")
    out=$("$bin" --database-url "$base/$db" $args 2>&1)
    rate=$(grep -m1 'workflows/s' <<<"$out" | awk '{print $2}')
    e2e=$(grep 'submit → completed' <<<"$out" | sed 's/.*completed)//; s/  */ /g')
    echo "round $round  $which ($parts partitions)  workflows/s $rate  end-to-end one at a time:$e2e"
    psql "$base/postgres" -qc "DROP DATABASE $db"
  done
done
