"""Build (if needed) every built-in tiny model and print where it lives, as JSON lines.

Usage: python tools/build_tiny_models.py [name ...]

Default: every model of twinkle.hub.TINY_MODELS except the large ones (qwen3-0.5b, ~1.8 GB of
weights; qwen3.5-4b-shape, ~1.7 GB), which are built only when named.
"""

from __future__ import annotations

import json
import sys
import time

from twinkle.hub import TINY_MODELS, load_config, resolve_model_dir


def _parameter_count(model_dir) -> int:
    # Read the shapes from the safetensors header: no need to instantiate the model.
    from safetensors import safe_open

    total = 0
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as weights:
        for key in weights.keys():
            total += _numel(weights.get_slice(key).get_shape())
    return total


def _numel(shape) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


ON_REQUEST = ("qwen3-0.5b", "qwen3.5-4b-shape")  # large: built only when named


def main(argv: list[str]) -> int:
    for name in argv or sorted(n for n in TINY_MODELS if n not in ON_REQUEST):
        start = time.perf_counter()
        model_dir = resolve_model_dir(f"tiny://{name}")
        seconds = time.perf_counter() - start
        config = load_config(f"tiny://{name}")
        record = {
            "model_id": f"tiny://{name}",
            "path": str(model_dir),
            "architecture": config.architectures[0],
            "parameters": _parameter_count(model_dir),
            "vocab_size": config.vocab_size,
            "resolve_seconds": round(seconds, 3),
        }
        print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
