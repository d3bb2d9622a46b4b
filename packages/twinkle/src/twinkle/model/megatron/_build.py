"""Build a megatron-core ``GPTModel`` from a Hugging Face Qwen3 checkpoint (tensor parallel 1).

The CUDA shims megatron-core needs on a CPU-only torch live here and nowhere else:
``torch.cuda.current_device`` is replaced only for the duration of a forward pass
(:func:`._shims.cpu_shims`), and megatron's CUDA RNG tracker is swapped for a no-op one only when the
process has no CUDA (dropout is 0 in this backend, so the tracker never draws numbers); in such a
process megatron's CUDA RNG state save and restore (activation recompute's checkpoint, which also
saves and restores the CPU generator's) are no-ops too.
"""

from __future__ import annotations

import contextlib
import socket
import warnings
from pathlib import Path
from typing import Any

import torch

from twinkle.model.megatron import _moe

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_moe")


def check_supported(hf_config: Any, model_id: str) -> None:
    """Refuse what this backend does not build: linear attention (Qwen3.5), RoPE scaling, sliding
    windows, MoE layouts other than uniformly sparse Qwen3-MoE (see :mod:`._moe`).

    Raises:
        ValueError: With the reason and the backend to use instead.
    """
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        hint = (
            " (Qwen3.5 mixes Gated DeltaNet linear-attention layers with full-attention ones; "
            "megatron-core 0.16.1 has Gated DeltaNet only as its experimental attention variant "
            "'gated_delta_net', whose block spec requires Transformer Engine (the local spec has "
            "no fused layernorm-linear) and whose layer needs flash-linear-attention's kernels; "
            "neither is part of this CPU/torch backend)"
            if str(model_type).startswith("qwen3_5")
            else ""
        )
        raise ValueError(
            f"backend 'megatron' does not support {model_id} (model_type {model_type!r}){hint}; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}. Use backend 'transformers' for it"
        )
    rope = getattr(hf_config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(
            f"backend 'megatron': RoPE scaling {rope.get('rope_type')!r} of {model_id} is not supported"
        )
    if any(t != "full_attention" for t in getattr(hf_config, "layer_types", None) or []):
        raise ValueError(f"backend 'megatron': {model_id} has non-full-attention (sliding) layers")
    _moe.check_moe(hf_config, model_id)


def check_tp(hf_config: Any, model_id: str, tp_size: int) -> None:
    """Refuse a tensor-parallel size the model's shapes do not divide by (megatron splits heads,
    query groups, the MLP width and the vocabulary evenly).

    Raises:
        ValueError: Naming the first size that does not divide.
    """
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    _moe.check_moe(hf_config, model_id, tp_size)
    for field in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size"):
        value = getattr(hf_config, field)
        if value % tp_size:
            raise ValueError(
                f"backend 'megatron': tp_size {tp_size} does not divide {model_id}'s {field} "
                f"({value})"
            )


class _NoopRngTracker:
    """Stands in for megatron's CUDA RNG tracker on CPU (dropout is 0: nothing is drawn)."""

    @contextlib.contextmanager
    def fork(self, name: str | None = None):
        yield

    def add(self, name: str, seed: int) -> None:
        pass

    def get_states(self) -> dict:
        return {}

    def set_states(self, states: dict) -> None:
        pass

    def reset(self) -> None:
        pass


def _no_cuda_rng_state(*_args: Any, **_kwargs: Any) -> None:
    return None


def _set_no_cuda_rng_state(*_args: Any, **_kwargs: Any) -> None:
    pass


def quiet_megatron_warnings() -> None:
    """Silence megatron-core 0.16 notices that say nothing to a twinkle user (no apex, default tp
    group, deprecated cuda-graph scope): they are emitted on every build or forward pass."""
    for message in (
        "Apex is not installed",
        "Warning: tp_group is None",
        "full scope is deprecated",
        "MLP requires ffn_hidden_size",
        "The 'megatron.core.transformer.custom_layers",
    ):
        warnings.filterwarnings("ignore", message=message, module="megatron")


def init_megatron(device: torch.device, seed: int = 0, tp_size: int = 1, pp_size: int = 1) -> None:
    """Megatron's parallel state with tensor parallel size ``tp_size`` and pipeline parallel
    size ``pp_size`` (the rest of the world is data parallel).

    A worker of :class:`~twinkle.model.megatron.parallel.ParallelMegatronModel` has joined its
    process group already; a lone process gets a one-process world (gloo on CPU, nccl on CUDA).
    """
    quiet_megatron_warnings()
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as mrandom

    if not dist.is_initialized():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            world_size=1,
            rank=0,
        )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tp_size, pp_size)
    have = (
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_pipeline_model_parallel_world_size(),
    )
    if have != (tp_size, pp_size):
        raise RuntimeError(
            f"megatron parallel state has (tp, pp) {have}, the model asks {(tp_size, pp_size)}"
        )
    if device.type == "cpu" and not torch.cuda.is_available():
        mrandom._CUDA_RNG_STATE_TRACKER = _NoopRngTracker()
        mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
        # Recompute's CheckpointFunction saves and restores the CUDA generator's state as well
        # as the CPU one's; a torch without CUDA has no such state to read.
        mrandom._get_cuda_rng_state = _no_cuda_rng_state
        mrandom._set_cuda_rng_state = _set_no_cuda_rng_state
    elif device.type == "cuda" and not mrandom.get_cuda_rng_tracker().get_states():
        mrandom.model_parallel_cuda_manual_seed(seed)  # untested here: no GPU on dev machines


def recompute_kwargs(recompute: bool) -> dict[str, Any]:
    """megatron-core's full activation recompute, one decoder layer per checkpoint (each layer
    keeps only its input and runs again in the backward), or none. Megatron recomputes only in
    a ``TransformerBlock`` in training mode: :class:`._model.MegatronRecompute` sets that per
    pass."""
    if not recompute:
        return {}
    return {
        "recompute_granularity": "full",
        "recompute_method": "uniform",
        "recompute_num_layers": 1,
    }


def transformer_config(
    hf_config: Any, dtype: torch.dtype, pp_size: int = 1, recompute: bool = False
):
    """Megatron's ``TransformerConfig`` equal to a Qwen3 HF config (RMSNorm, SwiGLU, GQA, qk-norm);
    ``recompute``: with megatron's full per-layer recompute settings (:func:`recompute_kwargs`)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=hf_config.num_hidden_layers,
        pipeline_model_parallel_size=pp_size,  # each stage builds num_layers / pp_size layers
        pipeline_dtype=dtype,
        hidden_size=hf_config.hidden_size,
        num_attention_heads=hf_config.num_attention_heads,
        num_query_groups=hf_config.num_key_value_heads,
        kv_channels=getattr(hf_config, "head_dim", None)
        or hf_config.hidden_size // hf_config.num_attention_heads,
        ffn_hidden_size=hf_config.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=bool(getattr(hf_config, "attention_bias", False)),
        qk_layernorm=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,
        perform_initialization=False,  # every weight is loaded from the checkpoint
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        **_moe.config_kwargs(hf_config),  # MoE layers: experts, router (empty when dense)
        **recompute_kwargs(recompute),
    )


def build_gpt(
    hf_config: Any, dtype: torch.dtype, pp_size: int = 1, stage: int = 0, recompute: bool = False
):
    """The GPTModel of pipeline stage ``stage`` (embedding on the first, final norm and output
    layer on the last). Under pp > 1 the output layer is untied: megatron would tie it to the
    first stage's embedding with a construction-time all-reduce that moves the weight to
    ``.cuda()``; the base is frozen, so a loaded copy is exact. ``recompute``: configured for
    megatron's activation recompute (used only in the passes that turn it on)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    rope = getattr(hf_config, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    if _moe.is_moe(hf_config):
        _moe.install_shims()
    return GPTModel(
        config=transformer_config(hf_config, dtype, pp_size, recompute),
        transformer_layer_spec=get_gpt_layer_local_spec(
            num_experts=_moe.num_experts(hf_config), qk_layernorm=True, normalization="RMSNorm"
        ),
        vocab_size=hf_config.vocab_size,
        max_sequence_length=hf_config.max_position_embeddings,
        position_embedding_type="rope",
        rotary_base=theta,
        share_embeddings_and_output_weights=bool(hf_config.tie_word_embeddings) and pp_size == 1,
        pre_process=stage == 0,
        post_process=stage == pp_size - 1,
        # Logits gathered over the vocab shards: every tp rank computes each tenant's loss
        # exactly as one process does (the gather's backward hands each rank its slice).
        parallel_output=False,
    )


def read_hf_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model_dir} has no *.safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


def qkv_layout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int) -> torch.Tensor:
    """HF q/k/v weights or biases (output dim first) in megatron's fused GQA order: per query
    group, its query heads, then its key head, then its value head."""
    rest = q.shape[1:]
    return torch.cat(
        [q.reshape(groups, -1, *rest), k.reshape(groups, -1, *rest), v.reshape(groups, -1, *rest)],
        dim=1,
    ).reshape(-1, *rest)


def tp_shard(value: torch.Tensor, dim: int, tp_size: int, tp_rank: int) -> torch.Tensor:
    """This rank's contiguous slice of ``value`` along ``dim``, as megatron shards its linears."""
    if value.shape[dim] % tp_size:
        raise ValueError(f"dim {dim} of shape {tuple(value.shape)} does not divide by tp {tp_size}")
    return value.chunk(tp_size, dim)[tp_rank]


#: How each megatron parameter is split over tensor-parallel ranks: the dim, or None (replicated).
#: Column-parallel linears (qkv, fc1) and the vocab-parallel embedding split their output rows,
#: row-parallel ones (proj, fc2) their input columns; norms are replicated.
TP_SPLIT_DIM = {
    "embedding.word_embeddings.weight": 0,
    "output_layer.weight": 0,
    "linear_qkv.weight": 0,
    "linear_qkv.bias": 0,
    "linear_proj.weight": 1,
    "linear_fc2.weight": 1,
}


def _split_dim(name: str) -> int | None:
    for suffix, dim in TP_SPLIT_DIM.items():
        if name.endswith(suffix):
            return dim
    return None


def load_hf_weights(
    gpt: torch.nn.Module,
    hf: dict[str, torch.Tensor],
    hf_config: Any,
    tp_size: int = 1,
    tp_rank: int = 0,
    layers: range | None = None,
) -> None:
    """Copy a Qwen3 HF state dict into ``gpt`` (this tp rank's shards; under pp the HF layers
    ``layers`` of this stage, embedding and head where the stage has them); every megatron
    parameter must be filled.

    Raises:
        ValueError: On a missing HF tensor, a shape mismatch or an unfilled megatron parameter.
    """
    groups = hf_config.num_key_value_heads
    layers = range(hf_config.num_hidden_layers) if layers is None else layers
    target: dict[str, torch.Tensor] = {}
    if getattr(gpt, "pre_process", True):
        target["embedding.word_embeddings.weight"] = hf["model.embed_tokens.weight"]
    for local, i in enumerate(layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{local}."
        attn, mlp = src + "self_attn.", src + "mlp."
        target.update(
            {
                dst + "input_layernorm.weight": hf[src + "input_layernorm.weight"],
                dst + "self_attention.linear_qkv.weight": qkv_layout(
                    hf[attn + "q_proj.weight"],
                    hf[attn + "k_proj.weight"],
                    hf[attn + "v_proj.weight"],
                    groups,
                ),
                dst + "self_attention.q_layernorm.weight": hf[attn + "q_norm.weight"],
                dst + "self_attention.k_layernorm.weight": hf[attn + "k_norm.weight"],
                dst + "self_attention.linear_proj.weight": hf[attn + "o_proj.weight"],
                dst + "pre_mlp_layernorm.weight": hf[src + "post_attention_layernorm.weight"],
            }
        )
        if _moe.is_moe(hf_config):  # router and this expert-parallel rank's experts
            target.update(_moe.expert_weights(hf, i, dst, hf_config))
        else:
            # fc1 is [gate | up] per rank: each rank holds its slice of both halves.
            fc1 = [hf[mlp + "gate_proj.weight"], hf[mlp + "up_proj.weight"]]
            target[dst + "mlp.linear_fc1.weight"] = torch.cat(
                [tp_shard(half, 0, tp_size, tp_rank) for half in fc1]
            )
            target[dst + "mlp.linear_fc2.weight"] = hf[mlp + "down_proj.weight"]
        if getattr(hf_config, "attention_bias", False):
            target[dst + "self_attention.linear_qkv.bias"] = qkv_layout(
                hf[attn + "q_proj.bias"], hf[attn + "k_proj.bias"], hf[attn + "v_proj.bias"], groups
            )
    if getattr(gpt, "post_process", True):
        target["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
        if not getattr(gpt, "share_embeddings_and_output_weights", True):
            tied = hf_config.tie_word_embeddings or "lm_head.weight" not in hf
            target["output_layer.weight"] = hf[
                "model.embed_tokens.weight" if tied else "lm_head.weight"
            ]
    params = dict(gpt.named_parameters())
    unfilled = sorted(set(params) - set(target))
    if unfilled:
        raise ValueError(f"no HF weight maps to megatron parameters {unfilled[:4]}")
    with torch.no_grad():
        for name, value in target.items():
            param = params[name]
            dim = _split_dim(name)
            if dim is not None and tp_size > 1:
                value = tp_shard(value, dim, tp_size, tp_rank)
            if tuple(param.shape) != tuple(value.shape):
                raise ValueError(
                    f"{name}: HF shape {tuple(value.shape)} != megatron {tuple(param.shape)}"
                )
            param.copy_(value.to(param.dtype))
