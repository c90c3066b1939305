#!/usr/bin/env bash
# Short jobs side by side (issue 11): app against HyperQueue (PyPI), task-spooler and GNU
# parallel (Debian), in one run, alternating, several rounds. Installs what it needs: tsp and
# parallel with apt when missing, HyperQueue into .venv-bench/, and builds app in release mode.
#
#   scripts/bench-peers.sh [--rounds 5] [--latency-samples 30]
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v tsp >/dev/null || missing+=(task-spooler)
command -v parallel >/dev/null || missing+=(parallel)
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
venv=.venv-bench
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import hyperqueue' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --disable-pip-version-check -q "hyperqueue==0.27.0"
fi
cargo build --release --bin app
exec "$venv/bin/python" bench/peers.py --app target/release/app "$@"
