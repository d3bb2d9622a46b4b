#!/usr/bin/env bash
# Run the Tinker SDK suite against older official SDKs (issue 27: 0.27.0, 0.33.0 and 0.38.0 pass
# the same suite; issue 44: 0.16.1, which ModelScope Twinkle pins, speaks JSON where later SDKs
# speak protobuf). Each version gets its own venv .venv-tinker-<V> (built once, then reused) with
# --system-site-packages, so torch, transformers and the editable twinkle packages come from the dev
# environment and only `tinker` differs. Tests that need a newer SDK skip with the version in the
# reason (tests/twinkle_server/tinker/sdk_version.py: requires_sdk). The server keeps the SDK it pins (0.38.0):
# for another version it runs in a subprocess with $PYTHON. Usage, from anywhere:
#   tools/run_tinker_sdk_versions.sh                  # 0.16.1 0.27.0 0.33.0 0.38.0
#   tools/run_tinker_sdk_versions.sh 0.27.0 -- -k sample   # versions, then pytest args after --
# The slow tier runs it for the old versions (tests/twinkle_server/tinker/test_tinker_sdk_versions.py).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 \
    RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled TINKER_TELEMETRY=0
PYTHON="${PYTHON:-python3}"
# The SDK suite: every tests/twinkle_server/tinker file that drives the official SDK over HTTP.
SUITE=(
  tests/twinkle_server/tinker/test_tinker_sdk.py
  tests/twinkle_server/tinker/test_tinker_rest_surface.py
  tests/twinkle_server/tinker/test_tinker_sampling_fields.py
  tests/twinkle_server/tinker/test_tinker_weights_external.py
  tests/twinkle_server/tinker/test_tinker_custom_loss.py
  tests/twinkle_server/tinker/test_tinker_jwt_auth.py
  tests/twinkle_server/tinker/test_tinker_extensions.py
)

VERSIONS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do VERSIONS+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
[ ${#VERSIONS[@]} -eq 0 ] && VERSIONS=(0.16.1 0.27.0 0.33.0 0.38.0)

venv_for() {  # venv_for V -> prints the venv's python, building the venv if needed
  local venv="$PWD/.venv-tinker-$1" py
  py="$venv/bin/python"
  if [ "$("$py" -c 'import tinker; print(tinker.__version__)' 2>/dev/null)" != "$1" ]; then
    "$PYTHON" -m venv --system-site-packages "$venv" >&2
    "$py" -m pip install -q "tinker==$1" >&2
  fi
  "$py" -c "import twinkle, twinkle.server, twinkle_client, tinker; \
assert tinker.__version__ == '$1', tinker.__version__" >&2
  echo "$py"
}

# The server pins the SDK it reads wire types from; under another SDK it runs in its own process
# with this Python (tests/twinkle_server/tinker/sdk_version.py), and tests that look inside it skip.
SERVER_SDK="$("$PYTHON" -c 'import tinker; print(tinker.__version__)')"
status=0
for v in "${VERSIONS[@]}"; do
  py="$(venv_for "$v")"
  server=""
  [ "$v" != "$SERVER_SDK" ] && server="$(command -v "$PYTHON")"
  echo "== tinker $v ($py), server: ${server:-in-process, tinker $SERVER_SDK}"
  TWINKLE_TINKER_SERVER_PYTHON="$server" "$py" -m pytest -q -p no:cacheprovider \
    "${SUITE[@]}" "$@" || status=1
done
exit $status
