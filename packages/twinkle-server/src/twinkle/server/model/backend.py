"""Build the model a deployment serves, by ``backend`` name, importing only what it needs."""

from __future__ import annotations

from typing import Any


def create_backend(backend: str, model_id: str, **kwargs: Any) -> Any:
    """The shared multi-LoRA model for ``backend`` in ``transformers | megatron | mock``.

    Raises:
        ValueError: Unknown backend.
        RuntimeError: ``megatron`` without megatron-core (and CUDA).
    """
    if backend == "transformers":
        from twinkle.model import MultiLoraTransformersModel

        return MultiLoraTransformersModel(model_id=model_id, **kwargs)
    if backend == "mock":
        from twinkle.model import MockModel

        return MockModel(model_id=model_id)
    if backend == "megatron":
        try:
            import megatron.core  # noqa: F401
        except ImportError as exc:
            raise RuntimeError(
                "backend 'megatron' needs megatron-core and CUDA (pip install megatron-core); "
                "use backend 'transformers' on this machine"
            ) from exc
        raise RuntimeError("backend 'megatron' is not available in this build of twinkle-server")
    raise ValueError(f"unknown backend {backend!r}; choose transformers, megatron or mock")
