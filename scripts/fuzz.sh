#!/usr/bin/env bash
# Fuzzes what the server takes from the network, each target for a bounded time:
#   sweep       sweep files (parse, count, build jobs)
#   api_bodies  register / claim / heartbeat / report bodies (placement, job state machine)
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET (default 60)] [TARGET...]
# Needs cargo-fuzz (`cargo install cargo-fuzz`) and a C++ compiler; works on stable Rust
# through RUSTC_BOOTSTRAP (libFuzzer needs a few unstable flags), without sanitizers.
# Crashes land in fuzz/artifacts/<target>/: turn each into a test in
# shared/tests/fuzz_regressions.rs, then fix. Not part of CI (time); run it before releases.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(sweep api_bodies)
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz is missing: cargo install cargo-fuzz" >&2
    exit 1
fi

# The corpus grows with what the fuzzer finds; it lives with the build outputs, seeded from
# the example configs and fuzz/seeds/ at every run.
corpus_root=target/fuzz-corpus
mkdir -p "$corpus_root/sweep" "$corpus_root/api_bodies"
for config in configs/*.yaml; do
    # The first byte of an input picks options (here: no --command).
    { printf '\x00'; cat "$config"; } > "$corpus_root/sweep/seed-$(basename "$config")"
done
cp fuzz/seeds/api_bodies/* "$corpus_root/api_bodies/"

for target in "${targets[@]}"; do
    echo "== fuzzing $target for $seconds s"
    mkdir -p "fuzz/artifacts/$target"
    RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir fuzz --target-dir target/fuzz -s none "$target" \
        "$corpus_root/$target" -- \
        -max_total_time="$seconds" -timeout=10 -max_len=65536 -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$target/"
done
