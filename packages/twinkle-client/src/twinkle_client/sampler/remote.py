"""Samplers on a server: ``sample`` is one ``POST`` to the sampler deployment."""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from twinkle_client._wire import jsonable
from twinkle_client.client import TwinkleClient, get_default_client
from twinkle_client.sampler.types import (
    SampledSequence,
    SampleResponse,
    SampleResult,
    SamplingParams,
    input_fields,
    use_logprob_pairs,
)

if TYPE_CHECKING:
    import torch


class Sampler:
    """Generates completions on the server, each input with its own adapter.

    Inputs are rendered with the template set by :meth:`set_template` on the server; adapters
    are this API key's ``twinkle://`` checkpoints (what ``model.save`` returns).

    Args:
        model_id: The served base model (``ms://Qwen/Qwen3.5-4B``, ``tiny://qwen3.5``...).

    Attributes:
        client: The :class:`TwinkleClient` used (default: the one ``init_twinkle_client``
            made); assign another to sample under another API key.
    """

    def __init__(self, model_id: str) -> None:
        self.model_id = model_id
        self.template = None
        self.client: TwinkleClient = get_default_client()
        self._named: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model_id={self.model_id!r}, server={self.client.base_url!r})"

    def set_template(self, template: Any, model_id: str | None = None, **kwargs: Any) -> None:
        """Use ``template`` (a registered name such as ``'Qwen3_5Template'``) on the server to
        render this key's trajectory inputs."""
        if not isinstance(template, str):
            template = getattr(template, "__name__", None) or type(template).__name__
        route = self.client.sampler_route(self.model_id)
        self.client.call(route, "set_template", {"template": template, **jsonable(kwargs)})
        self.template = template

    def load_adapter(self, adapter_uri: str | os.PathLike, adapter_name: str | None = None) -> None:
        """Name ``adapter_uri`` for ``sample(adapter_name=...)`` (the server loads it on first use)."""
        if adapter_name is not None:
            self._named[adapter_name] = str(adapter_uri)

    def add_adapter_to_sampler(self, adapter_name: str, config: Any) -> None:
        """Declare the LoRA adapter ``adapter_name`` (a PEFT ``LoraConfig`` or its dict) on the
        server's sampler, for this API key, before its weights arrive.

        ``sample(adapter_name=...)`` accepts the name at once. Until
        :meth:`load_adapter_from_model` hands the model's weights over under the same name,
        sampling with it uses the base model, which is what a freshly initialised LoRA
        (``B = 0``) computes.

        Raises:
            ValueError: An empty name or a config without a positive rank ``r`` (checked on the
                server too).
            TypeError: A config that is neither a PEFT config nor a mapping.
        """
        if not isinstance(adapter_name, str) or not adapter_name:
            raise ValueError(f"adapter_name must be a non-empty string, got {adapter_name!r}")
        if hasattr(config, "to_dict"):
            config = config.to_dict()
        if not isinstance(config, Mapping):
            raise TypeError(
                f"config must be a PEFT LoraConfig or a dict, got {type(config).__name__}"
            )
        route = self.client.sampler_route(self.model_id)
        body = {"adapter_name": adapter_name, "config": jsonable(dict(config))}
        reply = self.client.call(route, "add_adapter_to_sampler", body)
        self._named[adapter_name] = reply["adapter_uri"]

    def load_adapter_from_model(self, model: Any, adapter_name: str | None = None) -> str:
        """Take the current weights of ``model``'s adapter ``adapter_name``, with no checkpoint.

        One call to the server: the model deployment copies the adapter's tensors out of
        memory (after this key's earlier training calls) and hands them to the sampler
        deployment, in process or as binary buffers between replicas; nothing is written to
        disk. Call it again after each ``optim_step`` to sample with the new weights.

        Args:
            model: A ``twinkle_client.model.MultiLoraTransformersModel`` of this sampler's base
                model, trained under this sampler's API key.
            adapter_name: The model's adapter (``None``: its only one, or ``'default'``).

        Returns:
            The uri to pass as ``sample(adapter_uri=...)`` (``inflight://<adapter_name>``);
            ``sample(adapter_name=...)`` with the same name works too.

        Raises:
            ValueError: ``model`` is not a remote model of this sampler's base model.
            NotFoundError: This key has no such adapter (another key's is not visible).
        """
        from twinkle_client.client import API_PREFIX, served_model_name

        base = served_model_name(self.model_id)
        if not hasattr(model, "_name") or served_model_name(str(model.model_id)) != base:
            raise ValueError(
                f"model: expected a twinkle_client MultiLoraTransformersModel of {self.model_id!r}, "
                f"got {model!r}"
            )
        name = model._name(adapter_name) or "default"
        reply = self.client.http.post(
            f"{API_PREFIX}/publish_live_adapter", {"base_model": base, "adapter_name": name}
        )
        self._named[name] = reply["adapter_uri"]
        return reply["adapter_uri"]

    def sample(
        self,
        inputs: Any,
        sampling_params: SamplingParams | Mapping[str, Any] | None = None,
        adapter_uri: str | Sequence[str | None] | None = None,
        adapter_name: str | None = None,
        num_samples: int | None = None,
    ) -> SampleResponse:
        """Sample completions on the server.

        Args:
            inputs: Trajectories, ``InputFeature``s / dicts with ``input_ids`` (used as they
                are, even with ``messages``), or lists of token ids; one input alone is accepted
                too.
            sampling_params: :class:`SamplingParams`, a dict of its fields, another object
                with those field names, or ``None``.
            adapter_uri: A ``twinkle://`` checkpoint path for every input, a list with one
                (or ``None`` for the base model) per input, or ``None``.
            adapter_name: A name given with :meth:`load_adapter`, :meth:`add_adapter_to_sampler`
                or :meth:`load_adapter_from_model`; ``''`` is no adapter.
            num_samples: Sequences per input, instead of ``sampling_params.num_samples``.

        Returns:
            One :class:`SampleResult` per input, in order; each sequence's
            ``new_input_feature`` is the input with that completion, ready to train on.

        Raises:
            ValueError: Invalid parameters (checked here, before any request).
            NotFoundError: An unknown or another key's checkpoint.
        """
        params = _with_num_samples(SamplingParams.coerce(sampling_params), num_samples)
        adapter_name = adapter_name or None
        if adapter_name is not None:
            if adapter_uri is not None:
                raise ValueError("pass adapter_uri or adapter_name, not both")
            if adapter_name not in self._named:
                raise ValueError(
                    f"unknown adapter_name {adapter_name!r}: call load_adapter(uri, adapter_name) first"
                )
            adapter_uri = self._named[adapter_name]
        originals = _input_list(inputs)
        items = [jsonable(item) for item in originals]
        if isinstance(adapter_uri, os.PathLike):
            adapter_uri = os.fspath(adapter_uri)
        body = {
            "inputs": items,
            "sampling_params": jsonable(params),
            "adapter_uri": adapter_uri
            if adapter_uri is None or isinstance(adapter_uri, str)
            else list(adapter_uri),
        }
        reply = self.client.call(self.client.sampler_route(self.model_id), "sample", body)
        response = SampleResponse(
            _result(r, input_fields(item)) for r, item in zip(reply["results"], originals)
        )
        use_logprob_pairs(response, params)
        return response


class TorchSampler(Sampler):
    """The server's sampler, for scripts written against ``twinkle.sampler.TorchSampler``.

    ``max_loras``, ``allowed_adapter_dirs``, ``device`` and ``torch_dtype`` belong to the
    server's config; passing them warns and changes nothing.
    """

    def __init__(
        self,
        model_id: str,
        max_loras: int = 8,
        allowed_adapter_dirs: list[str | os.PathLike] | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(model_id)
        _warn_server_side(
            max_loras=(max_loras, 8),
            allowed_adapter_dirs=(allowed_adapter_dirs, None),
            device=(device, None),
            torch_dtype=(torch_dtype, None),
        )


class vLLMSampler(Sampler):  # noqa: N801 - the name twinkle.sampler uses
    """The server's sampler, for scripts written against ``twinkle.sampler.vLLMSampler``.

    ``engine_args`` and ``allowed_adapter_dirs`` belong to the server's config; passing them
    warns and changes nothing.
    """

    def __init__(
        self,
        model_id: str,
        engine_args: dict[str, Any] | None = None,
        allowed_adapter_dirs: list[str | os.PathLike] | None = None,
    ) -> None:
        super().__init__(model_id)
        _warn_server_side(
            engine_args=(engine_args, None), allowed_adapter_dirs=(allowed_adapter_dirs, None)
        )


class MockSampler(Sampler):
    """The server's sampler, for scripts written against ``twinkle.sampler.MockSampler``.

    The model's sizes and ``allowed_adapter_dirs`` belong to the server's config; passing them
    warns and changes nothing.
    """

    def __init__(
        self,
        model_id: str = "mock",
        vocab_size: int | None = None,
        hidden_size: int = 16,
        seed: int = 0,
        allowed_adapter_dirs: list[str | os.PathLike] | None = None,
    ) -> None:
        super().__init__(model_id)
        _warn_server_side(
            vocab_size=(vocab_size, None),
            hidden_size=(hidden_size, 16),
            seed=(seed, 0),
            allowed_adapter_dirs=(allowed_adapter_dirs, None),
        )


def _warn_server_side(**given: tuple[Any, Any]) -> None:
    ignored = [name for name, (value, default) in given.items() if value != default]
    if ignored:
        warnings.warn(
            f"{', '.join(ignored)}: set by the server's config for a remote sampler; ignored here",
            stacklevel=3,
        )


def _with_num_samples(params: SamplingParams, num_samples: int | None) -> SamplingParams:
    if num_samples is None or num_samples == params.num_samples:
        return params
    if params.num_samples != 1:
        raise ValueError(
            f"num_samples={num_samples} but sampling_params.num_samples={params.num_samples}; "
            "give one of them"
        )
    return dataclasses.replace(params, num_samples=num_samples)


def _input_list(inputs: Any) -> list[Any]:
    if isinstance(inputs, Mapping) or hasattr(inputs, "messages") or _is_token_list(inputs):
        inputs = [inputs]
    items = list(inputs)
    if not items:
        raise ValueError("inputs is empty")
    return items


def _is_token_list(value: Any) -> bool:
    if hasattr(value, "ndim"):
        return value.ndim == 1
    return (
        isinstance(value, (list, tuple)) and bool(value) and all(isinstance(t, int) for t in value)
    )


def _result(wire: dict[str, Any], fields: dict[str, Any]) -> SampleResult:
    return SampleResult(
        prompt_tokens=list(wire["prompt_tokens"]),
        sequences=[
            SampledSequence(
                tokens=list(s["tokens"]),
                logprobs=list(s.get("logprobs") or []),
                stop_reason=s["stop_reason"],
                text=s.get("text", ""),
                topk_logprobs=_pairs(s.get("topk_logprobs")),
            )
            for s in wire["sequences"]
        ],
        prompt_logprobs=wire.get("prompt_logprobs"),
        extra=dict(wire.get("extra") or {}),
        topk_prompt_logprobs=_pairs(wire.get("topk_prompt_logprobs")),
        target_prompt_logprobs=wire.get("target_prompt_logprobs"),
        prompt_alt_tokens=_pairs(wire.get("prompt_alt_tokens")),
        input_fields=fields,
    )


def _pairs(rows: Any) -> Any:
    """JSON ``[[id, logprob], ...]`` rows back to ``(id, logprob)`` tuples (``None`` rows kept)."""
    if rows is None:
        return None
    return [None if row is None else [(int(t), float(lp)) for t, lp in row] for row in rows]
