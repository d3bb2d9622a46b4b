#!/usr/bin/env bash
# Schema fuzzing at length (not CI): schemathesis over every application's OpenAPI document
# (gateway with the Tinker API, model, sampler, processor), in-process, with the oracles of
# tests/reliability/test_fuzz_schemas.py (no 5xx, a 4xx names the field and changes no state).
#   tools/run_fuzz.sh [EXAMPLES per operation and generation mode, default 50]
# Prints the tally (operations, examples, statuses, 5xx) and every failure; exits 1 on any.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
    RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled TINKER_TELEMETRY=0
export TWINKLE_FUZZ_EXAMPLES_SLOW="${1:-50}"
exec python -m pytest -q -s -m slow -p no:warnings -p no:cacheprovider \
    tests/reliability/test_fuzz_schemas.py::test_fuzz_every_schema_at_length
