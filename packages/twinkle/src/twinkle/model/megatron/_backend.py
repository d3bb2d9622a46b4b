"""The ``megatron`` backend's builder (:mod:`twinkle.model.factory`)."""

from __future__ import annotations

from typing import Any

from twinkle.model.factory import data_parallel_model, register_backend


@register_backend("megatron")
def build_megatron(
    model_id: str,
    dp_size: int = 1,
    device_type: str | None = None,
    worker_options: dict[str, Any] | None = None,
    tp_size: int = 1,
    pp_size: int = 1,
    **kwargs: Any,
) -> Any:
    """The megatron-core model for ``model_id``.

    With tensor, pipeline or expert parallelism (``tp_size``, ``pp_size`` or ``ep_size`` above
    1) it is one world of ``dp_size * pp_size * tp_size`` worker processes
    (:class:`~twinkle.model.megatron.parallel.ParallelMegatronModel`, dp: its groups); with
    ``dp_size`` above 1 alone, ``dp_size`` replicas of :class:`MultiLoraMegatronModel` as Ray
    actors; else one :class:`MultiLoraMegatronModel` in this process.

    Raises:
        RuntimeError: megatron-core is not installed.
    """
    ep_size = int(kwargs.get("ep_size", 1) or 1)  # MoE: experts over that many ranks
    one_world = tp_size > 1 or pp_size > 1 or ep_size > 1
    if dp_size > 1 and not one_world:
        return data_parallel_model(
            "megatron", model_id, dp_size, device_type, worker_options, **kwargs
        )
    try:
        import megatron.core  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(
            "backend 'megatron' needs megatron-core (pip install megatron-core==0.16.1); "
            "use backend 'transformers' on this machine"
        ) from exc
    if one_world:
        from twinkle.model.megatron import parallel

        return parallel.ParallelMegatronModel(
            model_id, tp_size=tp_size, pp_size=pp_size, dp_size=dp_size, **kwargs
        )
    from twinkle.model.megatron.multi_lora import MultiLoraMegatronModel

    return MultiLoraMegatronModel(model_id=model_id, **kwargs)
