#!/usr/bin/env bash
# One script for a session that has the GPU: builds the CUDA path (the shipped
# libedgeinfer_cuda.so, and libedgeinfer_cuda_testops.so = the same kernels plus the
# test-only ops of tests/cuda_ops), runs the GPU tests on the latter and a GPU benchmark
# on the former. Designed to finish within 6 minutes on the lent H200.
#   EDGEINFER_CUDA_ARCHS   archs to build (default "90": the H200; CI builds all three)
#   EDGEINFER_CACHE        where SmolLM2-135M-Instruct.Q4_1.gguf is cached (models/ under it);
#                          without the model the end-to-end tests and the benchmark are skipped.
#                          On the lent H200 (no network, 64 MiB a call) scripts/gpu_model_parts.sh
#                          brings the model and the cffi wheels in two calls: see its header.
#   EDGEINFER_CUDA_PREBUILT  a folder holding libedgeinfer_cuda.so and libedgeinfer_cuda_testops.so
#                          built elsewhere (scripts/build_cuda.sh with EDGEINFER_CUDA_OUT,
#                          scripts/build_cuda_testops.sh): used when the device loads them, which
#                          saves the minutes of nvcc; else both are built here.
# Order: what matters most first (GPU tests, benchmark, the peer), so a run cut short keeps it.
# Record the figures it prints in docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the scripts import edgeinfer from this checkout
T0=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - T0 ))s)"; }

step "device"
nvidia-smi --query-gpu=name,compute_cap,memory.total,memory.used,driver_version --format=csv 2>/dev/null || echo "nvidia-smi unavailable"

step "CPU extension"
"$PY" -c "import edgeinfer._native" 2>/dev/null || "$PY" -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .   # deps: in the device image

TESTLIB=build/cuda_testops/libedgeinfer_cuda_testops.so
probe() {
    "$PY" - <<'PYEOF'
from edgeinfer.backends import cuda as cb
devs, why = cb.probe()
print(devs[0].describe() if devs else f"NO CUDA DEVICE: {why}")
raise SystemExit(0 if devs else 1)
PYEOF
}
PREBUILT_OK=0
if [ -n "${EDGEINFER_CUDA_PREBUILT:-}" ]; then
    step "prebuilt libraries from $EDGEINFER_CUDA_PREBUILT"
    mkdir -p "$(dirname "$TESTLIB")"
    cp "$EDGEINFER_CUDA_PREBUILT/libedgeinfer_cuda.so" edgeinfer/ \
        && cp "$EDGEINFER_CUDA_PREBUILT/libedgeinfer_cuda_testops.so" "$TESTLIB" && probe && PREBUILT_OK=1 \
        || echo "the prebuilt libraries do not run here: building them"
fi
if [ "$PREBUILT_OK" != 1 ]; then
    step "build libedgeinfer_cuda.so"
    EDGEINFER_CUDA_REQUIRE=1 EDGEINFER_CUDA_ARCHS="${EDGEINFER_CUDA_ARCHS:-90}" EDGEINFER_CUDA_JOBS=8 bash scripts/build_cuda.sh

    step "build libedgeinfer_cuda_testops.so (the same sources plus tests/cuda_ops/ops.cu)"
    EDGEINFER_CUDA_ARCHS="${EDGEINFER_CUDA_ARCHS:-90}" bash scripts/build_cuda_testops.sh

    step "probe"
    probe
fi

HAVE_MODEL=$("$PY" -c "from edgeinfer.hub import DEFAULT_MODEL, is_cached; print(int(bool(is_cached(DEFAULT_MODEL))))" 2>/dev/null || echo 0)
SEL=""
if [ "$HAVE_MODEL" != 1 ]; then
    echo "note: SmolLM2 Q4_1 is not cached here (set EDGEINFER_CACHE); end-to-end tests and the benchmark are skipped"
    SEL="not end_to_end and not decode_steps and not greedy and not too_big and not falls_back"
fi

step "GPU tests"
set +e
EDGEINFER_CUDA_LIB="$TESTLIB" timeout 240 "$PY" -m pytest -q -rs tests/test_cuda.py -k "not builds${SEL:+ and ($SEL)}" -m "not oracle" -p no:cacheprovider
TESTS_RC=$?
set -e

if [ "$HAVE_MODEL" = 1 ]; then
    step "GPU benchmark (targets on H200: tg >= 1000 tok/s, batch-8 >= 4000, pp512 >= 20000)"
    timeout 150 "$PY" scripts/gpu_bench.py || echo "benchmark failed (rc=$?)"
    step "edgeinfer bench --device cuda (pp512 / tg128 / TTFT, TPOT through the engine)"
    timeout 120 "$PY" -m edgeinfer bench default --device cuda --threads 1 --reps 3 --no-isolated-rss --quiet \
        || echo "edgeinfer bench failed (rc=$?)"
    if "$PY" -c "import torch, transformers; assert torch.cuda.is_available()" 2>/dev/null; then
        step "peer: transformers on the same GGUF, bf16 on the GPU (same shapes as gpu_bench.py)"
        timeout 120 "$PY" scripts/gpu_peer_transformers.py || echo "peer failed (rc=$?)"
    fi
fi
if "$PY" -c "import torch, transformers" 2>/dev/null; then
    step "GPU tests of the hybrid families, Gemma 4 and LoRA (tiny checkpoints built with transformers)"
    set +e
    EDGEINFER_CUDA_LIB="$TESTLIB" timeout 240 "$PY" -m pytest -q -rs tests/test_cuda_hybrid.py tests/test_cuda_gemma4.py \
        tests/test_cuda_lora.py -m "not oracle" -p no:cacheprovider
    EXTRA_RC=$?
    set -e
    echo "hybrid / Gemma 4 / LoRA GPU tests rc=$EXTRA_RC"
fi
step "done: GPU tests rc=$TESTS_RC"
exit $TESTS_RC
