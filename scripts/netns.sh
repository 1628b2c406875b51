#!/usr/bin/env bash
# Hosts on one machine, for measuring several engine nodes against one PostgreSQL
# (docs/benchmarks.md, "A cost model for many nodes"): each host is a network namespace
# sfhostK with a veth pair to the root namespace on its own /30,
#
#     root namespace  sfvethK   10.231.K.1/30   <->   10.231.K.2/30  sfvethKp  netns sfhostK
#
# so a process started with `ip netns exec sfhostK …` has its own network stack and reaches
# the root namespace (where PostgreSQL runs) only over its link, at 10.231.K.1.
#
#   bash scripts/netns.sh up N [PGDIR]   make sfhost1..N (idempotent: what exists is kept);
#                                        with PGDIR (a cluster of scripts/pg.sh), also make
#                                        it listen on 127.0.0.1 and the hosts' 10.231.K.1,
#                                        trust 10.231.0.0/16, restart it, and check that
#                                        every host reaches it
#   bash scripts/netns.sh down           remove every sfhost* namespace and its link
#   bash scripts/netns.sh status         list the hosts and their addresses
#
# A failed or interrupted `up` removes the hosts it made (not those it found). Needs root
# and iproute2. The PostgreSQL part is for throwaway clusters only: it trusts every
# connection from the hosts' addresses.

set -euo pipefail

PREFIX=10.231
MAX_HOSTS=64

log() { printf 'netns.sh: %s\n' "$*" >&2; }

host() { printf 'sfhost%d' "$1"; }

host_exists() { ip netns list | awk '{print $1}' | grep -qx "$(host "$1")"; }

# Make host $1, completing whatever part of it is missing.
host_up() {
    local k=$1 ns root peer
    ns=$(host "$k")
    root="sfveth$k"
    peer="sfveth${k}p"
    host_exists "$k" || ip netns add "$ns"
    if ! ip link show "$root" >/dev/null 2>&1; then
        ip link add "$root" type veth peer name "$peer"
        ip link set "$peer" netns "$ns"
    fi
    ip addr replace "$PREFIX.$k.1/30" dev "$root"
    ip link set "$root" up
    ip -n "$ns" addr replace "$PREFIX.$k.2/30" dev "$peer"
    ip -n "$ns" link set "$peer" up
    ip -n "$ns" link set lo up
}

# Remove host $1 (deleting its namespace takes the veth pair with it); nothing if absent.
host_down() {
    local k=$1
    ip netns del "$(host "$k")" 2>/dev/null || true
    ip link del "sfveth$k" 2>/dev/null || true
}

# The K of every existing sfhostK.
existing() {
    ip netns list | awk '{print $1}' | sed -n 's/^sfhost\([0-9][0-9]*\)$/\1/p' | sort -n
}

# What an interrupted or failed `up` undoes: the hosts it made, not the ones it found.
MADE=()
SETUP_DONE=1
cleanup() {
    local k
    ((SETUP_DONE)) && return 0
    for k in "${MADE[@]}"; do host_down "$k"; done
    log "setup did not finish; removed the hosts it made (${MADE[*]:-none})"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# Let the scripts/pg.sh cluster in $1 listen on the root-side addresses of hosts 1..$2 and
# trust them, and restart it so that it binds them.
pg_open() {
    local dir=$1 n=$2 addrs k port bindir
    [[ -e "$dir/.sagaflow-pg" && -f "$dir/data/postmaster.pid" ]] || {
        log "$dir is not a running cluster of scripts/pg.sh"
        return 1
    }
    port=$(sed -n 4p "$dir/data/postmaster.pid")
    [[ "$port" =~ ^[0-9]+$ ]] || { log "no port in $dir/data/postmaster.pid"; return 1; }
    addrs=127.0.0.1
    for ((k = 1; k <= n; k++)); do addrs+=",$PREFIX.$k.1"; done
    psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres \
        -c "ALTER SYSTEM SET listen_addresses = '$addrs'"
    if ! grep -qx "host all all $PREFIX.0.0/16 trust" "$dir/data/pg_hba.conf"; then
        printf 'host all all %s.0.0/16 trust\n' "$PREFIX" >>"$dir/data/pg_hba.conf"
    fi
    bindir=$(dirname "$(readlink -f "/proc/$(head -n 1 "$dir/data/postmaster.pid")/exe")")
    # pg_ctl restart keeps the server's command line (its port); the server runs as the
    # data directory's owner.
    (cd "$dir" && runuser -u "$(stat -c %U "$dir/data")" -- \
        "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 -m fast restart \
        >/dev/null)
    log "PostgreSQL (port $port) listens on $addrs"
    # Each host must reach the server over its own link before a worker starts in it.
    for ((k = 1; k <= n; k++)); do
        ip netns exec "$(host "$k")" timeout 3 bash -c "exec 3<>/dev/tcp/$PREFIX.$k.1/$port" || {
            log "$(host "$k") cannot reach PostgreSQL at $PREFIX.$k.1:$port"
            return 1
        }
    done
}

up() {
    local n=$1 dir=${2:-} k
    [[ "$n" =~ ^[0-9]+$ ]] && ((n >= 1 && n <= MAX_HOSTS)) || {
        log "N must be 1..$MAX_HOSTS, got '$n'"
        return 2
    }
    SETUP_DONE=0
    for ((k = 1; k <= n; k++)); do
        host_exists "$k" || MADE+=("$k")
        host_up "$k"
    done
    if [[ -n "$dir" ]]; then
        pg_open "$dir" "$n"
    fi
    SETUP_DONE=1
    log "hosts sfhost1..sfhost$n up ($PREFIX.K.1 is the root side of host K)"
}

down() {
    local k
    for k in $(existing); do
        host_down "$k"
        log "removed $(host "$k")"
    done
}

status() {
    local k
    for k in $(existing); do
        printf '%s  root %s  host %s\n' "$(host "$k")" \
            "$(ip -4 -o addr show dev "sfveth$k" 2>/dev/null | awk '{print $4}')" \
            "$(ip -n "$(host "$k")" -4 -o addr show dev "sfveth${k}p" 2>/dev/null |
                awk '{print $4}')"
    done
}

[[ "$(id -u)" -eq 0 ]] || { log "needs root (network namespaces)"; exit 1; }
case "${1:-}" in
    up) up "${2:-}" "${3:-}" ;;
    down) down ;;
    status) status ;;
    *)
        cat >&2 <<EOF
usage: bash $0 up N [PGDIR]   make hosts sfhost1..N; with PGDIR, open that cluster to them
       bash $0 down           remove every sfhost* host
       bash $0 status         list the hosts
EOF
        exit 2
        ;;
esac
