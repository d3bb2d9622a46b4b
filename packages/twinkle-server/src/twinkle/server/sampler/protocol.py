"""The sampler deployment's protocol: what its callers (the gateway, the Tinker API) and the
sampler itself agree on, without importing the sampler's service.

- :class:`SampleLimits`: what one sampling request may ask of a sampler, checked by the gateway
  before the request is queued and by the sampler itself.
- The live-adapter key scheme of ``publish_adapter``: a tenant's in-memory adapter is published
  as ``inflight://<name>`` and held in the sampler's pool under the tenant-scoped key
  :func:`sampler_key`; :func:`decode_adapter_state` reads the JSON form of a publish payload.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from twinkle.server.config import ModelArgs, base_model_name
from twinkle.server.web.errors import BadRequest

INFLIGHT_SCHEME = "inflight://"
"""The scheme of a live (in-memory) adapter's uri: ``inflight://<name>``."""


@dataclass(frozen=True)
class SampleLimits:
    """What one sampling request may ask of a sampler (its ``max_num_samples`` and
    ``max_sample_tokens`` config): checked before the request is queued.

    ``max_length`` bounds prompt plus ``max_tokens`` (``twinkle.sampler.base.check_prompt_lengths``):
    the sampler's own ``max_length``, else that of the config's model application serving the
    same base model, so that a model trained with a limit samples with it too.
    """

    max_num_samples: int = 128
    max_sample_tokens: int = 32768
    max_length: int | None = None

    @classmethod
    def of(cls, args: Any, config: Any = None) -> SampleLimits:
        """The limits of a sampler application's ``args``; ``config`` (the whole server
        config) supplies the model application's ``max_length`` when the sampler sets none."""
        return cls(args.max_num_samples, args.max_sample_tokens, _max_length(args, config))


def _max_length(args: Any, config: Any) -> int | None:
    if args.max_length is not None or config is None:
        return args.max_length
    base = base_model_name(args.model_id)
    return next(
        (
            app.args.max_length
            for app in config.applications
            if isinstance(app.args, ModelArgs) and base_model_name(app.args.model_id) == base
        ),
        None,
    )


def sampler_key(owner: str, uri: str) -> str:
    """The sampler pool key of ``owner``'s inflight ``uri``: tenant-scoped, so one tenant's
    session can never name another tenant's live adapter."""
    if not str(uri).startswith(INFLIGHT_SCHEME):
        raise BadRequest(f"not an inflight adapter uri: {uri!r}")
    return f"{INFLIGHT_SCHEME}{owner}/{str(uri)[len(INFLIGHT_SCHEME) :]}"


def decode_adapter_state(payload: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(PEFT config, tensors) of a ``publish_adapter`` payload; a malformed one is a 400."""
    from safetensors.torch import load as load_tensors  # torch: only where tensors are read

    config, weights = payload.get("config"), payload.get("weights_b64")
    if not isinstance(config, dict):
        raise BadRequest("publish_adapter: config must be an object (the adapter's PEFT config)")
    if not isinstance(weights, str):
        raise BadRequest("publish_adapter: weights_b64 must be a base64 safetensors file")
    try:
        return dict(config), load_tensors(base64.b64decode(weights, validate=True))
    except Exception:  # noqa: BLE001 - binascii or safetensors errors: the client's bytes
        raise BadRequest("publish_adapter: weights_b64 is not a base64 safetensors file") from None


__all__ = ["INFLIGHT_SCHEME", "SampleLimits", "decode_adapter_state", "sampler_key"]
