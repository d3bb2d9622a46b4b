"""Between Tinker's request shapes and the Twinkle model and sampler payloads."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from tinker import types

from twinkle.server.tinker.wire import WireDatum
from twinkle.server.web.errors import BadRequest

ATTN_MODULES = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "in_proj_qkv",
    "in_proj_z",
    "in_proj_a",
    "in_proj_b",
    "out_proj",
    "qkv_proj",
]
MLP_MODULES = ["gate_proj", "up_proj", "down_proj", "gate_up_proj"]
# An MoE model's experts (transformers 5: 3-D parameters, reached by target_parameters only).
EXPERT_PARAMETERS = ["gate_up_proj", "down_proj"]
UNEMBED_MODULES = ["lm_head"]
LORA_ALPHA = 32

# loss_fn -> (required loss_fn_inputs besides target_tokens, accepted loss_fn_config keys)
LOSSES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "cross_entropy": ((), ()),
    "importance_sampling": (("logprobs", "advantages"), ()),
    "ppo": (("logprobs", "advantages"), ("clip_low_threshold", "clip_high_threshold")),
    "cispo": (("logprobs", "advantages"), ("clip_low_threshold", "clip_high_threshold")),
    "dro": (("logprobs", "advantages"), ("beta",)),
    "gspo": (("logprobs", "advantages"), ("clip_low_threshold", "clip_high_threshold")),
    # stable_reinforce's logprobs and weights come from the sampler's records (stability.py).
    "stable_reinforce": (("advantages",), ("clip_high_threshold", "kl_coeff")),
}
# Tinker input name -> Twinkle loss input name.
_INPUT_NAMES = {"weights": "weights", "advantages": "advantages", "logprobs": "old_logprobs"}
# Inputs only some losses take: gspo's ratio mask rides in the loss's per-token weights.
_LOSS_INPUT_NAMES = {"gspo": {"sequence_ratio_mask": "weights"}}


def lora_config(lora: dict[str, Any] | None, moe: bool = False) -> dict[str, Any]:
    """Tinker ``LoraConfig`` -> the Twinkle/PEFT LoRA config (rank, alpha, target modules).

    ``train_mlp`` is "the MLP layers (including MoE layers)" in the SDK: on an MoE base model
    (``moe``) it adapts the experts too (``target_parameters``)."""
    lora = lora or {}
    rank = lora.get("rank", 32)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank <= 0:
        raise BadRequest(f"lora_config.rank must be a positive integer, got {rank!r}")
    targets: list[str] = []
    if lora.get("train_attn", True):
        targets += ATTN_MODULES
    if lora.get("train_mlp", True):
        targets += MLP_MODULES
    if lora.get("train_unembed", True):
        targets += UNEMBED_MODULES
    if not targets:
        raise BadRequest("at least one of train_mlp, train_attn, train_unembed must be true")
    config: dict[str, Any] = {"r": rank, "lora_alpha": LORA_ALPHA, "target_modules": targets}
    if moe and lora.get("train_mlp", True):
        config["target_parameters"] = list(EXPERT_PARAMETERS)
    if lora.get("seed") is not None:
        config["seed"] = int(lora["seed"])
    return config


def lora_flags(config: dict[str, Any]) -> dict[str, Any]:
    """The Tinker view of a stored LoRA config (``weights_info``)."""
    targets = set(config.get("target_modules") or [])
    return {
        "lora_rank": config.get("r"),
        "train_attn": bool(targets & set(ATTN_MODULES)) if targets else None,
        "train_mlp": bool(targets & set(MLP_MODULES) or config.get("target_parameters"))
        if targets
        else None,
        "train_unembed": bool(targets & set(UNEMBED_MODULES)) if targets else None,
    }


def check_loss(loss_fn: str, config: dict[str, Any]) -> dict[str, Any]:
    """The per-request loss spec (``{'name': ..., **config}``) after checking name and keys."""
    if loss_fn not in LOSSES:
        raise BadRequest(f"unknown loss_fn {loss_fn!r}; supported: {', '.join(LOSSES)}")
    _, keys = LOSSES[loss_fn]
    unknown = sorted(set(config) - set(keys))
    if unknown:
        raise BadRequest(
            f"loss_fn {loss_fn!r} does not take loss_fn_config {unknown}; it takes {list(keys) or 'none'}"
        )
    for key, value in config.items():
        if not isinstance(value, float) or not math.isfinite(value):
            raise BadRequest(f"loss_fn_config[{key!r}] must be a finite number")
    if loss_fn == "dro" and "beta" not in config:
        raise BadRequest("loss_fn 'dro' needs loss_fn_config['beta']")
    return {"name": loss_fn, **config}


def datums_to_features(
    data: list[WireDatum], loss_fn: str, vocab_size: int | None
) -> list[dict[str, Any]]:
    """Tinker datums -> Twinkle features with aligned ``target_tokens`` and per-token loss inputs."""
    if not data:
        raise BadRequest("forward_backward needs at least one datum")
    required, _ = LOSSES.get(loss_fn, ((), ()))
    names = {**_INPUT_NAMES, **_LOSS_INPUT_NAMES.get(loss_fn, {})}
    features = []
    for i, datum in enumerate(data):
        n = len(datum.tokens)
        if n == 0:
            raise BadRequest(f"data[{i}]: model_input is empty")
        _check_ids(datum.tokens, vocab_size, f"data[{i}].model_input")
        if "target_tokens" not in datum.inputs:
            raise BadRequest(f"data[{i}]: loss_fn_inputs needs 'target_tokens'")
        missing = [name for name in required if name not in datum.inputs]
        if missing:
            raise BadRequest(f"data[{i}]: loss_fn {loss_fn!r} needs loss_fn_inputs {missing}")
        feature: dict[str, Any] = {"input_ids": list(datum.tokens)}
        for name, values in datum.inputs.items():
            if values.shape[0] != n:
                raise BadRequest(
                    f"data[{i}]: loss_fn_inputs[{name!r}] has {values.shape[0]} values for {n} input tokens"
                )
            if name == "target_tokens":
                targets = values.astype(np.int64)
                _check_ids(targets, vocab_size, f"data[{i}].target_tokens")
                feature["target_tokens"] = targets.tolist()
            elif name in names:
                if not np.all(np.isfinite(values)):
                    raise BadRequest(f"data[{i}]: loss_fn_inputs[{name!r}] has non-finite values")
                if names[name] in feature:
                    raise BadRequest(
                        f"data[{i}]: loss_fn {loss_fn!r} takes {name!r} or its alias, not both"
                    )
                feature[names[name]] = values.astype(np.float32).tolist()
            else:
                raise BadRequest(f"data[{i}]: unknown loss_fn_inputs key {name!r}")
        if getattr(datum, "image_grid_thw", None) is not None:  # image chunks, processed
            feature["pixel_values"] = datum.pixel_values.tolist()
            feature["image_grid_thw"] = datum.image_grid_thw.tolist()
        features.append(feature)
    return features


def _check_ids(ids: Any, vocab_size: int | None, where: str) -> None:
    array = np.asarray(ids)
    if array.size and (
        int(array.min()) < 0 or (vocab_size is not None and int(array.max()) >= vocab_size)
    ):
        bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
        raise BadRequest(f"{where}: token ids must be in {bound}")


def check_prompt(tokens: list[int], vocab_size: int | None) -> None:
    if not tokens:
        raise BadRequest("prompt is empty")
    _check_ids(tokens, vocab_size, "prompt")


def prompt_tokens(prompt: dict[str, Any]) -> list[int]:
    """The token ids of a JSON ``ModelInput`` (encoded-text chunks only)."""
    tokens: list[int] = []
    if not isinstance(prompt, dict) or not isinstance(prompt.get("chunks") or [], list):
        raise BadRequest("prompt must be a ModelInput object with a list of chunks")
    for i, chunk in enumerate(prompt.get("chunks") or []):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("tokens") or [], list):
            raise BadRequest(f"prompt.chunks[{i}] must be an object with a tokens list")
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise BadRequest(
                f"prompt.chunks[{i}]: only encoded_text chunks are supported by this server"
            )
        values = chunk.get("tokens") or []
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in values):
            raise BadRequest(f"prompt.chunks[{i}].tokens must be integers")
        tokens.extend(values)
    return tokens


def sampling_params(
    params: types.SamplingParams, num_samples: int, prompt_logprobs: bool, limits: Any = None
) -> dict[str, Any]:
    """Tinker ``SamplingParams`` -> the Twinkle sampler's ``sampling_params``.

    The SDK's type has checked the types; the ranges are the server's. ``limits`` (a
    :class:`~twinkle.server.gateway.backends.SampleLimits`) bounds ``num_samples`` and
    ``max_tokens``: a request for ten million samples is refused here, not queued.
    """
    stop = params.stop
    stop_items = [stop] if isinstance(stop, str) else list(stop or [])
    stop_strings = [item for item in stop_items if isinstance(item, str)]
    stop_ids = [
        _in_range(item, "sampling_params.stop[]", 0) for item in stop_items if isinstance(item, int)
    ]
    max_tokens = params.max_tokens
    return {
        "max_tokens": 64
        if max_tokens is None
        else _in_range(
            max_tokens, "sampling_params.max_tokens", 0, getattr(limits, "max_sample_tokens", None)
        ),
        "temperature": _number(params.temperature, "sampling_params.temperature", 0),
        "top_p": _number(params.top_p, "sampling_params.top_p", 0, 1, open_low=True),
        "top_k": _in_range(params.top_k, "sampling_params.top_k", -1),
        "seed": params.seed,
        "stop": stop_strings,
        "stop_token_ids": stop_ids,
        "num_samples": _in_range(
            num_samples, "num_samples", 1, getattr(limits, "max_num_samples", None)
        ),
        "logprobs": True,
        "prompt_logprobs": bool(prompt_logprobs),
    }


def _in_range(value: int, name: str, low: int | None, high: int | None = None) -> int:
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise BadRequest(f"{name} must be {bounds} on this server, got {value!r}")
    return value


def _number(
    value: float, name: str, low: float, high: float | None = None, open_low=False
) -> float:
    if not math.isfinite(value):
        raise BadRequest(f"{name} must be a finite number, got {value!r}")
    if value < low or (open_low and value == low) or (high is not None and value > high):
        bounds = f"{'(' if open_low else '['}{low}, {high}]" if high is not None else f">= {low}"
        raise BadRequest(f"{name} must be in {bounds}, got {value!r}")
    return float(value)


def to_twinkle_path(path: str) -> str:
    """``tinker://...`` or ``twinkle://...`` -> the ``twinkle://`` form the state stores."""
    if not isinstance(path, str) or "://" not in path:
        raise BadRequest(
            f"not a checkpoint path: {path!r} (expected tinker://<run>/weights/<name>)"
        )
    scheme, rest = path.split("://", 1)
    if scheme not in ("tinker", "twinkle"):
        raise BadRequest(f"checkpoint paths start with tinker:// or twinkle://, got {path!r}")
    return "twinkle://" + rest


def to_tinker_path(path: str) -> str:
    return "tinker://" + path.split("://", 1)[1]
