"""The sampler deployment's logic: resolve each tenant's adapter paths, sample on one worker thread."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from twinkle.sampler.base import check_prompt_lengths
from twinkle.server.images import check_request_images
from twinkle.server.ratelimit import RateLimiter
from twinkle.server.sampler.protocol import (
    INFLIGHT_SCHEME,
    SampleLimits,
    decode_adapter_state,
    sampler_key,
)
from twinkle.server.web.encoding import jsonable
from twinkle.server.web.errors import BadRequest, NotFound, from_exception
from twinkle_client.sampler.types import SamplingParams

MAX_LIVE_ADAPTERS_PER_KEY = 8
"""Live adapters one key holds on a sampler; publishing a ninth name drops its oldest."""

MAX_DECLARED_ADAPTERS_PER_KEY = 64
"""Names one key may declare with ``add_adapter_to_sampler``; a 65th drops its oldest."""


def sequence_to_wire(seq: Any) -> dict[str, Any]:
    """One sequence as JSON; ``new_input_feature`` stays behind (the client rebuilds it from its
    own input and these fields)."""
    return {
        "tokens": list(seq.tokens),
        "logprobs": [float(lp) for lp in seq.logprobs],
        "stop_reason": seq.stop_reason,
        "text": seq.text,
        "topk_logprobs": seq.topk_logprobs,
    }


def result_to_wire(result: Any) -> dict[str, Any]:
    return {
        "prompt_tokens": list(result.prompt_tokens),
        "sequences": [sequence_to_wire(seq) for seq in result.sequences],
        "prompt_logprobs": result.prompt_logprobs,
        "extra": jsonable(result.extra),
        "topk_prompt_logprobs": result.topk_prompt_logprobs,
        "target_prompt_logprobs": result.target_prompt_logprobs,
        "prompt_alt_tokens": result.prompt_alt_tokens,
    }


def tensor_state(payload: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(PEFT config, tensors) of a ``publish_adapter`` payload carrying tensors; a malformed
    one is a 400 naming the field."""
    import torch

    config, tensors = payload.get("config"), payload.get("tensors")
    if not isinstance(config, dict):
        raise BadRequest("publish_adapter: config must be an object (the adapter's PEFT config)")
    if not isinstance(tensors, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in tensors.items()
    ):
        raise BadRequest(
            "publish_adapter: tensors must map weight names to tensors (from another "
            "deployment); over HTTP send weights_b64"
        )
    return dict(config), tensors


def _render(template: Any, item: Any) -> Any:
    if isinstance(item, dict) and "messages" in item and "input_ids" not in item:
        feature = template.encode(item, add_generation_prompt=True)
        ids = feature["input_ids"].tolist()
        if feature.get("image_grid_thw") is None:
            return ids
        # The images go along with their tokens (a replica renders nothing itself).
        return {
            "input_ids": ids,
            "pixel_values": feature["pixel_values"],
            "image_grid_thw": feature["image_grid_thw"],
        }
    return item


class SamplerService:
    """Sampling for every tenant on one sampler; adapters are the tenants' own checkpoints.

    Args:
        sampler: A ``twinkle.sampler.Sampler`` (torch or vLLM).
        base_model: The name clients use for the model.
        resolve_adapter: ``(owner, path) -> local directory``; refuses other tenants' paths.
        rate_limiter: Per-tenant request/token limits.
    """

    def __init__(
        self,
        sampler: Any,
        base_model: str,
        resolve_adapter,
        rate_limiter: RateLimiter | None = None,
        executor: ThreadPoolExecutor | None = None,
        limits: SampleLimits | None = None,
    ) -> None:
        self.sampler = sampler
        self.limits = limits or SampleLimits()
        self.base_model = base_model
        self.resolve_adapter = resolve_adapter
        self.rate_limiter = rate_limiter or RateLimiter()
        self.templates: dict[str, Any] = {}
        # One thread per engine: a data-parallel sampler serves that many requests at once; an
        # in-process one runs on the thread that built it (``executor``, see ``model_thread``).
        workers = getattr(sampler, "dp_size", 1)
        self._executor = executor or ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="twinkle-sampler"
        )
        self.requests = 0
        # Each key's live (inflight) adapters, least recently published first: at most
        # MAX_LIVE_ADAPTERS_PER_KEY each, so publishing new names cannot grow memory unbounded.
        self._live: dict[str, OrderedDict[str, None]] = {}
        # Each key's names declared by add_adapter_to_sampler (name -> LoRA config): they
        # sample the base model until weights are published under them.
        self._declared: dict[str, OrderedDict[str, dict[str, Any]]] = {}

    async def call(self, owner: str, op: str, payload: dict[str, Any] | None = None) -> Any:
        payload = dict(payload or {})
        if op == "set_template":
            return self._set_template(owner, payload)
        if op == "publish_adapter":
            return await self._publish_adapter(owner, payload)
        if op == "add_adapter_to_sampler":
            return self._declare_adapter(owner, payload)
        if op == "live_adapters":
            return {"adapter_uris": self._live_uris(owner)}
        if op != "sample":
            raise NotFound(
                f"unknown sampler operation {op!r}; known: sample, set_template, "
                "publish_adapter, add_adapter_to_sampler, live_adapters"
            )
        inputs = payload.get("inputs")
        if not isinstance(inputs, list) or not inputs:
            raise BadRequest(
                "inputs must be a non-empty list of trajectories, features or token-id lists"
            )
        check_request_images(inputs)
        params = self._check_params(payload.get("sampling_params"))
        lengths = [_prompt_length(x) for x in inputs]
        # Token inputs are measured here, before the queue; trajectories once rendered, by the
        # sampler itself (every replica is built with the same max_length).
        try:
            check_prompt_lengths(lengths, params.max_tokens, self.limits.max_length)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        self.rate_limiter.check(owner, sum(n or 0 for n in lengths))
        uris = self._adapter_dirs(owner, payload.get("adapter_uri"), len(inputs))
        loop = asyncio.get_running_loop()
        try:
            response = await loop.run_in_executor(
                self._executor, self._sample, owner, inputs, params, uris
            )
        except Exception as exc:
            raise from_exception(exc) from exc
        self.requests += 1
        return {"results": [result_to_wire(r) for r in response]}

    def _check_params(self, value: Any) -> SamplingParams:
        """Validated params within this sampler's limits: a caller's mistake is a 400 here, not
        a ``ValueError`` (500) on the sampler's thread."""
        try:
            params = SamplingParams.coerce(value)
        except (ValueError, TypeError) as exc:
            raise BadRequest(f"sampling_params: {exc}") from None
        for name, limit in (
            ("num_samples", self.limits.max_num_samples),
            ("max_tokens", self.limits.max_sample_tokens),
        ):
            if getattr(params, name) > limit:
                raise BadRequest(
                    f"sampling_params.{name} is {getattr(params, name)}; this sampler allows "
                    f"at most {limit}"
                )
        return params

    def _set_template(self, owner: str, payload: dict[str, Any]) -> dict[str, Any]:
        from twinkle.template import get_template

        name = payload.pop("template", None)
        if not isinstance(name, str):
            raise BadRequest("template must be given by name over HTTP, e.g. 'Qwen3_5Template'")
        payload["model_id"] = self.sampler.model_id
        try:
            self.templates[owner] = get_template(name, **payload)
        except (ValueError, TypeError) as exc:
            raise BadRequest(str(exc)) from exc
        return {"ok": True}

    def _declare_adapter(self, owner: str, payload: dict[str, Any]) -> dict[str, Any]:
        """``add_adapter_to_sampler``: name an adapter of ``owner`` before its weights arrive;
        answers the ``inflight://`` uri that samples with it."""
        name, config = payload.get("adapter_name"), payload.get("config")
        if not isinstance(name, str) or not name or "/" in name:
            raise BadRequest(
                f"add_adapter_to_sampler: adapter_name must be a non-empty name without '/', "
                f"got {name!r}"
            )
        if not isinstance(config, dict):
            raise BadRequest("add_adapter_to_sampler: config must be an object (a LoRA config)")
        rank = config.get("r", 8)
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
            raise BadRequest(
                f"add_adapter_to_sampler: config.r must be an integer >= 1, got {rank!r}"
            )
        uri = f"{INFLIGHT_SCHEME}{name}"
        declared = self._declared.setdefault(owner, OrderedDict())
        declared[uri] = dict(config)
        declared.move_to_end(uri)
        while len(declared) > MAX_DECLARED_ADAPTERS_PER_KEY:
            declared.popitem(last=False)
        return {"adapter_name": name, "adapter_uri": uri}

    def _live_pool(self) -> Any:
        """The sampler's pool of adapters published from memory, or ``None`` where the sampler
        declares none (``Sampler.live_adapters``; a data-parallel sampler declares nothing)."""
        return self.sampler.adapters if getattr(self.sampler, "live_adapters", False) else None

    async def _publish_adapter(self, owner: str, payload: dict[str, Any]) -> dict[str, Any]:
        """An ``inflight://<model_id>`` adapter of ``owner`` from memory (see
        :mod:`twinkle.server.tinker.inflight`); replaces what that key held."""
        pool = self._live_pool()
        if pool is None:
            raise BadRequest("this sampler cannot load adapters from memory (inflight sampling)")
        uri = payload.get("adapter_uri")
        if not isinstance(uri, str):
            raise BadRequest("publish_adapter: adapter_uri must be a string (inflight://<name>)")
        key = sampler_key(owner, uri)
        # ``tensors``: from another deployment (in process or through a Ray handle, binary);
        # ``weights_b64``: the JSON form a client can send.
        config, state = (
            tensor_state(payload) if "tensors" in payload else decode_adapter_state(payload)
        )
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, pool.put_state, key, config, state)
        except Exception as exc:
            raise from_exception(exc) from exc
        live = self._live.setdefault(owner, OrderedDict())
        live[key] = None
        live.move_to_end(key)
        while len(live) > MAX_LIVE_ADAPTERS_PER_KEY:
            oldest, _ = live.popitem(last=False)
            await loop.run_in_executor(self._executor, pool.drop_state, oldest)
        return {"ok": True}

    def _live_uris(self, owner: str) -> list[str]:
        """``owner``'s live adapters on this sampler (``inflight://<name>``), oldest first."""
        pool = self._live_pool()
        prefix = sampler_key(owner, INFLIGHT_SCHEME)
        return [
            INFLIGHT_SCHEME + key[len(prefix) :]
            for key in self._live.get(owner, ())
            if pool is not None and pool.has_state(key)
        ]

    def _adapter_dirs(self, owner: str, adapter_uri: Any, count: int) -> list[str | None] | None:
        if adapter_uri is None:
            return None
        uris = adapter_uri if isinstance(adapter_uri, list) else [adapter_uri] * count
        if len(uris) != count:
            raise BadRequest(f"adapter_uri has {len(uris)} entries for {count} inputs")
        return [
            None
            if uri is None
            else self._live_key(owner, uri)
            if str(uri).startswith(INFLIGHT_SCHEME)
            else str(self.resolve_adapter(owner, uri))
            for uri in uris
        ]

    def _live_key(self, owner: str, uri: str) -> str | None:
        """The pool key of ``owner``'s live adapter ``uri``; ``None`` (the base model) for a
        name declared with ``add_adapter_to_sampler`` and not published yet; 404 when this key
        has neither under that name (another tenant's name is simply not there)."""
        key = sampler_key(owner, uri)
        pool = self._live_pool()
        published = pool is not None and pool.has_state(key)
        if published:
            return key
        if uri in self._declared.get(owner, {}):
            return None
        raise NotFound(
            f"adapter_uri {uri!r}: no live adapter of this key under that name on this "
            "sampler; publish it first (sampler.load_adapter_from_model, or a Tinker "
            "inflight save)"
        )

    def _sample(
        self, owner: str, inputs: list, sampling_params: Any, uris: list[str | None] | None
    ):
        template = self.templates.get(owner)
        if getattr(self.sampler, "dp_size", 1) > 1:
            # Replicas are shared by every tenant: render the tenant's trajectories here, send tokens.
            if template is not None:
                inputs = [_render(template, item) for item in inputs]
        else:
            # Each tenant renders with its own template; calls run one at a time on this thread.
            self.sampler.template = template
        return self.sampler.sample(inputs, sampling_params=sampling_params, adapter_uri=uris)

    def status(self) -> dict[str, Any]:
        return {"base_model": self.base_model, "requests": self.requests}


def _prompt_length(item: Any) -> int | None:
    """Prompt tokens of one input (token ids, or a feature's ``input_ids``); ``None`` for a
    trajectory, measured once rendered, or a shape the sampler then refuses with a 400 naming it
    (neither the rate nor the length check may turn a malformed input into a 500)."""
    ids = (
        item
        if isinstance(item, list)
        else item.get("input_ids")
        if isinstance(item, dict)
        else None
    )
    return len(ids) if isinstance(ids, (list, tuple)) else None
