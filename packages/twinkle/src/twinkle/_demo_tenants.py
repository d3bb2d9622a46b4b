"""The demo's two tenants and its picture, shared by the local demo (:mod:`twinkle.demo`) and the
served one (``twinkle.server.demo``): tenant A's SFT data, tenant B's raw-text windows, and the
loss-curve PNG.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from twinkle import get_logger

logger = get_logger("twinkle.demo")


def sft_dataloader(model_id: str, batch_size: int):
    """Tenant A: the shipped self-cognition conversations, templated and encoded."""
    from twinkle.dataloader import DataLoader
    from twinkle.dataset import Dataset, DatasetMeta

    dataset = Dataset(dataset_meta=DatasetMeta("builtin://self-cognition"))
    dataset.set_template("Qwen3_5Template", model_id=model_id, max_length=256)
    dataset.map(
        "SelfCognitionProcessor",
        init_args={"model_name": "Twinkle", "model_author": "the Twinkle team"},
    )
    dataset.encode(batched=True)
    return DataLoader(dataset=dataset, batch_size=batch_size, shuffle=True, seed=0)


def pretrain_dataloader(model_id: str, batch_size: int, seq: int = 64):
    """Raw text cut into fixed windows; every token is a target (continued pre-training)."""
    from twinkle.dataloader import DataLoader
    from twinkle.hub import load_tokenizer

    corpus = Path(__file__).parent / "hub" / "corpus"
    text = "\n".join(p.read_text() for p in sorted(corpus.glob("en_*.txt")))
    ids = np.asarray(load_tokenizer(model_id)(text)["input_ids"], dtype=np.int64)
    windows = [ids[i : i + seq] for i in range(0, len(ids) - seq, seq)][:160]
    features = [{"input_ids": w, "labels": w.copy()} for w in windows]
    return DataLoader(dataset=features, batch_size=batch_size, shuffle=True, seed=1)


def _smooth(values: list[float], weight: float = 0.9) -> list[float]:
    """Exponential moving average, bias-corrected so the curve starts at the first value."""
    out, average = [], 0.0
    for i, value in enumerate(values, start=1):
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight**i))
    return out


def save_curves(history: dict[str, list[float]], path: Path) -> Path | None:
    """Each tenant's loss per step and its moving average, as a PNG at ``path`` (``None``
    without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning(
            "matplotlib is not installed: no loss-curve picture (pip install matplotlib)"
        )
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for tenant, losses in history.items():
        steps = range(1, len(losses) + 1)
        line = ax.plot(steps, losses, alpha=0.3, linewidth=0.8)[0]
        ax.plot(
            steps,
            _smooth(losses),
            color=line.get_color(),
            linewidth=2,
            label=f"{tenant} (moving average)",
        )
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("Twinkle demo: two tenants on one shared base model")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


__all__ = ["pretrain_dataloader", "save_curves", "sft_dataloader"]


def save_tensorboard(histories: dict, directory: Path) -> Path | None:
    """Each tenant's training history (a ``TrainingHistory`` per name) as TensorBoard event
    files under ``directory/<name>`` (``tensorboard --logdir directory``); ``None``, saying
    why, without the ``tensorboard`` package (``pip install 'twinkle-client[tracking]'``)."""
    import importlib.util

    if importlib.util.find_spec("tensorboard") is None:
        logger.info("no TensorBoard directory: install twinkle-client[tracking] for one")
        return None
    from twinkle_client.tracking import export_history, make_tracker

    for name, history in histories.items():
        export_history(history, make_tracker("tensorboard", path=directory / name))
    return directory
