#!/usr/bin/env bash
# Throwaway PostgreSQL clusters for tests, benchmarks and chaos runs.
#
# Two ways to use it:
#
#   1. Source it and call the functions (this is what scripts/test.sh does):
#
#        source scripts/pg.sh
#        trap 'pg_stop "${SAGAFLOW_PG_DIR:-}"' EXIT
#        pg_start          # sets SAGAFLOW_PG_DIR, SAGAFLOW_PG_PORT, SAGAFLOW_PG_URL
#        ...
#
#   2. Call it from an interactive shell:
#
#        eval "$(bash scripts/pg.sh start)"   # exports SAGAFLOW_PG_URL and SAGAFLOW_PG_DIR
#        psql "$SAGAFLOW_PG_URL"
#        bash scripts/pg.sh stop "$SAGAFLOW_PG_DIR"
#
# The cluster lives entirely in a fresh temp dir (data, unix socket, server log),
# listens on 127.0.0.1 only, trusts every local connection, and is meant to be
# thrown away: it runs with durability switched off (see pg__write_conf).
#
# Environment knobs (all optional):
#   SAGAFLOW_PG_BINDIR   directory holding initdb/pg_ctl/postgres (default: auto-detect)
#   SAGAFLOW_PG_PORT0    first TCP port to try (default 54329; the next free one is used)
#   SAGAFLOW_PG_TMPBASE  where the temp dir is created (default /tmp; must be
#                        reachable by the postgres OS user when running as root)
#
# Requires bash. When sourced, it does not change the caller's shell options.

# Messages go to stderr so that `bash scripts/pg.sh start` prints only the export lines.
pg__log() { printf 'pg.sh: %s\n' "$*" >&2; }

# Print the directory holding the PostgreSQL server binaries, or fail.
pg__find_bindir() {
    local d best=""
    if [[ -n "${SAGAFLOW_PG_BINDIR:-}" ]]; then
        if [[ -x "$SAGAFLOW_PG_BINDIR/initdb" && -x "$SAGAFLOW_PG_BINDIR/pg_ctl" ]]; then
            printf '%s\n' "$SAGAFLOW_PG_BINDIR"
            return 0
        fi
        pg__log "SAGAFLOW_PG_BINDIR=$SAGAFLOW_PG_BINDIR has no initdb/pg_ctl"
        return 1
    fi
    # Debian/Ubuntu layout: /usr/lib/postgresql/<major>/bin; take the highest version.
    best=$(
        for d in /usr/lib/postgresql/*/bin; do
            [[ -x "$d/initdb" && -x "$d/pg_ctl" && -x "$d/postgres" ]] && printf '%s\n' "$d"
        done | sort -V | tail -n 1
    )
    if [[ -n "$best" ]]; then
        printf '%s\n' "$best"
        return 0
    fi
    # pg_config (libpq-dev) may exist without the server, so check for initdb.
    if command -v pg_config >/dev/null 2>&1; then
        d=$(pg_config --bindir 2>/dev/null || true)
        if [[ -n "$d" && -x "$d/initdb" && -x "$d/pg_ctl" ]]; then
            printf '%s\n' "$d"
            return 0
        fi
    fi
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(command -v initdb)"
        return 0
    fi
    return 1
}

# Find the server binaries, installing Debian's postgresql package if we are root.
pg__ensure_bindir() {
    local bindir
    if bindir=$(pg__find_bindir); then
        printf '%s\n' "$bindir"
        return 0
    fi
    if [[ "$(id -u)" -ne 0 ]]; then
        pg__log "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found."
        pg__log "Install them, e.g. 'sudo apt-get install postgresql' on Debian/Ubuntu,"
        pg__log "or point SAGAFLOW_PG_BINDIR at the directory that holds them."
        return 1
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        pg__log "PostgreSQL server binaries not found and apt-get is unavailable;"
        pg__log "install a PostgreSQL server or set SAGAFLOW_PG_BINDIR."
        return 1
    fi
    pg__log "PostgreSQL server not found; installing Debian package 'postgresql'..."
    # The package's postinst may fail to start its own cluster (no systemd/init
    # here); we never use that cluster, so its failure is tolerated as long as
    # the binaries end up on disk.
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 ||
        pg__log "apt-get update failed; trying the install anyway"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        postgresql >&2 ||
        pg__log "apt-get install postgresql reported an error; checking for binaries anyway"
    if bindir=$(pg__find_bindir); then
        printf '%s\n' "$bindir"
        return 0
    fi
    pg__log "installing postgresql did not provide initdb/pg_ctl"
    return 1
}

# Run a command as the cluster owner: the postgres OS user when we are root
# (the server refuses to run as root), otherwise as ourselves.
pg__as_owner() {
    if [[ "$(id -u)" -eq 0 ]]; then
        if command -v runuser >/dev/null 2>&1; then
            runuser -u postgres -- "$@"
        else
            # su needs one command string; quote every argument.
            su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
        fi
    else
        "$@"
    fi
}

pg__ensure_os_user() {
    [[ "$(id -u)" -eq 0 ]] || return 0
    id -u postgres >/dev/null 2>&1 && return 0
    pg__log "creating system user 'postgres'"
    useradd --system --user-group --no-create-home --home-dir /var/lib/postgresql \
        --shell /bin/sh postgres
}

# True when nothing listens on 127.0.0.1:$1.
pg__port_free() {
    local port=$1
    if command -v ss >/dev/null 2>&1; then
        [[ -z "$(ss -Htln "sport = :$port" 2>/dev/null)" ]] || return 1
    fi
    # Connect test as a fallback / double check: success means it is taken.
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        return 1
    fi
    return 0
}

pg__write_conf() {
    local dir=$1
    # TEST-ONLY settings: durability is switched off (fsync, synchronous_commit,
    # full_page_writes) because the cluster is thrown away after the run; a
    # crash loses nothing we care about. Never use these in production.
    # max_connections is raised because tests run in parallel, each with its own
    # database and connection pool.
    cat >>"$dir/data/postgresql.conf" <<EOF

# --- added by sagaflow scripts/pg.sh (throwaway test cluster) ---
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 300
shared_buffers = 128MB
EOF
}

# Print the server log of cluster dir $1 to stderr.
pg__dump_log() {
    local dir=$1
    if [[ -f "$dir/server.log" ]]; then
        pg__log "----- server log ($dir/server.log) -----"
        cat "$dir/server.log" >&2 || true
        pg__log "----- end of server log -----"
    fi
}

# pg_start: create and start a throwaway cluster.
# On success sets and exports:
#   SAGAFLOW_PG_DIR   the temp dir (pass it to pg_stop)
#   SAGAFLOW_PG_PORT  the TCP port on 127.0.0.1
#   SAGAFLOW_PG_URL   postgres://postgres@127.0.0.1:$PORT/postgres (superuser, trust auth)
#   SAGAFLOW_PG_BIN   the server binaries directory
# SAGAFLOW_PG_DIR is set as soon as the temp dir exists, so an EXIT trap calling
# pg_stop "${SAGAFLOW_PG_DIR:-}" cleans up even if pg_start fails halfway.
# On failure pg_start cleans up after itself and returns 1.
#
# pg_start PORT makes the new cluster a streaming standby of the primary listening on
# 127.0.0.1:PORT (pg_basebackup -R: a copy of its data, following its WAL) instead of an empty
# one; pg_promote turns it into a primary.
pg_start() {
    local bindir dir port tries=0 deadline isready primary_port=${1:-}
    bindir=$(pg__ensure_bindir) || return 1
    pg__ensure_os_user || { pg__log "could not create the postgres OS user"; return 1; }

    dir=$(mktemp -d "${SAGAFLOW_PG_TMPBASE:-/tmp}/sagaflow-pg.XXXXXX") || return 1
    SAGAFLOW_PG_DIR=$dir
    export SAGAFLOW_PG_DIR
    # Marker so pg_stop only ever deletes directories made here.
    : >"$dir/.sagaflow-pg"
    if [[ "$(id -u)" -eq 0 ]]; then
        chown -R postgres: "$dir" || { pg_stop "$dir"; return 1; }
    fi

    if [[ -n "$primary_port" ]]; then
        pg__log "pg_basebackup of 127.0.0.1:$primary_port into $dir (binaries: $bindir)"
        if ! (cd "$dir" && pg__as_owner "$bindir/pg_basebackup" -h 127.0.0.1 -p "$primary_port" \
            -U postgres -D "$dir/data" -R -X stream -c fast --no-sync >"$dir/initdb.log" 2>&1); then
            pg__log "pg_basebackup failed:"
            cat "$dir/initdb.log" >&2 || true
            pg_stop "$dir"
            return 1
        fi
    else
        pg__log "initdb in $dir (binaries: $bindir)"
        # cd into the temp dir: the caller's cwd may be unreadable for postgres.
        if ! (cd "$dir" && pg__as_owner "$bindir/initdb" -D "$dir/data" -A trust -U postgres \
            --no-sync --encoding=UTF8 --locale=C >"$dir/initdb.log" 2>&1); then
            pg__log "initdb failed:"
            cat "$dir/initdb.log" >&2 || true
            pg_stop "$dir"
            return 1
        fi
    fi
    # A standby's copied configuration names the primary's socket directory; the settings
    # appended now come last and win.
    pg__write_conf "$dir"

    port=${SAGAFLOW_PG_PORT0:-54329}
    while :; do
        tries=$((tries + 1))
        if ((tries > 50)); then
            pg__log "no free port found / server did not start after 50 attempts"
            pg__dump_log "$dir"
            pg_stop "$dir"
            return 1
        fi
        if ! pg__port_free "$port"; then
            port=$((port + 1))
            continue
        fi
        if (cd "$dir" && pg__as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" \
            -o "-p $port" -w -t 30 start >"$dir/pg_ctl.log" 2>&1); then
            break
        fi
        # Lost a race for the port: try the next one. Anything else is fatal.
        if grep -q -e 'could not bind' -e 'Address already in use' "$dir/server.log" 2>/dev/null; then
            pg__log "port $port taken, trying the next one"
            pg__as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true
            port=$((port + 1))
            continue
        fi
        pg__log "pg_ctl start failed:"
        cat "$dir/pg_ctl.log" >&2 || true
        pg__dump_log "$dir"
        pg_stop "$dir"
        return 1
    done

    # Wait (bounded) until the server accepts TCP connections.
    isready="$bindir/pg_isready"
    [[ -x "$isready" ]] || isready=$(command -v pg_isready || true)
    deadline=$((SECONDS + 30))
    while :; do
        if [[ -n "$isready" ]]; then
            "$isready" -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -t 2 && break
        else
            (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        fi
        if ((SECONDS >= deadline)); then
            pg__log "PostgreSQL on 127.0.0.1:$port not ready after 30 s"
            pg__dump_log "$dir"
            pg_stop "$dir"
            return 1
        fi
        sleep 0.2
    done

    SAGAFLOW_PG_PORT=$port
    SAGAFLOW_PG_URL="postgres://postgres@127.0.0.1:$port/postgres"
    SAGAFLOW_PG_BIN=$bindir
    export SAGAFLOW_PG_PORT SAGAFLOW_PG_URL SAGAFLOW_PG_BIN
    pg__log "PostgreSQL ($("$bindir/postgres" --version 2>/dev/null || echo '?')) ready at $SAGAFLOW_PG_URL (dir $dir)"
    return 0
}

# The pids whose parent is $1 (from /proc: procps may be missing).
pg__children() {
    local stat f
    for stat in /proc/[0-9]*/stat; do
        read -r -a f <"$stat" 2>/dev/null || continue
        [[ "${f[3]}" == "$1" ]] && printf '%s\n' "${f[0]}"
    done
    return 0
}

# pg_kill DIR: SIGKILL the server of DIR and every process it started, at once (a host
# that dies: no shutdown, no last WAL sent to standbys). The directory stays; pg_stop
# removes it.
pg_kill() {
    local dir=${1:-} pid
    [[ -f "$dir/data/postmaster.pid" ]] || { pg__log "no server running in $dir"; return 1; }
    pid=$(head -n 1 "$dir/data/postmaster.pid")
    [[ "$pid" =~ ^[0-9]+$ ]] || { pg__log "no postmaster pid in $dir"; return 1; }
    # Frozen first, so that no backend it forks while its children are listed escapes.
    kill -STOP "$pid" 2>/dev/null
    # shellcheck disable=SC2046 # one word per pid
    kill -KILL "$pid" $(pg__children "$pid") 2>/dev/null
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
}

# pg_promote DIR: promote the standby of DIR to a primary and wait until it accepts writes.
pg_promote() {
    local dir=${1:-} bindir
    bindir=${SAGAFLOW_PG_BIN:-}
    [[ -n "$bindir" && -x "$bindir/pg_ctl" ]] || bindir=$(pg__find_bindir) || return 1
    (cd "$dir" && pg__as_owner "$bindir/pg_ctl" -D "$dir/data" -w -t 30 promote >&2)
}

# pg_stop DIR: stop the cluster in DIR (pg_ctl stop -m immediate) and delete DIR.
# Safe to call twice, with an empty argument, or on a half-created DIR.
pg_stop() {
    local dir=${1:-} bindir pid
    [[ -n "$dir" ]] || return 0
    [[ -d "$dir" ]] || return 0
    if [[ ! -e "$dir/.sagaflow-pg" ]]; then
        pg__log "refusing to touch $dir: not a cluster dir made by scripts/pg.sh"
        return 1
    fi
    if [[ -f "$dir/data/postmaster.pid" ]]; then
        bindir=${SAGAFLOW_PG_BIN:-}
        [[ -n "$bindir" && -x "$bindir/pg_ctl" ]] || bindir=$(pg__find_bindir 2>/dev/null || true)
        if [[ -n "$bindir" ]]; then
            (cd "$dir" && pg__as_owner "$bindir/pg_ctl" -D "$dir/data" -m immediate -w -t 20 \
                stop >/dev/null 2>&1) || true
        fi
        # Still there? Kill the postmaster we started, by its pid.
        if [[ -f "$dir/data/postmaster.pid" ]]; then
            pid=$(head -n 1 "$dir/data/postmaster.pid" 2>/dev/null || true)
            if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
                pg__log "pg_ctl stop did not finish; sending SIGKILL to postmaster $pid"
                kill -KILL "$pid" 2>/dev/null || true
                sleep 0.5
            fi
        fi
    fi
    rm -rf -- "$dir"
    if [[ "${SAGAFLOW_PG_DIR:-}" == "$dir" ]]; then
        unset SAGAFLOW_PG_DIR SAGAFLOW_PG_PORT SAGAFLOW_PG_URL
    fi
    return 0
}

# ---------------------------------------------------------------------------
# Command-line use (only when executed, not when sourced).
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    set -euo pipefail
    case "${1:-}" in
        start)
            # Interrupted halfway: do not leave a half-started cluster behind.
            trap 'pg_stop "${SAGAFLOW_PG_DIR:-}"; exit 130' INT TERM HUP
            if pg_start; then
                trap - INT TERM HUP
                printf 'export SAGAFLOW_PG_URL=%q\n' "$SAGAFLOW_PG_URL"
                printf 'export SAGAFLOW_PG_DIR=%q\n' "$SAGAFLOW_PG_DIR"
                printf '# stop with: bash scripts/pg.sh stop %q\n' "$SAGAFLOW_PG_DIR"
            else
                exit 1
            fi
            ;;
        standby)
            # A streaming standby of the cluster listening on 127.0.0.1:$2.
            if [[ -z "${2:-}" ]]; then
                echo "usage: $0 standby PRIMARY_PORT" >&2
                exit 2
            fi
            trap 'pg_stop "${SAGAFLOW_PG_DIR:-}"; exit 130' INT TERM HUP
            if pg_start "$2"; then
                trap - INT TERM HUP
                printf 'export SAGAFLOW_REPLICA_URL=%q\n' "$SAGAFLOW_PG_URL"
                printf 'export SAGAFLOW_REPLICA_DIR=%q\n' "$SAGAFLOW_PG_DIR"
                printf '# stop with: bash scripts/pg.sh stop %q\n' "$SAGAFLOW_PG_DIR"
            else
                exit 1
            fi
            ;;
        stop)
            if [[ -z "${2:-}" ]]; then
                echo "usage: $0 stop DIR" >&2
                exit 2
            fi
            pg_stop "$2"
            ;;
        *)
            cat >&2 <<EOF
usage: bash $0 start        start a throwaway cluster; prints export lines
                            (use: eval "\$(bash $0 start)")
       bash $0 standby PORT start a streaming standby of the cluster on 127.0.0.1:PORT;
                            prints export lines (SAGAFLOW_REPLICA_URL, SAGAFLOW_REPLICA_DIR)
       bash $0 stop DIR     stop the cluster in DIR and delete DIR
EOF
            exit 2
            ;;
    esac
fi
