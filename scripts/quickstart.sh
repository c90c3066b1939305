#!/usr/bin/env bash
# The README's first command: build app, start it as a newcomer would (`app`: the server and a
# local worker in one process, no GPU needed), then submit the training project in
# examples/quickstart from inside it, as you would from your own project: its code is shipped
# to the worker, every run's metrics stream to the server, its model is stored as a result,
# and the leaderboard is printed. Data stays in ./app-data, attempt directories in ./app-work.
#
#   scripts/quickstart.sh            keeps app running at the end when run in a terminal
#                                    (Ctrl-C stops it), so its web page is there to look at
#   scripts/quickstart.sh --keep     keeps it running in any case
#   scripts/quickstart.sh --no-keep  stops it at the end (what happens without a terminal:
#                                    CI), printing the command that starts it again
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

keep=auto
for arg in "$@"; do
    case $arg in
        --keep) keep=yes ;;
        --no-keep) keep=no ;;
        -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "quickstart.sh: unknown argument \`$arg\` (expected --keep or --no-keep)" >&2; exit 2 ;;
    esac
done
if [ "$keep" = auto ]; then
    if [ -t 1 ]; then keep=yes; else keep=no; fi
fi

cargo build --release
target=${CARGO_TARGET_DIR:-target}
case $target in /*) ;; *) target=$repo/$target ;; esac
app=$target/release/app
export APP_URL=${APP_URL:-http://127.0.0.1:8000}
bind=${APP_URL#http://}
start_command="$app --bind $bind --data-dir $repo/app-data --work-dir $repo/app-work"

mkdir -p ./app-data
$start_command 2>>./app-data/app.log &
pid=$!
stop_app() {
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
trap stop_app EXIT

for _ in $(seq 100); do
    curl -fsS "$APP_URL/api/health" >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || { echo "app did not start; see app-data/app.log" >&2; exit 1; }
    sleep 0.1
done
curl -fsS "$APP_URL/api/health" >/dev/null 2>&1 || { echo "app did not answer at $APP_URL; see app-data/app.log" >&2; exit 1; }
echo "app running at $APP_URL (log: app-data/app.log)"

echo "== dry run of a 108-run grid: the job count and the first parameter sets, no server needed"
"$app" submit configs/vaep-grid.yaml --dry-run --no-code
echo
echo "== examples/quickstart: submitted from inside the project, so its code goes with the sweep"
submitted=$(mktemp)
# --wait exits non-zero (and shows the failed jobs' logs) if a run fails.
(cd examples/quickstart && "$app" submit sweep.yaml --wait) | tee "$submitted"
# A rerun gets moons-2, moons-3, ...: take the name this submission was given.
sweep=$(sed -n 's/^submitted sweep \([^ ]*\).*/\1/p' "$submitted" | head -n 1)
rm -f "$submitted"
echo
"$app" results "$sweep"
best=$("$app" results "$sweep" --top 1 --json | sed -n 's/.*"job_id": *\([0-9]*\).*/\1/p' | head -n 1)
if [ -n "$best" ]; then
    echo
    echo "== the best run's stored result files (app files $best --download DIR fetches them)"
    "$app" files "$best"
fi

echo
if [ "$keep" = yes ]; then
    echo "app keeps running: the web page is $APP_URL/#/sweeps/$sweep"
    echo "press Ctrl-C to stop it (its data stays in app-data/; start it again with: $start_command)"
    trap 'echo; stop_app; exit 0' INT TERM
    wait "$pid" || true
    trap - EXIT
else
    echo "app stopped (its data stays in app-data/). Start it again, then open $APP_URL/ :"
    echo "  $start_command"
fi
