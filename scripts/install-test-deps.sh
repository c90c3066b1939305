#!/usr/bin/env bash
# Installs what the tests and benchmarks use beyond Rust, when it is missing:
#   docker-compose  to check docker-compose.yml (`docker compose config`), when no Docker CLI
#                   plugin is there (the engine itself is not needed);
#   parallel        GNU parallel, the baseline of `app-bench worker`;
#   git, curl       git for the commit of a job's working tree, curl for scripts/quickstart.sh;
#   chromium        Debian's Chromium, driven by the browser test (tests/e2e/browser.rs);
#   nodejs, npm     to run that test's script, and `npm ci` of its packages (playwright-core)
#                   in tests/browser when they are missing or older than its package-lock.json;
#   prometheus      Debian's package, for `promtool check metrics` on the server's /metrics
#                   (tests/e2e/ops.rs);
#   postgresql      Debian's server (initdb, postgres, pg_isready, psql), started per test in a
#                   temporary directory by server/tests/postgres (as `nobody` when run as root);
#   systemd         for `systemd-analyze verify` and `security` of deploy/systemd (tests/e2e/ops.rs);
#   python3-venv    for .venv-deploy: the PyPI package kubernetes-validate (pinned), which checks
#                   deploy/kubernetes against the Kubernetes JSON schemas it ships (offline).
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v git >/dev/null || missing+=(git)
command -v curl >/dev/null || missing+=(curl)
command -v parallel >/dev/null || missing+=(parallel)
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null; then
    missing+=(docker-compose)
fi
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || missing+=(chromium)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
command -v promtool >/dev/null || missing+=(prometheus)
if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    missing+=(postgresql)
fi
command -v systemd-analyze >/dev/null || missing+=(systemd)
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)

if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "installing ${missing[*]} (apt-get)" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

browser_test=tests/browser
if [ ! -d "$browser_test/node_modules" ] || [ "$browser_test/package-lock.json" -nt "$browser_test/node_modules" ]; then
    echo "installing the browser test's packages (npm ci in $browser_test)" >&2
    npm ci --prefix "$browser_test" --no-audit --no-fund --loglevel=error >/dev/null
    touch "$browser_test/node_modules"
fi

deploy_venv=.venv-deploy
kubernetes_validate=1.37.0
if [ "$("$deploy_venv/bin/kubernetes-validate" --version 2>/dev/null)" != "$kubernetes_validate" ]; then
    echo "installing kubernetes-validate $kubernetes_validate (pip, in $deploy_venv)" >&2
    python3 -m venv "$deploy_venv"
    "$deploy_venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$kubernetes_validate"
fi
