#!/usr/bin/env bash
# CI as it runs on a clean clone of this checkout's HEAD, in a venv of its own: `.ci/run` installs
# the three packages in editable mode, and with the shared interpreter that would re-point this
# checkout's editable installs at the clone. Usage: tools/ci_clean_clone.sh [DIR] (default /tmp/ci).
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-/tmp/ci}"
rm -rf "$DIR" "$DIR-venv"
git clone -q "$ROOT" "$DIR"
python -m venv --system-site-packages "$DIR-venv"
cd "$DIR"
export PATH="$DIR-venv/bin:$PATH"
start=$(date +%s)
bash .ci/run
rc=$?
echo "rc=$rc seconds=$(( $(date +%s) - start ))"
exit $rc
