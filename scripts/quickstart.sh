#!/usr/bin/env bash
# The README's first command: build app, start it on 127.0.0.1:8000 with ./app-data, submit
# the example sweeps in configs/, show the queue, and stop it again.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release
app=./target/release/app
export APP_URL=${APP_URL:-http://127.0.0.1:8000}
bind=${APP_URL#http://}

mkdir -p ./app-data
"$app" --server-only --bind "$bind" --data-dir ./app-data 2>>./app-data/server.log &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT

for _ in $(seq 100); do
    curl -fsS "$APP_URL/api/health" >/dev/null 2>&1 && break
    kill -0 "$server" 2>/dev/null || { echo "the server did not start; see app-data/server.log" >&2; exit 1; }
    sleep 0.1
done
echo "server running at $APP_URL (log: app-data/server.log)"

echo "== dry run: the job count and the first parameter sets, no server needed"
"$app" submit configs/vaep-grid.yaml --dry-run
echo
echo "== submitting every example in configs/"
for sweep in configs/*.yaml; do
    "$app" submit "$sweep"
done
echo
"$app" status
echo
"$app" status quickstart
