"""Per-tenant LoRA on megatron's MoE experts (expert parallel 1), in PEFT's expert layout.

The adapters live in the HF view (:mod:`._model`) as on the transformers backend: the view's
``model.layers.<i>.mlp.experts`` is a shape-only stand-in of transformers' experts module
(:class:`ShapeOnlyExperts`), which a tenant's ``target_parameters`` wraps in a
:class:`~twinkle.model.lora.MultiLoraExperts`; saved keys are therefore PEFT's.

Megatron's MoE layer routes, permutes and (under expert parallel) all-to-alls the tokens before
its ``SequentialMLP`` sees them, so an expert no longer knows which row, hence which tenant, a
token came from. :class:`ExpertLoraHook` carries that along: when a routed tenant has an expert
adapter, each token gets one more hidden channel holding its tenant's index, which megatron's
dispatcher permutes with the token; the experts strip it and add each tenant's deltas to its
tokens' ``linear_fc1`` (gate/up) and ``linear_fc2`` (down) outputs. Passes without such a tenant
run megatron's own layer unchanged.

Not under expert parallel > 1: there an expert's gradient sums tokens of every rank, each
normalised by its own rank's share of the tenant's loss, while the data-parallel step scales each
rank's gradients by one factor after the backward; exact gradients need that factor per source
token. Refused (``ep_size > 1`` with ``target_parameters``) until built.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from twinkle.model.lora import LoraRouter, MultiLoraExperts
from twinkle.model.lora.experts import token_groups


class ShapeOnlyExperts(nn.Module):
    """transformers' experts module's shape (``gate_up_proj`` ``[E, 2I, H]``, ``down_proj``
    ``[E, H, I]``, ``act_fn``) with zero-byte weights; megatron computes the experts."""

    def __init__(self, experts: int, hidden: int, ffn: int, like: torch.Tensor) -> None:
        super().__init__()
        zero = torch.zeros((), dtype=like.dtype, device=like.device)
        self.gate_up_proj = nn.Parameter(zero.expand(experts, 2 * ffn, hidden), requires_grad=False)
        self.down_proj = nn.Parameter(zero.expand(experts, hidden, ffn), requires_grad=False)
        self.act_fn = nn.SiLU()

    def forward(self, *args: Any) -> torch.Tensor:
        raise RuntimeError("the HF view only carries adapters; megatron computes the experts")


class ExpertLoraHook:
    """Adds the routed tenants' expert adapters of ``view_mlp.experts`` to megatron MoE layer
    ``moe`` (its ``preprocess`` and its experts' ``forward``, replaced on the instances)."""

    def __init__(self, moe: nn.Module, view_mlp: nn.Module, router: LoraRouter) -> None:
        self.moe, self.view_mlp, self.router = moe, view_mlp, router
        self._preprocess = moe.preprocess
        self._experts_forward = moe.experts.forward
        self._slots: list[str] | None = None
        moe.preprocess = self.preprocess
        moe.experts.forward = self.experts_forward

    def _adapters(self) -> MultiLoraExperts | None:
        experts = self.view_mlp.experts
        return experts if isinstance(experts, MultiLoraExperts) else None

    def preprocess(self, hidden: torch.Tensor, probs: torch.Tensor, routing_map: torch.Tensor):
        adapters = self._adapters()
        slots, owner = adapters.routed_slots(self.router.routes) if adapters else ([], None)
        self._slots = slots or None
        if owner is None:
            return self._preprocess(hidden, probs, routing_map)
        seq, rows, width = hidden.shape  # megatron is [seq, batch, hidden]
        if owner.shape[0] != rows:
            raise ValueError(f"an MoE layer got {rows} rows, the routes cover {owner.shape[0]}")
        channel = owner.to(hidden.device, hidden.dtype).expand(seq, rows).unsqueeze(-1)
        out = self._preprocess(torch.cat([hidden, channel], dim=-1), probs, routing_map)
        # The dispatcher combines the experts' outputs into these shapes: without the channel.
        dispatcher = self.moe.token_dispatcher
        dispatcher.hidden_shape = hidden.shape
        dispatcher.hidden_shape_before_permute = torch.Size((seq * rows, width))
        return out

    def experts_forward(self, tokens: torch.Tensor, tokens_per_expert, probs: torch.Tensor):
        if self._slots is None:
            return self._experts_forward(tokens, tokens_per_expert, probs)
        adapters, slots = self._adapters(), self._slots
        x, owner = tokens[:, :-1], tokens[:, -1].round().long()
        sequential = self.moe.experts
        counts = tokens_per_expert
        counts = counts.tolist() if torch.is_tensor(counts) else list(counts)
        outputs = []
        for index, expert, xs, own, ps in zip(
            self.moe.local_expert_indices,  # global expert numbers: PEFT's layout is global
            sequential.local_experts,
            torch.split(x, counts),
            torch.split(owner, counts),
            torch.split(probs, counts),
            strict=True,
        ):
            groups = token_groups(own, slots)
            h, _ = expert.linear_fc1(xs)
            h = adapters.add_delta(h, xs, "gate_up_proj", index, groups)
            gate, up = h.chunk(2, dim=-1)
            h = expert.config.activation_func(gate) * up
            h = (h * ps.unsqueeze(-1)).to(h.dtype)  # megatron scales before linear_fc2
            y, _ = expert.linear_fc2(h)
            outputs.append(adapters.add_delta(y, h, "down_proj", index, groups))
        return torch.cat(outputs, dim=0), None
