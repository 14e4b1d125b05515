#!/usr/bin/env bash
# The GPU checks, on a machine with an NVIDIA GPU: sets up what they need, runs tests/gpu (a CUDA
# PyTorch training loop checkpointed and restored under Ferry, compared line by line with an
# uninterrupted run), and prints the measured GPU checkpoint and restore times and sizes.
#
#   tests/gpu/run_gpu_check.sh [pytest arguments...]
#
# Assumptions: Debian 12 or 13 (what ./setup.sh supports), run as root (CRIU needs it), an NVIDIA GPU
# with driver 570 or newer and its nvidia-smi, and access to PyPI (pip's own configuration may point
# at a mirror or a wheel cache; TORCH_INDEX_URL overrides where torch comes from). It runs
# ./setup.sh --no-demo (CRIU >= 4.1, NATS, .venv with Ferry; FERRY_SKIP_SETUP=1 skips it), then adds
# to .venv what the GPU path needs: a CUDA build of torch (PyPI's Linux x86_64 wheels are CUDA
# builds), nvidia-ml-py (NVML) and cuda-python (the CUDA driver's checkpoint API; 12.x for a CUDA 12
# driver, 13.x for CUDA 13). NVIDIA's cuda-checkpoint utility is optional: Ferry calls the driver
# through cuda-python, and CRIU's CUDA plugin uses cuda-checkpoint only when it is on PATH.
#
# Exit status: pytest's; 77 when this machine has no NVIDIA GPU (nothing to check).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
say() { printf '\033[1mgpu-check:\033[0m %s\n' "$*"; }
die() { printf 'gpu-check: %s\n' "$*" >&2; exit 1; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    say "no NVIDIA GPU on this machine (nvidia-smi -L lists none): nothing to check"
    exit 77
fi
nvidia-smi -L
DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n1 | tr -d ' ')
[ "${DRIVER%%.*}" -ge 570 ] || die "NVIDIA driver $DRIVER is older than 570, which has no CUDA checkpoint API"
CUDA_MAJOR=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\)\..*/\1/p' | head -n1)
say "NVIDIA driver $DRIVER (CUDA ${CUDA_MAJOR:-?})"

if [ "${FERRY_SKIP_SETUP:-0}" != 1 ]; then
    ./setup.sh --no-demo
fi
PY=.venv/bin/python
[ -x "$PY" ] || die ".venv is missing: run ./setup.sh first"
pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    TORCH_VERSION=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || echo 2.13.0)
    say "installing a CUDA build of torch $TORCH_VERSION into .venv"
    "$PY" -m pip uninstall -q -y torch >/dev/null 2>&1 || true
    pip_install "torch==$TORCH_VERSION" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
    "$PY" -c 'import torch; assert torch.cuda.is_available(), "torch sees no CUDA device"'
fi
if [ "${CUDA_MAJOR:-12}" -ge 13 ]; then CUDA_PYTHON="cuda-python>=13,<14"; else CUDA_PYTHON="cuda-python>=12.8,<13"; fi
"$PY" -c 'import pynvml, cuda.bindings.driver' 2>/dev/null || {
    say "installing nvidia-ml-py and $CUDA_PYTHON into .venv"
    pip_install nvidia-ml-py "$CUDA_PYTHON"
}
# Until the package's install knows libs/gpu, find ferry.gpu in the tree (the services inherit it).
"$PY" -c 'import ferry.gpu' 2>/dev/null || export PYTHONPATH="$PWD/libs/gpu${PYTHONPATH:+:$PYTHONPATH}"
if command -v cuda-checkpoint >/dev/null 2>&1; then
    say "cuda-checkpoint: $(command -v cuda-checkpoint) (CRIU's CUDA plugin will use it too)"
else
    say "cuda-checkpoint is not installed: Ferry drives the driver API through cuda-python"
fi

REPORT=$(mktemp /tmp/ferry-gpu-report.XXXXXX)
trap 'rm -f "$REPORT"' EXIT
rc=0
FERRY_GPU_REPORT="$REPORT" .venv/bin/pytest tests/gpu -q -rs -p no:cacheprovider "$@" || rc=$?

say "measurements"
"$PY" - "$REPORT" <<'EOF'
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
if not rows:
    print("   (none: the tests did not get that far)")
for row in rows:
    print(f"-- {row.pop('test')}")
    for key, value in row.items():
        if isinstance(value, int) and key.endswith("bytes"):
            value = f"{value / 2**20:.1f} MiB"
        elif isinstance(value, float) and key.endswith("_ms"):
            value = f"{value:.1f} ms"
        print(f"   {key:30} {value}")
EOF
exit $rc
