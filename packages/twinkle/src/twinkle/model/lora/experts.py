"""LoRA on a mixture-of-experts block's expert weights, per tenant, in PEFT's layout.

transformers 5 keeps an MoE layer's experts as two 3-D parameters of one module (Qwen3-MoE's
``Qwen3MoeExperts``: ``gate_up_proj`` ``[E, 2I, H]`` and ``down_proj`` ``[E, H, I]``, each expert's
weight ``[out, in]``), not as ``nn.Linear`` modules, so ``target_modules`` cannot reach them. PEFT
adapts them with ``LoraConfig(target_parameters=[...])`` (its ``ParamWrapper``); Twinkle reads the
same field, per tenant: a tenant that names none trains no expert adapter, and its rows run the
experts unchanged beside rows of tenants that do.

Layout, as PEFT 0.21 stores a 3-D parameter's adapter: ``lora_A`` is ``[r * E, in]`` with expert
``e``'s rows at ``e * r ... (e + 1) * r`` and ``lora_B`` is ``[out, r * E]`` with expert ``e``'s
columns at ``e, e + E, e + 2E, ...`` (PEFT reshapes it ``[out, r, E]``). Expert ``e`` computes
``x @ (W_e + scaling * B_e @ A_e).T``. When one adapter targets both parameters PEFT nests a
wrapper per parameter in the order the module registers them (``gate_up_proj`` innermost), so the
saved keys are ``experts.base_layer.lora_A.weight`` (gate_up) and ``experts.lora_A.weight``
(down); with one parameter, ``experts.lora_A.weight``.
"""

from __future__ import annotations

import torch
from torch import nn

from twinkle.model.lora.layer import LoraRouter, _uniform
from twinkle.model.lora.spec import AdapterSpec

#: The expert parameters an adapter may target, in the order the experts module registers them
#: (PEFT's nesting order, which its saved keys follow).
EXPERT_PARAMS = ("gate_up_proj", "down_proj")


def is_experts_module(module: nn.Module) -> bool:
    """Whether ``module`` holds experts as transformers 5 does: 3-D ``gate_up_proj`` and
    ``down_proj`` parameters, an ``act_fn``, weights ``[E, out, in]`` and no biases."""
    up = getattr(module, "gate_up_proj", None)
    down = getattr(module, "down_proj", None)
    return (
        isinstance(up, nn.Parameter)
        and isinstance(down, nn.Parameter)
        and up.dim() == down.dim() == 3
        and hasattr(module, "act_fn")
        and not getattr(module, "is_transposed", False)
        and not getattr(module, "has_bias", False)
    )


class MultiLoraExperts(nn.Module):
    """An experts module (see :func:`is_experts_module`) plus each routed tenant's expert LoRA.

    Called as the experts module is, ``(hidden_states [tokens, H], top_k_index, top_k_weights)``
    with the tokens of the pass's rows flattened row by row. Without a routed tenant that has
    an expert adapter it is the wrapped module itself (any of transformers' expert kernels);
    with one, every token runs an eager per-expert loop in which each tenant's tokens add that
    tenant's deltas to the gate/up and down projections.
    """

    def __init__(self, base_layer: nn.Module, router: LoraRouter) -> None:
        super().__init__()
        if not is_experts_module(base_layer):
            raise ValueError(f"{type(base_layer).__name__} is not a supported experts module")
        self.base_layer = base_layer
        self.lora_A = nn.ModuleDict({p: nn.ParameterDict() for p in EXPERT_PARAMS})
        self.lora_B = nn.ModuleDict({p: nn.ParameterDict() for p in EXPERT_PARAMS})
        self.scaling: dict[tuple[str, str], float] = {}
        object.__setattr__(self, "_router", router)

    @property
    def num_experts(self) -> int:
        return self.base_layer.gate_up_proj.shape[0]

    def features(self, param: str) -> tuple[int, int]:
        """``(in, out)`` of one expert's weight in ``param``."""
        _, out_f, in_f = getattr(self.base_layer, param).shape
        return in_f, out_f

    def add_adapter(
        self, spec: AdapterSpec, param: str, generator: torch.Generator, rank: int, alpha: float
    ) -> None:
        """Create ``spec.name``'s adapter on expert parameter ``param`` (rank ``rank``, scaling
        from ``alpha``), initialised as PEFT initialises a ``ParamWrapper``, from ``generator``."""
        if param not in EXPERT_PARAMS:
            raise ValueError(f"expert parameter must be one of {EXPERT_PARAMS}, got {param!r}")
        weight = getattr(self.base_layer, param)
        in_f, out_f = self.features(param)
        rows = rank * self.num_experts
        if spec.init_lora_weights == "gaussian":
            a = torch.randn((rows, in_f), generator=generator) / rank
        else:
            a = _uniform(torch.Size((rows, in_f)), in_f, generator)
        if spec.init_lora_weights is False:
            b = _uniform(torch.Size((out_f, rows)), rows, generator)
        else:
            b = torch.zeros(out_f, rows)
        self.lora_A[param][spec.name] = nn.Parameter(a.to(weight.device, weight.dtype))
        self.lora_B[param][spec.name] = nn.Parameter(b.to(weight.device, weight.dtype))
        self.scaling[(spec.name, param)] = alpha / (rank**0.5 if spec.use_rslora else rank)

    def remove_adapter(self, name: str) -> None:
        for param in EXPERT_PARAMS:
            for table in (self.lora_A[param], self.lora_B[param]):
                if name in table:
                    del table[name]
            self.scaling.pop((name, param), None)

    def has_adapter(self, name: str) -> bool:
        return any(name in self.lora_A[p] for p in EXPERT_PARAMS)

    def adapter_names(self) -> list[str]:
        """Every adapter this layer carries, sorted: a numbering every rank agrees on."""
        return sorted({n for p in EXPERT_PARAMS for n in self.lora_A[p]})

    def adapter_weights(self, name: str) -> dict[str, nn.Parameter]:
        """``name``'s weights under their PEFT key suffixes (after the module's name)."""
        params = [p for p in EXPERT_PARAMS if name in self.lora_A[p]]
        weights = {}
        for i, param in enumerate(params):
            nest = "base_layer." * (len(params) - 1 - i)
            weights[f"{nest}lora_A.weight"] = self.lora_A[param][name]
            weights[f"{nest}lora_B.weight"] = self.lora_B[param][name]
        return weights

    def _factors(self, name: str, param: str, expert: int):
        a = self.lora_A[param].get(name)
        if a is None:
            return None
        b = self.lora_B[param][name]
        e = self.num_experts
        r = a.shape[0] // e
        a_e = a.view(e, r, a.shape[1])[expert]  # [r, in]
        b_e = b.view(b.shape[0], r, e)[:, :, expert]  # [out, r]
        return a_e, b_e, self.scaling[(name, param)]

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        names = self.adapter_names()
        owner = row_owners(self._router.routes, names)
        if owner is None:
            return self.base_layer(hidden_states, top_k_index, top_k_weights)
        per_row, rest = divmod(hidden_states.shape[0], owner.shape[0])
        if rest or not per_row:
            raise ValueError(
                f"an experts layer got {hidden_states.shape[0]} tokens, not a multiple of the "
                f"pass's {owner.shape[0]} rows"
            )
        token_owner = owner.to(hidden_states.device).repeat_interleave(per_row)
        return self._experts_loop(hidden_states, top_k_index, top_k_weights, token_owner, names)

    def _experts_loop(self, hidden, top_k_index, top_k_weights, token_owner, slots):
        base = self.base_layer
        out = torch.zeros_like(hidden)
        with torch.no_grad():
            mask = nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1)
            mask = mask.permute(2, 1, 0)  # [experts + 1, k, tokens]
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()[:, 0].tolist()
        for expert in hit:
            if expert == self.num_experts:
                continue  # transformers marks dropped tokens with index E
            pos, tok = torch.where(mask[expert])
            x = hidden[tok]
            groups = token_groups(token_owner[tok], slots)
            h = nn.functional.linear(x, base.gate_up_proj[expert])
            h = self.add_delta(h, x, "gate_up_proj", expert, groups)
            gate, up = h.chunk(2, dim=-1)
            h = base.act_fn(gate) * up
            y = nn.functional.linear(h, base.down_proj[expert])
            y = self.add_delta(y, h, "down_proj", expert, groups)
            y = y * top_k_weights[tok, pos, None]
            out.index_add_(0, tok, y.to(out.dtype))
        return out

    def add_delta(self, y, x, param: str, expert: int, groups, weight_of=None) -> torch.Tensor:
        """``y`` (the base projection of ``x``, one expert's tokens) plus, for each
        ``(tenant, token indices)`` of ``groups``, that tenant's delta on those tokens.

        ``weight_of(tenant, indices)`` (optional) gives a function, called in the backward,
        returning those tokens' weights on the adapter weights' gradients (not on ``x``'s), or
        ``None`` for none: how expert parallel weighs tokens that came from other ranks (see
        :mod:`twinkle.model.megatron._moe_lora`)."""
        for name, sel in groups:
            factors = self._factors(name, param, expert)
            if factors is None:
                continue
            a_e, b_e, scaling = factors
            if weight_of is None:
                delta = (x[sel] @ a_e.t()) @ b_e.t() * scaling
            else:
                delta = WeightedDelta.apply(x[sel], a_e, b_e, scaling, weight_of(name, sel))
            y = y.index_add(0, sel, delta.to(y.dtype))
        return y


class WeightedDelta(torch.autograd.Function):
    """``scaling * (x @ a.T) @ b.T`` whose backward weighs each token's share of ``a``'s and
    ``b``'s gradients by ``weights()`` (``[tokens]``, read when the backward runs; ``None``:
    unweighted) and leaves ``x``'s gradient unweighted."""

    @staticmethod
    def forward(ctx, x, a, b, scaling, weights):
        h = x @ a.t()
        ctx.save_for_backward(x, a, b, h)
        ctx.scaling, ctx.weights = scaling, weights
        return (h @ b.t()) * scaling

    @staticmethod
    def backward(ctx, grad):
        x, a, b, h = ctx.saved_tensors
        s = ctx.scaling
        grad_x = ((grad @ b) * s) @ a
        w = ctx.weights()
        weighted = grad if w is None else grad * w.to(grad.device, grad.dtype)[:, None]
        grad_b = (weighted.t() @ h) * s
        grad_a = ((weighted @ b) * s).t() @ x
        return grad_x, grad_a, grad_b, None, None


def row_owners(routes, names: list[str]) -> torch.Tensor | None:
    """Per row of the pass, the index in ``names`` of the routed tenant it belongs to (``-1``:
    a tenant not in ``names``); ``None`` when no routed row belongs to one of ``names``."""
    if not any(r.adapter in names for r in routes):
        return None
    owner = torch.full((max(r.end for r in routes),), -1, dtype=torch.long)
    for route in routes:
        if route.adapter in names:
            owner[route.start : route.end] = names.index(route.adapter)
    return owner


def token_groups(owner: torch.Tensor, slots: list[str]) -> list[tuple[str, torch.Tensor]]:
    """``(tenant, indices into owner)`` for each tenant of ``slots`` present in ``owner``
    (per token, an index into ``slots``, or -1)."""
    present = [s for s in owner.unique().tolist() if s >= 0]
    return [(slots[s], (owner == s).nonzero()[:, 0]) for s in present]
