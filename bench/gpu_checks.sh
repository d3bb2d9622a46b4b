#!/usr/bin/env bash
# Every GPU measurement that issue 4 asks for, in one run that fits a 15-minute device lease
# (at most 9.75 minutes of work: each step has its own time limit, and a failed step does not stop
# the others; give the device call a 600 s limit). At most 9 files, all in OUT_DIR. Run from the
# repository root on a CUDA machine, offline:
#
#     bash bench/gpu_checks.sh [OUT_DIR]        # default: $OUT, else ./gpu_out
#
# It uses the python that holds CUDA torch ($PYTHON, default python3) with the repo's packages on
# PYTHONPATH, plus the wheels in .whl/ (from bench/gpu_wheels.sh) installed into /tmp/site when
# that folder exists. It writes to OUT_DIR:
#   env.txt              GPU, driver, torch / triton / transformers / peft versions
#   triton_tests.log     tests/twinkle/model/lora on the GPU: the Triton kernels against the torch reference;
#                        tests/twinkle/model/test_direct_grads.py: training steps on both kernels
#   lora_kernel.jsonl    multi-LoRA linear vs the frozen base linear, 4k tokens (target <= 1.15x)
#   train_<model>.log    fused vs time-sliced vs limit at N=8, B in {1, 4}, one JSON line per
#                        point: tiny://qwen3-0.5b (0.44 B parameters, built offline on first
#                        use) and tiny://qwen3.5-25m
#   megatron_tp.jsonl    the megatron backend's fused two-tenant step on tiny://qwen3-0.5b, tp=1, and
#                        tp=2 where two GPUs are lent (one JSON line per tp size)
#   summary.txt          each step's exit status and the GPU targets read from the JSON lines
set -u
out="${1:-${OUT:-gpu_out}}"
mkdir -p "$out"
py="${PYTHON:-python3}"
root="$(pwd)"
site=""
if compgen -G ".whl/*.whl" >/dev/null; then  # wheels from bench/gpu_wheels.sh, carried along
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && site=":/tmp/site"
fi
export PYTHONPATH="$root/packages/twinkle/src:$root/packages/twinkle-client/src$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TWINKLE_CACHE_DIR="${TWINKLE_CACHE_DIR:-/tmp/twinkle-cache}"
summary="$out/summary.txt"
: >"$summary"

step() {  # step NAME SECONDS COMMAND... : run with a time limit, record the exit status
  local name="$1" limit="$2"
  shift 2
  local start=$SECONDS
  timeout "$limit" "$@"
  local rc=$?
  echo "$name: rc $rc in $((SECONDS - start)) s (limit $limit s)" | tee -a "$summary"
}

{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  "$py" - <<'EOF'
import importlib
for name in ("torch", "triton", "transformers", "peft", "pydantic", "tokenizers", "safetensors"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as exc:  # report and go on: the steps below say what failed
        print(name, "MISSING", repr(exc))
import torch
print("cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
} >"$out/env.txt" 2>&1
cat "$out/env.txt"
if ! "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "no CUDA device: nothing to measure" | tee -a "$summary"
  exit 2
fi

step triton_tests 120 "$py" -m pytest -q -p no:cacheprovider tests/twinkle/model/lora \
  tests/twinkle/model/test_direct_grads.py >"$out/triton_tests.log" 2>&1
tail -3 "$out/triton_tests.log"

step lora_kernel 90 "$py" bench/lora_kernel.py --iters 50 \
  >"$out/lora_kernel.jsonl" 2>"$out/lora_kernel.log"
cat "$out/lora_kernel.jsonl"

# One process per model, so a failure with one (say, an older transformers without Qwen3.5)
# leaves the other's figures.
# The model list is gpu_summary.py's, which reads the results.
for model in $("$py" bench/gpu_summary.py --models); do
  name=${model#tiny://}
  step "train_$name" 150 "$py" bench/multi_tenant_train.py \
    --models "$model" --tenants 8 --point-seconds 4 --no-rss >"$out/train_$name.log" 2>&1
  grep '^{' "$out/train_$name.log"
done

# The megatron backend (issue 31): tp=1 on one GPU, tp=1 and 2 when two are lent.
tps="1"
if [ "$("$py" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then tps="1 2"; fi
step megatron_tp 75 "$py" tools/bench_megatron_tp.py --device cuda --model tiny://qwen3-0.5b \
  --tp $tps --steps 5 --warmup 2 >"$out/megatron_tp.jsonl" 2>"$out/megatron_tp.log"
cat "$out/megatron_tp.jsonl"

"$py" bench/gpu_summary.py "$out" | tee -a "$summary"
