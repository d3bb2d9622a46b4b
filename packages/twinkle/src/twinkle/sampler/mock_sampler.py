"""``MockSampler``: sampling from the numpy mock model, for CPU-only development and server tests.

The mock model scores the next token from the current one only (``twinkle.model.mock``), so
generation is a walk over that distribution: cheap, deterministic with a seed, and it reflects a
tenant's training, because adapters are the mock backend's own checkpoints (``adapter_model.npz``).
No torch is needed.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from twinkle.errors import InvalidArgumentError, PathForbiddenError, PathNotFoundError
from twinkle.sampler.base import Prompt, Sampler
from twinkle.sampler.types import SampledSequence, SampleResponse, SampleResult, SamplingParams


class MockSampler(Sampler):
    """The sampler of ``sampler_type: mock``.

    Stop strings are not applied (stop token ids are).

    Args:
        model_id: Model id; its tokenizer renders trajectories (e.g. ``tiny://qwen3.5``).
        vocab_size: Vocabulary of the mock model (the tokenizer's when ``None`` and resolvable).
        hidden_size: Hidden size of the mock model (must match the mock backend's, 16).
        seed: Base-weight seed (must match the mock backend's, 0).
        allowed_adapter_dirs: When given, adapter directories must lie inside one of them.
        max_length: Most tokens of prompt and completion together (see ``Sampler``).
    """

    def __init__(
        self,
        model_id: str = "mock",
        vocab_size: int | None = None,
        hidden_size: int = 16,
        seed: int = 0,
        allowed_adapter_dirs: list[str | os.PathLike] | None = None,
        max_length: int | None = None,
    ) -> None:
        from twinkle.model.mock._lora import BaseWeights

        super().__init__(model_id, max_length)
        self.vocab_size = vocab_size or _vocab_size(model_id)
        self.base = BaseWeights.from_seed(self.vocab_size, hidden_size, seed)
        self.allowed = (
            None
            if allowed_adapter_dirs is None
            else [Path(d).resolve() for d in allowed_adapter_dirs]
        )

    def _adapter(self, uri: str | None) -> tuple[np.ndarray, np.ndarray, float] | None:
        from twinkle.model.mock import _checkpoint as ckpt

        if uri is None:
            return None
        path = Path(uri).resolve()
        if self.allowed is not None and not any(
            path == d or d in path.parents for d in self.allowed
        ):
            raise PathForbiddenError(f"adapter {uri} is outside the allowed adapter directories")
        if not (path / ckpt.ADAPTER_WEIGHTS).is_file():
            raise PathNotFoundError(
                f"{uri} is not a mock-backend adapter (no {ckpt.ADAPTER_WEIGHTS})"
            )
        config = ckpt.read_json(str(path), ckpt.ADAPTER_CONFIG)
        weights = ckpt.read_arrays(str(path), ckpt.ADAPTER_WEIGHTS)
        if weights["A"].shape[0] != self.base.embed_V_H.shape[1]:
            raise InvalidArgumentError(f"adapter {uri} does not fit this mock model (hidden size)")
        return weights["A"], weights["B"], config["lora_alpha"] / config["r"]

    def _logprobs(self, token: int, adapter) -> np.ndarray:
        hidden = self.base.embed_V_H[token]
        if adapter is not None:
            a, b, scale = adapter
            hidden = hidden + scale * (hidden @ a) @ b
        logits = hidden @ self.base.unembed_H_V
        shifted = logits - logits.max()
        return shifted - np.log(np.exp(shifted).sum())

    def _generate(
        self,
        prompts: list[Prompt],
        params: SamplingParams,
        adapter_uris: list[str | None],
        adapter_name: str | None,
    ) -> SampleResponse:
        adapter_uris = self._named_adapter_uris(adapter_name, adapter_uris)
        adapters = {uri: self._adapter(uri) for uri in set(adapter_uris)}
        stops = set(params.stop_token_ids or ()) | self._template_stops()
        response = SampleResponse()
        for i, (prompt, uri) in enumerate(zip(prompts, adapter_uris)):
            if any(t < 0 or t >= self.vocab_size for t in prompt.tokens):
                raise InvalidArgumentError(
                    f"input {i} has token ids outside the vocabulary [0, {self.vocab_size})"
                )
            adapter = adapters[uri]
            sequences = [
                self._walk(prompt.tokens, adapter, params, stops, i, k)
                for k in range(params.num_samples)
            ]
            prompt_lps = None
            if params.prompt_logprobs or params.max_tokens == 0:
                prompt_lps = [None] + [
                    float(self._logprobs(prev, adapter)[nxt])
                    for prev, nxt in zip(prompt.tokens, prompt.tokens[1:])
                ]
            response.append(
                SampleResult(
                    prompt_tokens=list(prompt.tokens),
                    sequences=sequences if params.max_tokens > 0 else [],
                    prompt_logprobs=prompt_lps,
                    extra=prompt.extra,
                )
            )
        return response

    def _template_stops(self) -> set[int]:
        # The bare "mock" model has no tokenizer, hence no template end-of-turn tokens.
        return set() if self.model_id == "mock" else self.stop_token_ids

    def _walk(
        self, tokens: list[int], adapter, params: SamplingParams, stops: set[int], i: int, k: int
    ) -> SampledSequence:
        seed = None if params.seed is None else [int(params.seed), i, k]
        rng = np.random.default_rng(seed)
        out, lps, topk, current = [], [], [], tokens[-1]
        stop_reason = "length"
        for _ in range(params.max_tokens):
            logprobs = self._logprobs(current, adapter)
            if params.temperature == 0:
                token = int(np.argmax(logprobs))
            else:
                scaled = logprobs / params.temperature
                probs = np.exp(scaled - scaled.max())
                token = int(rng.choice(self.vocab_size, p=probs / probs.sum()))
            out.append(token)
            lps.append(float(logprobs[token]))
            if params.topk_logprobs:
                best = np.argsort(-logprobs, kind="stable")[: params.topk_logprobs]
                topk.append([(int(t), float(logprobs[t])) for t in best])
            current = token
            if token in stops:
                stop_reason = "stop"
                break
        text = (
            ""
            if self.model_id == "mock"
            else self._template().decode([t for t in out if t not in stops])
        )
        return SampledSequence(
            tokens=out,
            logprobs=lps if params.logprobs else [],
            stop_reason=stop_reason,
            text=text,
            topk_logprobs=topk if params.topk_logprobs else None,
        )


def _vocab_size(model_id: str) -> int:
    """The vocabulary of ``model_id`` (an image-text model's text vocabulary), else 256."""
    from twinkle.model.mock import model_vocab_size

    return model_vocab_size(model_id)


__all__ = ["MockSampler"]
