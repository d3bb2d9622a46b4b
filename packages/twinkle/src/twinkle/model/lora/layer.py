"""A frozen linear layer with a pool of LoRA adapters, applied per row segment."""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from twinkle.model.lora.direct_grads import new_anchor
from twinkle.model.lora.ops import KERNELS, LoraSegment, Plan, build_plan, segmented_lora
from twinkle.model.lora.spec import AdapterSpec


@dataclass(frozen=True)
class RowRoute:
    """Rows ``start:end`` of the current batch use adapter ``adapter``."""

    adapter: str
    start: int
    end: int


#: Where a layer's input rows come from: the batch's rows (``"text"``), or the vision tower's
#: patches of every image in the pass, concatenated (``"vision"``).
SCOPES = ("text", "vision")


class LoraRouter:
    """Tells every :class:`MultiLoraLinear` of one model which rows use which adapter, and how.

    The model sets the routes for one forward pass; with no routes the base model runs alone
    (that is how reference log-probabilities are computed with the adapters disabled). A router
    belongs to one model, whose passes run on one thread: the per-pass state it holds (routes,
    direct-gradient anchors) needs no thread-local.

    Args:
        kernel: The multi-LoRA op's kernel for every layer (``auto | torch | triton``, see
            :func:`~twinkle.model.lora.ops.segmented_lora`); a model passes its
            ``ExecutionOptions.lora_kernel``.

    Raises:
        ValueError: An unknown ``kernel``.
    """

    MAX_LAYOUTS = 64  # distinct layouts remembered; layers cache their op plans per layout

    def __init__(self, kernel: str = "auto") -> None:
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
        self.kernel = kernel
        self.routes: tuple[RowRoute, ...] = ()
        # Vision routes count merged image tokens; a vision-tower layer sees a whole multiple of
        # them (patches before the merger, merged tokens after it) and scales the routes by it.
        self.vision_routes: tuple[RowRoute, ...] = ()
        self.vision_tokens = 0
        # A number per distinct routing layout, never reused: layers key their cached plans on it.
        self.layout_id = 0
        self._layout_ids: dict[tuple[RowRoute, ...], int] = {}
        self._next_id = 1
        # Inside direct_weight_grads: one anchor per device, made at its first use in the block.
        self._anchors: dict[torch.device, torch.Tensor] | None = None

    @contextmanager
    def route(self, routes: list[RowRoute], vision_routes: list[RowRoute] | None = None):
        """Use ``routes`` (non-overlapping, any order) for the forward passes inside the block.

        ``vision_routes`` route the pass's images through the vision tower's layers: ranges of
        merged image tokens (the images of all rows concatenated in row order), each with the
        adapter of the rows the images belong to.
        """
        previous = self.routes, self.vision_routes, self.vision_tokens, self.layout_id
        self.routes = tuple(sorted(routes, key=lambda r: r.start))
        self.vision_routes = tuple(sorted(vision_routes or (), key=lambda r: r.start))
        self.vision_tokens = max((r.end for r in self.vision_routes), default=0)
        layout = (self.routes, self.vision_routes)
        layout_id = self._layout_ids.get(layout)
        if layout_id is None:
            if len(self._layout_ids) >= self.MAX_LAYOUTS:
                self._layout_ids.clear()
            layout_id = self._layout_ids[layout] = self._next_id
            self._next_id += 1
        self.layout_id = layout_id
        try:
            yield
        finally:
            self.routes, self.vision_routes, self.vision_tokens, self.layout_id = previous

    def snapshot(self) -> tuple:
        """This pass's routing state (routes, vision routes, layout, direct-gradient anchors),
        for :meth:`restored` to bring back when a layer is recomputed in the backward."""
        return (self.routes, self.vision_routes, self.vision_tokens, self.layout_id, self._anchors)

    @contextmanager
    def restored(self, state: tuple):
        """Route as :meth:`snapshot` found it inside the block: a recomputed layer then sends
        every row to the adapter, vision route and anchor its first forward used."""
        previous = self.snapshot()
        self.routes, self.vision_routes, self.vision_tokens, self.layout_id, self._anchors = state
        try:
            yield
        finally:
            (
                self.routes,
                self.vision_routes,
                self.vision_tokens,
                self.layout_id,
                self._anchors,
            ) = previous

    def routes_for(self, scope: str, rows: int) -> tuple[RowRoute, ...]:
        """The routes of a layer of ``scope`` whose input has ``rows`` rows.

        Raises:
            ValueError: A vision layer's input is not a whole multiple of the routed image tokens.
        """
        if scope == "text":
            return self.routes
        if not self.vision_routes:
            return ()
        factor, rest = divmod(rows, self.vision_tokens)
        if rest or not factor:
            raise ValueError(
                f"a vision layer got {rows} rows, not a multiple of the pass's "
                f"{self.vision_tokens} image tokens"
            )
        return tuple(
            RowRoute(r.adapter, r.start * factor, r.end * factor) for r in self.vision_routes
        )

    @contextmanager
    def direct_weight_grads(self):
        """Layer calls inside this block add their weight gradients straight to the weights'
        ``.grad`` (see :mod:`~twinkle.model.lora.direct_grads`).

        Every layer takes this pass's anchor on its input's device (:meth:`anchor`) in place of
        its weights as the op's autograd inputs. The caller's contract: before the forward, every
        routed weight has a ``.grad`` to add to and no gradient hooks, and the graph is only
        backpropagated with a plain ``.backward()``. ``twinkle.model.step.fused_forward_backward`` checks
        this and enters the block only when it holds.
        """
        previous = self._anchors
        self._anchors = {}
        try:
            yield
        finally:
            self._anchors = previous

    def anchor(self, device: torch.device) -> torch.Tensor | None:
        """The anchor on ``device`` of the enclosing :meth:`direct_weight_grads` block, or None
        outside such a block."""
        if self._anchors is None:
            return None
        anchor = self._anchors.get(device)
        if anchor is None:
            anchor = self._anchors[device] = new_anchor(device)
        return anchor


def _uniform(shape: torch.Size, fan_in: int, generator: torch.Generator) -> torch.Tensor:
    bound = 1.0 / math.sqrt(fan_in)
    return torch.rand(shape, generator=generator) * 2 * bound - bound


class MultiLoraLinear(nn.Module):
    """``base_layer(x)`` plus, for each routed row segment, that segment's adapter delta.

    Parameter names follow PEFT (``lora_A.<adapter>.weight``, ``lora_B.<adapter>.weight``) so a
    saved adapter is a standard PEFT checkpoint.
    """

    def __init__(self, base_layer: nn.Linear, router: LoraRouter, scope: str = "text") -> None:
        super().__init__()
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
        self.scope = scope
        self.base_layer = base_layer
        self.lora_A = nn.ModuleDict()
        self.lora_B = nn.ModuleDict()
        self.lora_dropout = nn.ModuleDict()
        self.scaling: dict[str, float] = {}
        # A plain attribute, not a submodule: the router is shared by every layer of the model.
        object.__setattr__(self, "_router", router)
        # Segments and op plan per routing layout and input shape, rebuilt when this layer's
        # adapters change: repeated layouts (the same tenants and batch sizes, step after step)
        # skip building them.
        self._plans: dict[tuple, tuple] = {}

    @property
    def in_features(self) -> int:
        return self.base_layer.in_features

    @property
    def out_features(self) -> int:
        return self.base_layer.out_features

    def add_adapter(self, spec: AdapterSpec, generator: torch.Generator) -> None:
        """Create ``spec.name``'s A and B (``spec`` as :meth:`AdapterSpec.for_module` gives it for
        this layer), initialised as peft's ``init_lora_weights`` does, from ``generator``."""
        weight = self.base_layer.weight
        lora_a = nn.Linear(
            self.in_features, spec.r, bias=False, device=weight.device, dtype=weight.dtype
        )
        lora_b = nn.Linear(
            spec.r, self.out_features, bias=False, device=weight.device, dtype=weight.dtype
        )
        with torch.no_grad():
            if spec.init_lora_weights == "gaussian":
                lora_a.weight.copy_(torch.randn(lora_a.weight.shape, generator=generator) / spec.r)
            else:
                # Kaiming-uniform with a=sqrt(5) (bound 1/sqrt(fan_in)), as nn.Linear and peft do.
                lora_a.weight.copy_(_uniform(lora_a.weight.shape, self.in_features, generator))
            if spec.init_lora_weights is False:
                lora_b.weight.copy_(_uniform(lora_b.weight.shape, spec.r, generator))
            else:
                lora_b.weight.zero_()
        self.lora_A[spec.name] = lora_a
        self.lora_B[spec.name] = lora_b
        self.lora_dropout[spec.name] = (
            nn.Dropout(spec.lora_dropout) if spec.lora_dropout > 0 else nn.Identity()
        )
        self.scaling[spec.name] = spec.scaling
        self._plans.clear()

    def remove_adapter(self, name: str) -> None:
        for table in (self.lora_A, self.lora_B, self.lora_dropout):
            if name in table:
                del table[name]
        self.scaling.pop(name, None)
        self._plans.clear()

    def segments(self, rows: int) -> list[LoraSegment]:
        """The current routes that have an adapter in this layer, as op segments.

        Dropout applies in passes that build a graph (autograd on), as peft applies it in
        training mode only: ``forward_only`` and sampling run without it.
        """
        segments = []
        training = torch.is_grad_enabled()
        for route in self._router.routes_for(self.scope, rows):
            if route.adapter not in self.lora_A or route.start >= rows:
                continue
            dropout = self.lora_dropout[route.adapter] if training else None
            segments.append(
                LoraSegment(
                    start=route.start,
                    end=min(route.end, rows),
                    lora_A=self.lora_A[route.adapter].weight,
                    lora_B=self.lora_B[route.adapter].weight,
                    scaling=self.scaling[route.adapter],
                    dropout=None if isinstance(dropout, (nn.Identity, type(None))) else dropout,
                )
            )
        return segments

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base_layer(x)
        router = self._router
        if not (router.vision_routes if self.scope == "vision" else router.routes):
            return out
        key = (self._router.layout_id, x.shape[:-1], x.dtype, x.device, torch.is_grad_enabled())
        cached = self._plans.get(key)
        if cached is None:
            if len(self._plans) >= LoraRouter.MAX_LAYOUTS:
                self._plans.clear()
            segments = self.segments(x.shape[0])
            cached = self._plans[key] = (segments, build_plan(segments, x, self.out_features))
        segments, plan = cached
        if not segments:
            return out
        return out + self.lora_delta(x, segments, plan).to(out.dtype)

    def lora_delta(
        self, x: torch.Tensor, segments: list[LoraSegment], plan: Plan | None = None
    ) -> torch.Tensor:
        """The op over ``segments`` (from :meth:`segments`) on the router's kernel, with its
        direct-gradient anchor when the pass has one."""
        router = self._router
        return segmented_lora(
            x,
            segments,
            self.out_features,
            plan,
            kernel=router.kernel,
            anchor=router.anchor(x.device),
        )
