"""Leaner activations (twinkle.model.transformers.lean): the rewired SwiGLU MLPs keep fewer
tensors for backward and give bit-identical losses and gradients."""

import weakref

import torch
import torch.nn.functional as F
from peft import LoraConfig

from tests.twinkle.model.conftest import make_batch
from twinkle.model import MultiLoraTransformersModel
from twinkle.model.transformers.lean import SiluMul, make_lean

RANKS = {"a": 8, "b": 16}


def _model(model_id, lean):
    m = MultiLoraTransformersModel(model_id, options={"lean_activations": lean})
    for name, rank in RANKS.items():
        m.add_adapter_to_model(
            name, LoraConfig(r=rank, lora_alpha=2 * rank, init_lora_weights=False)
        )
        m.set_optimizer("AdamW", lr=1e-2, adapter_name=name)
    return m


def _saved_bytes(fn):
    """What ``fn``'s output graph keeps for backward: bytes of the distinct storages it holds
    (a tensor saved by a branch that was dropped again does not count)."""
    packed = []

    def pack(t):
        packed.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    alive = {}
    for ref in packed:
        t = ref()
        if t is not None:
            alive[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return out, sum(alive.values())


def _step(model):
    requests = {
        "a": {"inputs": make_batch(rows=2, seq=24, seed=1)},
        "b": {"inputs": make_batch(rows=3, seq=16, seed=2)},
    }
    out = model.forward_backward_many(requests)
    losses = {n: float(o["loss"]) for n, o in out.items()}
    grads = {n: [p.grad.clone() for p in model.tenants[n].params] for n in RANKS}
    model.clip_grad_and_step_many(list(RANKS))
    after = {n: [p.detach().clone() for p in model.tenants[n].params] for n in RANKS}
    return losses, grads, after


def test_rewires_the_swiglu_mlps_of_one_instance_only():
    lean = _model("tiny://qwen3.5", lean=True)
    plain = _model("tiny://qwen3.5", lean=False)
    kinds = lambda m: sorted(  # noqa: E731
        type(mod).__name__ for mod in m.model.modules() if "forward" in vars(mod)
    )
    # tiny://qwen3.5: two decoder layers, two MLPs; the linear-attention layer's gated norm keeps
    # its own forward. The decoder layers of both carry the recompute switch (off unless a pass
    # asks for it, tests/twinkle/model/test_recompute.py).
    layers = ["Qwen3_5DecoderLayer", "Qwen3_5DecoderLayer"]
    assert kinds(lean) == layers + ["Qwen3_5MLP", "Qwen3_5MLP"]
    assert kinds(plain) == layers  # the MLP class is untouched: this instance runs its own code


def test_fused_step_is_bit_identical_with_fewer_saved_bytes():
    for model_id in ("tiny://qwen3", "tiny://qwen3.5"):
        results = {}
        for lean in (False, True):
            m = _model(model_id, lean)
            results[lean] = _step(m)
        (l0, g0, w0), (l1, g1, w1) = results[False], results[True]
        assert l0 == l1, model_id
        for name in RANKS:
            assert all(torch.equal(x, y) for x, y in zip(g0[name], g1[name], strict=True))
            assert all(torch.equal(x, y) for x, y in zip(w0[name], w1[name], strict=True))


def test_a_training_pass_saves_less():
    ids = make_batch(rows=4, seq=64, seed=3)["input_ids"]
    saved = {}
    for lean in (False, True):
        m = _model("tiny://qwen3.5", lean).model
        embeds = m.get_input_embeddings()(ids).detach().requires_grad_(True)
        _, saved[lean] = _saved_bytes(lambda m=m, e=embeds: m(inputs_embeds=e, use_cache=False))
    # 256 tokens. The two MLPs drop silu(gate) (intermediate size 128, fp32, per token each).
    dropped = 4 * 64 * 2 * 128 * 4
    assert dropped <= saved[False] - saved[True] <= dropped + 1024


def test_silu_mul_matches_autograd_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    gate = torch.randn(7, 33, generator=g, requires_grad=True)
    up = torch.randn(7, 33, generator=g, requires_grad=True)
    grad = torch.randn(7, 33, generator=g)
    (F.silu(gate) * up).backward(grad)
    expected = gate.grad.clone(), up.grad.clone()
    gate.grad = up.grad = None
    SiluMul.apply(gate, up).backward(grad)
    assert torch.equal(gate.grad, expected[0]) and torch.equal(up.grad, expected[1])


def test_without_gradients_the_modules_run_their_own_forward():
    m = _model("tiny://qwen3.5", lean=True)
    ids = make_batch(rows=2, seq=12, seed=4)["input_ids"]
    with torch.no_grad():
        lean_logits = m.model(input_ids=ids, use_cache=False).logits
    plain = _model("tiny://qwen3.5", lean=False)
    with torch.no_grad():
        plain_logits = plain.model(input_ids=ids, use_cache=False).logits
    assert torch.equal(lean_logits, plain_logits)


def test_other_mlp_bodies_are_left_alone():
    class GeluMLP(torch.nn.Module):  # same attribute names, another body
        def __init__(self):
            super().__init__()
            self.gate_proj = torch.nn.Linear(4, 8)
            self.up_proj = torch.nn.Linear(4, 8)
            self.down_proj = torch.nn.Linear(8, 4)
            self.act_fn = torch.nn.SiLU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) + self.up_proj(x))

    assert make_lean(GeluMLP()) == []
