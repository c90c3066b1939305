#!/usr/bin/env bash
# Runs every test of the workspace. This is the README's test command; .ci/run calls it.
# It installs what the tests need first, so a fresh machine that follows the README passes.
set -euo pipefail
cd "$(dirname "$0")/.."

# Tools the tests drive (none beyond Rust yet; the worker, trainer and web page add theirs).

if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --all-targets --no-fail-fast
    # nextest does not run doctests.
    cargo test --workspace --doc
else
    cargo test --workspace --all-targets --no-fail-fast
fi
