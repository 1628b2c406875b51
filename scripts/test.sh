#!/usr/bin/env bash
# Run the whole sagaflow test suite: the one command to type.
#
#   bash scripts/test.sh                    # fmt, clippy, doc, API listing, all tests
#   bash scripts/test.sh -- --nocapture     # extra args go to `cargo test`
#   bash scripts/test.sh some_test_filter
#   SAGAFLOW_SKIP_LINT=1 bash scripts/test.sh   # skip fmt, clippy, doc and the API listing
#
# It starts a throwaway PostgreSQL cluster (scripts/pg.sh) on 127.0.0.1, runs
# the tests against it, and stops and deletes it on exit, whatever happens.
# If no PostgreSQL server is installed it installs Debian's `postgresql`
# package when running as root, and otherwise says what to install.
#
# The console's browser test drives headless Chromium through chromedriver: when
# `chromium` or `chromedriver` is missing it installs Debian's `chromium` and
# `chromium-driver` packages when running as root, and otherwise says what to install.
#
# The HTTP contract test runs schemathesis, which it installs (pinned) from PyPI into a
# virtual environment under the target directory, with Debian's `python3-venv` when python3
# lacks its venv module and it runs as root.
#
# The tests see:
#   SAGAFLOW_PG_URL=postgres://postgres@127.0.0.1:PORT/postgres
#       superuser URL (trust auth); tests create their own databases through it.
#   SAGAFLOW_REQUIRE_PG=1
#       tests must FAIL, not skip, when PostgreSQL is unreachable.
#   SAGAFLOW_REQUIRE_BROWSER=1
#       the browser test must FAIL, not skip, when Chromium or chromedriver is missing.
#   SAGAFLOW_SCHEMATHESIS=$target_dir/schemathesis-venv/bin/schemathesis
#       the fuzzer of the HTTP contract test, installed here (pinned) from PyPI.
#   SAGAFLOW_REQUIRE_SCHEMATHESIS=1
#       the HTTP contract test must FAIL, not skip, when schemathesis is missing.
#   RUST_TEST_THREADS=4 (unless set): four tests at a time, which mostly wait.
#   SAGAFLOW_SCREENSHOTS (optional, yours to set)
#       where the browser test saves its screenshots (default: target/console-screenshots).
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

# shellcheck source=scripts/pg.sh
source "$repo_root/scripts/pg.sh"

# Each step says when it began (minutes and seconds since the script started), so a slow one
# shows in the log.
banner() { printf '\n==> [%02d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*" >&2; }

# shellcheck disable=SC2317  # invoked via trap
cleanup() {
    local status=$?
    # pip, when it still runs beside the build (a job of this shell's, not a reused pid).
    if [[ -n "${schemathesis_pid:-}" ]] && jobs -pr | grep -qx "$schemathesis_pid"; then
        kill "$schemathesis_pid" 2>/dev/null || true
    fi
    if [[ -n "${SAGAFLOW_PG_DIR:-}" ]]; then
        banner "stopping PostgreSQL"
        pg_stop "$SAGAFLOW_PG_DIR" || true
    fi
    exit "$status"
}
trap cleanup EXIT
# Turn signals into a normal exit so the EXIT trap stops the cluster.
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

if ! command -v cargo >/dev/null 2>&1; then
    echo "test.sh: cargo not found in PATH (install Rust with rustup)" >&2
    exit 1
fi

lint=0
[[ "${SAGAFLOW_SKIP_LINT:-0}" != "1" ]] && lint=1
if [[ "$lint" -eq 1 ]]; then
    for tool in rustfmt clippy-driver; do
        # A rustup proxy exists for a component not installed: ask the tool itself.
        if ! "$tool" --version >/dev/null 2>&1; then
            echo "test.sh: $tool not found: the lints need rustfmt and Clippy" >&2
            echo "         (rustup component add rustfmt clippy)" >&2
            exit 1
        fi
    done
fi

# A whole-workspace run gains little from incremental compilation, which makes a cold
# build slower and adds several GB of caches to the target directory; a developer's own
# setting wins.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# A full disk shows up as a linker crash far from its cause: say up front how
# much room the build has.
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
mkdir -p "$target_dir"
banner "free disk for $target_dir: $(df -h --output=avail "$target_dir" | tail -1 | tr -d ' ')"

# PostgreSQL first: a machine that cannot provide it fails in seconds, not
# after a long clippy run.
banner "starting throwaway PostgreSQL"
pg_start

export SAGAFLOW_PG_URL
export SAGAFLOW_REQUIRE_PG=1

# Chromium and chromedriver for the console's browser test.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
        banner "installing chromium and chromium-driver (apt-get)"
        if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null; then
            DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >/dev/null
        fi
    else
        echo "test.sh: the console's browser test needs chromium and chromedriver" >&2
        echo "         (Debian: apt-get install chromium chromium-driver)" >&2
        exit 1
    fi
fi
export SAGAFLOW_REQUIRE_BROWSER=1

# schemathesis, pinned, for the HTTP contract test (tests/tests/suite/http_contract.rs): in a
# virtual environment under the target directory, reused while it holds that version. It
# comes from PyPI; python3's venv module is Debian's `python3-venv` package.
schemathesis_version=4.32.5
schemathesis_venv="$target_dir/schemathesis-venv"
if ! "$schemathesis_venv/bin/schemathesis" --version 2>/dev/null | grep -qxF "schemathesis, version $schemathesis_version"; then
    if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
        if [[ "$(id -u)" -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
            banner "installing python3-venv (apt-get)"
            if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null; then
                DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
                DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv >/dev/null
            fi
        else
            echo "test.sh: the HTTP contract test needs python3 with its venv module" >&2
            echo "         (Debian: apt-get install python3-venv)" >&2
            exit 1
        fi
    fi
    # Beside the build (it waits on the network more than on the processors; 17 s from a
    # fresh clone); the tests wait for it.
    banner "installing schemathesis $schemathesis_version into $schemathesis_venv (pip, beside the build)"
    rm -rf "$schemathesis_venv"
    python3 -m venv "$schemathesis_venv"
    schemathesis_log="$target_dir/schemathesis-install.log"
    "$schemathesis_venv/bin/pip" install -q --disable-pip-version-check \
        "schemathesis==$schemathesis_version" >"$schemathesis_log" 2>&1 &
    schemathesis_pid=$!
fi
export SAGAFLOW_SCHEMATHESIS="$schemathesis_venv/bin/schemathesis"
export SAGAFLOW_REQUIRE_SCHEMATHESIS=1

# Clippy lints the workspace's crates inside the build the tests run: cargo runs them through
# scripts/clippy-rustc (clippy-driver, which is rustc with Clippy's lints, warnings denied) as
# RUSTC_WORKSPACE_WRAPPER, so every dependency is compiled once. A separate `cargo clippy`
# would compile the whole graph a second time in check mode and type-check every crate
# twice: 4.5 minutes cold on two cores. The wrapper stays set for `cargo test` below, which
# then finds nothing to rebuild.
if [[ "$lint" -eq 1 ]]; then
    banner "cargo fmt --all -- --check"
    cargo fmt --all -- --check
    export RUSTC_WORKSPACE_WRAPPER="$repo_root/scripts/clippy-rustc"
fi

# Every target of every crate (the binaries too: the chaos and crash tests start
# sagaflow-chaos, and `cargo test` alone builds no binary), in one command so that cargo
# resolves the dependencies' features once, with the tests' dev-dependencies; `cargo test`
# below reuses every artifact.
lints_on=""
[[ "$lint" -eq 1 ]] && lints_on=" (with Clippy's lints, warnings denied)"
banner "cargo build --workspace --all-targets --locked$lints_on"
cargo build --workspace --all-targets --locked

# The suite's tests mostly wait (on the database, timers, child processes): with two test
# threads on two cores the suite took 6 min and kept the test process under half a core
# busy; with four, 4.4 min. (Running the check-mode lints below beside the tests instead
# starved both: Clippy took three times as long, and a failover test timed out.) A
# developer's own setting wins.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-4}"

if [[ "$lint" -eq 1 ]]; then
    # The OpenTelemetry bridge (the `otel` feature, off by default) is code of the libraries
    # only: Clippy checks them once more with it on. The dependencies it checks are the ones
    # the docs below are built on.
    banner "cargo clippy --workspace --lib --features sagaflow/otel --locked -- -D warnings"
    (unset RUSTC_WORKSPACE_WRAPPER && cargo clippy --workspace --lib --features sagaflow/otel --locked -- -D warnings)

    banner "cargo doc --workspace --no-deps --locked (warnings denied)"
    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked

    # The public API listing (docs/public-api.txt) must match the code, so that every
    # change of the API shows in review. The command was built just above; it is run as
    # built, since `cargo run -p` would resolve the tool's features alone and build its
    # dependencies again. It reads rustdoc's JSON output, built on the dependencies the
    # docs were (scripts/rustdoc-unstable says how).
    banner "public API listing (docs/public-api.txt)"
    "$target_dir/debug/sagaflow-public-api" --check
else
    banner "SAGAFLOW_SKIP_LINT=1: skipping cargo fmt, clippy, doc and the API listing"
fi

if [[ -n "${schemathesis_pid:-}" ]]; then
    pip_pid=$schemathesis_pid
    schemathesis_pid=""
    if ! wait "$pip_pid"; then
        cat "$schemathesis_log" >&2
        echo "test.sh: installing schemathesis $schemathesis_version failed (above)" >&2
        exit 1
    fi
fi

banner "cargo test --workspace --locked $*  (SAGAFLOW_PG_URL=$SAGAFLOW_PG_URL)"
status=0
cargo test --workspace --locked "$@" || status=$?
if [[ "$status" -eq 0 ]]; then
    banner "all tests passed"
else
    banner "cargo test failed (exit $status)"
fi
exit "$status"
