"""The megatron GPTModel behind a transformers-like face, with LoRA under HF module names.

LoRA layout (the simplest one that stays PEFT-compatible): every tenant's adapter lives on the
HF-equivalent projections ``model.layers.<i>.self_attn.{q,k,v,o}_proj`` and
``model.layers.<i>.mlp.{gate,up,down}_proj``, as :class:`~twinkle.model.lora.MultiLoraLinear`
modules of a shape-only "HF view" tree (:class:`_HFView`; its base weights are zero-byte
stand-ins and its forward is never called). The megatron linears are wrapped by
:class:`_LoraParallelLinear`, which adds those adapters' deltas to megatron's output: q/k/v deltas
are interleaved into ``linear_qkv``'s GQA layout, gate/up deltas concatenated as ``linear_fc1``'s
halves. An MoE layer's view holds ``mlp.experts``, a stand-in of transformers' experts module for
``target_parameters`` adapters, which :mod:`._moe_lora` applies inside megatron's experts. Saved
adapters therefore carry HF names and load with ``peft.PeftModel`` on the HF model.

The LM head (HF ``lm_head``; Tinker's ``train_unembed``) is one more column-parallel part:
:class:`_LoraOutputLayer` adds each tenant's ``(x A^T) B^T`` to megatron's ``output_layer``
logits (its vocab shard at tp > 1, before the logits gather). With tied embeddings megatron passes
the embedding weight into ``output_layer``; the adapter still adapts only the output, as PEFT's
does on a tied HF ``lm_head``. Under pipeline parallel it sits on the last stage (whose output
layer is untied: the first stage's embedding stays frozen as it is).

Logits-free log-probs (one pipeline stage): :meth:`MegatronCausalLM.last_hidden_states` stops at
the final normalised hidden states (the output layer hands its input back instead of the logits)
and :meth:`MegatronCausalLM.linear_head_weight` gives the output layer's weight (the embedding's
where tied), so the step takes log-probs from them in tiles
(:mod:`twinkle.model.step.linear_logprobs`), the ``lm_head`` adapters' low-rank part included. At
tp > 1 the weight is this rank's vocab shard and each token's row figures are reduced over the
tensor-parallel group (:meth:`MegatronCausalLM.vocab_shard`): no rank holds a whole row of logits.

Activation recompute: :class:`MegatronRecompute` runs megatron-core's own full per-layer recompute
(``_build.recompute_kwargs``) in the passes the step turns it on for, with each tenant's row routes
replayed when a layer runs again in the backward.
"""

from __future__ import annotations

import types
import weakref
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from twinkle.model.lora import LoraRouter, MultiLoraLinear
from twinkle.model.megatron import _moe, _moe_lora, _tp_lora
from twinkle.model.megatron._shims import cpu_shims
from twinkle.model.step.linear_logprobs import VocabShard
from twinkle.model.transformers.recompute import LayerRecompute


class _ShapeOnlyLinear(nn.Module):
    """A frozen linear's shape, dtype and device without its weights (a zero-stride tensor)."""

    def __init__(self, in_features: int, out_features: int, like: torch.Tensor) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        stub = torch.zeros((), dtype=like.dtype, device=like.device).expand(
            out_features, in_features
        )
        self.weight = nn.Parameter(stub, requires_grad=False)
        self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the HF view only carries adapters; megatron computes the base layer")


class _HFView(nn.Module):
    """``layers[i].self_attn.{q,k,v,o}_proj`` and ``layers[i].mlp.{gate,up,down}_proj``; under
    pipeline parallel only this stage's ``layers`` (HF indices kept: ``layers.<i>`` names)."""

    def __init__(
        self, hf_config: Any, router: LoraRouter, like: torch.Tensor, layers: range | None = None
    ) -> None:
        super().__init__()
        h = hf_config.hidden_size
        # An MoE layer's router and experts are no nn.Linear in HF either (3-D expert
        # parameters): its mlp has no linears to adapt (see _moe.check_adapter_targets), only
        # the experts' stand-in, which target_parameters adapts (see _moe_lora).
        dense_mlp = not _moe.is_moe(hf_config)
        d = getattr(hf_config, "head_dim", None) or h // hf_config.num_attention_heads
        q, kv, ffn = (
            hf_config.num_attention_heads * d,
            hf_config.num_key_value_heads * d,
            hf_config.intermediate_size,
        )

        def lin(i: int, o: int) -> MultiLoraLinear:
            return MultiLoraLinear(_ShapeOnlyLinear(i, o, like), router)

        indices = range(hf_config.num_hidden_layers) if layers is None else layers
        layers = []
        for _ in indices:
            layer = nn.Module()
            layer.self_attn = nn.Module()
            for name, (i, o) in {
                "q_proj": (h, q),
                "k_proj": (h, kv),
                "v_proj": (h, kv),
                "o_proj": (q, h),
            }.items():
                setattr(layer.self_attn, name, lin(i, o))
            layer.mlp = nn.Module()
            mlp_parts = {"gate_proj": (h, ffn), "up_proj": (h, ffn), "down_proj": (ffn, h)}
            for name, (i, o) in (mlp_parts if dense_mlp else {}).items():
                setattr(layer.mlp, name, lin(i, o))
            if not dense_mlp:
                layer.mlp.experts = _moe_lora.ShapeOnlyExperts(
                    _moe.num_experts(hf_config), h, hf_config.moe_intermediate_size, like
                )
            layers.append(layer)
        if len(indices) == hf_config.num_hidden_layers:
            self.layers = nn.ModuleList(layers)
        else:  # a pipeline stage: keyed by the HF index, so adapter names stay the HF model's
            self.layers = nn.ModuleDict({str(i): layer for i, layer in zip(indices, layers)})


class _LoraParallelLinear(nn.Module):
    """A megatron Column/RowParallelLinear plus the LoRA deltas of its HF parts (tp > 1: see
    :mod:`~twinkle.model.megatron._tp_lora`).

    Megatron activations are ``[seq, batch, hidden]``: rows (tenants' sequences) are dim 1, so the
    input is viewed batch-first for the op (``MultiLoraLinear.lora_delta``) and the delta turned
    back.
    """

    def __init__(
        self,
        base: nn.Module,
        parts: list[MultiLoraLinear],
        kind: str,
        groups: int = 1,
        tp_size: int = 1,
    ) -> None:
        super().__init__()
        self.base = base
        # kind: 'qkv' / 'fc1' (column-parallel, output split), 'row' (input split).
        self.kind, self.groups, self.tp_size = kind, groups, tp_size
        # Plain attribute: the adapters are registered (and named) in the HF view only.
        object.__setattr__(self, "parts", parts)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any):
        out, bias = self.base(x, *args, **kwargs)
        xb = x.transpose(0, 1)
        segments = [part.segments(xb.shape[0]) for part in self.parts]
        if not any(segments):
            return out, bias
        deltas = [
            self._delta(xb, part, segs) if segs else None
            for part, segs in zip(self.parts, segments)
        ]
        tp = self.tp_size
        deltas = [
            d
            if d is not None
            else xb.new_zeros(*xb.shape[:-1], p.out_features // (tp if self.kind != "row" else 1))
            for d, p in zip(deltas, self.parts)
        ]
        if self.kind == "qkv":
            g = self.groups // tp  # this rank's query groups
            delta = torch.cat([d.unflatten(-1, (g, -1)) for d in deltas], dim=-1).flatten(-2)
        else:  # fc1: [gate | up] (this rank's slice of each); row: one part
            delta = torch.cat(deltas, dim=-1) if len(deltas) > 1 else deltas[0]
        return out + delta.transpose(0, 1).to(out.dtype), bias

    def _delta(self, xb: torch.Tensor, part: MultiLoraLinear, segments: list) -> torch.Tensor:
        if self.tp_size == 1:
            return part.lora_delta(xb, segments)
        if self.kind == "row":
            return _tp_lora.row_delta(xb, segments, part.out_features)
        return _tp_lora.column_delta(xb, segments, part.out_features)


class _LoraOutputLayer(nn.Module):
    """megatron's ``output_layer`` (ColumnParallelLinear over the vocabulary) plus the tenants'
    ``lm_head`` deltas, added to this rank's vocab shard before the logits are gathered."""

    def __init__(self, base: nn.Module, part: MultiLoraLinear, tp_size: int = 1) -> None:
        super().__init__()
        self.base, self.tp_size = base, tp_size
        #: While set, the layer hands its input (the final hidden states) back in place of the
        #: logits (:meth:`MegatronCausalLM.last_hidden_states`).
        self.pass_hidden = False
        object.__setattr__(self, "part", part)  # registered in the HF view's place only

    def __getattr__(self, name: str) -> Any:
        # GPTModel reads the output layer's attributes (``weight``, ``sequence_parallel``...).
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.base, name)

    def forward(self, x: torch.Tensor, weight=None, runtime_gather_output=None):
        if self.pass_hidden:  # GPTModel turns it batch-first, as it does the logits
            return x, None
        segments = self.part.segments(x.shape[1])
        if not segments:
            return self.base(x, weight=weight, runtime_gather_output=runtime_gather_output)
        gather = self.base.gather_output if runtime_gather_output is None else runtime_gather_output
        logits, bias = self.base(x, weight=weight, runtime_gather_output=False)
        xb = x.transpose(0, 1)
        if self.tp_size == 1:
            delta = self.part.lora_delta(xb, segments)
        else:
            delta = _tp_lora.column_delta(xb, segments, self.part.out_features)
        logits = logits + delta.transpose(0, 1).to(logits.dtype)
        if gather and self.tp_size > 1:
            from megatron.core.tensor_parallel.mappings import (
                gather_from_tensor_model_parallel_region,
            )

            logits = gather_from_tensor_model_parallel_region(logits)
        return logits, bias


def _megatron_recomputing() -> bool:
    """Whether megatron's checkpoint is running its function (its rerun, in the backward)."""
    from megatron.core.tensor_parallel import random as mrandom

    return mrandom.IS_CHECKPOINTING


class MegatronRecompute(LayerRecompute):
    """The switch of one megatron model's activation recompute (the interface of the
    transformers backend's :class:`~twinkle.model.transformers.recompute.LayerRecompute`).

    megatron-core recomputes (its config's full, uniform, one-layer recompute) only in a
    ``TransformerBlock`` in training mode; the base model stays in eval mode, so the block is put
    in training mode for the passes the step turns recompute on for (:meth:`enabled`) that build
    a graph. Its ``CheckpointFunction`` runs each layer without a graph, keeps the layer's input
    and runs the layer again inside the backward, after the pass's route context has exited. So:

    - the layer's first run takes a graph all the same (dropped at once: one layer's activations
      live at a time), so the LoRA dropout, which applies where a graph is built, draws its masks
      as a pass without recompute does; megatron's checkpoint restores the generators' states
      before the rerun, so the rerun draws the same masks;
    - each first run records the router's state (routes, direct-gradient anchors) under its
      input's storage, which the checkpoint keeps for the rerun; the rerun restores it, so every
      row goes through the adapter it went through in the forward (any number of passes or
      pipeline microbatches in flight);
    - the block's input is made to require a gradient (the embedding is frozen): megatron's
      checkpoint gives a gradient only to a layer whose inputs need one.

    Attributes:
        layers: Qualified names of the decoder layers that recompute.
        active: Whether passes with gradients recompute now.
    """

    def __init__(self, gpt: nn.Module, router: LoraRouter, device: torch.device) -> None:
        super().__init__(router, [])
        self.device = device
        self._first_run = False  # inside a recomputing block's forward
        self._replay: dict[tuple[int, int], tuple[weakref.ref, tuple]] = {}
        decoder = gpt.decoder
        decoder.forward = types.MethodType(self._block(decoder.forward), decoder)
        for i, layer in enumerate(decoder.layers):
            layer.forward = types.MethodType(self._layer(layer.forward), layer)
            self.layers.append(f"decoder.layers.{i}")

    def _block(self, plain):
        def forward(block, *args: Any, **kwargs: Any):
            if not (self.active and torch.is_grad_enabled()):
                return plain(*args, **kwargs)
            hidden = kwargs.get("hidden_states")
            if hidden is not None and not hidden.requires_grad:
                kwargs["hidden_states"] = hidden.detach().requires_grad_(True)
            training, first = block.training, self._first_run
            block.training, self._first_run = True, True
            try:
                return plain(*args, **kwargs)
            finally:
                block.training, self._first_run = training, first

        return forward

    def _layer(self, plain):
        def forward(layer, *args: Any, **kwargs: Any):
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            if self._first_run and not torch.is_grad_enabled():
                # The checkpoint's first run: record the routes, run as a pass with a graph.
                self._remember((id(layer), hidden.data_ptr()), hidden)
                with torch.enable_grad():
                    out = plain(*args, **kwargs)
                return tuple(o.detach() if isinstance(o, torch.Tensor) else o for o in out)
            if not (torch.is_grad_enabled() and _megatron_recomputing()):
                return plain(*args, **kwargs)
            # The rerun inside the backward: the routes of the layer's first run.
            entry = self._replay.pop((id(layer), hidden.data_ptr()), None)
            if entry is None:
                raise RuntimeError("a recomputed decoder layer has no recorded row routes")
            with self.router.restored(entry[1]), cpu_shims(self.device):
                return plain(*args, **kwargs)

        return forward

    def _remember(self, key: tuple[int, int], hidden: torch.Tensor) -> None:
        def forget(ref: weakref.ref) -> None:
            if self._replay.get(key, (None,))[0] is ref:
                del self._replay[key]

        self._replay[key] = (weakref.ref(hidden, forget), self.router.snapshot())


class MegatronCausalLM(nn.Module):
    """``model(input_ids, attention_mask, position_ids).logits`` ([batch, seq, vocab]) from a GPTModel.

    ``self.model`` (the HF view, registered first so its names win) holds the adapters,
    ``self.gpt`` the megatron model.
    """

    def __init__(
        self,
        gpt: nn.Module,
        hf_config: Any,
        router: LoraRouter,
        device: torch.device,
        tp_size: int = 1,
        layers: range | None = None,
    ) -> None:
        super().__init__()
        like = next(gpt.parameters())  # a pipeline stage past the first has no embedding
        self.model = _HFView(hf_config, router, like, layers)
        output_layer = getattr(gpt, "output_layer", None)
        if output_layer is not None:  # pp 1, or the last stage: the HF ``lm_head``
            h, vocab = hf_config.hidden_size, hf_config.vocab_size
            self.lm_head = MultiLoraLinear(_ShapeOnlyLinear(h, vocab, like), router)
            gpt.output_layer = _LoraOutputLayer(output_layer, self.lm_head, tp_size)
        self.gpt = gpt
        self.config = hf_config
        self._device = device
        self.tp_size = tp_size
        #: Rows and padded tokens run forward so far: what this rank computed (under expert
        #: parallel its share of the rows, not the whole batch).
        self.rows_computed = self.tokens_computed = 0
        groups = hf_config.num_key_value_heads
        self._hooks: list[_moe_lora.ExpertLoraHook] = []
        self.expert_token_scales = _moe_lora.TokenScales()
        views = self.model.layers
        views = views.values() if isinstance(views, nn.ModuleDict) else views
        for view, layer in zip(views, gpt.decoder.layers, strict=True):
            attn, mlp = layer.self_attention, layer.mlp
            a, m = view.self_attn, view.mlp
            attn.linear_qkv = _LoraParallelLinear(
                attn.linear_qkv, [a.q_proj, a.k_proj, a.v_proj], "qkv", groups, tp_size
            )
            attn.linear_proj = _LoraParallelLinear(attn.linear_proj, [a.o_proj], "row", 1, tp_size)
            if hasattr(m, "gate_proj"):  # a dense MLP (an MoE layer's experts: no LoRA)
                mlp.linear_fc1 = _LoraParallelLinear(
                    mlp.linear_fc1, [m.gate_proj, m.up_proj], "fc1", 1, tp_size
                )
                mlp.linear_fc2 = _LoraParallelLinear(
                    mlp.linear_fc2, [m.down_proj], "row", 1, tp_size
                )
            elif hasattr(m, "experts"):  # an MoE layer: the experts' adapters, per token
                self._hooks.append(
                    _moe_lora.ExpertLoraHook(mlp, m, router, self.expert_token_scales)
                )

    def expert_layers(self) -> list[nn.Module]:
        """The HF view's expert adapter layers (``MultiLoraExperts``; none until a tenant
        names ``target_parameters``)."""
        return [a for a in (h.adapters() for h in self._hooks) if a is not None]

    def get_input_embeddings(self) -> nn.Module:
        embedding = self.gpt.embedding.word_embeddings
        if self.tp_size == 1:
            return embedding
        # A vocab shard: callers read the vocabulary size off ``weight``; show the whole one.
        vocab = self.config.vocab_size
        return _ShapeOnlyLinear(embedding.weight.shape[1], vocab, embedding.weight)

    def get_output_embeddings(self) -> nn.Module | None:
        # The HF view's LM head: 'all-linear' leaves it out, as peft does; naming it adapts it.
        return getattr(self, "lm_head", None)

    def linear_head_weight(self) -> torch.Tensor | None:
        """The output layer's ``[vocab, hidden]`` weight, which the step takes log-probs from
        with :meth:`last_hidden_states` (the input embedding's where tied; the ``lm_head``
        adapters come from :meth:`get_output_embeddings`): at tp > 1 this rank's vocab shard
        (:meth:`vocab_shard`). ``None`` without an output layer."""
        output_layer = getattr(self.gpt, "output_layer", None)
        if not isinstance(output_layer, _LoraOutputLayer):
            return None
        if self.gpt.share_embeddings_and_output_weights:
            return self.gpt.shared_embedding_or_output_weight()
        return output_layer.base.weight

    def vocab_shard(self) -> VocabShard | None:
        """At tp > 1, where this rank's rows of :meth:`linear_head_weight` sit in the vocabulary
        and how its tensor-parallel group combines them (``None`` at tp 1)."""
        return tp_vocab_shard(self.config.vocab_size) if self.tp_size > 1 else None

    def install_recompute(self, router: LoraRouter) -> MegatronRecompute:
        """Activation recompute for this model's decoder layers (built with megatron's recompute
        settings, ``_build.recompute_kwargs``); off until :meth:`MegatronRecompute.enabled`."""
        return MegatronRecompute(self.gpt, router, self._device)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **_: Any,
    ) -> SimpleNamespace:
        return SimpleNamespace(logits=self._run(input_ids, attention_mask, position_ids))

    def last_hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **_: Any,
    ) -> torch.Tensor:
        """``[batch, seq, hidden]``: the final normalised hidden states, the output layer's input
        (no logits computed)."""
        output_layer = self.gpt.output_layer
        output_layer.pass_hidden = True
        try:
            return self._run(input_ids, attention_mask, position_ids)
        finally:
            output_layer.pass_hidden = False

    def _run(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        position_ids, mask = megatron_inputs(input_ids, attention_mask, position_ids)
        self.rows_computed += input_ids.shape[0]
        self.tokens_computed += input_ids.numel()
        with cpu_shims(self._device):
            return self.gpt(input_ids, position_ids, mask)


def tp_vocab_shard(vocab_size: int) -> VocabShard:
    """This rank's contiguous rows of a ``vocab_size`` head split over megatron's tensor-parallel
    group (as its vocab-parallel output layer and embedding split it)."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel.mappings import (
        copy_to_tensor_model_parallel_region,
        gather_from_tensor_model_parallel_region,
    )

    rows = vocab_size // ps.get_tensor_model_parallel_world_size()
    return VocabShard(
        start=ps.get_tensor_model_parallel_rank() * rows,
        group=ps.get_tensor_model_parallel_group(),
        enter=copy_to_tensor_model_parallel_region,
        rows_of=_tp_lora.vocab_rows,
        gather=gather_from_tensor_model_parallel_region,
    )


def megatron_inputs(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Position ids and megatron's attention mask (True = not attended): causal, plus padded
    keys when a mask is given."""
    rows, seq = input_ids.shape
    if position_ids is None:
        position_ids = torch.arange(seq, device=input_ids.device).expand(rows, seq)
    mask = torch.ones(seq, seq, dtype=torch.bool, device=input_ids.device).triu(1)
    mask = mask.expand(rows, 1, seq, seq)
    if attention_mask is not None and not bool(attention_mask.all()):
        mask = mask | (attention_mask == 0)[:, None, None, :]
    return position_ids, mask
