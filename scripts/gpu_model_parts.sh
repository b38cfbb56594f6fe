#!/usr/bin/env bash
# The lent GPU machine reaches no network, and a call carries at most 64 MiB, so the
# 98 MB default model travels in two calls (files written outside the repo stay on the
# machine while it is warm, 30 s after each call), with the wheels its image lacks
# (cffi, pycparser: the CPU extension is built there; gguf: read at load):
#   here:                  bash scripts/gpu_model_parts.sh split      # .gpu/part1 + wheels, .gpu/part2
#   device call 1, carry [".gpu/part1"]:  bash scripts/gpu_model_parts.sh stash
#   device call 2, carry [".gpu/part2"]:
#       bash scripts/gpu_model_parts.sh join && PYTHONPATH=/tmp/site EDGEINFER_CACHE=/tmp/ei bash scripts/gpu_check.sh
# join writes /tmp/ei/models/<file> and checks its sha256.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
FILE=SmolLM2-135M-Instruct.Q4_1.gguf
case "${1:-}" in
split)
    src=$("$PY" -m edgeinfer pull | tail -1)
    mkdir -p .gpu
    grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
    half=$(( ($(stat -c %s "$src") + 1) / 2 ))
    head -c "$half" "$src" > .gpu/part1
    tail -c +"$((half + 1))" "$src" > .gpu/part2
    mkdir -p .gpu/part1.d && mv .gpu/part1 .gpu/part1.d/model && rm -rf .gpu/part1 && mv .gpu/part1.d .gpu/part1
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .gpu/part1/wheels cffi pycparser gguf
    ls -lR .gpu ;;
stash)
    mkdir -p /tmp/ei/models && cp .gpu/part1/model /tmp/ei/models/$FILE.part1
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/part1/wheels/*.whl
    echo "stashed part 1; wheels in /tmp/site" ;;
join)
    cat /tmp/ei/models/$FILE.part1 .gpu/part2 > /tmp/ei/models/$FILE
    rm -f /tmp/ei/models/$FILE.part1
    want=$("$PY" -c "import json; print(next(m['sha256'] for m in json.load(open('edgeinfer/models.json'))['models'] if m['file'] == '$FILE'))")
    got=$(sha256sum /tmp/ei/models/$FILE | cut -d' ' -f1)
    [ "$got" = "$want" ] && echo "model ok" || { echo "model FAILS its sha256"; exit 1; } ;;
*)
    echo "usage: $0 split|stash|join" >&2; exit 2 ;;
esac
