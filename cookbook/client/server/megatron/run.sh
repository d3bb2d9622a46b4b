#!/usr/bin/env bash
# Start a one-node Ray cluster with 4 GPUs, then the Twinkle server (Megatron backend).
# Multi-node: start workers with `ray start --address=<head-ip>:6379 --num-gpus=N` before launching.
set -euo pipefail
cd "$(dirname "$0")"

CONFIG="${1:-server_config.yaml}"   # or server_config_4b.yaml (needs 6 GPUs)

export TWINKLE_TRUST_REMOTE_CODE="${TWINKLE_TRUST_REMOTE_CODE:-0}"
export RAY_USAGE_STATS_ENABLED=0
# API keys: the server refuses to start without any. The keys the clients send (the cookbook
# scripts send EMPTY_API_KEY); the other two ways are auth.api_keys_file (one key a line) and
# auth.api_keys in the YAML.
export TWINKLE_SERVER_API_KEYS="${TWINKLE_SERVER_API_KEYS:-EMPTY_API_KEY}"

twinkle-server check-config -c "$CONFIG"

ray stop || true
CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0,1,2,3}" ray start --head --num-gpus=4 --port=6379

exec twinkle-server launch -c "$CONFIG" --namespace "${TWINKLE_RAY_NAMESPACE:-twinkle}"
