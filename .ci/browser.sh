#!/usr/bin/env bash
# The book in a real browser (CI, after `make test`): Debian's chromium driven by Playwright's Python package,
# given executable_path=/usr/bin/chromium (Playwright's own browser download fails on a closed network).
#
#   .ci/browser.sh    # installs chromium (apt-get) and playwright (into .venv) when missing, builds the book,
#                     # runs tests/test_browser.py; screenshots land in book/_build/screenshots/ (CI artifacts)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
if ! command -v chromium >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi
make browser
echo "browser tests finished in $(( $(date +%s) - start )) s; screenshots in book/_build/screenshots/"
