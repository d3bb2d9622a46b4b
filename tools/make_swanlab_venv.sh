#!/usr/bin/env bash
# Build the separate virtual environment the SwanLab tracker is tested in, and run its tests.
#
# swanlab requires protobuf < 7, while the server's dependencies need protobuf 7, so it cannot
# be in the dev environment. --system-site-packages keeps everything the dev environment has
# (the editable twinkle packages, pytest, yaml); swanlab and protobuf<7 installed into the venv
# shadow the system protobuf for this venv's python only. Usage, from the repo root:
#   tools/make_swanlab_venv.sh                # creates .venv-swanlab (once), runs the tests
#   VENV=/tmp/swvenv tools/make_swanlab_venv.sh
#   tools/make_swanlab_venv.sh -k offline     # extra arguments go to pytest
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv-swanlab}"
PY="$VENV/bin/python"
PYTHON="${PYTHON:-python3}"

if ! "$PY" -c "import swanlab, google.protobuf as p; assert int(p.__version__.split('.')[0]) < 7" \
  >/dev/null 2>&1; then
  "$PYTHON" -m venv --system-site-packages "$VENV"
  "$PY" -m pip install "swanlab>=0.10" "protobuf<7"
fi
"$PY" -c "import swanlab, google.protobuf as p; print('swanlab', swanlab.__version__, \
'protobuf', p.__version__)"
cd "$ROOT"
"$PY" -m pytest -q tests/twinkle_client/tracking/test_swanlab.py "$@"
