"""Sampler throughput with many adapters: one mixed batch vs one adapter at a time.

For K distinct adapters (1, 4, 16) and the same total number of sequences, measures generated
tokens per second when all K adapters share ONE batch (one forward per decode step) and when each
adapter's sequences run as their own batch, one after the other. Prints one JSON line per K.

    python bench/sampler.py            # tiny://qwen3.5, 32 sequences x 32 tokens
    python bench/sampler.py --quick    # smaller, for CI's correctness check
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch
from peft import LoraConfig

from twinkle.model import MultiLoraTransformersModel
from twinkle.sampler import TorchSampler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny://qwen3.5")
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.sequences, args.max_tokens = 16, 8
    torch.manual_seed(0)
    out_dir = tempfile.mkdtemp(prefix="bench-sampler-")
    trainer = MultiLoraTransformersModel(args.model)
    paths = []
    for i in range(16):
        trainer.add_adapter_to_model(
            f"a{i}", LoraConfig(r=8, lora_alpha=16, init_lora_weights=False), seed=i
        )
        paths.append(trainer.save(f"a{i}", output_dir=out_dir, adapter_name=f"a{i}"))
    sampler = TorchSampler(args.model, max_loras=16)
    prompts = torch.randint(10, 4000, (args.sequences, args.prompt_len)).tolist()
    # Fixed length: no stop token, so both modes generate exactly the same number of tokens.
    params = {"max_tokens": args.max_tokens, "seed": 0, "stop_token_ids": []}
    sampler.sample(
        prompts[:2], {"max_tokens": 2}, adapter_uri=paths[:2]
    )  # warm-up, loads 2 adapters
    for k in (1, 4, 16):
        uris = [paths[i % k] for i in range(args.sequences)]
        sampler.sample(
            prompts[:k], {"max_tokens": 1}, adapter_uri=uris[:k]
        )  # load outside the timing
        start = time.perf_counter()
        mixed = sampler.sample(prompts, params, adapter_uri=uris)
        mixed_s = time.perf_counter() - start
        start = time.perf_counter()
        for a in range(k):
            rows = [i for i in range(args.sequences) if i % k == a]
            sampler.sample([prompts[i] for i in rows], params, adapter_uri=paths[a])
        serial_s = time.perf_counter() - start
        tokens = sum(len(s.tokens) for s in mixed.sequences)
        print(
            json.dumps(
                {
                    "bench": "sampler",
                    "model": args.model,
                    "adapters": k,
                    "sequences": args.sequences,
                    "tokens": tokens,
                    "one_batch_tok_s": round(tokens / mixed_s, 1),
                    "one_adapter_at_a_time_tok_s": round(tokens / serial_s, 1),
                    "speedup": round(serial_s / mixed_s, 2),
                }
            )
        )


if __name__ == "__main__":
    main()
