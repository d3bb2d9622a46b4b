"""The README demo: two tenants fine-tune their own LoRA adapters on one shared tiny model.

Tenant A does SFT (rank 8, Adam) on the shipped self-cognition data; tenant B does continued
pre-training (rank 32, AdamW, its own learning rate, loss on every token) on raw text.

By default (with twinkle-server installed) the demo starts the tiny server on Ray Serve and both
tenants train through it at the same time with ``twinkle_client``; the model deployment fuses their
waiting calls. ``--local`` runs the same two tenants in this process instead, each step ONE fused
base-model pass (``forward_backward_many``). Checkpoints and a loss-curve PNG land in
``--output-dir``.

Run: ``python -m twinkle.demo`` (or ``twinkle-demo``).
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path

from tqdm import tqdm

from twinkle import get_logger
from twinkle._demo_tenants import pretrain_dataloader, save_curves, save_tensorboard, sft_dataloader
from twinkle.env import TWINKLE_OUTPUT_DIR

logger = get_logger("twinkle.demo")


def _next_batch(iterators: dict, loaders: dict, name: str):
    """The tenant's next batch; a new epoch starts when its data runs out."""
    try:
        return next(iterators[name])
    except StopIteration:
        iterators[name] = iter(loaders[name])
        return next(iterators[name])


def run(
    model_id: str, steps: int, output_dir: Path, batch_size: int = 4, log_every: int = 20
) -> dict[str, list[float]]:
    """Train both tenants; returns each tenant's per-step loss history."""
    from peft import LoraConfig

    from twinkle.model import MultiLoraTransformersModel

    started = time.perf_counter()
    loaders = {
        "tenant_a": sft_dataloader(model_id, batch_size),
        "tenant_b": pretrain_dataloader(model_id, batch_size),
    }
    model = MultiLoraTransformersModel(model_id=model_id)

    model.add_adapter_to_model(
        "tenant_a", LoraConfig(r=8, lora_alpha=32, target_modules="all-linear")
    )
    model.set_template("Qwen3_5Template", adapter_name="tenant_a")
    model.set_processor("InputProcessor", padding_side="right", adapter_name="tenant_a")
    model.set_loss("CrossEntropyLoss", adapter_name="tenant_a")
    model.set_optimizer("Adam", lr=1e-2, adapter_name="tenant_a")

    model.add_adapter_to_model(
        "tenant_b", LoraConfig(r=32, lora_alpha=64, target_modules="all-linear")
    )
    model.set_template("Qwen3_5Template", adapter_name="tenant_b")
    model.set_loss("CrossEntropyLoss", reduction="sum", adapter_name="tenant_b")
    model.set_optimizer("AdamW", lr=5e-3, weight_decay=0.01, adapter_name="tenant_b")
    model.set_lr_scheduler(
        "cosine", num_warmup_steps=5, num_training_steps=steps, adapter_name="tenant_b"
    )

    history: dict[str, list[float]] = {name: [] for name in loaders}
    iterators = {name: iter(loader) for name, loader in loaders.items()}
    bar = tqdm(range(1, steps + 1), desc="fused multi-tenant training", unit="step")
    for step in bar:
        requests = {name: {"inputs": _next_batch(iterators, loaders, name)} for name in loaders}
        results = model.forward_backward_many(requests)  # one base-model pass, both tenants
        for name in requests:
            model.clip_grad_and_step(adapter_name=name)
            tokens = max(results[name]["num_tokens"], 1)
            history[name].append(results[name]["loss"] / (tokens if name == "tenant_b" else 1))
        bar.set_postfix({name: f"{losses[-1]:.3f}" for name, losses in history.items()})
        if step % log_every == 0 or step == steps:
            for name in loaders:
                metric = model.calculate_metric(is_training=True, adapter_name=name).result
                tqdm.write(
                    f"step {step:4d} {name}: loss/token {history[name][-1]:.4f} "
                    f"(first {history[name][0]:.4f}) token_acc {metric['token_acc'] or 0.0:.3f} lr {metric['lr']:.2e}"
                )
    for name, loader in loaders.items():
        path = model.save(
            f"step-{steps}",
            output_dir=output_dir / name,
            save_optimizer=True,
            consumed_train_samples=loader.get_state()["consumed_train_samples"],
            adapter_name=name,
        )
        logger.info("saved %s checkpoint: %s", name, path)
    picture = save_curves(history, output_dir / "loss_curves.png")
    if picture:
        logger.info("loss curves: %s", picture)
    board = save_tensorboard(
        {name: model.get_training_history(adapter_name=name) for name in loaders},
        output_dir / "tensorboard",
    )
    if board:
        logger.info("training history for TensorBoard: tensorboard --logdir %s", board)
    logger.info("done in %.1f s", time.perf_counter() - started)
    return history


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-id", default="tiny://qwen3.5")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument(
        "--local", action="store_true", help="train in this process, without a server"
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path(TWINKLE_OUTPUT_DIR.get()) / "demo",
    )
    args = parser.parse_args(argv)
    served = not args.local and importlib.util.find_spec("twinkle.server") is not None
    if not args.local and not served:
        logger.info("twinkle-server is not installed: running the demo in this process (--local)")
    if served:
        # The served demo lives with the server, which is installed apart from the library.
        from twinkle.server import demo as served_demo

        history = served_demo.run(args.steps, args.output_dir)
    else:
        history = run(args.model_id, args.steps, args.output_dir)
    for name, losses in history.items():
        print(f"{name}: loss/token {losses[0]:.3f} -> {losses[-1]:.3f} over {len(losses)} steps")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
