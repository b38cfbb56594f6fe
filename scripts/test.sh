#!/usr/bin/env bash
# The one command that installs edgeinfer with its test oracles and runs the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip install -q --disable-pip-version-check -e ".[test]"
PYTHON="$PY" bash scripts/install_oracles.sh
"$PY" -m edgeinfer pull >/dev/null   # the real models, cached after the first fetch
"$PY" -m edgeinfer pull gemma3-270m >/dev/null
# strict: a missing oracle fails (and the other files still run); -rs lists every skip with its reason
EDGEINFER_STRICT=${EDGEINFER_STRICT:-1} "$PY" -m pytest -q -rs --continue-on-collection-errors "$@"
