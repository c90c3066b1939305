#!/usr/bin/env bash
# Builds the folder scripts/gpu-check.sh runs from on a GPU machine with no Rust and no network:
# a stripped release `app` with the trainer (--features torch), gpu-check.sh, and the two Python
# helpers it uses (bench/torch_mlp.py, bench/load_checkpoint.py). libtorch is not in it: the
# GPU machine's own Python torch 2.11 provides it (gpu-check.sh points LD_LIBRARY_PATH there).
# The folder must stay under 64 MiB, what a GPU run can carry; this script checks that.
#
#   scripts/gpu-bundle.sh [DIR]     default target/gpu-bundle (ignored by git, so carriable)
#
# Then, on the GPU machine:  cd DIR && ./gpu-check.sh   (here, for the plumbing: ./gpu-check.sh --cpu)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/gpu-bundle}
limit=$((64 << 20))

./scripts/setup-torch.sh
cargo build --release --features torch
rm -rf "$out"
mkdir -p "$out"
# Stripped here rather than in Cargo.toml's release profile, which keeps line tables for
# backtraces in everyday builds.
strip --strip-all -o "$out/app" target/release/app
cp scripts/gpu-check.sh bench/torch_mlp.py bench/load_checkpoint.py "$out/"
size=$(du -cb "$out"/* | tail -n 1 | cut -f1)
echo "gpu-bundle: $out, $((size >> 20)) MiB ($size bytes; limit 64 MiB)" >&2
ls -l "$out" >&2
[ "$size" -le "$limit" ] || { echo "gpu-bundle: over 64 MiB" >&2; exit 1; }
