#!/usr/bin/env bash
# Installs what the tests and benchmarks use beyond Rust, when it is missing:
#   docker-compose  to check docker-compose.yml (`docker compose config`), when no Docker CLI
#                   plugin is there (the engine itself is not needed);
#   parallel        GNU parallel, the baseline of `app bench-worker`;
#   git, curl       git for the commit of a job's working tree, curl for scripts/quickstart.sh.
set -euo pipefail

missing=()
command -v git >/dev/null || missing+=(git)
command -v curl >/dev/null || missing+=(curl)
command -v parallel >/dev/null || missing+=(parallel)
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null; then
    missing+=(docker-compose)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing ${missing[*]} (apt-get)" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
