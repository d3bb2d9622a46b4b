"""``TorchSampler``: generation with transformers and the multi-LoRA router, several adapters per batch."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import torch

from twinkle.errors import InvalidArgumentError
from twinkle.model.lora import LoraRouter, RowRoute
from twinkle.model.memory import release_above
from twinkle.model.options import ExecutionOptions, resolve_options
from twinkle.model.step.plan import memory_limit_bytes
from twinkle.sampler._adapter_pool import AdapterPool
from twinkle.sampler._decoding import choose_tokens, row_seeds
from twinkle.sampler._generation import DecodeBatch
from twinkle.sampler._images import batch_images
from twinkle.sampler._memory import DecodeShape, fit_row_groups
from twinkle.sampler._prompt_scores import (
    PromptScores,
    blank_before_last_n,
    check_prompt_params,
    score_prompt,
    topk_rows,
    wants_prompt_scores,
)
from twinkle.sampler.base import Prompt, Sampler
from twinkle.sampler.types import SampledSequence, SampleResponse, SampleResult, SamplingParams


class TorchSampler(Sampler):
    """Samples with a transformers model; rows of one batch may use different LoRA adapters.

    The whole batch runs one forward per decode step: each row's adapter is applied to its rows
    by the multi-LoRA router, the base model is shared. Prompts are left-padded, and decoding
    reuses the model's cache (attention KV and, for Qwen3.5's linear-attention layers, their
    recurrent state); a model that returns no cache is recomputed in full at each step.

    Args:
        model_id: ``tiny://qwen3.5``, ``ms://org/name``, ``hf://org/name`` or a local directory.
        max_loras: Adapters kept loaded; the least recently used is evicted beyond this.
        allowed_adapter_dirs: When given, ``adapter_uri`` must resolve inside one of them.
        device: Torch device; CUDA when available unless given.
        torch_dtype: Weights dtype (float32 on CPU, bfloat16 on CUDA by default).
        options: Execution options (``ExecutionOptions`` or a mapping of its fields); the
            sampler uses ``lora_kernel``, ``linear_logprobs``, ``linear_chunk_bytes`` and
            ``memory_budget_mb`` (rows that would not fit decode in groups that do; a row that
            cannot fit alone is refused with the tokens that fit).
        max_length: Most tokens of prompt and completion together (see ``Sampler``).
    """

    supports_extra_logprobs = True
    live_adapters = True

    def __init__(
        self,
        model_id: str,
        max_loras: int = 8,
        allowed_adapter_dirs: list[str | os.PathLike] | None = None,
        device: str | torch.device | None = None,
        torch_dtype: torch.dtype | None = None,
        options: ExecutionOptions | dict | None = None,
        max_length: int | None = None,
    ) -> None:
        from twinkle.hub import remote_code_guard, resolve_model_dir
        from twinkle.model.transformers._auto import auto_model_class

        super().__init__(model_id, max_length)
        self.model_dir = Path(resolve_model_dir(model_id))
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = torch_dtype or (torch.bfloat16 if self.device.type == "cuda" else torch.float32)
        with remote_code_guard(self.model_dir) as trust:
            # A model with a vision tower (Qwen3.5, tiny://qwen3.5-vl) loads whole, so prompts
            # may carry images.
            self.model = auto_model_class(self.model_dir, trust).from_pretrained(
                self.model_dir, dtype=dtype, trust_remote_code=trust
            )
        self.model.to(self.device).eval().requires_grad_(False)
        self.options = resolve_options(options)
        self.router = LoraRouter(kernel=self.options.lora_kernel)
        self.adapters = AdapterPool(
            self.model, self.router, model_id, self.model_dir, max_loras, allowed_adapter_dirs
        )
        self._cache_kwarg = (
            "cache"
            if "cache" in inspect.signature(self.model.forward).parameters
            else "past_key_values"
        )
        self.uses_cache: bool | None = None  # known after the first generation
        self.decode_shape = DecodeShape.of(self.model)  # what the memory model reads, fixed

    def load_adapter(self, adapter_uri: str | os.PathLike, adapter_name: str | None = None) -> None:
        """Load ``adapter_uri`` now (and name it, for ``sample(adapter_name=...)``)."""
        self.adapters.acquire([str(adapter_uri)])
        if adapter_name is not None:
            self._named[adapter_name] = str(adapter_uri)

    def _put_live_adapter(self, uri: str, model: Any, adapter_name: str | None) -> None:
        from twinkle.sampler._adapter_pool import check_base_model, live_adapter_tensors

        config = model.adapter_peft_config(adapter_name)
        check_base_model(config, Path(uri), self.model_id, self.model_dir)
        # The pool copies them into its own adapter: one copy, straight from the trainer's.
        self.adapters.put_state(uri, config, live_adapter_tensors(model, adapter_name))

    # -------------------------------------------------------------- generation
    def _generate(
        self,
        prompts: list[Prompt],
        params: SamplingParams,
        adapter_uris: list[str | None],
        adapter_name: str | None,
    ) -> SampleResponse:
        adapter_uris = self._named_adapter_uris(adapter_name, adapter_uris)
        vocab = self.model.get_input_embeddings().weight.shape[0]
        for i, prompt in enumerate(prompts):
            check_prompt_params(params, len(prompt.tokens), i)
            # Up front: an id past the embedding is an IndexError deep in the forward pass.
            bad = next((t for t in prompt.tokens if not 0 <= int(t) < vocab), None)
            if bad is not None:
                raise InvalidArgumentError(
                    f"inputs[{i}]: token id {bad} is out of the vocabulary [0, {vocab})"
                )
        names = self.adapters.acquire([u for u in adapter_uris if u is not None])
        n = params.num_samples
        row_prompts = [p.tokens for p in prompts for _ in range(n)]
        row_adapters = [None if u is None else names[u] for u in adapter_uris for _ in range(n)]
        seeds = row_seeds(params.seed, len(prompts), n)
        # Rows with the same adapter sit together, so each adapter is one contiguous route.
        order = sorted(range(len(row_prompts)), key=lambda r: (row_adapters[r] or "", r))
        row_images = [p for p in prompts for _ in range(n)]
        by_row = {}
        # Rows that would not fit the memory budget as one batch decode in consecutive groups
        # that do; a row that cannot fit alone is refused here, before any work.
        for group in self._row_groups([len(row_prompts[r]) for r in order], order, params, n):
            rows = [order[g] for g in group]
            sequences, prompt_lps, prompt_scores = self._decode(
                [row_prompts[r] for r in rows],
                [row_adapters[r] for r in rows],
                [seeds[r] for r in rows],
                params,
                [row_images[r] for r in rows],
            )
            by_row.update(zip(rows, zip(sequences, prompt_lps, prompt_scores)))
        release_above(self.options.memory_budget_mb)
        response = SampleResponse()
        for i, prompt in enumerate(prompts):
            rows = [by_row[i * n + k] for k in range(n)]
            want_prompt = params.prompt_logprobs or params.max_tokens == 0
            scores = rows[0][2]
            response.append(
                SampleResult(
                    prompt_tokens=list(prompt.tokens),
                    sequences=[row[0] for row in rows] if params.max_tokens > 0 else [],
                    prompt_logprobs=blank_before_last_n(rows[0][1], params.prompt_logprobs_last_n)
                    if want_prompt
                    else None,
                    extra=prompt.extra,
                    topk_prompt_logprobs=scores.topk,
                    target_prompt_logprobs=scores.targets,
                    prompt_alt_tokens=scores.alt_tokens,
                )
            )
        return response

    def _row_groups(
        self, lengths: list[int], order: list[int], params: SamplingParams, n: int
    ) -> list[range]:
        """Groups of consecutive rows in decode order (``order``: each one's row, ``lengths``:
        its prompt tokens; ``n`` rows per prompt) that each fit the memory limit."""
        want_scores = wants_prompt_scores(params)
        want_prompt = params.prompt_logprobs or params.max_tokens == 0 or want_scores
        head = self._linear_head() if want_prompt and not want_scores else None
        budget = self.options.memory_budget_mb
        return fit_row_groups(
            self.decode_shape,
            lengths,
            params.max_tokens,
            memory_limit_bytes(self.device, budget),
            prompt_logits=want_prompt and head is None,
            budget_mb=budget,
            row_label=lambda i: f"inputs[{order[i] // n}]",
        )

    def _decode(
        self,
        rows: list[list[int]],
        adapters: list[str | None],
        seeds: list[int],
        params: SamplingParams,
        images: list[Prompt] | None = None,
    ) -> tuple[list[SampledSequence], list[list[float | None] | None], list[PromptScores]]:
        template = self._template()
        want_scores = wants_prompt_scores(params)
        want_prompt = params.prompt_logprobs or params.max_tokens == 0 or want_scores
        batch = DecodeBatch.left_padded(rows, template.pad_token_id, self.device)
        images = images or []
        batch.images = batch_images(
            self.model,
            [p.pixel_values for p in images],
            [p.image_grid_thw for p in images],
            adapters,
            self.device,
            rows,
        )
        vision_routes = batch.images.vision_routes if batch.images is not None else None
        vocab = self.model.get_input_embeddings().weight.shape[0]
        seen_B_V = batch.seen_tokens(vocab) if params.repetition_penalty != 1.0 else None
        generators = [torch.Generator().manual_seed(s) for s in seeds]
        stop_ids = self.stop_token_ids | set(params.stop_token_ids)
        # Prompt log-probs alone (no prompt scores, which read whole rows of logits) come from
        # the last hidden states and the LM head: the prefill keeps no [B, T, V] logits.
        head = self._linear_head() if want_prompt and not want_scores else None
        with torch.no_grad(), self.router.route(_routes(adapters), vision_routes):
            if head is not None:
                hidden_B_T_H, cache = self._prefill_hidden(batch)
                logits_B_T_V = self.model.get_output_embeddings()(hidden_B_T_H[:, -1:])
                prompt_lps = batch.prompt_logprobs(
                    hidden_B_T_H=hidden_B_T_H,
                    head_V_H=head,
                    chunk_bytes=self.options.linear_chunk_bytes,
                )
                del hidden_B_T_H
            else:
                logits_B_T_V, cache = self._forward(batch, None, keep_all=want_prompt)
                prompt_lps = (
                    batch.prompt_logprobs(logits_B_T_V) if want_prompt else [None] * len(rows)
                )
            scores = [
                self._score_row(logits_B_T_V, b, len(row), params, seeds[b], vocab)
                if want_scores
                else PromptScores()
                for b, row in enumerate(rows)
            ]
            last_B_V = logits_B_T_V[:, -1]
            for step in range(params.max_tokens):
                picked_B = choose_tokens(last_B_V, seen_B_V, params, generators)
                lps_B_V = torch.log_softmax(last_B_V.float(), dim=-1)
                logprobs_B = lps_B_V.gather(1, picked_B.to(last_B_V.device)[:, None])
                topk_B = topk_rows(lps_B_V, params.topk_logprobs) if params.topk_logprobs else None
                batch.append(picked_B, logprobs_B[:, 0].cpu(), stop_ids, params, template, topk_B)
                if seen_B_V is not None:
                    seen_B_V[torch.arange(len(rows)), picked_B.to(seen_B_V.device)] = True
                if batch.all_done() or step == params.max_tokens - 1:
                    break
                logits_B_T_V, cache = self._forward(batch, cache, keep_all=False)
                last_B_V = logits_B_T_V[:, -1]
        return batch.sequences(template, params), prompt_lps, scores

    @staticmethod
    def _score_row(
        logits_B_T_V: torch.Tensor,
        b: int,
        length: int,
        params: SamplingParams,
        seed: int,
        vocab: int,
    ) -> PromptScores:
        """Prompt scores of row ``b``, whose prompt fills the last ``length`` prefill columns."""
        width = logits_B_T_V.shape[1]
        return score_prompt(logits_B_T_V[b, width - length : width - 1], params, seed, vocab)

    def _linear_head(self) -> torch.Tensor | None:
        """The LM head's weight where log-probs may skip the logits (see
        :func:`twinkle.model.step.passes.linear_head`), unless the options turn that off."""
        if not self.options.linear_logprobs:
            return None
        from twinkle.model.step.passes import linear_head, lora_head

        # A head with adapters on it takes the materialised path here (the logits-free form
        # with the adapters' low-rank part is the training step's, step.passes.lora_head).
        return None if lora_head(self.model) is not None else linear_head(self.model)

    def _prefill_hidden(self, batch: DecodeBatch) -> tuple[torch.Tensor, Any]:
        """The prefill through the decoder alone: its last hidden states ``[B, T, H]`` and the
        cache (the LM head is left to the caller)."""
        decoder = getattr(self.model, self.model.base_model_prefix)
        return self._forward(batch, None, keep_all=True, module=decoder)

    def _forward(
        self,
        batch: DecodeBatch,
        cache: Any,
        keep_all: bool,
        module: torch.nn.Module | None = None,
    ) -> tuple[torch.Tensor, Any]:
        """Prefill (``cache is None``) or one decode step; falls back to full recompute when the
        model keeps no cache."""
        full = cache is None or self.uses_cache is False
        ids, mask, pos = batch.full_inputs() if full else batch.step_inputs()
        kwargs: dict[str, Any] = {"use_cache": self.uses_cache is not False}
        if module is None:
            kwargs["logits_to_keep"] = 0 if keep_all else 1
        if batch.images is not None:
            # Every full pass re-reads the images; a cached step only moves the 3-D positions on.
            if full:
                pos = batch.images.full_positions(self.model, ids, mask)
                kwargs.update(batch.images.prefill_kwargs())
            else:
                pos = batch.images.step_positions(pos)
        if cache is not None and self.uses_cache:
            kwargs[self._cache_kwarg] = cache
        out = (module or self.model)(input_ids=ids, attention_mask=mask, position_ids=pos, **kwargs)
        new_cache = out.get("cache", None)
        if new_cache is None:
            new_cache = out.get("past_key_values", None)
        if self.uses_cache is None:
            self.uses_cache = new_cache is not None
        return (out.logits if module is None else out[0]), new_cache


def _routes(adapters: list[str | None]) -> list[RowRoute]:
    """Contiguous runs of one adapter as router routes (rows without an adapter use the base model)."""
    routes, start = [], 0
    for row in range(1, len(adapters) + 1):
        if row == len(adapters) or adapters[row] != adapters[start]:
            if adapters[start] is not None:
                routes.append(RowRoute(adapters[start], start, row))
            start = row
    return routes
