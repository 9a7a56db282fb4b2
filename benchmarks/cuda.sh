#!/usr/bin/env bash
# The checks that need a GPU, in one script: the tests that run on every real device
# (tests/test_devices.py and the device tests of tests/test_scan.py) and the speed suite on CUDA.
#
#   bash benchmarks/cuda.sh tests    # the tests
#   bash benchmarks/cuda.sh speed    # the speed suite: eager, torch's scan operator, compiled
#
# Logs and the suite's raw medians go to $OUT (default: ./cuda-results). Packages missing from the
# machine's Python may be given as wheels in ./.whl; they are installed into /tmp/site first.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-cuda-results}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

environment() {
    nvidia-smi -L
    python3 -c "import torch, onnx, onnxruntime, onnxscript, onnx_ir, optree; print('torch', \
torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(), '| onnx', \
onnx.__version__, '| onnxruntime', onnxruntime.__version__, '| onnxscript', \
onnxscript.__version__, '| onnx_ir', onnx_ir.__version__, '| optree', optree.__version__)"
    python3 -c "import torchscan; print('torchscan', torchscan.__version__)"
}

case "${1:-tests}" in
tests)
    environment 2>&1 | tee "$OUT/environment.txt"
    timeout 150 python3 -m pytest -p no:cacheprovider -p no:benchmark -q -n 8 -o addopts="" \
        tests/test_devices.py "tests/test_scan.py::test_runs_on_the_device_of_its_inputs" \
        tests/test_hoist.py 2>&1 | tee "$OUT/tests.txt"
    ;;
speed)
    timeout 240 python3 benchmarks/speed.py --device cuda --no-hop --memory --budget 0.3 \
        --json "$OUT/speed-cuda.json" 2>&1 | tee "$OUT/speed-cuda.md"
    timeout 40 python3 benchmarks/speed.py --device cuda --cells RNN LSTM --hidden 64 --batch 8 \
        --lengths 10 100 --budget 0.3 2>&1 | tee "$OUT/speed-cuda-hop.md"
    timeout 120 python3 benchmarks/speed.py --device cuda --compiled --no-hop --cells RNN \
        --hidden 64 --batch 8 --lengths 200 --budget 1 2>&1 | tee "$OUT/speed-cuda-compiled.md"
    ;;
esac
