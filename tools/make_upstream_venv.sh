#!/usr/bin/env bash
# A user's environment for upstream ModelScope Twinkle's client scripts (tools/upstream_scripts.py):
# this interpreter's packages (twinkle, twinkle_client, tinker, torch) plus what the scripts import
# and Twinkle does not need: swanlab (it pins an older protobuf, so it stays out of the project's
# environment), python-dotenv, openenv-core and open-spiel (the multi-turn rollout's environment).
#   bash tools/make_upstream_venv.sh /tmp/upstream-venv
set -euo pipefail
target="${1:-/tmp/upstream-venv}"
python -m venv --system-site-packages "$target"
"$target/bin/python" -m pip install -q swanlab python-dotenv openenv-core open-spiel
echo "$target/bin/python"
