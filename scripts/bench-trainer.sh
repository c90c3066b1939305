#!/usr/bin/env bash
# `app train` against PyTorch eager on the CPU, same machine, same run: an MLP of 3 x 512,
# batch 1024, fp32, Adam, synthetic data (bench/train-mlp-cpu.yaml, bench/torch_mlp.py).
# Each side trains ROUNDS times (default 3) for 3 epochs, alternating; an epoch's samples/s is
# over its training part; the figure of a run is its median epoch, and the script prints the
# median over runs of each side and their ratio. Needs `import torch` to work, so it sets up
# the full wheel (scripts/setup-torch.sh --full).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-3}

./scripts/setup-torch.sh --full
. scripts/torch-env.sh
# APP_BIN: an `app` built with --features torch elsewhere (skips the build).
app=${APP_BIN:-./target/release/app}
[ -n "${APP_BIN:-}" ] || cargo build --release --features torch
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
epoch_median() { grep -o '"samples_per_s": *[0-9.e+]*' | sed 's/.*: *//' | median; }

rust=() python=()
for round in $(seq "$rounds"); do
    rm -rf "$out/run"
    "$app" train --config bench/train-mlp-cpu.yaml --out "$out/run" --metrics-file "$out/rust-$round.jsonl" >/dev/null
    rust+=("$(epoch_median < "$out/rust-$round.jsonl")")
    "$TORCH_PYTHON" bench/torch_mlp.py --epochs 3 > "$out/python-$round.jsonl"
    python+=("$(epoch_median < "$out/python-$round.jsonl")")
    echo "round $round: app train ${rust[-1]} samples/s, PyTorch eager ${python[-1]} samples/s"
done
r=$(printf '%s\n' "${rust[@]}" | median)
p=$(printf '%s\n' "${python[@]}" | median)
threads=$("$TORCH_PYTHON" -c 'import torch; print(torch.get_num_threads())')
echo "median over $rounds runs ($threads intra-op threads): app train $r samples/s, PyTorch eager $p samples/s, ratio $(awk -v r="$r" -v p="$p" 'BEGIN { printf "%.2f", r / p }')x"
