#!/usr/bin/env bash
# The soak (not CI): the tiny server in its own process while tenants of every kind (twinkle_client
# SFT, Tinker SDK SFT, Tinker SDK RL) create an adapter, train a few steps and remove it, over and
# over. Every SOAK_SAMPLE_S seconds a JSON line with the server's RSS, threads, open files (sockets
# apart); the last line is the summary (drift of each after the warm-up, adapters left, errors).
#   tools/run_soak.sh [MINUTES, default 30]   (env: SOAK_TENANTS=6 SOAK_WARMUP_MIN=3
#                                              SOAK_SAMPLE_S=10 SOAK_OUT=soak.jsonl
#                                              SOAK_STORE=memory|redis)
# Exits 1 unless every resource stayed within 5%, no adapter was left and no client call failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
    RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled TINKER_TELEMETRY=0
minutes="${1:-30}"
out="${SOAK_OUT:-soak-$(date +%Y%m%d-%H%M%S).jsonl}"
python bench/load_mixed.py --soak-minutes "$minutes" --tenants "${SOAK_TENANTS:-6}" \
    --warmup-minutes "${SOAK_WARMUP_MIN:-3}" --sample-s "${SOAK_SAMPLE_S:-10}" \
    --store "${SOAK_STORE:-memory}" | tee "$out"
tail -n 1 "$out" | python -c '
import json, sys
s = json.loads(sys.stdin.read())
ok = s["flat_within_5pct"] and s["adapters_at_end"] == 0 and s["client_error_count"] == 0
print("soak", "passed" if ok else "FAILED", file=sys.stderr)
sys.exit(0 if ok else 1)'
