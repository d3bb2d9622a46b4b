"""Per-tenant LoRA on megatron's MoE experts (any expert parallel size), in PEFT's expert layout.

The adapters live in the HF view (:mod:`._model`) as on the transformers backend: the view's
``model.layers.<i>.mlp.experts`` is a shape-only stand-in of transformers' experts module
(:class:`ShapeOnlyExperts`), which a tenant's ``target_parameters`` wraps in a
:class:`~twinkle.model.lora.MultiLoraExperts`; saved keys are therefore PEFT's.

Megatron's MoE layer routes, permutes and (under expert parallel) all-to-alls the tokens before
its ``SequentialMLP`` sees them, so an expert no longer knows which row, hence which tenant, a
token came from. :class:`ExpertLoraHook` carries that along: while any tenant has an expert
adapter in the layer, each token gets one more hidden channel holding its tenant's number and its
source rank, which megatron's dispatcher permutes (and all-to-alls) with the token; the experts
strip it and add each tenant's deltas to its tokens' ``linear_fc1`` (gate/up) and ``linear_fc2``
(down) outputs. Layers without expert adapters run megatron's own code unchanged.

Expert parallel (ep > 1). Every rank keeps each tenant's whole expert adapter (PEFT shapes,
replicated like the dense adapters) and uses its local experts' slices. An expert's gradient
then sums tokens from every rank, each carrying its own rank's loss normalisation, while the
data-parallel step scales a rank's gradients by that rank's share after the backward. So the
expert adapters' gradients are scaled per token instead, by the token's source rank's share
(:class:`TokenScales`, agreed before the backward by :class:`~._dp_world.ExpertRanksSync`), and
skip the after-backward scale; the all-reduce then sums each expert's slice from the rank that
holds it, and every rank has the whole, exact gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from twinkle.model.lora import LoraRouter, MultiLoraExperts
from twinkle.model.lora.experts import row_owners, token_groups


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


class TokenScales:
    """Per tenant, each expert-parallel rank's gradient scale for this call (``[ep]``), set by
    the expert ranks' agreement before the backward; ``None`` outside such a call (and at ep 1,
    where a rank's experts see only its own tokens)."""

    def __init__(self) -> None:
        self.by_tenant: dict[str, torch.Tensor] | None = None


def _ep() -> tuple[int, int]:
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        return 1, 0
    return ps.get_expert_model_parallel_world_size(), ps.get_expert_model_parallel_rank()


class ExpertLoraHook:
    """Adds the routed tenants' expert adapters of ``view_mlp.experts`` to megatron MoE layer
    ``moe`` (its ``preprocess`` and its experts' ``forward``, replaced on the instances).

    The extra channel holds ``tenant * ep + source rank`` per token, ``tenant`` numbering the
    layer's adapters in sorted order (the same on every rank): under expert parallel a token may
    come from another rank, and its share of the adapter's gradient takes that rank's scale
    (:class:`TokenScales`).
    """

    def __init__(
        self, moe: nn.Module, view_mlp: nn.Module, router: LoraRouter, scales: TokenScales
    ) -> None:
        self.moe, self.view_mlp, self.router, self.scales = moe, view_mlp, router, scales
        self._preprocess = moe.preprocess
        self._experts_forward = moe.experts.forward
        self._names: list[str] | None = None
        moe.preprocess = self.preprocess
        moe.experts.forward = self.experts_forward

    def adapters(self) -> MultiLoraExperts | None:
        experts = self.view_mlp.experts
        return experts if isinstance(experts, MultiLoraExperts) else None

    def preprocess(self, hidden: torch.Tensor, probs: torch.Tensor, routing_map: torch.Tensor):
        adapters = self.adapters()
        names = adapters.adapter_names() if adapters is not None else []
        # Every rank takes the channel when any adapter exists here (replicated tenants), so
        # the dispatcher's all-to-alls carry the same width everywhere.
        self._names = names or None
        if not names:
            return self._preprocess(hidden, probs, routing_map)
        seq, rows, width = hidden.shape  # megatron is [seq, batch, hidden]
        world, rank = _ep()
        code = torch.full((rows,), -1.0)
        owner = row_owners(self.router.routes, names)
        if owner is not None:
            code[: owner.shape[0]] = torch.where(owner < 0, -1, owner * world + rank).float()
        channel = code.to(hidden.device, hidden.dtype).expand(seq, rows).unsqueeze(-1)
        out = self._preprocess(torch.cat([hidden, channel], dim=-1), probs, routing_map)
        # The dispatcher combines the experts' outputs into these shapes: without the channel.
        dispatcher = self.moe.token_dispatcher
        dispatcher.hidden_shape = hidden.shape
        dispatcher.hidden_shape_before_permute = torch.Size((seq * rows, width))
        return out

    def experts_forward(self, tokens: torch.Tensor, tokens_per_expert, probs: torch.Tensor):
        if self._names is None:
            return self._experts_forward(tokens, tokens_per_expert, probs)
        adapters, names = self.adapters(), self._names
        world, _ = _ep()
        code = tokens[:, -1].round().long()
        x, owner, source = tokens[:, :-1], code.div(world, rounding_mode="floor"), code % world
        owner = torch.where(code < 0, -1, owner)
        sequential = self.moe.experts
        counts = tokens_per_expert
        counts = counts.tolist() if torch.is_tensor(counts) else list(counts)
        outputs = []
        for index, expert, xs, own, ps, src in zip(
            self.moe.local_expert_indices,  # global expert numbers: PEFT's layout is global
            sequential.local_experts,
            torch.split(x, counts),
            torch.split(owner, counts),
            torch.split(probs, counts),
            torch.split(source, counts),
            strict=True,
        ):
            groups = token_groups(own, names)
            # Under expert parallel the tokens' gradient weights are agreed after this forward.
            w = _weights_by_source(self.scales, src) if world > 1 else None
            h, _ = expert.linear_fc1(xs)
            h = adapters.add_delta(h, xs, "gate_up_proj", index, groups, w)
            gate, up = h.chunk(2, dim=-1)
            h = expert.config.activation_func(gate) * up
            h = (h * ps.unsqueeze(-1)).to(h.dtype)  # megatron scales before linear_fc2
            y, _ = expert.linear_fc2(h)
            outputs.append(adapters.add_delta(y, h, "down_proj", index, groups, w))
        return torch.cat(outputs, dim=0), None


def _weights_by_source(scales: TokenScales, source: torch.Tensor):
    """``weight_of(tenant, token indices)`` over one expert's tokens: a function returning
    each token's source rank's scale for ``tenant`` when the backward runs (``None`` when no
    scales were agreed: the step then scales the whole gradient after the backward)."""

    def weight_of(name: str, sel: torch.Tensor):
        src = source[sel]

        def weights() -> torch.Tensor | None:
            table = scales.by_tenant
            return None if table is None or name not in table else table[name][src]

        return weights

    return weight_of
