#!/usr/bin/env bash
# Build the separate virtual environment the tinker-cookbook conformance tests run the recipes in.
#
# tinker-cookbook 0.6.1 requires tml-renderers>=0.4.1, which the package index lacks, and pins
# transformers <= 5.5.4, so it cannot share the dev environment. 0.5.8 brings the dependencies,
# then 0.6.1 goes over it without its own. --system-site-packages keeps the CPU torch of the dev
# environment (a fresh torch spec here would pull a CUDA build). Usage, from the repo root:
#   tools/make_cookbook_venv.sh                # creates .venv-cookbook (once)
#   VENV=/tmp/tcvenv tools/make_cookbook_venv.sh
# then: export TWINKLE_COOKBOOK_PYTHON=<venv>/bin/python
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv-cookbook}"
PY="$VENV/bin/python"
PYTHON="${PYTHON:-python3}"

if ! "$PY" -c "import tinker_cookbook.recipes.math_rl.train" >/dev/null 2>&1; then
  "$PYTHON" -m venv --system-site-packages "$VENV"
  TORCH="$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)"
  PIN=()
  if [ -n "$TORCH" ]; then PIN=("torch==$TORCH"); fi  # keep the inherited build, never a new one
  "$PY" -m pip install "${PIN[@]}" tinker-cookbook==0.5.8 tinker==0.38.0
  "$PY" -m pip install --no-deps tinker-cookbook==0.6.1
  "$PY" -m pip install "${PIN[@]}" sympy pylatexenc math-verify  # recipes.math_rl
fi
"$PY" -c "import tinker_cookbook, tinker, transformers; from importlib.metadata import version; \
print('tinker-cookbook', version('tinker-cookbook'), 'tinker', tinker.__version__, \
'transformers', transformers.__version__)"
echo "export TWINKLE_COOKBOOK_PYTHON=$PY"
