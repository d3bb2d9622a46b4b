"""Step to sample: time from ``optim_step`` done to the first sampled token, in memory vs through
a saved checkpoint, for the local library and over HTTP (an in-process server on a real socket).

Each repeat trains one step, then hands the new weights to the sampler and samples ONE token
(``max_tokens=1``, greedy); the clock starts when the step has returned and stops when the sample
has. Modes, interleaved repeat by repeat (the order rotates) so the machine's drift hits all:
  local  ``memory``      ``sampler.load_adapter_from_model(model)`` (tensors copied in process)
  local  ``checkpoint``  ``model.save(name)`` then ``sample(adapter_uri=path)`` (disk round trip)
  http   ``memory``      ``twinkle_client`` ``sampler.load_adapter_from_model(model)``: one POST;
                         the model's tensors reach the sampler in process (by reference)
  http   ``memory_b64``  the same publish with ``encoding: "base64"`` (safetensors bytes in
                         base64, the JSON form), to measure what the binary hand-over saves
  http   ``checkpoint``  ``model.save(name)`` (a POST, files + checkpoint record) then sample
                         with its ``twinkle://`` path (the sampler loads it from disk)
Every mode reports the median and min of the total, and of its two parts (``handover``: the
publish or the save; ``sample``: the one-token sample, adapter load included), plus
``warm_sample`` (the same sample once more, adapter in place: the floor both modes pay) and
``weights_to_sampler`` (total minus that floor: what getting the new weights to the sampler
costs). A final check
samples the same weights both ways and reports whether the log-probabilities are equal.

Prints one JSON object per line, then a summary line with the ratios side by side.

Usage: python bench/step_to_sample.py [--models tiny://qwen3 tiny://qwen3-25m] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

PROMPT = [[11, 22, 33, 44, 55, 66, 77, 88]]
ONE_TOKEN = {"max_tokens": 1, "temperature": 0.0}
ROWS = [{"input_ids": list(range(10, 74)), "labels": list(range(10, 74))}]
LORA = {"r": 8, "lora_alpha": 32, "target_modules": "all-linear"}


def summarise(samples: list[dict]) -> dict:
    out = {}
    for part in ("total", "handover", "sample", "warm_sample"):
        values = [s[part] * 1000 for s in samples]
        out[f"{part}_median_ms"] = round(statistics.median(values), 2)
        out[f"{part}_min_ms"] = round(min(values), 2)
    # From the medians (and the mins), not per repeat: two noisy readings' difference is noisier.
    for stat in ("median", "min"):
        out[f"weights_to_sampler_{stat}_ms"] = round(
            out[f"total_{stat}_ms"] - out[f"warm_sample_{stat}_ms"], 2
        )
    return out


def run_modes(modes: dict, step, again, repeats: int) -> dict[str, dict]:
    """``modes``: name -> fn(i) returning (t_handover_done); each timed after ``step()``.

    ``again()`` then samples once more with the adapter already in place: the floor both modes
    pay (the one-token forward)."""
    names = list(modes)
    times: dict[str, list[dict]] = {n: [] for n in names}
    for i in range(repeats):
        for k in range(len(names)):
            name = names[(i + k) % len(names)]
            step()
            t0 = time.perf_counter()
            t1 = modes[name](f"{name}-{i}")
            t2 = time.perf_counter()
            again()
            warm = time.perf_counter() - t2
            times[name].append(
                {"total": t2 - t0, "handover": t1 - t0, "sample": t2 - t1, "warm_sample": warm}
            )
    return {n: summarise(times[n]) for n in names}


def logprob_lists(response) -> list[list[float]]:
    return [s.logprobs for r in response for s in r.sequences]


def local_bench(model_id: str, repeats: int, storage: Path, threads: int = 1) -> dict:
    from twinkle.model import MultiLoraTransformersModel
    from twinkle.sampler import TorchSampler

    model = MultiLoraTransformersModel(model_id)
    model.add_adapter_to_model("t", dict(LORA))
    model.set_optimizer("AdamW", lr=1e-3)
    sampler = TorchSampler(model_id, allowed_adapter_dirs=[storage])

    def step():
        model.forward_backward(ROWS)
        model.clip_grad_and_step()

    last = {}

    def memory(_):
        last["uri"] = uri = sampler.load_adapter_from_model(model, "t")
        t = time.perf_counter()
        sampler.sample(PROMPT, ONE_TOKEN, adapter_uri=uri)
        return t

    def checkpoint(name):
        last["uri"] = path = model.save(name, output_dir=storage, save_optimizer=False)
        t = time.perf_counter()
        sampler.sample(PROMPT, ONE_TOKEN, adapter_uri=path)
        return t

    def again():
        sampler.sample(PROMPT, ONE_TOKEN, adapter_uri=last["uri"])

    step(), memory("warm"), checkpoint("warm")  # first-call costs (allocations) out of the way
    modes = run_modes({"memory": memory, "checkpoint": checkpoint}, step, again, repeats)
    check = {"max_tokens": 8, "temperature": 0.0}
    live = sampler.sample(PROMPT, check, adapter_uri=sampler.load_adapter_from_model(model, "t"))
    saved = sampler.sample(
        PROMPT, check, adapter_uri=model.save("check", output_dir=storage, save_optimizer=False)
    )
    return {"modes": modes, "logprobs_equal": logprob_lists(live) == logprob_lists(saved)}


def http_bench(model_id: str, repeats: int, storage: Path, threads: int = 1) -> dict:
    from twinkle.server.config import parse_config
    from twinkle.server.process.local import build_local_server
    from twinkle.server.state import MemoryStore
    from twinkle.server.testing import KEYS, config_dict, serve_in_thread
    from twinkle_client import init_twinkle_client
    from twinkle_client.model import MultiLoraTransformersModel
    from twinkle_client.sampler import TorchSampler

    config = config_dict(model_id, sampler=True)
    config["storage"] = {"root": str(storage)}
    for app in config["applications"]:
        if app["name"] in ("model", "sampler"):
            app["args"]["execution"] = {"cpu_threads": threads}
    server = build_local_server(parse_config(config), store=MemoryStore("bench:"))
    base = model_id.replace("://", "/")
    with serve_in_thread(server.app) as url:
        client = init_twinkle_client(base_url=url, api_key=KEYS["alice"], timeout=300)
        model = MultiLoraTransformersModel(model_id)
        model.add_adapter_to_model("t", dict(LORA))
        model.set_optimizer("AdamW", lr=1e-3)
        sampler = TorchSampler(model_id)

        def step():
            model.forward_backward(inputs=ROWS)
            model.clip_grad_and_step()

        last = {}

        def memory(_):
            last["uri"] = uri = sampler.load_adapter_from_model(model, "t")
            t = time.perf_counter()
            sampler.sample(PROMPT, ONE_TOKEN, adapter_uri=uri)
            return t

        def memory_b64(_):
            body = {"base_model": base, "adapter_name": "t", "encoding": "base64"}
            last["uri"] = uri = client.http.post("/api/v1/publish_live_adapter", body)[
                "adapter_uri"
            ]
            t = time.perf_counter()
            sampler.sample(PROMPT, ONE_TOKEN, adapter_uri=uri)
            return t

        def checkpoint(name):
            last["uri"] = path = model.save(name)
            t = time.perf_counter()
            sampler.sample(PROMPT, ONE_TOKEN, adapter_uri=path)
            return t

        def again():
            sampler.sample(PROMPT, ONE_TOKEN, adapter_uri=last["uri"])

        step(), memory("warm"), memory_b64("warm"), checkpoint("warm")
        modes = run_modes(
            {"memory": memory, "memory_b64": memory_b64, "checkpoint": checkpoint},
            step,
            again,
            repeats,
        )
        check = {"max_tokens": 8, "temperature": 0.0}
        live = sampler.sample(PROMPT, check, adapter_uri=sampler.load_adapter_from_model(model))
        saved = sampler.sample(PROMPT, check, adapter_uri=model.save("check"))
        equal = logprob_lists(live) == logprob_lists(saved)
        client.close()
    return {"modes": modes, "logprobs_equal": equal}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["tiny://qwen3", "tiny://qwen3-25m"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--paths", nargs="+", default=["local", "http"], choices=["local", "http"])
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (1: the steadiest readings on a shared 2-core machine)",
    )
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for model_id in args.models:
            for path in args.paths:
                storage = Path(tmp) / f"{path}-{model_id.replace('://', '-')}"
                storage.mkdir()
                run = local_bench if path == "local" else http_bench
                result = run(model_id, args.repeats, storage, args.threads)
                modes = result["modes"]
                ckpt = modes["checkpoint"]["total_median_ms"]
                record = {
                    "bench": "step_to_sample",
                    "path": path,
                    "model": model_id,
                    "repeats": args.repeats,
                    **{f"{m}": v for m, v in modes.items()},
                    "checkpoint_over_memory_median": round(
                        ckpt / modes["memory"]["total_median_ms"], 2
                    ),
                    "checkpoint_over_memory_min": round(
                        modes["checkpoint"]["total_min_ms"] / modes["memory"]["total_min_ms"], 2
                    ),
                    "weights_to_sampler_ratio_median": round(
                        modes["checkpoint"]["weights_to_sampler_median_ms"]
                        / max(modes["memory"]["weights_to_sampler_median_ms"], 1e-3),
                        2,
                    ),
                    "logprobs_equal": result["logprobs_equal"],
                }
                if "memory_b64" in modes:
                    record["b64_over_binary_median"] = round(
                        modes["memory_b64"]["total_median_ms"] / modes["memory"]["total_median_ms"],
                        2,
                    )
                print(json.dumps(record), flush=True)
                records.append(record)
    summary = {
        "bench": "step_to_sample",
        "summary": [
            {
                "path": r["path"],
                "model": r["model"],
                "memory_ms": r["memory"]["total_median_ms"],
                "checkpoint_ms": r["checkpoint"]["total_median_ms"],
                "ratio": r["checkpoint_over_memory_median"],
                "ratio_min": r["checkpoint_over_memory_min"],
                "floor_ms": r["memory"]["warm_sample_median_ms"],
                "weights_to_sampler_ratio": r["weights_to_sampler_ratio_median"],
            }
            for r in records
        ],
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "torch_threads": args.threads,
    }
    print(json.dumps(summary), flush=True)
    return records


if __name__ == "__main__":
    main()
