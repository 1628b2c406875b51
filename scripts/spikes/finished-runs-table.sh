#!/bin/bash
# What moving a run's row at its end into a day-partitioned table of finished runs costs,
# against ending it in place (ADR 0007). One client runs, for a fixed time, batches of 100 runs
# through their life on the runs table (started in one statement, two updates, their end) with
# a week of finished runs already stored: in the runs table when the end is an update in
# place, in the partitioned table when the end moves the rows there. Prints runs/s, the time
# per batch, and the WAL written per run; designs alternate, on fresh databases.
#
#   eval "$(bash scripts/pg.sh start)"
#   bash scripts/spikes/finished-runs-table.sh [rounds] [seconds] [finished runs stored]
set -euo pipefail
rounds=${1:-3}
secs=${2:-20}
finished=${3:-500000}
here=$(cd "$(dirname "$0")" && pwd)
base=${SAGAFLOW_PG_URL:?start PostgreSQL first: eval "\$(bash scripts/pg.sh start)"}
base=${base%/*}
bin=$(dirname "$(command -v pg_ctl 2>/dev/null || ls -d /usr/lib/postgresql/*/bin/pg_ctl | tail -1)")
echo "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), $(psql "$base/postgres" -Atc 'SHOW server_version'); $finished finished runs stored"
for round in $(seq "$rounds"); do
  for design in update move; do
    db=spike_finished_${design}_$round
    psql "$base/postgres" -qc "DROP DATABASE IF EXISTS $db" 2>/dev/null
    psql "$base/postgres" -qc "CREATE DATABASE $db"
    psql "$base/$db" -q -v ON_ERROR_STOP=1 -v finished="$finished" -v design="$design" \
        -f "$here/finished-runs-table.sql" >/dev/null
    psql "$base/$db" -qc CHECKPOINT
    before=$(psql "$base/$db" -Atc 'SELECT pg_current_wal_lsn()')
    out=$("$bin/pgbench" -n -M simple -c 1 -T "$secs" -f "$here/finished-runs-end-$design.sql" "$base/$db" 2>&1)
    wal=$(psql "$base/$db" -Atc "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '$before')")
    tps=$(grep -m1 '^tps' <<<"$out" | awk '{print $3}')
    lat=$(grep -m1 'latency average' <<<"$out" | awk '{print $4}')
    batches=$(grep -m1 'number of transactions actually processed' <<<"$out" | awk '{print $NF}')
    rows=$(psql "$base/$db" -Atc "SELECT (SELECT count(*) FROM sagaflow_runs) || ' rows in sagaflow_runs, ' || (SELECT count(*) FROM sagaflow_runs_done) || ' in sagaflow_runs_done'")
    awk -v r="$round" -v d="$design" -v t="$tps" -v l="$lat" -v w="$wal" -v b="${batches%%/*}" -v rows="$rows" \
        'BEGIN { printf "round %s  %-6s  runs/s %7.0f  ms per 100 runs %6.2f  WAL per run %5.0f B  (%s)\n", r, d, t * 100, l, w / (b * 100), rows }'
    psql "$base/postgres" -qc "DROP DATABASE $db"
  done
done
