"""The ``transformers`` backend's builder (:mod:`twinkle.model.factory`)."""

from __future__ import annotations

from typing import Any

from twinkle.model.factory import data_parallel_model, register_backend


@register_backend("transformers")
def build_transformers(
    model_id: str,
    dp_size: int = 1,
    device_type: str | None = None,
    worker_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """A :class:`MultiLoraTransformersModel`, or with ``dp_size`` above 1 that many replicas
    of it as Ray actors (``device_type`` and ``worker_options`` place them).

    Args:
        **kwargs: Passed to the model (``torch_dtype``, ``options``, ...).
    """
    if dp_size > 1:
        return data_parallel_model(
            "transformers", model_id, dp_size, device_type, worker_options, **kwargs
        )
    from twinkle.model.transformers.multi_lora import MultiLoraTransformersModel

    return MultiLoraTransformersModel(model_id=model_id, **kwargs)
