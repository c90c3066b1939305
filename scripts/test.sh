#!/usr/bin/env bash
# Runs every test of the workspace. This is the README's test command; .ci/run calls it.
# It installs what the tests need first, so a fresh machine that follows the README passes.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-test-deps.sh
# libtorch for the built-in trainer (idempotent: instant when .venv-torch is in place).
# The full wheel: the checkpoint tests load our checkpoints with Python torch (import torch
# needs every dependency), and the trainer benchmark runs PyTorch eager beside app.
./scripts/setup-torch.sh --full

# docker-compose.yml must be a valid Compose file (no engine needed to check that).
# (The file requires the two tokens to be set; any values do for the check.)
compose_check=(env APP_USER_TOKEN=compose-check-user-token APP_WORKER_TOKEN=compose-check-worker-token)
if docker compose version >/dev/null 2>&1; then
    "${compose_check[@]}" docker compose -f docker-compose.yml config -q
else
    "${compose_check[@]}" docker-compose -f docker-compose.yml config -q
fi
echo "docker-compose.yml: valid"

# The trainer's pure parts (config, schedules, loss scaler, bench search) build and pass
# without libtorch too; the whole suite then runs with the trainer built in.
cargo test -p trainer --lib
if cargo nextest --version >/dev/null 2>&1; then
    # nextest does not run doctests; they go first so the run ends with nextest's summary.
    cargo test --workspace --doc --features torch
    cargo nextest run --workspace --all-targets --features torch --no-fail-fast
    # Again on PostgreSQL (Debian's, started by the tests themselves): the server's API suite
    # and the end-to-end suites of real server and worker processes (its `replicas::` tests run
    # on PostgreSQL either way).
    APP_TEST_BACKEND=postgres cargo nextest run --workspace --all-targets --features torch --no-fail-fast \
        -E 'binary(api) | (binary(e2e) & !test(/^replicas::/))'
else
    cargo test --workspace --all-targets --features torch --no-fail-fast
    APP_TEST_BACKEND=postgres cargo test -p server --test api --no-fail-fast
    APP_TEST_BACKEND=postgres cargo test -p app --test e2e --features torch --no-fail-fast
fi
