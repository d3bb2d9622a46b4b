"""Build the model a deployment serves, by ``backend`` name, importing only what it needs."""

from __future__ import annotations

from typing import Any


def create_backend(
    backend: str,
    model_id: str,
    dp_size: int = 1,
    device_type: str | None = None,
    worker_options: dict[str, Any] | None = None,
    tp_size: int = 1,
    pp_size: int = 1,
    **kwargs: Any,
) -> Any:
    """The shared multi-LoRA model for ``backend`` in ``transformers | megatron | mock``.

    Args:
        dp_size: Data-parallel replicas; above 1 (transformers, or megatron with tp_size 1) the
            model is a ``twinkle.parallel.DataParallelModel`` whose ranks are Ray actors.
        device_type: ``cpu`` or ``cuda`` of the replicas (``device_mesh.device_type``).
        worker_options: ``DataParallelModel`` placement options (``num_cpus``, ``resources``).
        tp_size: Tensor-parallel ranks of the megatron backend (worker processes; 1: in process).
        pp_size: Pipeline stages of the megatron backend. With tp or pp > 1 the megatron model
            is one world of ``dp_size * pp_size * tp_size`` worker processes (dp: its groups).

    Raises:
        ValueError: Unknown backend, or ``dp_size > 1`` with a backend other than transformers.
        RuntimeError: ``megatron`` without megatron-core.
    """
    ep_size = int(kwargs.get("ep_size", 1) or 1)  # megatron MoE: experts over that many ranks
    one_world = backend == "megatron" and (tp_size > 1 or pp_size > 1 or ep_size > 1)
    if dp_size > 1 and not one_world:
        if backend not in ("transformers", "megatron"):
            raise ValueError(
                f"dp_size {dp_size} > 1 needs backend 'transformers' or 'megatron' "
                f"(backend is '{backend}'): mock runs in one process"
            )
        from twinkle.parallel import DataParallelModel

        if backend == "megatron":
            kwargs["model_backend"] = "megatron"  # each replica a MultiLoraMegatronModel
        return DataParallelModel(
            model_id, dp_size, device_type or "cpu", **(worker_options or {}), **kwargs
        )
    if backend == "transformers":
        from twinkle.model import MultiLoraTransformersModel

        return MultiLoraTransformersModel(model_id=model_id, **kwargs)
    if backend == "mock":
        from twinkle.model import MockModel

        # The vocabulary of the model id's tokenizer, so real tokenized data fits the mock model.
        return MockModel.for_model(model_id)
    if backend == "megatron":
        try:
            import megatron.core  # noqa: F401
        except ImportError as exc:
            raise RuntimeError(
                "backend 'megatron' needs megatron-core (pip install megatron-core==0.16.1); "
                "use backend 'transformers' on this machine"
            ) from exc
        if one_world:
            from twinkle.model.megatron.parallel import ParallelMegatronModel

            return ParallelMegatronModel(
                model_id, tp_size=tp_size, pp_size=pp_size, dp_size=dp_size, **kwargs
            )
        from twinkle.model.megatron import MultiLoraMegatronModel

        return MultiLoraMegatronModel(model_id=model_id, **kwargs)
    raise ValueError(f"unknown backend {backend!r}; choose transformers, megatron or mock")
