#!/usr/bin/env bash
# Sets up libtorch for the trainer (`cargo build --features torch`): a venv under the repo,
# .venv-torch/, with the PyPI torch wheel that tch 0.24.0 is built against, and a stable
# link .venv-torch/libtorch to its files (.cargo/config.toml points LIBTORCH there).
#
#   scripts/setup-torch.sh            libtorch for building and running on CPU: torch without
#                                     its dependencies (1.2 GB) plus the two small CUDA wheels
#                                     libtorch_cpu links (cudart, cupti). With an NVIDIA GPU
#                                     (nvidia-smi works) it installs the full wheel instead.
#   scripts/setup-torch.sh --full     the full wheel with every CUDA library (~4.5 GB): what a
#                                     GPU box needs, and what `import torch` needs even on CPU
#                                     (scripts/bench-trainer.sh runs PyTorch for comparison),
#                                     plus numpy and safetensors (the checkpoint tests load our
#                                     checkpoints in Python with them), and the loggers whose
#                                     capture the end-to-end tests check with the real packages:
#                                     wandb, tensorboard (torch.utils.tensorboard) and lightning.
#
# Idempotent: a second run finds everything in place and returns in well under a second.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.11.0          # tch 0.24.0 is built for torch 2.11; tch 0.26 needs 2.13
CUDA_RUNTIME="nvidia-cuda-runtime==13.0.96.*"   # the versions torch 2.11.0's cuda-toolkit 13.0.2 pins
CUDA_CUPTI="nvidia-cuda-cupti==13.0.85.*"
venv=.venv-torch
# Pinned: tests/e2e/capture.rs runs scripts that use them unchanged.
LOGGERS="wandb==0.31.0 tensorboard==2.21.0 lightning==2.6.6"

full=0
case "${1:-}" in
    --full) full=1 ;;
    "") command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && full=1 ;;
    *) echo "usage: $0 [--full]" >&2; exit 2 ;;
esac

# Bump REVISION when the set of packages changes, so existing set-ups install the new ones.
REVISION=3
stamp="$venv/.setup-torch-$TORCH_VERSION-$([ "$full" = 1 ] && echo full || echo cpu)-$REVISION"
full_stamp="$venv/.setup-torch-$TORCH_VERSION-full-$REVISION"
if [ -e "$stamp" ] || [ -e "$full_stamp" ]; then
    [ -e "$venv/libtorch/lib/libtorch_cpu.so" ] && exit 0
fi

python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip() { "$venv/bin/python" -m pip --disable-pip-version-check -q "$@"; }

if [ "$full" = 1 ]; then
    echo "setup-torch: installing torch==$TORCH_VERSION with its CUDA libraries into $venv" >&2
    pip install "torch==$TORCH_VERSION" numpy safetensors $LOGGERS
else
    echo "setup-torch: installing torch==$TORCH_VERSION (no dependencies) and the CUDA runtime into $venv" >&2
    pip install --no-deps "torch==$TORCH_VERSION" "$CUDA_RUNTIME" "$CUDA_CUPTI"
fi

site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
ln -sfn "${site#"$PWD/$venv/"}/torch" "$venv/libtorch"   # relative: the repo may move
[ -e "$venv/libtorch/lib/libtorch_cpu.so" ] || { echo "setup-torch: no libtorch_cpu.so under $site/torch" >&2; exit 1; }
rm -f "$venv"/.setup-torch-*
touch "$stamp"
echo "setup-torch: libtorch $TORCH_VERSION at $venv/libtorch" >&2
