"""The README demo, served: start the tiny server on Ray Serve, train two tenants through it at the
same time with ``twinkle_client``, sample from one tenant's adapter, shut everything down.

Tenant A: SFT, LoRA rank 8, Adam, on the shipped self-cognition data.
Tenant B: continued pre-training, LoRA rank 32, AdamW with its own lr and a summed loss, on raw text.
Both run concurrently; the model deployment fuses their waiting ``forward_backward`` calls into one
pass through the shared base model.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from twinkle import get_logger
from twinkle._demo_tenants import (
    pretrain_dataloader,
    save_curves,
    save_tensorboard,
    sft_dataloader,
)

logger = get_logger("twinkle.demo")

MODEL_ID = "tiny://qwen3.5"
KEYS = {"tenant_a": "demo-key-tenant-a", "tenant_b": "demo-key-tenant-b"}


def demo_config(port: int, storage_root: Path) -> dict[str, Any]:
    """The tiny server of ``cookbook/client/server/tiny/server_config.yaml``, with demo keys."""
    actor = [{"name": "d", "ray_actor_options": {"num_cpus": 0.1}}]
    return {
        "http_options": {"host": "127.0.0.1", "port": port},
        "auth": {"api_keys": list(KEYS.values())},
        "storage": {"root": str(storage_root)},
        "applications": [
            {
                "name": "server",
                "route_prefix": "/api/v1",
                "import_path": "server",
                "args": {"server_config": {"supported_models": ["tiny/qwen3.5"]}},
                "deployments": actor,
            },
            {
                "name": "models-tiny-qwen3.5",
                "route_prefix": "/api/v1/model/tiny/qwen3.5",
                "import_path": "model",
                "args": {"backend": "transformers", "model_id": MODEL_ID, "max_length": 512},
                "deployments": actor,
            },
            {
                "name": "sampler-tiny-qwen3.5",
                "route_prefix": "/api/v1/sampler/tiny/qwen3.5",
                "import_path": "sampler",
                "args": {"model_id": MODEL_ID, "sampler_type": "torch"},
                "deployments": actor,
            },
        ],
    }


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(config: dict[str, Any]) -> str:
    import ray

    from twinkle.server.config import parse_config
    from twinkle.server.env import RAY_USAGE_STATS_ENABLED
    from twinkle.server.process.launch import deploy

    os.environ.setdefault(RAY_USAGE_STATS_ENABLED.name, "0")
    ray.init(
        num_cpus=os.cpu_count() or 2,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        namespace=f"twinkle-demo-{os.getpid()}",
    )
    url = deploy(parse_config(config), ready_timeout_s=300)
    return url.rsplit("/api/v1", 1)[0]


def _stop() -> None:
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def _tenant(
    name: str, url: str, loader, steps: int, position: int, history: list[float], paths: dict
) -> None:
    from peft import LoraConfig

    from twinkle_client.client import TwinkleClient
    from twinkle_client.model import MultiLoraTransformersModel

    with TwinkleClient(url, KEYS[name]) as client:
        model = MultiLoraTransformersModel(model_id=MODEL_ID, client=client)
        if name == "tenant_a":
            model.add_adapter_to_model(
                name, LoraConfig(r=8, lora_alpha=32, target_modules="all-linear")
            )
            model.set_template("Qwen3_5Template")
            model.set_processor("InputProcessor", padding_side="right")
            model.set_loss("CrossEntropyLoss")
            model.set_optimizer("Adam", lr=1e-2)
        else:
            model.add_adapter_to_model(
                name, LoraConfig(r=32, lora_alpha=64, target_modules="all-linear")
            )
            model.set_loss("CrossEntropyLoss", reduction="sum")
            model.set_optimizer("AdamW", lr=5e-3, weight_decay=0.01)
            model.set_lr_scheduler("cosine", num_warmup_steps=5, num_training_steps=steps)
        iterator = iter(loader)
        bar = tqdm(
            range(1, steps + 1), desc=f"{name} (served)", position=position, unit="step", leave=True
        )
        for _ in bar:
            try:
                batch = next(iterator)
            except StopIteration:
                iterator = iter(loader)
                batch = next(iterator)
            out = model.forward_backward(inputs=batch)
            model.clip_grad_and_step()
            tokens = max(out["num_tokens"], 1)
            history.append(out["loss"] / (tokens if name == "tenant_b" else 1))
            bar.set_postfix(loss=f"{history[-1]:.3f}")
        metric = model.calculate_metric(is_training=True).result
        # The server keeps each step's figures with the run (they outlive this client), written
        # to its state a moment after each step: wait for the last one.
        record = model.get_training_history()
        deadline = time.monotonic() + 10
        while len(record.points) < steps and time.monotonic() < deadline:
            time.sleep(0.2)
            record = model.get_training_history()
        paths[f"{name}:history"] = record
        paths[name] = model.save(
            f"step-{steps}",
            save_optimizer=True,
            consumed_train_samples=loader.get_state()["consumed_train_samples"],
        )
        tqdm.write(
            f"{name}: loss/token {history[0]:.3f} -> {history[-1]:.3f}, step {metric['step']}, "
            f"checkpoint {paths[name]}"
        )


def _sample(url: str, adapter_path: str) -> str:
    from twinkle_client import init_twinkle_client
    from twinkle_client.sampler import TorchSampler

    with init_twinkle_client(url, KEYS["tenant_a"]):
        sampler = TorchSampler(model_id=MODEL_ID)
        sampler.set_template("Qwen3_5Template")
        prompt = {"messages": [{"role": "user", "content": "Who are you?"}]}
        (result,) = sampler.sample(
            [prompt],
            sampling_params={"max_tokens": 32, "temperature": 0.0},
            adapter_uri=adapter_path,
        )
        return result.sequences[0].text


def run(steps: int, output_dir: Path) -> dict[str, list[float]]:
    """Serve, train both tenants concurrently, sample, shut down; returns the loss histories."""
    output_dir.mkdir(parents=True, exist_ok=True)
    loaders = {
        "tenant_a": sft_dataloader(MODEL_ID, 4),
        "tenant_b": pretrain_dataloader(MODEL_ID, 4),
    }
    started = time.perf_counter()
    logger.info("starting the tiny Twinkle server on Ray Serve ...")
    url = _start(demo_config(_free_port(), output_dir / "server-storage"))
    logger.info("server up at %s/api/v1 after %.1f s", url, time.perf_counter() - started)
    logger.info(
        "web console while the demo runs: %s/api/v1/console/ (log in with %s)",
        url,
        KEYS["tenant_a"],
    )
    history: dict[str, list[float]] = {name: [] for name in loaders}
    paths: dict[str, str] = {}
    try:
        threads = [
            threading.Thread(
                target=_tenant, args=(name, url, loader, steps, i, history[name], paths)
            )
            for i, (name, loader) in enumerate(loaders.items())
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if not set(loaders) <= set(paths):
            raise RuntimeError("a tenant failed; see the error above")
        logger.info(
            "tenant_a's adapter answers 'Who are you?': %r", _sample(url, paths["tenant_a"])
        )
    finally:
        logger.info("shutting the server down")
        _stop()
    picture = save_curves(history, output_dir / "loss_curves.png")
    if picture:
        logger.info("loss curves: %s", picture)
    board = save_tensorboard(
        {name: paths[f"{name}:history"] for name in loaders}, output_dir / "tensorboard"
    )
    if board:
        logger.info("training history for TensorBoard: tensorboard --logdir %s", board)
    logger.info("done in %.1f s", time.perf_counter() - started)
    return history
