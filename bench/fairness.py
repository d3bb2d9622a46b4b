"""A small tenant's latency beside a large one that streams: the scheduler's size rule.

Tenant ``small`` sends ``forward_backward`` calls of ``--small-tokens`` tokens at random moments
(fixed seed). First alone (its solo latency), then while tenant ``large`` streams
``forward_backward`` of ``--large-rows`` x ``--large-seq`` tokens and ``clip_grad_and_step``
back to back: once with the scheduler's size rule off (``group_tokens=0``, every waiting head
fuses: the behaviour before issue 47) and once with it on (the default). The server is the tiny
model in-process (httpx ASGI transport, no socket). Prints JSON lines: the solo p50/p99, the
beside-large p50/p99 of each scheduler with their ratio to solo, and a summary.

    python bench/fairness.py            # 32 x 500-token large calls, 20 small calls per phase
    python bench/fairness.py --quick    # 16 x 250, 10 small calls: under 2 minutes on a laptop
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from twinkle.server.testing import client, local_server

MODEL = "/api/v1/model/tiny/qwen3"


def features(rows: int, seq: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {"input_ids": [rng.randrange(10, 200) for _ in range(seq)], "labels": [5] * seq}
        for _ in range(rows)
    ]


def quantiles(values: list[float]) -> dict:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_s": round(statistics.median(ordered), 4), "p99_s": round(p99, 4)}


async def ok(response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


async def add_adapter(http, name: str) -> None:
    sid = (await ok(await http.post("/api/v1/create_session", json={})))["session_id"]
    body = {"adapter_name": name, "config": {"r": 4, "lora_alpha": 8}, "session_id": sid}
    await ok(await http.post(f"{MODEL}/add_adapter_to_model", json=body))


async def small_calls(http, n: int, tokens: int, seed: int) -> list[float]:
    rng, latencies = random.Random(seed), []
    body = {"adapter_name": "small", "inputs": features(1, tokens, seed)}
    for _ in range(n):
        await asyncio.sleep(rng.uniform(0.05, 0.4))
        started = time.perf_counter()
        await ok(await http.post(f"{MODEL}/forward_backward", json=body))
        latencies.append(time.perf_counter() - started)
        await ok(await http.post(f"{MODEL}/clip_grad_and_step", json={"adapter_name": "small"}))
    return latencies


async def stream_large(http, stop: asyncio.Event, rows: int, seq: int) -> list[float]:
    body = {"adapter_name": "large", "inputs": features(rows, seq, 1)}
    took = []
    while not stop.is_set():
        started = time.perf_counter()
        await ok(await http.post(f"{MODEL}/forward_backward", json=body))
        took.append(time.perf_counter() - started)
        await ok(await http.post(f"{MODEL}/clip_grad_and_step", json={"adapter_name": "large"}))
    return took


async def measure(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="twinkle-fairness-"))
    server = local_server(root, max_length=max(args.large_seq, args.small_tokens) + 8)
    scheduler = server.services["model"].scheduler
    async with client(server, "alice") as small, client(server, "bob") as large:
        await add_adapter(small, "small")
        await add_adapter(large, "large")
        for http, name in ((small, "small"), (large, "large")):
            body = {"adapter_name": name, "optimizer": "Adam", "lr": 1e-4}
            await ok(await http.post(f"{MODEL}/set_optimizer", json=body))
        await small_calls(small, 2, args.small_tokens, 0)  # warm up
        solo = await small_calls(small, args.calls, args.small_tokens, 1)
        solo_q = quantiles(solo)
        print(json.dumps({"phase": "solo", "small_tokens": args.small_tokens, **solo_q}))
        rows = {}
        for label, group_tokens in (("before", 0), ("after", scheduler.group_tokens or 2048)):
            scheduler.group_tokens = group_tokens
            stop = asyncio.Event()
            streamer = asyncio.create_task(
                stream_large(large, stop, args.large_rows, args.large_seq)
            )
            beside = await small_calls(small, args.calls, args.small_tokens, 2)
            stop.set()
            large_took = await streamer
            q = quantiles(beside)
            rows[label] = q
            print(
                json.dumps(
                    {
                        "phase": "beside_large",
                        "scheduler": label,
                        "group_tokens": group_tokens,
                        "large_tokens": args.large_rows * args.large_seq,
                        **q,
                        "ratio_p50": round(q["p50_s"] / solo_q["p50_s"], 2),
                        "ratio_p99": round(q["p99_s"] / solo_q["p99_s"], 2),
                        "large_call_p50_s": round(statistics.median(large_took), 4),
                    }
                )
            )
    print(
        json.dumps(
            {
                "summary": "fairness",
                "solo_p50_s": solo_q["p50_s"],
                "before_p50_s": rows["before"]["p50_s"],
                "after_p50_s": rows["after"]["p50_s"],
                "before_p99_s": rows["before"]["p99_s"],
                "after_p99_s": rows["after"]["p99_s"],
                "cpu_count": os.cpu_count(),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 x 250 tokens, 10 calls")
    parser.add_argument("--large-rows", type=int, default=32)
    parser.add_argument("--large-seq", type=int, default=500)
    parser.add_argument("--small-tokens", type=int, default=16)
    parser.add_argument("--calls", type=int, default=20, help="small calls per phase")
    args = parser.parse_args()
    if args.quick:
        args.large_rows, args.large_seq, args.calls = 16, 250, 10
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
