#!/usr/bin/env bash
# Build the lab as a website that opens offline (labs/build_site.py): run the site's notebooks
# under nbval as the tests do (lessons, lecture demo, exercises: 5-10 minutes on a CPU); the last
# test item builds labs/site/html from the outputs they showed and checks its pages in Chromium.
# Then open labs/site/html/index.html in a browser.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TRITON_INTERPRET=1
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider --nbval-lax \
  labs/[0-9]*.ipynb labs/lecture_demo.ipynb labs/exercises "$@" || status=$?
if [ -f labs/site/html/index.html ]; then echo "built: open labs/site/html/index.html"; fi
exit $status
