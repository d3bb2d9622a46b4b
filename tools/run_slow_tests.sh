#!/usr/bin/env bash
# The long-running tests (marked `slow`: the cookbook against real `twinkle-server launch`, Ray,
# the tinker-cookbook recipes in their own venv). The default run leaves them out (pyproject's
# addopts; the fast loop: python -m pytest -m "not integration and not slow").
#   tools/run_slow_tests.sh [pytest args, e.g. tests/twinkle_client]
# The tinker-cookbook venv is $TWINKLE_COOKBOOK_PYTHON, else .venv-cookbook, built here if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
    RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled TINKER_TELEMETRY=0
if [ -z "${TWINKLE_COOKBOOK_PYTHON:-}" ]; then
  tools/make_cookbook_venv.sh
  export TWINKLE_COOKBOOK_PYTHON="$PWD/.venv-cookbook/bin/python"
fi
exec python -m pytest -m slow -q "$@"
