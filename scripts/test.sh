#!/usr/bin/env bash
# Set up and run every test: unit tests, Triton kernel (interpreter), browser test, notebooks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TRITON_INTERPRET=1
.venv/bin/python -m pytest -q tests "$@"
