"""Build the model a deployment serves, by ``backend`` name (:mod:`twinkle.model.factory`)."""

from __future__ import annotations

from typing import Any

from twinkle.model.factory import create_model


def create_backend(backend: str, model_id: str, **kwargs: Any) -> Any:
    """The shared multi-LoRA model of the registered ``backend`` (``transformers``,
    ``megatron``, ``mock``, or one registered with
    :func:`twinkle.model.factory.register_backend`).

    Args:
        **kwargs: The deployment's placement and options, passed to the backend's builder:
            ``dp_size`` (data-parallel replicas; above 1 with transformers, or megatron with
            tp_size 1, the model is a ``twinkle.parallel.DataParallelModel`` whose ranks are
            Ray actors), ``device_type`` and ``worker_options`` (those replicas' device and
            placement), ``tp_size``, ``pp_size``, ``ep_size`` (megatron: one world of
            ``dp_size * pp_size * tp_size`` worker processes), ``options``, ``torch_dtype``.

    Raises:
        ValueError: An unknown backend (the message lists the registered ones), or
            ``dp_size > 1`` with a backend that runs in one process.
        RuntimeError: ``megatron`` without megatron-core.
    """
    return create_model(backend, model_id, **kwargs)
