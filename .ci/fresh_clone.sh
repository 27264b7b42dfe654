#!/usr/bin/env bash
# A new user's first run: clone this repository's HEAD into a temporary folder and run the README's commands
# there (`make setup`, `make book`, `make test`), each timed and logged. Uncommitted work is not in the clone.
#
#   .ci/fresh_clone.sh [DIR]     # default DIR: a new folder under ${TMPDIR:-/tmp}; logs: DIR/make-*.log
#
# Takes 10-20 minutes on 2 cores (run it with nohup ... & and poll). Without internet, export VIT_COURSE_DATA
# (the offline MNIST/CIFAR-10, see the README) first. Exits non-zero if any step fails.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$(mktemp -d "${TMPDIR:-/tmp}/vit-course-fresh.XXXXXX")}"
git clone --quiet "$repo" "$dir/repo" || exit 1
cd "$dir/repo" || exit 1
echo "fresh clone of $(git rev-parse --short HEAD) in $dir/repo"
status=0
for target in setup book test; do
  start=$(date +%s)
  if make "$target" > "$dir/make-$target.log" 2>&1; then result=ok; else result=FAILED; status=1; fi
  echo "make $target: $result in $(( $(date +%s) - start )) s (log: $dir/make-$target.log)"
done
exit $status
