#!/usr/bin/env bash
# Create .venv and install the lab (CPU build of torch here; see docs/GPU.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

pip_install() {  # quiet, minus this machine's warnings about missing local package folders
  .venv/bin/python -m pip install -q "$@" 2>&1 | { grep -v "is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$PY" --version)" >&2
  "$PY" -m venv .venv
  pip_install --upgrade pip >/dev/null || true
fi
echo "setup: installing requirements.txt into .venv (the first time takes a few minutes)" >&2
pip_install -r requirements.txt
.venv/bin/python -m pip show -q minilm-lab >/dev/null 2>&1 || pip_install --no-deps -e .
echo "setup: ready" >&2
