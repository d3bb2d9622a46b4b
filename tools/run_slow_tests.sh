#!/usr/bin/env bash
# The long-running tests (marked `slow`: the cookbook against real `twinkle-server launch`, Ray).
# The default fast loop excludes them: python -m pytest -m "not integration and not slow".
#   tools/run_slow_tests.sh [pytest args, e.g. tests/client]
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
    RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled TINKER_TELEMETRY=0
exec python -m pytest -m slow -q "$@"
