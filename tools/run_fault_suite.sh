#!/usr/bin/env bash
# Every fault scenario of issue 28 point 3, with their timings printed ("[fault] ..." lines):
# the default-run part (the whole server SIGKILLed with file and Redis persistence, orphaned
# futures, lost adapters, a full disk mid-checkpoint) and the slow part (eight tenants of both
# clients through a SIGKILL, Redis SIGKILLed under a live server; under `twinkle-server launch`
# on Ray Serve, one replica SIGKILLed: the gateway, the model mid-step, a data-parallel worker;
# TWINKLE_FAULT_TENANTS sets their tenant count, default 8).
#   tools/run_fault_suite.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
    RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled TINKER_TELEMETRY=0
python -m pytest -q -s -p no:warnings tests/reliability/test_faults.py "$@" | grep -v '^WARNING'
python -m pytest -q -s -p no:warnings -m slow tests/reliability/test_faults_slow.py "$@" \
    | grep -v '^WARNING'
python -m pytest -q -s -p no:warnings -m slow tests/reliability/test_faults_replica.py "$@" \
    | grep -v '^WARNING'
