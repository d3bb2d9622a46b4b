"""Build a multi-LoRA training model by backend name, from a registry of backends.

Each backend registers a builder under its name with :func:`register_backend`, in its own
package (``twinkle.model.transformers._backend``, ``twinkle.model.megatron._backend``,
``twinkle.model.mock._backend``). The built-in backends' modules are imported only when their
name is asked for, so that building a ``mock`` model never imports torch. Another package adds a backend the same way::

    @register_backend("my_backend")
    def build(model_id: str, **kwargs) -> TrainingModel: ...

A builder takes the model id and the deployment's keyword arguments (``dp_size``,
``device_type``, ``worker_options``, ``tp_size``, ``pp_size``, ``ep_size``, ``options``,
backend-specific ones) and refuses what it cannot build.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from twinkle.errors import InvalidArgumentError

#: A backend's builder: ``builder(model_id, **kwargs)`` returns the model.
Builder = Callable[..., Any]

_BUILDERS: dict[str, Builder] = {}
#: The modules that register the built-in backends, imported on first use of their name.
_BUILT_IN = {
    "transformers": "twinkle.model.transformers._backend",
    "megatron": "twinkle.model.megatron._backend",
    "mock": "twinkle.model.mock._backend",
}


def register_backend(name: str) -> Callable[[Builder], Builder]:
    """Register the decorated function as the builder of backend ``name``.

    Raises:
        InvalidArgumentError: ``name`` already has another builder.
    """

    def decorate(builder: Builder) -> Builder:
        held = _BUILDERS.get(name)
        if held is not None and held is not builder:
            raise InvalidArgumentError(f"backend {name!r} is registered already ({held!r})")
        _BUILDERS[name] = builder
        return builder

    return decorate


def registered_backends() -> list[str]:
    """Every backend name :func:`create_model` accepts (the built-in ones and those
    registered since), sorted."""
    return sorted(set(_BUILDERS) | set(_BUILT_IN))


def create_model(backend: str, model_id: str, **kwargs: Any) -> Any:
    """The shared multi-LoRA model of ``backend`` for ``model_id``.

    Args:
        backend: A registered backend name (:func:`registered_backends`).
        model_id: ``tiny://qwen3``, ``ms://org/name``, ``hf://org/name`` or a local directory.
        **kwargs: Passed to the backend's builder.

    Raises:
        InvalidArgumentError: An unknown backend (the message lists the registered ones), or
            options the backend refuses.
    """
    if backend not in _BUILDERS and backend in _BUILT_IN:
        importlib.import_module(_BUILT_IN[backend])  # registers its builder
    builder = _BUILDERS.get(backend)
    if builder is None:
        raise InvalidArgumentError(
            f"unknown backend {backend!r}; registered backends: {', '.join(registered_backends())}"
        )
    return builder(model_id, **kwargs)


def data_parallel_model(
    backend: str,
    model_id: str,
    dp_size: int,
    device_type: str | None = None,
    worker_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """``dp_size`` replicas of ``backend``'s model as Ray actors
    (:class:`twinkle.parallel.DataParallelModel`), for the builders that support it."""
    from twinkle.parallel import DataParallelModel

    if backend != "transformers":
        kwargs["model_backend"] = backend
    return DataParallelModel(
        model_id, dp_size, device_type or "cpu", **(worker_options or {}), **kwargs
    )


def refuse_data_parallel(backend: str, dp_size: int) -> None:
    """Refuse ``dp_size > 1`` for a backend that runs in one process.

    Raises:
        InvalidArgumentError: ``dp_size`` above 1.
    """
    if dp_size > 1:
        raise InvalidArgumentError(
            f"dp_size {dp_size} > 1 needs backend 'transformers' or 'megatron' "
            f"(backend is '{backend}'): {backend} runs in one process"
        )


__all__ = [
    "Builder",
    "create_model",
    "data_parallel_model",
    "refuse_data_parallel",
    "register_backend",
    "registered_backends",
]
