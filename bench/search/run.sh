#!/usr/bin/env bash
# app's TPE, random search and early stopping side by side with Optuna's.
# Installs Optuna from PyPI into bench/search/.venv (once), runs Optuna on the problems of
# bench/src/search.rs, then `app-bench search` with those results. Usage:
#   bench/search/run.sh [SEEDS]        (default 15)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
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
results="$(mktemp)"
trap 'rm -f "$results"' EXIT
echo "optuna $("$venv/bin/python" -c 'import optuna; print(optuna.__version__)'): $seeds seeds" >&2
"$venv/bin/python" "$here/optuna_bench.py" "$seeds" > "$results"
cd "$root"
cargo build --release --quiet -p bench
./target/release/app-bench search --seeds "$seeds" --optuna "$results"
echo
./target/release/app-bench search --hostile
