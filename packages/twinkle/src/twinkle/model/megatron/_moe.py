"""Qwen3-MoE on megatron-core: config fields, the MoE layer spec, expert weights, CPU shims.

Qwen3-MoE (``Qwen3MoeForCausalLM``) is Qwen3 with every decoder MLP replaced by a sparse block:
a router ``mlp.gate`` (``[experts, hidden]``, no bias) picks the top-k experts of a softmax; with
``norm_topk_prob`` the k probabilities are renormalised to sum to 1. Each expert is a SwiGLU MLP
of width ``moe_intermediate_size``. Megatron's ``TopKRouter`` with ``softmax`` scores computes
the same: without ``moe_router_pre_softmax`` it takes the top-k logits and softmaxes them (the
renormalised probabilities), with it the softmax first and no renormalisation. There is no shared
expert, no aux loss on the logits (``moe_router_load_balancing_type='none'``, coefficient 0) and
no capacity / token dropping. Only uniformly sparse models are built (``decoder_sparse_step`` 1,
``mlp_only_layers`` empty: every released Qwen3-MoE checkpoint).

Expert parallel: megatron's experts are ``SequentialMLP`` (the local spec, no grouped GEMM), one
``MLP`` per local expert; with ``expert_model_parallel_size`` E each rank holds
``num_experts / E`` of them (global expert ``ep_rank * local + j`` is local ``j``) and the
``alltoall`` token dispatcher moves each token to the ranks of its experts and back.

Shims (:func:`install_shims`, run only when this backend builds an MoE model):

* Without Transformer Engine (any device), megatron-core 0.16.1's router linear reads the module
  global ``moe_utils.te_general_gemm``, which is bound only when TE imports, so every MoE
  forward raises ``NameError: name 'te_general_gemm' is not defined``; it is bound to ``None``
  (the torch-matmul fallback the code then takes).
* On a CPU-only torch the alltoall dispatcher's constructor calls ``torch.cuda.Stream()``
  (``RuntimeError: torch.cuda.Stream requires CUDA support``) and its forward copies the split
  sizes to the host on that stream. The class gets a placeholder stream and a host-side
  version of that one step (the tensors are on the host already). The all-to-all's backward
  allocates on ``torch.cuda.current_device()``, which ``cpu_shims`` answers only during the
  forward pass; its backward runs under the same shim. With CUDA nothing changes.
"""

from __future__ import annotations

from typing import Any

import torch

MOE_MODEL_TYPES = ("qwen3_moe",)


def is_moe(hf_config: Any) -> bool:
    return getattr(hf_config, "model_type", None) in MOE_MODEL_TYPES


def num_experts(hf_config: Any) -> int | None:
    """The expert count of a MoE config (``None`` for a dense one: megatron's dense spec)."""
    if not is_moe(hf_config):
        return None
    return getattr(hf_config, "num_experts", None) or hf_config.num_local_experts


def check_moe(hf_config: Any, model_id: str, tp_size: int = 1, ep_size: int = 1) -> None:
    """Refuse what this MoE mapping does not build, naming the field.

    Raises:
        ValueError: Dense layers among sparse ones, shared experts, tp > 1 with MoE, or an
            ``ep_size`` that does not divide the experts (or is given for a dense model).
    """
    if not is_moe(hf_config):
        if ep_size > 1:
            raise ValueError(
                f"backend 'megatron': ep_size {ep_size} > 1 needs an MoE model; {model_id} "
                f"(model_type {getattr(hf_config, 'model_type', None)!r}) has no experts"
            )
        return
    if (
        getattr(hf_config, "mlp_only_layers", None)
        or getattr(hf_config, "decoder_sparse_step", 1) != 1
    ):
        raise ValueError(
            f"backend 'megatron': {model_id} mixes dense and MoE layers (mlp_only_layers "
            f"{hf_config.mlp_only_layers}, decoder_sparse_step {hf_config.decoder_sparse_step}); "
            "only uniformly sparse Qwen3-MoE models are built. Use backend 'transformers'"
        )
    if getattr(hf_config, "shared_expert_intermediate_size", 0):
        raise ValueError(f"backend 'megatron': {model_id} has shared experts (not mapped)")
    if tp_size > 1:
        raise ValueError(
            f"backend 'megatron': tp_size {tp_size} with the MoE model {model_id} is not built "
            "(expert tensor parallelism is not mapped); use ep_size to split the experts"
        )
    experts = num_experts(hf_config)
    if ep_size < 1 or experts % ep_size:
        raise ValueError(
            f"backend 'megatron': ep_size {ep_size} does not divide {model_id}'s num_experts "
            f"({experts})"
        )


def config_kwargs(hf_config: Any) -> dict[str, Any]:
    """The ``TransformerConfig`` fields of the MoE layers (empty for a dense model)."""
    if not is_moe(hf_config):
        return {}
    return dict(
        num_moe_experts=num_experts(hf_config),
        moe_router_topk=hf_config.num_experts_per_tok,
        moe_ffn_hidden_size=hf_config.moe_intermediate_size,
        moe_router_score_function="softmax",
        # Top-k of the logits then softmax = HF's renormalised top-k probabilities.
        moe_router_pre_softmax=not bool(getattr(hf_config, "norm_topk_prob", False)),
        moe_router_load_balancing_type="none",  # no aux loss: the logits are HF's
        moe_aux_loss_coeff=0.0,
        moe_router_dtype="fp32",  # HF softmaxes the router logits in float32
        moe_token_dispatcher_type="alltoall",
        moe_grouped_gemm=False,
        moe_permute_fusion=False,
        moe_router_fusion=False,
    )


def expert_weights(
    hf: dict[str, torch.Tensor], layer: int, dst: str, hf_config: Any
) -> dict[str, torch.Tensor]:
    """Megatron names -> HF tensors of MoE layer ``layer``'s router and this rank's experts.

    Router ``mlp.gate`` -> ``mlp.router.weight``; expert ``e``'s ``gate_proj``/``up_proj`` ->
    ``linear_fc1`` (``[gate; up]``), ``down_proj`` -> ``linear_fc2``, for the experts of this
    expert-parallel rank.
    """
    from megatron.core import parallel_state as ps

    ep, rank = ps.get_expert_model_parallel_world_size(), ps.get_expert_model_parallel_rank()
    local = num_experts(hf_config) // ep
    src = f"model.layers.{layer}.mlp."
    out = {dst + "mlp.router.weight": hf[src + "gate.weight"]}
    for j in range(local):
        e = f"{src}experts.{rank * local + j}."
        mine = f"{dst}mlp.experts.local_experts.{j}."
        out[mine + "linear_fc1.weight"] = torch.cat(
            [hf[e + "gate_proj.weight"], hf[e + "up_proj.weight"]]
        )
        out[mine + "linear_fc2.weight"] = hf[e + "down_proj.weight"]
    return out


#: Names of an MoE block's parts in HF checkpoints and modules (router ``gate``, the experts'
#: ``gate_proj`` / ``up_proj`` / ``down_proj`` or transformers 5's fused ``gate_up_proj``).
EXPERT_MODULES = frozenset({"experts", "gate", "gate_proj", "up_proj", "down_proj", "gate_up_proj"})
_EXPERT_PROBE = "model.layers.0.mlp.experts.0.gate_proj"


def check_adapter_targets(hf_config: Any, adapter: str, selector: Any) -> None:
    """Refuse a LoRA selector that names an MoE model's router or experts.

    In transformers 5 the experts are 3-D parameters (``experts.gate_up_proj``,
    ``experts.down_proj``) and the router a plain parameter, not ``nn.Linear`` modules, so
    PEFT's ``target_modules`` cannot select them; ``target_parameters`` adapts the experts
    (:mod:`._moe_lora`), ``target_modules`` the attention projections.

    Raises:
        InvalidArgumentError: Naming ``target_modules``.
    """
    if not is_moe(hf_config) or selector == "all-linear":
        return
    import re

    from twinkle.errors import InvalidArgumentError

    if isinstance(selector, str):
        named = sorted(
            n for n in (_EXPERT_PROBE, "model.layers.0.mlp.gate") if re.fullmatch(selector, n)
        )
    else:
        named = sorted(set(selector) & EXPERT_MODULES)
    if named:
        raise InvalidArgumentError(
            f"adapter {adapter!r}: LoraConfig field target_modules={selector!r} is refused: it "
            f"selects {named} of an MoE model's router/experts, which target_modules cannot "
            "reach (the experts are 3-D parameters, not nn.Linear modules, in transformers 5; "
            "the router carries no LoRA): adapt the experts with target_parameters, e.g. "
            "['mlp.experts.gate_up_proj', 'mlp.experts.down_proj'], and the attention "
            "projections (q_proj, "
            "k_proj, v_proj, o_proj) or use 'all-linear'"
        )


class _PlaceholderStream:
    """Stands in for the alltoall dispatcher's class-level CUDA stream on a CPU-only torch."""


def _host_splits(self, point: str, tokens_per_expert: torch.Tensor | None = None):
    # The CUDA path copies these to the host on a side stream; on CPU they are there already.
    # The all-to-all wants plain split sizes, as the CUDA path hands it (numpy there).
    if not self.drop_and_pad and point == self.cuda_dtoh_point:
        for name in ("input_splits", "output_splits", "output_splits_tp"):
            value = getattr(self, name)
            if torch.is_tensor(value):
                setattr(self, name, value.tolist())
    return tokens_per_expert


def install_shims() -> None:
    """Called before building an MoE GPTModel; idempotent.

    Any device: bind megatron's missing ``te_general_gemm`` to ``None`` (see the module
    docstring). A CPU-only torch (where the CUDA path cannot run at all): the alltoall
    dispatcher class gets a placeholder stream and a host-side split step.
    """
    from megatron.core.transformer.moe import moe_utils
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher as D

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    if torch.cuda.is_available():
        return
    if D.cuda_dtoh_stream is None:
        D.cuda_dtoh_stream = _PlaceholderStream()
    D._maybe_dtoh_and_synchronize = _host_splits
    from megatron.core.tensor_parallel import mappings

    backward = mappings._AllToAll.backward
    if not getattr(backward, "_twinkle_cpu", False):
        # The all-to-all's backward is another all-to-all, whose output is allocated on
        # torch.cuda.current_device(): shimmed to the host during the forward pass only
        # (_shims.cpu_shims), so the backward gets the same shim.
        def cpu_backward(ctx, *grads):
            from twinkle.model.megatron._shims import cpu_shims

            with cpu_shims(torch.device("cpu")):
                return backward(ctx, *grads)

        cpu_backward._twinkle_cpu = True
        mappings._AllToAll.backward = staticmethod(cpu_backward)


def init_expert_parallel(kwargs: dict[str, Any]) -> None:
    """In a :class:`~twinkle.model.megatron.parallel.ParallelMegatronModel` worker whose process
    group exists: megatron's parallel state with ``expert_model_parallel_size = ep_size`` (a
    no-op at ep 1: the model's own ``init_megatron`` sets tp/pp up).

    megatron carves the expert-parallel groups out of the data-parallel ranks: with tp 1 and
    pp 1 the ``ep_size`` ranks are megatron's data-parallel ranks, each fed its share of the
    rows (:mod:`~twinkle.model.megatron._dp_world`; see docs/megatron.md, Expert parallel).
    """
    ep = int(kwargs.get("ep_size", 1) or 1)
    if ep == 1:
        return
    from megatron.core import parallel_state as ps

    if not ps.model_parallel_is_initialized():
        ps.initialize_model_parallel(
            kwargs.get("tp_size", 1),
            kwargs.get("pp_size", 1) or 1,
            expert_model_parallel_size=ep,
        )
    if ps.get_expert_model_parallel_world_size() != ep:
        raise RuntimeError(
            f"megatron parallel state has ep {ps.get_expert_model_parallel_world_size()}, "
            f"the model asks {ep}"
        )
