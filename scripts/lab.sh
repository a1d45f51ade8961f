#!/usr/bin/env bash
# Set up (first run only) and open the lab in JupyterLab at lesson 0.
# With --demo, print the headline comparison in the terminal instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "${1:-}" = "--demo" ]; then
  exec .venv/bin/python -m minilm compare --workload mixed --policies static,continuous,chunked --ignore-eos
fi
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)  # containers and VMs often run as root
exec .venv/bin/jupyter lab labs/00_start_here.ipynb "${extra[@]}" "$@"
