#!/usr/bin/env bash
# Every fault scenario of issue 28 point 3, with their timings printed ("[fault] ..." lines):
# the default-run part (the whole server SIGKILLed, 2 tenants, file persistence; orphaned
# futures, lost adapters, a full disk mid-checkpoint, a dead dp worker or replica in-process)
# and the slow part (eight tenants of both clients through a SIGKILL of the whole server and of
# Redis; under `twinkle-server launch` on Ray Serve, one replica SIGKILLed: the gateway, the
# model mid-step, a data-parallel worker, each with file and Redis persistence;
# TWINKLE_FAULT_TENANTS sets their tenant count, default 8). Every part runs even if an earlier
# one failed; the exit status says whether all passed.
#   tools/run_fault_suite.sh [extra pytest args]
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
    RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled TINKER_TELEMETRY=0
# This checkout's code, whatever copy is installed (the servers and Ray workers inherit it).
src="$PWD/packages/twinkle/src:$PWD/packages/twinkle-client/src:$PWD/packages/twinkle-server/src"
export PYTHONPATH="$src${PYTHONPATH:+:$PYTHONPATH}"
started=$(date +%s)
status=0
part() {
    echo "== $* ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
    python -u -m pytest -q -s -p no:warnings "$@" | grep --line-buffered -v '^WARNING' || status=1
}
part tests/reliability/test_faults.py tests/reliability/test_faults_replica.py "$@"
part -m slow tests/reliability/test_faults.py tests/reliability/test_faults_slow.py "$@"
part -m slow tests/reliability/test_faults_replica.py "$@"
verdict=$([ $status = 0 ] && echo passed || echo FAILED)
echo "== fault suite: $verdict in $(($(date +%s) - started)) s" \
    "(load $(cut -d' ' -f1-3 /proc/loadavg))"
exit $status
