#!/usr/bin/env bash
# Set up and run every test: unit and property tests, the Triton kernel (interpreter),
# the real-browser widget test, and every lesson notebook (nbval).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The browser test drives Debian's Chromium; install it where we can (CI runs as root).
if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "warning: could not install chromium; the browser test will be skipped"
fi
export TRITON_INTERPRET=1
# Two runs, so both cores work and no time assert is measured beside other work. First, on two
# workers (pytest-xdist, a file per worker at a time): tests/, which check behaviour, not speed,
# and every notebook whose asserts read no time measured here. Then the lessons whose asserts do
# (TIMED_NOTEBOOKS in conftest.py), one after the other, alone; and last the site, built from
# what both runs' notebooks showed (their executed copies, cleared first). Both runs run whatever
# the first gives; the exit is the first failure's.
rm -rf labs/site/executed
status=0
.venv/bin/python -m pytest -q tests labs --nbval-lax --notebooks untimed -n 2 --dist loadfile "$@" \
  || status=$?
.venv/bin/python -m pytest -q labs --nbval-lax --notebooks timed --site "$@" \
  || { s=$?; [ "$status" != 0 ] || status=$s; }
exit "$status"
