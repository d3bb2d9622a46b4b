"""Mixed multi-tenant load, and a soak, against the tiny server over real HTTP on loopback.

Load (default): ``--tenants`` tenants (16) run ``--steps`` steps each (200), all at once, a third
of them of each kind: ``twinkle_sft`` (twinkle_client ``forward_backward`` +
``clip_grad_and_step``), ``tinker_sft`` (Tinker SDK ``forward_backward`` + ``optim_step``) and
``tinker_rl`` (Tinker SDK: sample from a snapshot of its own weights, ``importance_sampling``
``forward_backward`` + ``optim_step``, a fresh snapshot every ``--sync-every`` steps). Low
per-tenant limits (``--rps-limit``, ``--tps-limit``; model and sampler) make the server answer
429 (twinkle_client retries it) and ``paused_rate_limit`` (the SDK keeps polling the future).
Prints JSON lines: one per tenant, one per operation (p50/p95/p99 seconds) and a summary (exact
step counts, fairness, every status the server answered, client errors).

Soak (``--soak-minutes M``, bench/_load_soak.py): the same server in a child process; tenants
create an adapter (a twinkle_client adapter or a Tinker training client), train ``--cycle-steps``
steps and remove it, over and over. Every ``--sample-s`` the child's RSS, open files and threads are printed; the
summary says whether each stayed within 5% after ``--warmup-minutes``.

    python bench/load_mixed.py                      # 16 tenants x 200 steps
    python bench/load_mixed.py --tenants 4 --steps 10
    python bench/load_mixed.py --soak-minutes 30    # or tools/run_soak.sh
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TINKER_TELEMETRY": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
}.items():
    os.environ.setdefault(_key, _value)

import numpy as np  # noqa: E402

MODEL_ID = "tiny://qwen3.5"
BASE = "tiny/qwen3.5"
KINDS = ("twinkle_sft", "tinker_sft", "tinker_rl")
SEQ, ROWS = 32, 2  # SFT batch: ROWS sequences of SEQ trained tokens
PROMPT, SAMPLES, MAX_TOKENS = 8, 4, 8  # RL: one prompt, a group of SAMPLES completions
TIMEOUT_S = 600.0


def keys(n: int) -> list[str]:
    return [f"load-key-{i:02d}" for i in range(n)]


def server_config(
    storage: str, tenants: int, limits: dict, future_ttl_s: float | None = None
) -> dict:
    """Gateway, model and sampler of the tiny model; ``limits``: ``rps_limit`` and ``tps_limit``
    per tenant on both queues, ``rps_limit_per_key`` on every route (None: unlimited);
    ``future_ttl_s``: how long finished Tinker futures are kept (None: the default, 1 h)."""
    queue = {k: limits[k] for k in ("rps_limit", "tps_limit") if limits.get(k)}
    gateway = {"server_config": {"per_token_model_limit": 4, "supported_models": [BASE]}}
    if limits.get("rps_limit_per_key"):
        gateway["rps_limit_per_key"] = limits["rps_limit_per_key"]
    if future_ttl_s is not None:
        gateway["future_ttl_s"] = future_ttl_s
    slots = tenants + 4  # every tenant's adapter, plus room for the soak's overlapping cycles
    return {
        "auth": {"api_keys": keys(tenants)},
        "storage": {"root": storage},
        "applications": [
            {
                "name": "server",
                "route_prefix": "/api/v1",
                "import_path": "server",
                "args": gateway,
            },
            {
                "name": "model",
                "route_prefix": f"/api/v1/model/{BASE}",
                "import_path": "model",
                "args": {
                    "backend": "transformers",
                    "model_id": MODEL_ID,
                    "max_loras": slots,
                    "queue_config": queue,
                },
            },
            {
                "name": "sampler",
                "route_prefix": f"/api/v1/sampler/{BASE}",
                "import_path": "sampler",
                "args": {
                    "model_id": MODEL_ID,
                    "sampler_type": "torch",
                    "max_loras": slots,
                    "queue_config": queue,
                },
            },
        ],
    }


def build_server(
    storage: str,
    tenants: int,
    limits: dict,
    future_ttl_s: float | None = None,
    redis_url: str | None = None,
):
    """The in-process server; its state in memory, or in the Redis at ``redis_url``."""
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore

    raw = server_config(storage, tenants, limits, future_ttl_s)
    if redis_url:
        raw["persistence"] = {"mode": "redis", "redis_url": redis_url, "key_prefix": "load:"}
        return build_local_server(parse_config(raw))
    return build_local_server(parse_config(raw), store=MemoryStore("load:"))


def _route(path: str) -> str:
    """``model/<op>`` and ``sampler/<op>`` for the native routes, ``<op>`` for the gateway's
    (the Tinker API among them)."""
    op = path.rstrip("/").rsplit("/", 1)[-1]
    for app in ("model", "sampler"):
        if path.startswith(f"/api/v1/{app}/"):
            return f"{app}/{op}"
    return op


class StatusCounter:
    """ASGI wrapper: every status the server answered, by route, and the ``paused_rate_limit``
    future polls (what the Tinker SDK saw while the gateway retried a rate-limited call)."""

    def __init__(self, app) -> None:
        self.app = app
        self.statuses: Counter = Counter()
        self.paused_rate_limit = 0

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = _route(scope["path"])

        async def counting(message) -> None:
            if message["type"] == "http.response.start":
                self.statuses[(route, message["status"])] += 1
            elif message["type"] == "http.response.body":
                self.paused_rate_limit += b'"paused_rate_limit"' in message.get("body", b"")
            await send(message)

        await self.app(scope, receive, counting)

    def unexpected(self) -> dict[str, int]:
        """Answers other than success, 429, and 410 to a heartbeat of a finished session (how
        the server tells the Tinker SDK's heartbeat thread, racing ``close``, to stop)."""
        return {
            f"{route} {status}": n
            for (route, status), n in self.statuses.items()
            if status >= 400 and status != 429 and (route, status) != ("session_heartbeat", 410)
        }

    def count(self, status: int) -> int:
        return sum(n for (_, s), n in self.statuses.items() if s == status)


class RateLimitTrace:
    """Which tenant each limiter refused, and which tenant's Tinker futures were paused for a
    rate limit (the gateway retries those itself; the SDK's polls see ``paused_rate_limit``
    only when the retry outlasts a long-poll)."""

    def __init__(self, server, tenant_keys: list[str]) -> None:
        self.key_of = {
            server.context.authenticate({"authorization": f"Bearer {k}"}): k for k in tenant_keys
        }
        self.refused: Counter = Counter()  # (key, component)
        self.paused: Counter = Counter()  # key
        for component in ("model", "sampler"):
            limiter = server.services[component].rate_limiter
            limiter.check = self._counting(limiter.check, component)
        state = server.context.state
        set_queue_state = state.set_queue_state

        def counting_set_queue_state(owner, request_id, queue_state):
            if queue_state == "paused_rate_limit":
                self.paused[self.key_of.get(owner, owner)] += 1
            return set_queue_state(owner, request_id, queue_state)

        state.set_queue_state = counting_set_queue_state

    def _counting(self, check, component: str):
        def counting_check(tenant, tokens=0):
            try:
                return check(tenant, tokens)
            except Exception as exc:
                if getattr(exc, "status", None) == 429:
                    self.refused[(self.key_of.get(tenant, tenant), component)] += 1
                raise

        return counting_check

    def by_tenant(self, key: str) -> dict:
        return {
            "refused_model": self.refused[(key, "model")],
            "refused_sampler": self.refused[(key, "sampler")],
            "paused_rate_limit": self.paused[key],
        }


class Recorder:
    """Latencies per (kind, operation), completed steps and errors per tenant (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latencies: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.steps: Counter = Counter()
        self.errors: list[dict] = []
        self.spans: dict[str, tuple[float, float]] = {}

    @contextlib.contextmanager
    def timed(self, kind: str, op: str):
        started = time.perf_counter()
        yield
        with self.lock:
            self.latencies[(kind, op)].append(time.perf_counter() - started)

    def step(self, tenant: str) -> None:
        with self.lock:
            self.steps[tenant] += 1

    def error(self, tenant: str, exc: BaseException) -> None:
        with self.lock:
            self.errors.append({"tenant": tenant, "error": f"{type(exc).__name__}: {exc}"[:300]})


def tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(10, 4000, size=n).tolist()


def twinkle_tenant(url: str, key: str, steps: int, rec: Recorder, seed: int, name: str = "load"):
    """twinkle_client SFT: one adapter, ``steps`` x (forward_backward + clip_grad_and_step)."""
    from twinkle_client import TwinkleClient
    from twinkle_client.model import MultiLoraTransformersModel

    rows = [tokens(seed * 100 + r, SEQ + 1) for r in range(ROWS)]
    features = [{"input_ids": r, "labels": r} for r in rows]
    client = TwinkleClient(base_url=url, api_key=key, timeout=TIMEOUT_S)
    try:
        model = MultiLoraTransformersModel(model_id=MODEL_ID, client=client)
        with rec.timed("twinkle_sft", "add_adapter_to_model"):
            model.add_adapter_to_model(name, {"r": 8, "lora_alpha": 16})
        model.set_optimizer("Adam", lr=1e-3)
        for _ in range(steps):
            with rec.timed("twinkle_sft", "step"):
                with rec.timed("twinkle_sft", "forward_backward"):
                    model.forward_backward(inputs=features)
                with rec.timed("twinkle_sft", "clip_grad_and_step"):
                    model.clip_grad_and_step()
            rec.step(key)
        with rec.timed("twinkle_sft", "remove_adapter"):
            model.remove_adapter()
    finally:
        client.close()


def _sft_data(seed: int):
    from tinker import types

    rows = [tokens(seed * 100 + r, SEQ + 1) for r in range(ROWS)]
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(r[:-1]),
            loss_fn_inputs={"target_tokens": r[1:], "weights": [1.0] * SEQ},
        )
        for r in rows
    ]


def _rl_data(prompt: list[int], sequences) -> list:
    """One ``importance_sampling`` datum per completion; reward: the share of even tokens."""
    from tinker import types

    rewards = np.array([np.mean([t % 2 == 0 for t in s.tokens]) for s in sequences])
    advantages = rewards - rewards.mean()
    data = []
    for seq, adv in zip(sequences, advantages):
        full = prompt + list(seq.tokens)
        pad = [0.0] * (len(prompt) - 1)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(full[:-1]),
                loss_fn_inputs={
                    "target_tokens": full[1:],
                    "logprobs": np.asarray(pad + list(seq.logprobs), dtype=np.float32),
                    "advantages": np.asarray(pad + [adv] * len(seq.tokens), dtype=np.float32),
                },
            )
        )
    return data


def tinker_tenant(url: str, key: str, steps: int, rec: Recorder, seed: int, rl: bool, sync: int):
    """Tinker SDK SFT, or RL (``rl``) with sampling from snapshots of its own weights."""
    import tinker
    from tinker import types

    kind = "tinker_rl" if rl else "tinker_sft"
    service = tinker.ServiceClient(base_url=url, api_key=key)
    try:
        with rec.timed(kind, "create_lora_training_client"):
            trainer = service.create_lora_training_client(base_model=BASE, rank=8).result(
                timeout=TIMEOUT_S
            )
        adam = types.AdamParams(learning_rate=1e-3)
        data, sampler = _sft_data(seed), None
        prompt = tokens(seed, PROMPT)
        params = types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0)
        for step in range(steps):
            started = time.perf_counter()
            if rl:
                if step % sync == 0:
                    with rec.timed(kind, "save_weights_and_get_sampling_client"):
                        sampler = trainer.save_weights_and_get_sampling_client()
                        # tinker>=0.38 hands back a future of the client
                        sampler = sampler.result() if hasattr(sampler, "result") else sampler
                with rec.timed(kind, "sample"):
                    out = sampler.sample(
                        types.ModelInput.from_ints(prompt),
                        num_samples=SAMPLES,
                        sampling_params=params,
                    ).result(timeout=TIMEOUT_S)
                data = _rl_data(prompt, out.sequences)
            submitted = time.perf_counter()
            fwd = trainer.forward_backward(data, "importance_sampling" if rl else "cross_entropy")
            opt = trainer.optim_step(adam)
            fwd.result(timeout=TIMEOUT_S)
            fwd_done = time.perf_counter()
            opt.result(timeout=TIMEOUT_S)
            done = time.perf_counter()
            with rec.lock:
                rec.latencies[(kind, "forward_backward")].append(fwd_done - submitted)
                rec.latencies[(kind, "optim_step")].append(done - submitted)
                rec.latencies[(kind, "step")].append(done - started)
            rec.step(key)
    finally:
        with rec.timed(kind, "close"):
            service.close("success").result(timeout=TIMEOUT_S)


def run_tenant(url: str, index: int, key: str, steps: int, rec: Recorder, sync: int) -> None:
    kind = KINDS[index % len(KINDS)]
    started = time.perf_counter()
    try:
        if kind == "twinkle_sft":
            twinkle_tenant(url, key, steps, rec, index)
        else:
            tinker_tenant(url, key, steps, rec, index, kind == "tinker_rl", sync)
    except Exception as exc:  # noqa: BLE001 - reported in the summary
        rec.error(key, exc)
    with rec.lock:
        rec.spans[key] = (started, time.perf_counter())


def percentiles(values: list[float]) -> dict:
    p50, p95, p99 = np.percentile(values, [50, 95, 99])
    return {"p50_s": round(p50, 4), "p95_s": round(p95, 4), "p99_s": round(p99, 4)}


def run_load(tenants: int, steps: int, limits: dict, sync: int = 10) -> list[dict]:
    """The load run; returns its JSON records (tenants, operations, then the summary)."""
    from twinkle.server.testing import serve_in_thread
    from twinkle_client import init_tinker_client

    init_tinker_client()
    rec = Recorder()
    with tempfile.TemporaryDirectory() as storage:
        server = build_server(storage, tenants, limits)
        counter = StatusCounter(server.app)
        trace = RateLimitTrace(server, keys(tenants))
        model, sampler = server.services["model"], server.services["sampler"]
        with serve_in_thread(counter) as url:
            started = time.perf_counter()
            threads = [
                threading.Thread(target=run_tenant, args=(url, i, k, steps, rec, sync))
                for i, k in enumerate(keys(tenants))
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            wall = time.perf_counter() - started
    records = []
    rates = {}
    for i, key in enumerate(keys(tenants)):
        begin, end = rec.spans[key]
        rates[key] = rec.steps[key] / (end - begin)
        kind = KINDS[i % len(KINDS)]
        records.append(
            {"record": "tenant", "tenant": key, "kind": kind, "steps": rec.steps[key]}
            | {"steps_per_s": round(rates[key], 3), "elapsed_s": round(end - begin, 2)}
            | trace.by_tenant(key)
        )
    for (kind, op), values in sorted(rec.latencies.items()):
        records.append(
            {"record": "op", "kind": kind, "op": op, "n": len(values)} | percentiles(values)
        )
    by_kind = {
        kind: [rates[k] for i, k in enumerate(keys(tenants)) if KINDS[i % len(KINDS)] == kind]
        for kind in KINDS
    }
    records.append(
        {
            "record": "summary",
            "tenants": tenants,
            "steps_per_tenant": steps,
            "limits": limits,
            "exact_steps": all(rec.steps[k] == steps for k in keys(tenants)),
            "total_steps": sum(rec.steps.values()),
            "wall_s": round(wall, 2),
            "steps_per_s": round(sum(rec.steps.values()) / wall, 3),
            "fairness_max_over_min": round(max(rates.values()) / max(min(rates.values()), 1e-9), 3),
            "fairness_by_kind": {
                kind: round(max(r) / max(min(r), 1e-9), 3) for kind, r in by_kind.items() if r
            },
            "http_429": counter.count(429),
            "http_429_by_route": {r: n for (r, s), n in counter.statuses.items() if s == 429},
            "paused_rate_limit_polls": counter.paused_rate_limit,
            "model_rate_limit_rejections": model.rate_limiter.rejections,
            "sampler_rate_limit_rejections": sampler.rate_limiter.rejections,
            "refused_by_kind": {
                kind: sum(
                    n
                    for (k, _), n in trace.refused.items()
                    if KINDS[keys(tenants).index(k) % 3] == kind
                )
                for kind in KINDS
            },
            "paused_rate_limit_futures": sum(trace.paused.values()),
            "fused_passes": model.scheduler.fused_passes,
            "unexpected_statuses": counter.unexpected(),
            "heartbeats_after_finish_410": counter.statuses[("session_heartbeat", 410)],
            "client_errors": rec.errors,
            "statuses": {f"{r} {s}": n for (r, s), n in sorted(counter.statuses.items())},
            "cpus": os.cpu_count(),
        }
    )
    return records


def limits(args) -> dict:
    return {
        "rps_limit": args.rps_limit or None,
        "tps_limit": args.tps_limit or None,
        "rps_limit_per_key": args.key_rps_limit or None,
    }


def parser() -> argparse.ArgumentParser:
    """This script's options (bench/_load_soak.py reads the same)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tenants", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rps-limit", type=float, default=1.0, help="per tenant; 0: none")
    parser.add_argument("--tps-limit", type=float, default=100.0, help="per tenant; 0: none")
    parser.add_argument("--key-rps-limit", type=float, default=0.0, help="every route, per key")
    parser.add_argument("--sync-every", type=int, default=10, help="RL: steps per weight sync")
    parser.add_argument("--soak-minutes", type=float, default=0.0)
    parser.add_argument("--warmup-minutes", type=float, default=3.0)
    parser.add_argument("--sample-s", type=float, default=10.0)
    parser.add_argument("--cycle-steps", type=int, default=3)
    parser.add_argument(
        "--future-ttl-s",
        type=float,
        default=60.0,
        help="soak: seconds finished futures are kept (with --store memory, in the server's RSS)",
    )
    parser.add_argument(
        "--store",
        choices=("memory", "redis"),
        default="memory",
        help="soak: the server's state in its own memory, or in a redis-server the soak starts",
    )
    parser.add_argument("--redis-url", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--serve", nargs=2, metavar=("STORAGE", "PORT"), help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = parser().parse_args()
    if args.serve or args.soak_minutes > 0:
        # The soak is its own script (it imports this one, never the other way round).
        soak = str(Path(__file__).resolve().with_name("_load_soak.py"))
        os.execv(sys.executable, [sys.executable, soak, *sys.argv[1:]])
    for record in run_load(args.tenants, args.steps, limits(args), args.sync_every):
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
