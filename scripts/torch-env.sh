# Sourced by scripts that build or run the trainer (`. scripts/torch-env.sh`): where libtorch
# is. cargo gets the same LIBTORCH from .cargo/config.toml; binaries find the libraries through
# their rpath, so LD_LIBRARY_PATH only matters for binaries built elsewhere.
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export LIBTORCH="$repo_root/.venv-torch/libtorch"
export LD_LIBRARY_PATH="$LIBTORCH/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export TORCH_PYTHON="$repo_root/.venv-torch/bin/python"
unset repo_root
