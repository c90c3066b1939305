#!/usr/bin/env bash
# 100 one-second jobs shipped with a 5,000-file, 48 MiB project, on 2 workers x 2 slots, against
# the same sweep with --no-code: what an attempt's copy of the code costs end to end. Each round
# starts a fresh server and fresh workers (empty caches: the first attempt on each worker
# downloads and unpacks); rounds alternate code / no code; prints each wall time and the
# medians. Workers use their default code_copy (auto) unless CODE_COPY is set.
#
#   bench/code_jobs.sh [ROUNDS]      (APP=path/to/app, default target/release/app)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
app=${APP:-target/release/app}
[ -x "$app" ] || { echo "no $app (cargo build --release, or set APP)" >&2; exit 1; }
app=$(realpath "$app")
work=$(mktemp -d "${TMPDIR:-/var/tmp}/code-jobs.XXXXXX")
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

python3 - "$work/project" <<'PY'
import os, random, sys
root = sys.argv[1]
random.seed(7)
os.makedirs(root)
# 4,950 small source files and 50 large ones: 48 MiB in all, as app-bench code writes.
for i in range(4950):
    d = os.path.join(root, "src", f"package_{i // 100:03d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"module_{i:05d}.py"), "w") as f:
        f.write("".join(f"value_{j} = {random.random()}\n" for j in range(60)))
for i in range(50):
    with open(os.path.join(root, f"data_{i:02d}.bin"), "wb") as f:
        f.write(os.urandom(900_000))
PY
printf 'name: code-jobs\ncommand: sleep 1\ngrid:\n  i: [%s]\n' "$(seq -s, 1 100)" > "$work/project/sweep.yaml"
echo "project: $(find "$work/project" -type f | wc -l) files, $(du -sm "$work/project" | cut -f1) MiB; $rounds rounds each" >&2

run() {  # run NAME [submit flags]: prints the wall time of the sweep, from submit to its end
    local name=$1; shift
    local port dir
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    dir=$(mktemp -d "$work/round.XXXX")
    "$app" --server-only --bind "127.0.0.1:$port" --data-dir "$dir/data" > "$dir/server.log" 2>&1 &
    pids+=($!)
    for w in 1 2; do
        if [ -n "${CODE_COPY:-}" ]; then printf '[worker]\ncode_copy = "%s"\n' "$CODE_COPY" > "$dir/w$w.toml"; else : > "$dir/w$w.toml"; fi
        "$app" --client-only --url "http://127.0.0.1:$port" --name "w$w" --max-jobs 2 --work-dir "$dir/w$w" \
            --config "$dir/w$w.toml" > "$dir/w$w.log" 2>&1 &
        pids+=($!)
    done
    for _ in $(seq 100); do
        [ "$("$app" workers --url "http://127.0.0.1:$port" --json 2>/dev/null | grep -c '"name"')" -ge 2 ] && break
        sleep 0.1
    done
    local started ended
    started=$(date +%s.%N)
    (cd "$work/project" && "$app" submit sweep.yaml --url "http://127.0.0.1:$port" --wait "$@" > "$dir/submit.log" 2>&1)
    ended=$(date +%s.%N)
    local copy
    copy=$(grep -o 'code_copy="\?[a-z]*' "$dir/w1.log" | head -n 1 | sed 's/.*=//; s/"//g')
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
    wait 2>/dev/null || true
    pids=()
    python3 -c "print(f'{\"$name\":8} {${ended} - ${started}:6.2f} s  (workers: $copy)')"
}

code=() none=()
for round in $(seq "$rounds"); do
    line=$(run code); echo "round $round $line" >&2; code+=("$(echo "$line" | awk '{print $2}')")
    line=$(run no-code --no-code); echo "round $round $line" >&2; none+=("$(echo "$line" | awk '{print $2}')")
done
python3 - "${code[*]}" "${none[*]}" <<'PY'
import statistics, sys
code = [float(x) for x in sys.argv[1].split()]
none = [float(x) for x in sys.argv[2].split()]
c, n = statistics.median(code), statistics.median(none)
print(f"100 x sleep 1 on 2 workers x 2 slots: with the code {c:.2f} s, --no-code {n:.2f} s median: {c / n:.3f}x (target within 1.10x)")
PY
