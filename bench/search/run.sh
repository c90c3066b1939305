#!/usr/bin/env bash
# app's bayes (auto, TPE, GP), random search and early stopping side by side with Optuna's,
# then app's auto choice through the real queue (a server and a worker) beside its functions.
# Installs Optuna from PyPI into bench/search/.venv (once), runs Optuna on the problems of
# bench/src/search_table.rs, then `app-bench search` with those results. Usage:
#   bench/search/run.sh [--gp] [SEEDS]        (default 15)
# --gp also runs Optuna's GPSampler, which needs torch and scipy (installed into the same
# venv: torch is large; pip's cache keeps it once scripts/setup-torch.sh has fetched it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
gp=0
if [ "${1:-}" = "--gp" ]; then
    gp=1
    shift
fi
seeds="${1:-15}"
venv="$here/.venv"
# Pinned: TPESampler's default is the independent TPE in Optuna 4 and the multivariate one in
# Optuna 5, so "Optuna TPE" would change meaning with whatever pip picked (decision 0075).
optuna_version="5.0.0"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
if [ "$("$venv/bin/python" -c 'import optuna; print(optuna.__version__)' 2>/dev/null)" != "$optuna_version" ]; then
    "$venv/bin/pip" install --quiet "optuna==$optuna_version"
fi
if [ "$gp" = 1 ] && ! "$venv/bin/python" -c 'import torch, scipy' 2>/dev/null; then
    "$venv/bin/pip" install --quiet scipy "torch==2.11.0"
fi
# Optuna's results are kept (an hour or more with --gp): if app's side fails, rerun it alone
# with `app-bench search --seeds N --optuna FILE`.
suffix=""
if [ "$gp" = 1 ]; then
    suffix="-gp"
fi
results="$root/target/bench-search/optuna-$seeds-seeds$suffix.json"
mkdir -p "$(dirname "$results")"
echo "optuna $("$venv/bin/python" -c 'import optuna; print(optuna.__version__)'): $seeds seeds -> $results" >&2
OPTUNA_GP="$gp" "$venv/bin/python" "$here/optuna_bench.py" "$seeds" > "$results.partial"
mv "$results.partial" "$results"
cd "$root"
# app itself too: --queue runs it as the server and the worker.
cargo build --release --quiet -p bench --bin app-bench
cargo build --release --quiet --bin app
target="${CARGO_TARGET_DIR:-target}"
"$target/release/app-bench" search --seeds "$seeds" --optuna "$results"
echo
"$target/release/app-bench" search --queue --seeds "$seeds"
echo
"$target/release/app-bench" search --hostile
