"""The state of one batch being decoded: left-padded token ids, positions, outputs, stop checks."""

from __future__ import annotations

from typing import Any

import torch

from twinkle.sampler.types import SampledSequence, SamplingParams


class DecodeBatch:
    """Rows of prompts growing by one token per step.

    ``ids_B_T`` is left-padded so every row's last token sits in the last column; positions count
    real tokens only, so padding never shifts a row's rotary positions.
    """

    def __init__(
        self, ids_B_T: torch.Tensor, mask_B_T: torch.Tensor, prompt_lens: list[int]
    ) -> None:
        self.ids_B_T, self.mask_B_T = ids_B_T, mask_B_T
        self.prompt_lens = prompt_lens
        rows = len(prompt_lens)
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.logprobs: list[list[float]] = [[] for _ in range(rows)]
        self.topk: list[list[list[tuple[int, float]]]] = [[] for _ in range(rows)]
        self.done = [False] * rows
        # Where the text ends: before the stop string that ended it, or after it when kept.
        self.stop_text: list[int | None] = [None] * rows
        self.images: Any = None  # the batch's image inputs (``_images.BatchImages``), if any

    @classmethod
    def left_padded(cls, rows: list[list[int]], pad_id: int, device: torch.device) -> DecodeBatch:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), int(pad_id), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, row in enumerate(rows):
            ids[b, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[b, width - len(row) :] = 1
        return cls(ids.to(device), mask.to(device), [len(r) for r in rows])

    @property
    def positions_B_T(self) -> torch.Tensor:
        return (self.mask_B_T.cumsum(dim=1) - 1).clamp(min=0)

    def full_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.ids_B_T, self.mask_B_T, self.positions_B_T

    def step_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The newest token of each row, the full mask, and the newest positions."""
        return self.ids_B_T[:, -1:], self.mask_B_T, self.positions_B_T[:, -1:]

    def seen_tokens(self, vocab: int) -> torch.Tensor:
        """[B, V] bool: which tokens each prompt contains (for the repetition penalty)."""
        seen = torch.zeros(
            (self.ids_B_T.shape[0], vocab), dtype=torch.bool, device=self.ids_B_T.device
        )
        for b, length in enumerate(self.prompt_lens):
            seen[b, self.ids_B_T[b, self.ids_B_T.shape[1] - length :]] = True
        return seen

    def prompt_logprobs(
        self,
        logits_B_T_V: torch.Tensor | None = None,
        *,
        hidden_B_T_H: torch.Tensor | None = None,
        head_V_H: torch.Tensor | None = None,
        chunk_bytes: int | None = None,
    ) -> list[list[float | None]]:
        """Per row, ``log p(prompt[t] | prompt[:t])``; ``None`` for the first token. From the
        prefill's logits, or logits-free from its last hidden states and the LM head (in tiles
        of tokens by vocabulary columns: no ``[B, T, V]`` tensor)."""
        width = self.ids_B_T.shape[1]
        if logits_B_T_V is not None:
            lp_B_T = torch.log_softmax(logits_B_T_V[:, :-1].float(), dim=-1).gather(
                2, self.ids_B_T[:, 1:, None]
            )[..., 0]
        else:
            from twinkle.model.step.linear_logprobs import (
                DEFAULT_CHUNK_BYTES,
                linear_token_logprobs,
            )

            lp_B_T = linear_token_logprobs(
                hidden_B_T_H[:, :-1],
                head_V_H,
                self.ids_B_T[:, 1:],
                chunk_bytes or DEFAULT_CHUNK_BYTES,
            ).logprobs
        out = []
        for b, length in enumerate(self.prompt_lens):
            values = lp_B_T[b, width - length :].tolist()
            out.append([None, *values])
        return out

    def append(
        self,
        picked_B: torch.Tensor,
        logprobs_B: torch.Tensor,
        stop_ids: set[int],
        params: SamplingParams,
        template: Any,
        topk_B: list[list[tuple[int, float]]] | None = None,
    ) -> None:
        """Record each active row's token (and top-k) and check its stop conditions; extend the
        batch."""
        picked = picked_B.tolist()
        logprobs = logprobs_B.tolist()
        for b, token in enumerate(picked):
            if self.done[b]:
                continue
            self.tokens[b].append(token)
            self.logprobs[b].append(logprobs[b])
            if topk_B is not None:
                self.topk[b].append(topk_B[b])
            if token in stop_ids:
                self.done[b] = True
            elif params.stop:
                text = template.decode(self.tokens[b], skip_special_tokens=True)
                hits = [(text.find(s), len(s)) for s in params.stop if s and s in text]
                if hits:
                    start, size = min(hits)
                    keep = size if params.include_stop_str_in_output else 0
                    self.done[b], self.stop_text[b] = True, start + keep
        column = picked_B.to(self.ids_B_T.device)[:, None]
        self.ids_B_T = torch.cat([self.ids_B_T, column], dim=1)
        self.mask_B_T = torch.cat([self.mask_B_T, torch.ones_like(column)], dim=1)

    def all_done(self) -> bool:
        return all(self.done)

    def sequences(self, template: Any, params: SamplingParams) -> list[SampledSequence]:
        out = []
        for b, tokens in enumerate(self.tokens):
            text = template.decode(tokens, skip_special_tokens=True)
            if self.stop_text[b] is not None:
                text = text[: self.stop_text[b]]
            out.append(
                SampledSequence(
                    tokens=list(tokens),
                    logprobs=list(self.logprobs[b]) if params.logprobs else [],
                    stop_reason="stop" if self.done[b] else "length",
                    text=text,
                    topk_logprobs=list(self.topk[b]) if params.topk_logprobs else None,
                )
            )
        return out
