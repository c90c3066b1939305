#!/usr/bin/env bash
# The README's first command: build app, start it as a newcomer would (`app`: the server and a
# local worker in one process, no GPU needed), run the quick-start sweep to the end and show
# its leaderboard, then stop it. Data stays in ./app-data, attempt directories in ./app-work.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release
app=./target/release/app
export APP_URL=${APP_URL:-http://127.0.0.1:8000}
bind=${APP_URL#http://}

mkdir -p ./app-data
"$app" --bind "$bind" --data-dir ./app-data --work-dir ./app-work 2>>./app-data/app.log &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true' EXIT

for _ in $(seq 100); do
    curl -fsS "$APP_URL/api/health" >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { echo "app did not start; see app-data/app.log" >&2; exit 1; }
    sleep 0.1
done
echo "app running at $APP_URL (log: app-data/app.log)"

echo "== dry run of the 108-run grid: the job count and the first parameter sets"
"$app" submit configs/vaep-grid.yaml --dry-run
echo
echo "== running configs/quickstart.yaml (6 runs) on the local worker"
# --wait exits non-zero (and shows the failed jobs' logs) if a run fails.
"$app" submit configs/quickstart.yaml --wait
# The newest sweep named quickstart (a rerun gets quickstart-2, -3, ...).
sweep=$("$app" sweeps ls | awk -F'│' '$2 ~ /quickstart/ { gsub(/ /, "", $2); print $2; exit }')
echo
"$app" results "$sweep"
