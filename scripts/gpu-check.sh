#!/usr/bin/env bash
# The GPU check: one command that verifies the GPU paths of `app` end to end on a machine with
# an NVIDIA GPU and Python torch 2.11 (no Rust, no network), and prints a table.
#
#   ./gpu-check.sh          on the GPU machine
#   ./gpu-check.sh --cpu    every step on the CPU instead (no GPU needed): checks the plumbing,
#                           so a first real GPU run does not fail on a typo
#
# It runs from a folder holding the stripped release `app` (built with --features torch), this
# script, torch_mlp.py and load_checkpoint.py: scripts/gpu-bundle.sh makes that folder. From the
# repository it uses target/release/app and bench/. libtorch comes from this machine's Python
# torch (LD_LIBRARY_PATH is set to its lib/), PYTHON picks the interpreter (default python3).
# Every step runs under `timeout` against one deadline, so the check ends within 10 minutes.
#
# Steps: the worker's NVML inventory and telemetry reaching a server (both started here on
# loopback); a real job placed on a GPU with CUDA_VISIBLE_DEVICES, and its per-job accounting
# (utilisation, peak memory, GPU-hours) in its result; `app train` on CUDA against
# PyTorch eager (bf16 and tf32, same data, same run) with its log line naming the device; the
# checkpoint loaded by torch.load; `app bench` over batch sizes x {fp32, tf32, bf16, fp16} on a
# 4 x 4096 MLP at batch 8192 with model FLOP/s and MFU (FLOPs counted from the layer shapes,
# against 790 TFLOP/s dense bf16); GPU utilisation sampled during a long bf16 run; an OOM row that
# does not hang; data parallelism over NCCL (one rank per GPU; a one-rank group on one GPU).
# The table also goes to gpu-check.md in $OUT (when set) or the current directory.
set -uo pipefail

mode=gpu
case "${1:-}" in
    --cpu) mode=cpu ;;
    "") ;;
    *) echo "usage: $0 [--cpu]" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
started=$SECONDS
BUDGET=${GPU_CHECK_BUDGET:-570}   # seconds for all steps; the last ones are skipped past it

app=${APP_BIN:-}
for candidate in "$here/app" "$here/../target/release/app"; do
    [ -z "$app" ] && [ -x "$candidate" ] && app=$candidate
done
pydir=$here
[ -f "$pydir/torch_mlp.py" ] || pydir=$here/../bench
python=$(command -v "${PYTHON:-python3}") || { echo "gpu-check: no ${PYTHON:-python3}" >&2; exit 1; }
[ -n "$app" ] || { echo "gpu-check: no app binary beside the script (run scripts/gpu-bundle.sh)" >&2; exit 1; }
torch_lib=$("$python" -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))') || {
    echo "gpu-check: $python cannot import torch" >&2
    exit 1
}
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
torch_version=$("$python" -c 'import torch; print(torch.__version__)')

work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
    wait 2>/dev/null
    [ -n "${KEEP:-}" ] && echo "gpu-check: kept $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT

rows=()
# record STEP STATUS DETAIL: STATUS is ok, FAIL, miss (ran, but a target was missed) or skip.
record() {
    rows+=("$1|$2|$3")
    printf '%-34s %-5s %s\n' "$1" "$2" "$3" >&2
}
# Seconds a step may take: its own limit, or what is left of the budget.
limit() {
    local left=$((BUDGET - (SECONDS - started)))
    [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
# Whether a step can still start: some 20 s of the budget left.
have_time() { [ $((BUDGET - (SECONDS - started))) -ge 20 ]; }
# report.py KIND FILE: one figure or table rows from a step's output (JSON, JSON lines, CSV).
cat > "$work/report.py" <<'REPORT'
import json, statistics, sys

kind, path = sys.argv[1], sys.argv[2]
text = open(path).read()


def json_lines():
    return [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]


if kind == "median-epochs":
    # The median samples/s of the epochs after the first (warm-up).
    epochs = [line["samples_per_s"] for line in json_lines()]
    print(round(statistics.median(epochs[1:] or epochs)))
elif kind == "ratio":
    ours, theirs = float(sys.argv[3]), float(sys.argv[4])
    print(f"{'ok' if ours >= 0.95 * theirs else 'miss'}|{ours / theirs:.2f}x")
elif kind == "checkpoint":
    d = json.loads(text)
    keys = d["keys"]
    print(f"{d['loaded_with']}: {len(keys)} tensors ({keys[0]} ... {keys[-1]}), strict load_state_dict, torch {d['torch']}")
elif kind == "bench-rows":
    d = json.loads(text)
    for row, mfu in zip(d["rows"], d["mfu"]):
        name = f"bench {row['batch_size']} {row['amp']}"
        if row["status"] == "ok":
            util = row["gpu_utilization"] if row["gpu_utilization"] is not None else row["cpu_utilization"]
            print(f"{name}|ok|{row['samples_per_s']:.0f} samples/s, step {row['step_ms']:.2f} ms, "
                  f"{row['tflops']:.3g} TFLOP/s, MFU {100 * (mfu or 0):.1f}%, util {util or 0:.0f}%")
        else:
            print(f"{name}|{'skip' if row['status'] == 'unsupported' else 'FAIL'}|{row['error']}")
elif kind == "bench-targets":
    # At the largest batch: bf16 >= 5x fp32 and >= 1.3x tf32, bf16 MFU >= 40% (the H100 targets).
    d = json.loads(text)
    largest = max(row["batch_size"] for row in d["rows"])
    rows = {row["amp"]: (row, mfu) for row, mfu in zip(d["rows"], d["mfu"])
            if row["batch_size"] == largest and row["status"] == "ok"}
    if not all(name in rows for name in ("fp32", "tf32", "bf16")):
        print(f"FAIL|missing rows at batch {largest}: {sorted(rows)}")
    else:
        bf16, mfu = rows["bf16"][0]["samples_per_s"], rows["bf16"][1] or 0
        over_fp32, over_tf32 = bf16 / rows["fp32"][0]["samples_per_s"], bf16 / rows["tf32"][0]["samples_per_s"]
        met = over_fp32 >= 5 and over_tf32 >= 1.3 and mfu >= 0.4
        print(f"{'ok' if met else 'miss'}|batch {largest}: bf16/fp32 {over_fp32:.1f}x, bf16/tf32 {over_tf32:.2f}x, "
              f"bf16 MFU {100 * mfu:.0f}% (targets 5x, 1.3x, 40%)")
elif kind == "oom":
    d = json.loads(text)
    statuses = ",".join(row["status"] for row in d["rows"])
    print(f"{'ok' if statuses == 'ok,oom' else 'FAIL'}|rows {statuses}; {(d['rows'][-1]['error'] or '')[:100]}")
elif kind == "utilisation":
    values = [float(value) for value in text.split() if value.replace(".", "").isdigit()]
    middle = values[len(values) // 5 : len(values) - len(values) // 5] or values
    mean = sum(middle) / len(middle) if middle else 0
    print(f"{'ok' if mean >= 90 else 'miss'}|{mean:.0f}% mean over the middle 60% of {len(values)} samples every 200 ms (target >= 90%)")
REPORT
free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

if [ "$mode" = gpu ]; then
    device=cuda
    features=4096; hidden="[4096, 4096, 4096, 4096]"; eager_hidden=4096,4096,4096,4096; classes=10
    samples=131072; batch=8192; bench_batches=2048,8192; long_epochs=400; oom_batch=4194304
    peak=790
    gpu_count=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || gpu_count=0
    [ "$gpu_count" -ge 1 ] || { echo "gpu-check: nvidia-smi lists no GPU (use --cpu for the plumbing check)" >&2; exit 1; }
else
    device=cpu
    features=128; hidden="[256, 256, 256, 256]"; eager_hidden=256,256,256,256; classes=10
    samples=8192; batch=512; bench_batches=256,512; long_epochs=3; oom_batch=1099511627776
    peak=1
    gpu_count=0
    # Some VMs report AMX but fault on it; cap oneDNN so bf16 on the CPU runs there too.
    export ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-AVX512_CORE_BF16}
fi
echo "gpu-check ($mode): $app, torch $torch_version from $torch_lib, $gpu_count GPU(s)" >&2

cat > "$work/mlp.yaml" <<EOF
seed: 0
data: {source: synthetic, samples: $samples, features: $features, classes: $classes, val_fraction: 0.0}
model: {name: mlp, hidden_dims: $hidden}
optimizer: {name: adam, lr: 0.0001}
batch_size: $batch
epochs: 8
early_stopping: {metric: train_loss}
device: $device
EOF

# --- 1. inventory and telemetry through a server and a worker on loopback ------------------
port=$(free_port)
url=http://127.0.0.1:$port
"$app" --server-only --bind "127.0.0.1:$port" --data-dir "$work/server" > "$work/server.log" 2>&1 &
pids+=($!)
# GPU readings every second, so a job of a few seconds gets its own accounting.
printf '[worker]\ntelemetry_secs = 1\n' > "$work/worker.toml"
"$app" --client-only --url "$url" --name gpu-check --work-dir "$work/worker" --max-jobs 2 \
    --config "$work/worker.toml" > "$work/worker.log" 2>&1 &
pids+=($!)
inventory=""
for _ in $(seq 150); do
    inventory=$("$python" - "$url" <<'EOF' 2>/dev/null
import json, sys, urllib.request
workers = json.load(urllib.request.urlopen(sys.argv[1] + "/api/workers", timeout=2))
mine = [w for w in workers if w["name"] == "gpu-check"]
if mine:
    gpus = mine[0]["capacity"]["gpus"]
    print(f"{len(gpus)} GPU(s)" + "".join(f"; {g}" for g in gpus)[:200])
EOF
)
    [ -n "$inventory" ] && break
    sleep 0.2
done
if [ -z "$inventory" ]; then
    record "worker NVML inventory" FAIL "the worker did not register within 30 s: $(tail -n 2 "$work/worker.log" | tr '\n' ' ')"
elif [ "$mode" = gpu ] && [[ "$inventory" == 0\ GPU* ]]; then
    record "worker NVML inventory" FAIL "registered without GPUs: $(tail -n 2 "$work/worker.log" | tr '\n' ' ')"
else
    record "worker NVML inventory" ok "$inventory"
fi
if [ "$mode" = gpu ]; then
    telemetry=""
    for _ in $(seq 100); do
        telemetry=$("$python" - "$url" <<'EOF' 2>/dev/null
import json, sys, urllib.request
samples = json.load(urllib.request.urlopen(sys.argv[1] + "/api/workers/gpu-check/telemetry", timeout=2))
if samples:
    s = samples[-1]
    print(f"{len(samples)} sample(s); GPU {s['index']} {s['name']}: {s['utilization']}% busy, "
          f"{s['memory_used'] >> 20} MiB used, {s['temperature']} C, {s['power_watts']} W")
EOF
)
        [ -n "$telemetry" ] && break
        sleep 0.2
    done
    [ -n "$telemetry" ] && record "GPU telemetry at the server" ok "$telemetry" ||
        record "GPU telemetry at the server" FAIL "no samples within 20 s"
else
    record "GPU telemetry at the server" skip "CPU mode: no GPUs to sample"
fi

# --- 2. a real job placed on a GPU --------------------------------------------------------
gpus_wanted=$([ "$mode" = gpu ] && echo 1 || echo 0)
# The job says what it sees, then keeps its GPU busy for 6 s (matrix products), so that its
# per-job accounting (utilisation, peak memory, GPU-hours) has readings to show.
cat > "$work/gpu_job.py" <<'EOF'
import os, time
import torch
print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", ""), "torch sees",
      torch.cuda.device_count(), "GPU(s)", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
if torch.cuda.is_available():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    end = time.time() + 6
    while time.time() < end:
        for _ in range(20):
            b = a @ a
        torch.cuda.synchronize()
EOF
cat > "$work/job.yaml" <<EOF
name: gpu-check-job
command: $python $work/gpu_job.py
resources: {gpus: $gpus_wanted}
EOF
# --no-code: the job is the script above, not the scratch directory the file sits in.
if have_time 60 && APP_URL=$url timeout "$(limit 20)" "$app" submit --no-code "$work/job.yaml" > "$work/submit.out" 2>&1; then
    job_log=""
    for _ in $(seq "$(( $(limit 60) * 4 ))"); do
        job_log=$("$python" - "$url" <<'EOF' 2>/dev/null
import json, sys, urllib.request
base = sys.argv[1]
jobs = json.load(urllib.request.urlopen(base + "/api/jobs?sweep=gpu-check-job", timeout=2))["jobs"]
if jobs and jobs[0]["status"] in ("succeeded", "failed", "cancelled"):
    log = json.load(urllib.request.urlopen(f"{base}/api/jobs/{jobs[0]['id']}/log", timeout=2))["text"]
    print(jobs[0]["status"] + ": " + " / ".join(line for line in log.splitlines() if line.strip()))
EOF
)
        [ -n "$job_log" ] && break
        sleep 0.25
    done
    if [ "$mode" = gpu ] && [[ "$job_log" == succeeded:*CUDA_VISIBLE_DEVICES=?*"torch sees 1 GPU(s)"* ]]; then
        record "job placed on a GPU" ok "${job_log#succeeded: }"
        account=$("$python" - "$url" <<'EOF' 2>/dev/null
import json, sys, urllib.request
base = sys.argv[1]
job = json.load(urllib.request.urlopen(base + "/api/jobs?sweep=gpu-check-job", timeout=2))["jobs"][0]
versions = json.load(urllib.request.urlopen(f"{base}/api/jobs/{job['id']}/results", timeout=2))
usage = (versions[-1]["record"].get("gpu_usage") if versions else None) or {}
if usage.get("samples"):
    print(f"{usage['samples']} readings: {usage.get('utilization_mean') or 0:.0f}% mean, "
          f"{usage.get('utilization_p95') or 0:.0f}% p95 busy, peak {(usage.get('memory_peak') or 0) >> 20} MiB, "
          f"{usage['gpu_hours'] * 3600:.1f} GPU-seconds" + (", flagged idle" if usage.get("idle_gpus") else ""))
EOF
)
        [ -n "$account" ] && record "per-job GPU accounting" ok "$account" ||
            record "per-job GPU accounting" FAIL "the job's result records no GPU readings"
    elif [ "$mode" = cpu ] && [[ "$job_log" == "succeeded: CUDA_VISIBLE_DEVICES= "* ]]; then
        record "job placed on a GPU" ok "CPU mode, a CPU job: ${job_log#succeeded: }"
        record "per-job GPU accounting" skip "CPU mode: no GPU readings to account"
    else
        record "job placed on a GPU" FAIL "${job_log:-no outcome within the limit}"
    fi
else
    record "job placed on a GPU" FAIL "submit: $(tail -n 1 "$work/submit.out" 2>/dev/null)"
fi
for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
pids=()

# --- 3. app train against PyTorch eager, same data and model --------------------------------
# median_epochs FILE: the median samples/s of the epochs after the first (warm-up).
median_epochs() { "$python" "$work/report.py" median-epochs "$1"; }
train_vs_eager() {
    local precision=$1 amp tf32
    amp=$([ "$precision" = tf32 ] && echo off || echo "$precision")
    tf32=$([ "$precision" = tf32 ] && echo true || echo false)
    local out=$work/train-$precision
    if ! have_time 100; then record "app train vs eager ($precision)" skip "out of time"; return; fi
    if ! timeout "$(limit 100)" "$app" train --config "$work/mlp.yaml" --set "amp=$amp" --set "tf32=$tf32" \
        --out "$out" --metrics-file "$out.jsonl" > "$out.stdout" 2> "$out.stderr"; then
        record "app train ($precision)" FAIL "$(tail -n 1 "$out.stderr")"
        return
    fi
    first_line=$(head -n 1 "$out.stdout")
    if [ "$mode" = gpu ] && [[ "$first_line" != "device cuda:"* ]]; then
        record "app train on CUDA ($precision)" FAIL "$first_line"
        return
    fi
    record "app train on $device ($precision)" ok "$first_line"
    local ours theirs
    ours=$(median_epochs "$out.jsonl")
    if ! timeout "$(limit 100)" "$python" "$pydir/torch_mlp.py" --device "$device" --precision "$precision" \
        --samples "$samples" --features "$features" --classes "$classes" --hidden "$eager_hidden" \
        --batch-size "$batch" --epochs 8 --lr 0.0001 --val-fraction 0 > "$out.eager.jsonl" 2> "$out.eager.stderr"; then
        record "PyTorch eager ($precision)" FAIL "$(tail -n 1 "$out.eager.stderr")"
        return
    fi
    theirs=$(median_epochs "$out.eager.jsonl")
    local verdict
    verdict=$("$python" "$work/report.py" ratio /dev/null "$ours" "$theirs")
    record "app train / eager ($precision)" "${verdict%%|*}" "${verdict#*|}: $ours vs $theirs samples/s (median epoch; target >= 0.95x)"
}
train_vs_eager bf16
train_vs_eager tf32

# --- 4. the checkpoint in PyTorch ---------------------------------------------------------
if [ -f "$work/train-bf16/model_best.pt" ]; then
    if timeout "$(limit 60)" "$python" "$pydir/load_checkpoint.py" "$work/train-bf16" > "$work/load.json" 2> "$work/load.stderr"; then
        record "checkpoint in torch.load" ok "$("$python" "$work/report.py" checkpoint "$work/load.json")"
    else
        record "checkpoint in torch.load" FAIL "$(tail -n 1 "$work/load.stderr")"
    fi
else
    record "checkpoint in torch.load" FAIL "no model_best.pt from the bf16 run"
fi

# --- 5. app bench: batch sizes x precisions, FLOP/s and MFU ---------------------------------
if have_time 150 && timeout "$(limit 150)" "$app" bench --config "$work/mlp.yaml" --batch-sizes "$bench_batches" \
    --amp fp32,tf32,bf16,fp16 --steps 15 --warmup 3 --peak-tflops "$peak" --json > "$work/bench.json" 2> "$work/bench.stderr"; then
    while IFS='|' read -r name status detail; do
        record "$name" "$status" "$detail"
    done < <("$python" "$work/report.py" bench-rows "$work/bench.json")
    verdict=$("$python" "$work/report.py" bench-targets "$work/bench.json")
    if [ "$mode" = gpu ]; then
        record "bench targets (largest batch)" "${verdict%%|*}" "${verdict#*|}"
    else
        record "bench targets (largest batch)" skip "CPU mode (no TF32/fp16; the H100 targets do not apply)"
    fi
else
    record "app bench" FAIL "$(tail -n 1 "$work/bench.stderr" 2>/dev/null)"
fi

# --- 6. GPU utilisation during a long bf16 run --------------------------------------------
if [ "$mode" = gpu ] && have_time 80; then
    nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -i 0 -lms 200 > "$work/util.csv" 2>/dev/null &
    sampler=$!
    timeout "$(limit 75)" "$app" train --config "$work/mlp.yaml" --set amp=bf16 --set "epochs=$long_epochs" \
        --set checkpoint_every=0 --set early_stopping.patience=0 --out "$work/long" > "$work/long.stdout" 2>&1
    code=$?
    kill "$sampler" 2>/dev/null
    util=$("$python" "$work/report.py" utilisation "$work/util.csv")
    # A run cut short by the limit (124) still sampled the whole time it ran.
    if [ "$code" = 0 ] || [ "$code" = 124 ]; then
        record "GPU busy during a long bf16 run" "${util%%|*}" "${util#*|}"
    else
        record "GPU busy during a long bf16 run" FAIL "$(tail -n 1 "$work/long.stdout")"
    fi
else
    record "GPU busy during a long bf16 run" skip "$([ "$mode" = cpu ] && echo "CPU mode" || echo "out of time")"
fi

# --- 7. an out-of-memory setting is a row, not a hang --------------------------------------
if have_time 90; then
    oom_started=$SECONDS
    if timeout "$(limit 90)" "$app" bench --config "$work/mlp.yaml" --batch-sizes "$batch,$oom_batch" --amp bf16 \
        --steps 3 --warmup 1 --json > "$work/oom.json" 2> "$work/oom.stderr"; then
        verdict=$("$python" "$work/report.py" oom "$work/oom.json")
        record "OOM row does not hang" "${verdict%%|*}" "batch $oom_batch in $((SECONDS - oom_started)) s: ${verdict#*|}"
    else
        record "OOM row does not hang" FAIL "exit $? after $((SECONDS - oom_started)) s: $(tail -n 1 "$work/oom.stderr")"
    fi
else
    record "OOM row does not hang" skip "out of time"
fi

# --- 8. data parallelism over c10d ----------------------------------------------------------
if have_time 60; then
    ddp_env=()
    ddp_set=()
    if [ "$gpu_count" -ge 2 ]; then
        ddp_set=(--set ddp=2)
    elif [ "$mode" = gpu ]; then
        # One GPU: a one-rank NCCL group (two ranks cannot share a GPU under NCCL).
        ddp_env=(RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 "MASTER_PORT=$(free_port)")
    else
        ddp_set=(--set ddp=2)
    fi
    if env "${ddp_env[@]}" timeout "$(limit 60)" "$app" train --config "$work/mlp.yaml" --set epochs=2 "${ddp_set[@]}" \
        --out "$work/ddp" > "$work/ddp.stdout" 2> "$work/ddp.stderr"; then
        ranks=$(grep -o '[0-9]* ranks over [A-Za-z]* (this is rank 0)' "$work/ddp.stdout" | head -n 1)
        if [ -n "$ranks" ]; then
            record "DDP over c10d" ok "$ranks; $(tail -n 1 "$work/ddp.stdout" | cut -c1-90)"
        else
            record "DDP over c10d" FAIL "no rank line in the log: $(head -n 1 "$work/ddp.stdout")"
        fi
    else
        record "DDP over c10d" FAIL "$(tail -n 1 "$work/ddp.stderr")"
    fi
else
    record "DDP over c10d" skip "out of time"
fi

# --- the table ------------------------------------------------------------------------------
gpu_name=$([ "$mode" = gpu ] && nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null || echo "CPU mode")
{
    echo "GPU check, $(date -u +%Y-%m-%d), $gpu_name, torch $torch_version, $((SECONDS - started)) s"
    echo
    echo "| step | result | detail |"
    echo "|---|---|---|"
    for row in "${rows[@]}"; do
        IFS='|' read -r name status detail <<< "$row"
        echo "| $name | $status | $detail |"
    done
} | tee "${OUT:-.}/gpu-check.md"
failures=$(printf '%s\n' "${rows[@]}" | grep -c '|FAIL|')
[ "$failures" = 0 ]
