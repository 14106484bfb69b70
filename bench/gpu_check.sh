#!/usr/bin/env bash
# geomx's checks for a machine with an NVIDIA GPU, in one script with a time limit per part
# (CI has no GPU: there the CUDA kernels run under NUMBA_ENABLE_CUDASIM=1 and torch on its
# CPU device). Run from the repository root:  bash bench/gpu_check.sh [OUTDIR]
#
#   1. the CUDA codec kernels against the CPU kernels, on the device (tests/codec);
#   2. examples/resnet_torch.py, full-width ResNet-18 with --device cuda: time to 80 %
#      accuracy in the emulator (no codec, FP16, Bi-Sparse), and 30 iterations on a
#      1 Gbit/s WAN over real sockets and in the emulator;
#   3. bench/codecs.py --cuda: GB/s of every codec's CUDA kernels next to the CPU kernels;
#   4. tests/torch with a GPU present (pinned staging buffers are used where CUDA is).
#
# Wheels in .whl/ (packages the GPU machine lacks, e.g. tomli-w) are installed first. Numba's
# CUDA target (numba-cuda) fails to compile any kernel under numpy 2.5 ("module 'numpy' has
# no attribute 'row_stack'"), so where numpy is 2.5 put a numpy 2.4 wheel there too.
set -u
OUTDIR=${1:-${OUT:-/tmp/geomx-gpu-check}}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || exit 1
fi
$PY -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
    || export PYTHONPATH=$PWD
part() { echo; echo "=== $1 ($(date +%T))"; }

part "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY - <<'EOF'
import os, numpy, numba, torch
from numba import cuda
print(f"python numpy {numpy.__version__} numba {numba.__version__} torch {torch.__version__}; "
      f"torch sees {torch.cuda.get_device_name(0)}; numba.cuda available {cuda.is_available()}; "
      f"{os.cpu_count()} CPUs")
EOF

part "CUDA codec kernels on the device"
timeout 90 $PY -m pytest -q -p no:cacheprovider tests/codec/test_cuda.py tests/codec/test_fp16.py 2>&1 | tail -6

resnet() {  # resnet LABEL ITERATIONS geomx-run-args...
    local label=$1 iterations=$2; shift 2
    part "ResNet-18 on the GPU: $label"
    timeout 110 $PY -m geomx run examples/resnet_torch.toml --quiet --out runs-gpu \
        --set run.name="$label" --set run.iterations="$iterations" --set run.max_wall_time=90s \
        "$@" 2>&1 | grep -E "final accuracy|stopped by|Error|error" | tail -4
    local run; run=$(ls -dt runs-gpu/"$label"-* 2>/dev/null | head -1)
    [ -n "$run" ] && cp "$run/summary.json" "$OUTDIR/summary-$label.json"
}
GPU='training.program_args=["--device","cuda"]'
ONE_G=(--set wan.0.bandwidth=1Gbps --set wan.1.bandwidth=1Gbps)
# time to 80 % on the scenario's 100 Mbit/s WAN, in the emulator
resnet emu-none 300 --set "$GPU"
# the same job in both runtimes on a 1 Gbit/s WAN (seconds per iteration side by side)
resnet real-1g 30 --runtime real "${ONE_G[@]}" --set "$GPU"
resnet emu-1g 30 "${ONE_G[@]}" --set "$GPU"

part "codec kernels: CUDA next to CPU"
timeout 100 $PY bench/codecs.py --cuda --no-torch --repeat 3 2>&1 | tee "$OUTDIR/codecs.txt" | tail -28

resnet emu-fp16 300 --set 'training.program_args=["--device","cuda","--compression","fp16"]'
resnet emu-bsc 300 --set codec.type=bsc --set "$GPU"

part "tests/torch with a GPU present"
timeout 90 $PY -m pytest -q -p no:cacheprovider -x tests/torch 2>&1 | tail -6
part "done"
