"""Server overhead: a remote forward_backward vs the same call in-process, and the aggregate
throughput of 1, 4 and 8 concurrent tenants through a real Ray Serve deployment vs local fused steps.

Prints one JSON object per line:
  {"bench": "server_overhead", "kind": "latency", "path", ...local_p50_ms, remote_p50_ms, overhead_p50_ms...}
  {"bench": "server_overhead", "kind": "throughput", "path", "tenants": N, "server_tps", "local_fused_tps", "ratio"}

``path``: "direct" when the model offers its own address (``GET .../endpoint``, Ray Serve's direct
ingress, as ``twinkle-server launch`` starts it; what ``twinkle_client`` uses), "proxy" through
Serve's HTTP proxy (what the unmodified Tinker SDK uses). Both are measured when both exist.

Throughput runs at two call shapes (``--shape ROWSxSEQ``, repeatable): 8 x 128 tokens per call,
a small but real training micro-batch, and 2 x 64, a probe where the per-request cost dominates.
On a 2-core machine every request's CPU (client, Serve proxy, replica) comes out of the same two
cores the fused step runs on, so the second shape shows the cost of the request path itself.

Usage: python bench/server_overhead.py [--model tiny://qwen3.5] [--quick] [--shape 8x128 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import time

import httpx
import numpy as np

KEYS = [f"bench-key-{i}" for i in range(8)]
DEFAULT_SHAPES = ((8, 128), (2, 64))  # rows x tokens per tenant call


def parse_shape(text: str) -> tuple[int, int]:
    """``"8x128"`` -> ``(8, 128)``."""
    rows, sep, seq = text.lower().partition("x")
    if not sep or not rows.isdigit() or not seq.isdigit() or int(rows) < 1 or int(seq) < 2:
        raise argparse.ArgumentTypeError(f"expected ROWSxSEQ such as 8x128, got {text!r}")
    return int(rows), int(seq)


def features(rows: int, seq: int, seed: int) -> list[dict]:
    ids = np.random.default_rng(seed).integers(10, 4000, size=(rows, seq)).tolist()
    return [{"input_ids": r, "labels": r} for r in ids]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def local_latency(model_id: str, batch: list[dict], calls: int) -> list[float]:
    from twinkle.model import MultiLoraTransformersModel

    model = MultiLoraTransformersModel(model_id)
    model.add_adapter_to_model("t", {"r": 8, "lora_alpha": 16})
    model.set_optimizer("Adam", lr=1e-4)
    inputs = [{k: np.asarray(v) for k, v in f.items()} for f in batch]
    times = []
    for i in range(calls + 3):
        start = time.perf_counter()
        model.forward_backward(inputs)
        if i >= 3:
            times.append(time.perf_counter() - start)
        model.clip_grad_and_step()
    return times


def local_fused_tps(model_id: str, tenants: int, rows: int, seq: int, steps: int) -> float:
    from twinkle.model import MultiLoraTransformersModel

    model = MultiLoraTransformersModel(model_id)
    names = [f"t{i}" for i in range(tenants)]
    batches = {}
    for i, name in enumerate(names):
        model.add_adapter_to_model(name, {"r": 8, "lora_alpha": 16})
        model.set_optimizer("Adam", lr=1e-4, adapter_name=name)
        batches[name] = [{k: np.asarray(v) for k, v in f.items()} for f in features(rows, seq, i)]
    start = None
    for step in range(steps + 2):
        if step == 2:
            start = time.perf_counter()
        model.forward_backward_many({name: {"inputs": batches[name]} for name in names})
        model.clip_grad_and_step_many(names)
    return tenants * rows * seq * steps / (time.perf_counter() - start)


def server_config(model_id: str, port: int, storage: str) -> dict:
    base = model_id.replace("://", "/")
    return {
        "http_options": {"host": "127.0.0.1", "port": port},
        "auth": {"api_keys": KEYS},
        "storage": {"root": storage},
        "applications": [
            {
                "name": "server",
                "route_prefix": "/api/v1",
                "import_path": "server",
                "args": {"server_config": {"per_token_model_limit": 2, "supported_models": [base]}},
            },
            {
                "name": "model",
                "route_prefix": f"/api/v1/model/{base}",
                "import_path": "model",
                "args": {
                    "backend": "transformers",
                    "model_id": model_id,
                    "max_loras": 16,
                },
            },
        ],
    }


def start_server(model_id: str, port: int, storage: str) -> str:
    """Ray Serve as ``twinkle-server launch`` starts it: the gateway and the model as Serve
    applications, on a local Ray with the launcher's settings (``use_local_ray_env``)."""
    import ray

    from twinkle.server.config import parse_config
    from twinkle.server.process.launch import deploy, use_local_ray_env

    base = model_id.replace("://", "/")
    config = parse_config(server_config(model_id, port, storage))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    use_local_ray_env()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        namespace="twinkle-bench",
    )
    deploy(config, ready_timeout_s=300)
    return f"http://127.0.0.1:{port}/api/v1/model/{base}"


def start_local_server(model_id: str, port: int, storage: str):
    """``twinkle-server launch --local``: every application in one uvicorn process, no Ray."""
    import subprocess
    import sys

    import yaml

    path = os.path.join(storage, "config.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump(server_config(model_id, port, storage), handle)
    proc = subprocess.Popen(
        [sys.executable, "-m", "twinkle.server", "launch", "--local", "-c", path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    base = model_id.replace("://", "/")
    return f"http://127.0.0.1:{port}/api/v1/model/{base}", proc


def direct_url(url: str, key: str) -> str | None:
    """The model's own address (``GET .../endpoint``, as ``twinkle_client`` asks), or None."""
    reply = httpx.get(f"{url}/endpoint", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    reply.raise_for_status()
    base = reply.json().get("direct_url")
    if not base:
        return None
    return base.rstrip("/") + httpx.URL(url).path  # the same path on the replica's port


def remote_client(url: str, key: str, name: str) -> httpx.Client:
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=300)
    r = http.post(
        "/add_adapter_to_model", json={"adapter_name": name, "config": {"r": 8, "lora_alpha": 16}}
    )
    r.raise_for_status()
    http.post(
        "/set_optimizer", json={"adapter_name": name, "optimizer": "Adam", "lr": 1e-4}
    ).raise_for_status()
    return http


def remote_latency(url: str, batch: list[dict], calls: int) -> list[float]:
    http = remote_client(url, KEYS[0], "latency")
    times = []
    for i in range(calls + 3):
        start = time.perf_counter()
        http.post(
            "/forward_backward", json={"adapter_name": "latency", "inputs": batch}
        ).raise_for_status()
        if i >= 3:
            times.append(time.perf_counter() - start)
        http.post("/clip_grad_and_step", json={"adapter_name": "latency"}).raise_for_status()
    http.post("/remove_adapter", json={"adapter_name": "latency"}).raise_for_status()
    http.close()
    return times


def _tenant_program(
    url: str, key: str, name: str, rows: int, seq: int, seed: int, steps: int, barrier, results
) -> None:
    """One tenant's training program (its own process): add an adapter, 2 warm-up steps, then
    ``steps`` timed ``forward_backward`` + ``clip_grad_and_step`` calls once every tenant is ready."""
    http = remote_client(url, key, name)
    batch = features(rows, seq, seed)

    def step() -> None:
        http.post(
            "/forward_backward", json={"adapter_name": name, "inputs": batch}
        ).raise_for_status()
        http.post("/clip_grad_and_step", json={"adapter_name": name}).raise_for_status()

    for _ in range(2):
        step()
    barrier.wait()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    results.put((start, time.perf_counter()))
    http.post("/remove_adapter", json={"adapter_name": name})
    http.close()


def remote_tps(url: str, tenants: int, rows: int, seq: int, steps: int) -> float:
    """Aggregate tokens/s of ``tenants`` concurrent tenant programs, each in its own process (as
    separate users' scripts are; threads of one process would serialise on its GIL)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(tenants), ctx.Queue()
    procs = [
        ctx.Process(
            target=_tenant_program,
            args=(url, KEYS[i], f"tp{tenants}", rows, seq, i, steps, barrier, results),
        )
        for i in range(tenants)
    ]
    for proc in procs:
        proc.start()
    spans: list[tuple[float, float]] = []
    while len(spans) < tenants:
        try:
            spans.append(results.get(timeout=1))
        except queue.Empty:
            failed = [proc.exitcode for proc in procs if proc.exitcode not in (None, 0)]
            if failed:
                for proc in procs:
                    proc.terminate()
                raise RuntimeError(
                    f"{len(failed)} tenant process(es) failed: exit codes {failed}"
                ) from None
    for proc in procs:
        proc.join(timeout=60)
    elapsed = max(end for _, end in spans) - min(start for start, _ in spans)
    return tenants * rows * seq * steps / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny://qwen3.5")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument(
        "--shape",
        action="append",
        type=parse_shape,
        default=None,
        metavar="ROWSxSEQ",
        help="rows x tokens per tenant call for the throughput runs; repeatable "
        f"(default: {' and '.join(f'{r}x{s}' for r, s in DEFAULT_SHAPES)})",
    )
    parser.add_argument(
        "--ray-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="environment for Ray Serve (serve mode), e.g. RAY_SERVE_ENABLE_HA_PROXY=1; repeatable",
    )
    parser.add_argument(
        "--mode",
        choices=("serve", "local"),
        default="serve",
        help="serve: Ray Serve (the default deployment); local: `twinkle-server launch --local`",
    )
    args = parser.parse_args()
    import tempfile

    import torch

    calls = 20 if args.quick else 60
    steps = 5 if args.quick else 15
    # The server's torch model replicas keep freed memory in the process; the in-process
    # baseline must run under the same allocator setting (TWINKLE_MALLOC_TUNING=0 turns it off
    # on both sides).
    from twinkle.model.memory import keep_freed_memory

    local_kept = keep_freed_memory()
    batch = features(2, 16, 0)
    local = local_latency(args.model, batch, calls)
    storage = tempfile.mkdtemp(prefix="twinkle-bench-")
    proc = None
    if args.mode == "local":
        url, proc = start_local_server(args.model, args.port, storage)
    else:
        for item in args.ray_env:
            name, _, value = item.partition("=")
            os.environ[name] = value
        url = start_server(args.model, args.port, storage)
    try:
        # What twinkle_client does: use the model's own address when the server offers one
        # ("direct"), else the main one ("proxy"); both are measured when both exist.
        direct = direct_url(url, KEYS[0])
        paths = {"direct": direct, "proxy": url} if direct else {"proxy": url}
        common = {"bench": "server_overhead", "mode": args.mode, "ray_env": args.ray_env}
        for path, target in paths.items():
            remote = remote_latency(target, batch, calls)
            line = {
                **common,
                "kind": "latency",
                "path": path,
                "model": args.model,
                "rows": 2,
                "seq": 16,
                "calls": calls,
                "torch_threads": torch.get_num_threads(),
                "local_keeps_freed_memory": local_kept,
                "local_p50_ms": round(1e3 * statistics.median(local), 2),
                "local_p95_ms": round(1e3 * percentile(local, 95), 2),
                "remote_p50_ms": round(1e3 * statistics.median(remote), 2),
                "remote_p95_ms": round(1e3 * percentile(remote, 95), 2),
                "overhead_p50_ms": round(
                    1e3 * (statistics.median(remote) - statistics.median(local)), 2
                ),
            }
            print(json.dumps(line), flush=True)
        for rows, seq in args.shape or DEFAULT_SHAPES:
            for tenants in (1, 4, 8):
                local_fused = local_fused_tps(args.model, tenants, rows=rows, seq=seq, steps=steps)
                for path, target in paths.items():
                    server = remote_tps(target, tenants, rows=rows, seq=seq, steps=steps)
                    line = {
                        **common,
                        "kind": "throughput",
                        "path": path,
                        "model": args.model,
                        "tenants": tenants,
                        "rows": rows,
                        "seq": seq,
                        "server_tps": round(server, 1),
                        "local_fused_tps": round(local_fused, 1),
                        "local_keeps_freed_memory": local_kept,
                        "ratio": round(server / local_fused, 3),
                    }
                    print(json.dumps(line), flush=True)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        else:
            import ray
            from ray import serve

            serve.shutdown()
            ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
