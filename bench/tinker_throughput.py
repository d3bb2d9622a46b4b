"""SFT throughput through the official Tinker SDK against an in-process Twinkle server.

The server (gateway, model, sampler of ``tiny://qwen3.5`` unless ``--model``) runs under uvicorn on
loopback in this process; every tenant is a real ``tinker.ServiceClient`` with its own API key, doing
``forward_backward`` + ``optim_step`` steps in its own thread. Concurrent tenants' passes are fused
by the model deployment. Prints one JSON line per tenant count: steps/s (all tenants together),
tokens/s (trained-over tokens), fused passes, mean step latency.

    python bench/tinker_throughput.py            # 1 and 4 tenants, 20 steps each
    python bench/tinker_throughput.py --quick    # 1 and 4 tenants, 5 steps each
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import tempfile
import time

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TINKER_TELEMETRY": "0",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)

import numpy as np  # noqa: E402

KEYS = [f"bench-key-{i}" for i in range(8)]


def build_server(model_id: str, storage: str, tenants: int):
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore

    base = model_id.replace("://", "/")
    config = {
        "auth": {"api_keys": KEYS},
        "storage": {"root": storage},
        "applications": [
            {
                "name": "server",
                "route_prefix": "/api/v1",
                "import_path": "server",
                "args": {"server_config": {"per_token_model_limit": 4, "supported_models": [base]}},
            },
            {
                "name": "model",
                "route_prefix": f"/api/v1/model/{base}",
                "import_path": "model",
                "args": {
                    "backend": "transformers",
                    "model_id": model_id,
                    "max_loras": max(8, tenants),
                },
            },
        ],
    }
    return build_local_server(parse_config(config), store=MemoryStore("bench:")), base


def batch(seed: int, rows: int, seq: int):
    from tinker import types

    ids = np.random.default_rng(seed).integers(10, 4000, size=(rows, seq + 1))
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(r[:-1].tolist()),
            loss_fn_inputs={"target_tokens": r[1:].tolist(), "weights": [1.0] * seq},
        )
        for r in ids
    ]


def tenant_run(url: str, key: str, base: str, steps: int, rows: int, seq: int) -> dict:
    import tinker
    from tinker import types

    service = tinker.ServiceClient(base_url=url, api_key=key)
    trainer = service.create_lora_training_client(base_model=base, rank=8).result(timeout=120)
    data = batch(hash(key) % 1000, rows, seq)
    trainer.forward_backward(data, "cross_entropy").result(timeout=120)  # warm-up
    trainer.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=120)
    latencies, losses = [], []
    started = time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        fwd = trainer.forward_backward(data, "cross_entropy")
        opt = trainer.optim_step(types.AdamParams(learning_rate=1e-3))
        losses.append(fwd.result(timeout=120).metrics["loss:sum"])
        opt.result(timeout=120)
        latencies.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    service.close("success").result(timeout=30)
    return {
        "elapsed": elapsed,
        "latencies": latencies,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }


def run_point(model_id: str, tenants: int, steps: int, rows: int, seq: int) -> dict:
    from twinkle.server.testing import serve_in_thread
    from twinkle_client import init_tinker_client

    init_tinker_client()
    with tempfile.TemporaryDirectory() as storage:
        server, base = build_server(model_id, storage, tenants)
        with serve_in_thread(server.app) as url:
            model = next(iter(server.services.values()))
            fused_before = model.scheduler.fused_passes
            started = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(tenants) as pool:
                results = list(
                    pool.map(lambda k: tenant_run(url, k, base, steps, rows, seq), KEYS[:tenants])
                )
            wall = time.perf_counter() - started
            fused = model.scheduler.fused_passes - fused_before
    span = max(r["elapsed"] for r in results)
    total_steps = tenants * steps
    return {
        "bench": "tinker_sdk_sft",
        "model": model_id,
        "tenants": tenants,
        "steps_per_tenant": steps,
        "rows": rows,
        "seq": seq,
        "steps_per_s": round(total_steps / span, 3),
        "tokens_per_s": round(total_steps * rows * seq / span, 1),
        "mean_step_latency_s": round(
            float(np.mean([x for r in results for x in r["latencies"]])), 4
        ),
        "fused_passes": fused,
        "loss_decreased": all(r["last_loss"] < r["first_loss"] for r in results),
        "wall_s_incl_setup": round(wall, 2),
        "cpu": platform.processor() or platform.machine(),
        "threads": __import__("torch").get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 steps per tenant")
    parser.add_argument("--model", default="tiny://qwen3.5")
    parser.add_argument("--tenants", default="1,4")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()
    steps = 5 if args.quick else args.steps
    for tenants in [int(t) for t in args.tenants.split(",")]:
        print(json.dumps(run_point(args.model, tenants, steps, args.rows, args.seq)), flush=True)


if __name__ == "__main__":
    main()
