#!/usr/bin/env bash
# Issue 15's measurement: the queue on SQLite (one server) against PostgreSQL with 1, 2 and 3
# replicas, in one run (`app-bench replicas`): a 100,000-job submission and claim+finish
# cycles/s of 64 simulated workers spread over the replicas. Starts Debian's PostgreSQL in a
# temporary directory on a free loopback port (as `nobody` under root), with its default
# durability (fsync, synchronous commit), and removes it afterwards.
#
#   scripts/bench-replicas.sh [--rounds 3] [--seconds 5] [--replicas 1,2,3] [--workers 64]
#
# BENCH_BIN runs that `app-bench` build instead of building target/release/app-bench (an A/B
# runs this script once per build and round, alternating); APP_BIN runs an `app` built before
# the benchmarks left it (2026-11-28), as `app dev bench`.
# PG_SETTINGS adds server settings, e.g. PG_SETTINGS="-c synchronous_commit=off" (SQLite's
# queue.db commits without an fsync per transaction: a crash of the process loses nothing,
# a power cut may lose the last commits; that is PostgreSQL's synchronous_commit=off).
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    ./scripts/install-test-deps.sh
    bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
fi
if [ -n "${APP_BIN:-}" ]; then
    bench=("$APP_BIN" dev bench)
else
    bench=("${BENCH_BIN:-target/release/app-bench}")
    [ -n "${BENCH_BIN:-}" ] || cargo build --release -p bench
fi

dir=$(mktemp -d)
as=()
if [ "$(id -u)" -eq 0 ]; then
    chown 65534:65534 "$dir"
    as=(setpriv --reuid=65534 --regid=65534 --clear-groups)
fi
"${as[@]}" "$bin/initdb" -D "$dir/data" -U app --auth=trust -E UTF8 --locale=C >/dev/null
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"${as[@]}" "$bin/postgres" -D "$dir/data" -p "$port" -k "$dir" \
    -c listen_addresses=127.0.0.1 -c max_connections=200 ${PG_SETTINGS:-} >"$dir/server.log" 2>&1 &
pg=$!
trap 'kill -INT $pg 2>/dev/null; wait $pg 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 300); do
    "$bin/pg_isready" -h 127.0.0.1 -p "$port" -q && break
    sleep 0.1
done
"$bin/pg_isready" -h 127.0.0.1 -p "$port" -q || { cat "$dir/server.log"; exit 1; }
echo "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port"
"${bench[@]}" replicas --database-url "postgres://app@127.0.0.1:$port/postgres" "$@"
