"""ModelScope Twinkle's extensions of Tinker's training calls, beside the protocol's own losses.

- ``loss_fn_config={'disable_lora': True}`` on ``forward`` (or ``forward_backward``): a pass of
  the base model alone, the reference of DPO. It trains nothing: a ``forward_backward`` so marked
  runs as a forward (its adapter gradients would be zero). Only ``cross_entropy`` may be asked for;
  its ``loss:sum`` is ``-sum(logprobs * weights)`` of the base model.
- DPO through ``importance_sampling``: datums carrying ``ref_logps`` (the reference pass's
  per-token ``logprobs``), in (chosen, rejected) pairs, are trained with ``DPOLoss``;
  ``loss_fn_config`` takes ``dpo_beta``, ``dpo_sft_weight`` and ``dpo_loss_type``. The step's
  ``dpo/<metric>:mean`` values come back in the ``forward_backward`` metrics.

Every other call is Tinker's own (:mod:`.convert`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from twinkle.server.tinker import convert
from twinkle.server.tinker.wire import WireForwardBackward
from twinkle.server.web.errors import BadRequest

DISABLE_LORA = "disable_lora"
REF_LOGPS = "ref_logps"
# DPO's loss_fn_config key -> DPOLoss argument.
_DPO_CONFIG = {"dpo_beta": "beta", "dpo_sft_weight": "sft_weight", "dpo_loss_type": "loss_type"}
_DPO_INPUTS = {"target_tokens", "weights", REF_LOGPS}
_DPO_METRICS = ("reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward")


def take_disable_lora(msg: WireForwardBackward) -> bool:
    """Remove ``disable_lora`` from the call's ``loss_fn_config``; whether it was set.

    Raises:
        BadRequest: ``disable_lora`` with a loss other than ``cross_entropy``.
    """
    value = msg.loss_fn_config.pop(DISABLE_LORA, 0.0)
    if value not in (0.0, 1.0):
        raise BadRequest(f"loss_fn_config['disable_lora'] must be true or false, got {value!r}")
    if value and msg.loss_fn != "cross_entropy":
        raise BadRequest(
            "loss_fn_config['disable_lora'] runs the base model as a reference pass: use "
            f"loss_fn 'cross_entropy' with it, not {msg.loss_fn!r}"
        )
    return bool(value)


def is_dpo(msg: WireForwardBackward) -> bool:
    """An ``importance_sampling`` call whose datums carry reference log-probabilities."""
    return msg.loss_fn == "importance_sampling" and any(REF_LOGPS in d.inputs for d in msg.data)


def features_and_loss(
    msg: WireForwardBackward, vocab_size: int | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The model call's features and per-request loss spec of a non-custom Tinker call."""
    if not is_dpo(msg):
        loss = convert.check_loss(msg.loss_fn, msg.loss_fn_config)
        return convert.datums_to_features(msg.data, msg.loss_fn, vocab_size), loss
    return _dpo_features(msg, vocab_size), _dpo_loss(msg.loss_fn_config, len(msg.data))


def _dpo_loss(config: dict[str, Any], rows: int) -> dict[str, Any]:
    unknown = sorted(set(config) - set(_DPO_CONFIG))
    if unknown:
        raise BadRequest(
            f"DPO (importance_sampling with ref_logps) does not take loss_fn_config {unknown}; "
            f"it takes {list(_DPO_CONFIG)}"
        )
    if rows % 2:
        raise BadRequest(
            f"DPO (importance_sampling with ref_logps) takes (chosen, rejected) pairs of datums; "
            f"got {rows} datums"
        )
    loss: dict[str, Any] = {"name": "DPOLoss"}
    for key, value in config.items():
        if key == "dpo_loss_type" and not isinstance(value, str):
            raise BadRequest("loss_fn_config['dpo_loss_type'] must be a string")
        if key != "dpo_loss_type" and not isinstance(value, float):
            raise BadRequest(f"loss_fn_config[{key!r}] must be a number")
        loss[_DPO_CONFIG[key]] = value
    return loss


def _dpo_features(msg: WireForwardBackward, vocab_size: int | None) -> list[dict[str, Any]]:
    refs = []
    for i, datum in enumerate(msg.data):
        if REF_LOGPS not in datum.inputs:
            raise BadRequest(
                f"data[{i}]: loss_fn_inputs needs 'ref_logps' (DPO: every datum carries the "
                "reference pass's logprobs)"
            )
        unknown = sorted(set(datum.inputs) - _DPO_INPUTS)
        if unknown:
            raise BadRequest(
                f"data[{i}]: DPO takes loss_fn_inputs {sorted(_DPO_INPUTS)}, not {unknown}"
            )
        refs.append(datum.inputs.pop(REF_LOGPS))
    features = convert.datums_to_features(msg.data, "cross_entropy", vocab_size)
    for i, (feature, ref) in enumerate(zip(features, refs)):
        n = len(feature["input_ids"])
        if ref.shape[0] < n:
            raise BadRequest(
                f"data[{i}]: loss_fn_inputs['ref_logps'] has {ref.shape[0]} values for "
                f"{n} input tokens"
            )
        ref = ref[:n]  # a reference padded past the datum: the padding is never trained
        if not np.all(np.isfinite(ref)):
            raise BadRequest(f"data[{i}]: loss_fn_inputs['ref_logps'] has non-finite values")
        feature["ref_logprobs"] = ref.astype(np.float32).tolist()
    return features


def reference_loss(msg: WireForwardBackward, logprobs: list[Any]) -> float:
    """``cross_entropy`` of a ``disable_lora`` pass: ``-sum(logprobs * weights)``."""
    total = 0.0
    for datum, lp in zip(msg.data, logprobs):
        lp_T = np.asarray(lp, dtype=np.float64)
        weights = datum.inputs.get("weights")
        w_T = np.ones_like(lp_T) if weights is None else np.asarray(weights, dtype=np.float64)
        total -= float((lp_T * w_T[: lp_T.shape[0]]).sum())
    return total


def loss_metrics(loss: dict[str, Any] | None, result: dict[str, Any]) -> dict[str, float]:
    """``dpo/<name>:mean`` of a DPO step (empty for every other loss)."""
    if not isinstance(loss, dict) or loss.get("name") != "DPOLoss":
        return {}
    metrics = result.get("metrics") or {}
    return {
        f"dpo/{name}:mean": float(metrics[name])
        for name in _DPO_METRICS
        if isinstance(metrics.get(name), (int, float))
    }


__all__ = ["features_and_loss", "is_dpo", "loss_metrics", "reference_loss", "take_disable_lora"]
