#!/usr/bin/env bash
# The lent GPU machine reaches no network, and a call carries at most 64 MiB, so the
# 98 MB default model travels in two calls (files written outside the repo stay on the
# machine while it is warm, 30 s after each call):
#   here:                  bash scripts/gpu_model_parts.sh split      # .gpu/part1, .gpu/part2
#   device call 1, carry [".gpu/part1"]:  bash scripts/gpu_model_parts.sh stash
#   device call 2, carry [".gpu/part2"]:  bash scripts/gpu_model_parts.sh join && EDGEINFER_CACHE=/tmp/ei bash scripts/gpu_check.sh
# join writes /tmp/ei/models/<file>; edgeinfer checks its sha256 before use.
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
    ls -l .gpu ;;
stash)
    mkdir -p /tmp/ei/models && cp .gpu/part1 /tmp/ei/models/$FILE.part1 && echo "stashed part 1" ;;
join)
    cat /tmp/ei/models/$FILE.part1 .gpu/part2 > /tmp/ei/models/$FILE
    rm -f /tmp/ei/models/$FILE.part1
    want=$("$PY" -c "import json; print(next(m['sha256'] for m in json.load(open('edgeinfer/models.json'))['models'] if m['file'] == '$FILE'))")
    got=$(sha256sum /tmp/ei/models/$FILE | cut -d' ' -f1)
    [ "$got" = "$want" ] && echo "model ok" || { echo "model FAILS its sha256"; exit 1; } ;;
*)
    echo "usage: $0 split|stash|join" >&2; exit 2 ;;
esac
