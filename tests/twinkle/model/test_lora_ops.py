"""The grouped multi-LoRA path (one bmm per rank/rows group) equals the per-segment loop, and
``segmented_lora`` dispatches by its explicit ``kernel`` argument."""

import pytest
import torch

from twinkle.model.lora import LoraRouter
from twinkle.model.lora.direct_grads import new_anchor
from twinkle.model.lora.ops import (
    LoraSegment,
    _segmented_lora_loop,
    segmented_lora,
    segmented_lora_reference,
)

IN, OUT = 24, 40


def _weights(rank: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(rank, IN, generator=g, dtype=torch.float64).requires_grad_(True)
    b = torch.randn(OUT, rank, generator=g, dtype=torch.float64).requires_grad_(True)
    return a, b


def _segments(layout, dropout=None):
    """``layout``: (start, end, rank, scaling) per segment."""
    segs = []
    for i, (start, end, rank, scaling) in enumerate(layout):
        a, b = _weights(rank, seed=i)
        segs.append(LoraSegment(start, end, a, b, scaling, dropout if i % 2 == 0 else None))
    return segs


def _run(fn, layout, x_shape, dropout=None):
    x = torch.randn(*x_shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    x.requires_grad_(True)
    segs = _segments(layout, dropout)
    out = fn(x, segs, OUT)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    (out * weight).sum().backward()
    grads = [x.grad] + [t.grad for s in segs for t in (s.lora_A, s.lora_B)]
    return out.detach(), grads


LAYOUTS = {
    "uniform, contiguous": (
        [(0, 2, 16, 2.0), (2, 4, 16, 2.0), (4, 6, 16, 2.0), (6, 8, 16, 2.0)],
        (8, 5, IN),
    ),
    "mixed ranks": (
        [(0, 2, 8, 2.0), (2, 4, 16, 2.0), (4, 6, 32, 2.0), (6, 8, 64, 2.0)],
        (8, 5, IN),
    ),
    "gaps and interleaved groups": (
        [(1, 3, 8, 1.5), (3, 5, 16, 2.0), (5, 7, 8, 0.5), (8, 10, 16, 2.0), (10, 11, 8, 3.0)],
        (12, 3, IN),
    ),
    "same rank, different rows": ([(0, 1, 16, 2.0), (1, 4, 16, 2.0), (4, 5, 16, 2.0)], (5, 4, IN)),
    "different scalings": ([(0, 3, 4, 0.25), (3, 6, 4, 4.0), (6, 9, 4, 1.0)], (9, IN)),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_grouped_equals_loop(name):
    layout, shape = LAYOUTS[name]
    out, grads = _run(segmented_lora_reference, layout, shape)
    ref_out, ref_grads = _run(_segmented_lora_loop, layout, shape)
    torch.testing.assert_close(out, ref_out, rtol=1e-6, atol=1e-6)
    for g, ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, ref, rtol=1e-6, atol=1e-6)


def test_grouped_applies_each_segments_dropout():
    def halve(t):
        return t * 0.5

    layout, shape = LAYOUTS["uniform, contiguous"]
    out, grads = _run(segmented_lora_reference, layout, shape, dropout=halve)
    ref_out, ref_grads = _run(_segmented_lora_loop, layout, shape, dropout=halve)
    plain_out, _ = _run(_segmented_lora_loop, layout, shape)
    torch.testing.assert_close(out, ref_out, rtol=1e-6, atol=1e-6)
    for g, ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out[:2], plain_out[:2] * 0.5)  # segment 0 has the dropout
    torch.testing.assert_close(out[2:4], plain_out[2:4])  # segment 1 has none


def test_rows_outside_every_segment_are_zero():
    layout, shape = LAYOUTS["gaps and interleaved groups"]
    out, _ = _run(segmented_lora_reference, layout, shape)
    assert out.shape == (12, 3, OUT)
    assert torch.count_nonzero(out[0]) == 0 and torch.count_nonzero(out[7]) == 0
    assert torch.count_nonzero(out[11]) == 0


def test_grouped_float32_matches_loop_within_1e6():
    layout, shape = LAYOUTS["uniform, contiguous"]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    segs = [
        LoraSegment(s, e, a.detach().float(), b.detach().float(), sc)
        for (s, e, _, sc), (a, b) in zip(
            layout, [_weights(r, i) for i, (_, _, r, _) in enumerate(layout)]
        )
    ]
    torch.testing.assert_close(
        segmented_lora_reference(x, segs, OUT),
        _segmented_lora_loop(x, segs, OUT),
        rtol=1e-6,
        atol=1e-5,
    )


def test_torch_dropout_draws_the_same_masks_as_the_loop():
    layout, shape = LAYOUTS["mixed ranks"]
    dropout = torch.nn.Dropout(0.5)
    torch.manual_seed(11)
    out, grads = _run(segmented_lora_reference, layout, shape, dropout=dropout)
    torch.manual_seed(11)
    ref_out, ref_grads = _run(_segmented_lora_loop, layout, shape, dropout=dropout)
    plain_out, _ = _run(_segmented_lora_loop, layout, shape)
    torch.testing.assert_close(out, ref_out, rtol=1e-6, atol=1e-6)
    for g, ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, ref, rtol=1e-6, atol=1e-6)
    assert not torch.allclose(out[:2], plain_out[:2])  # the mask did something on segment 0


# ------------------------------------------------------------------ direct weight gradients
def _direct_run(layout, shape, start_grads):
    """Forward with a direct pass's anchor and backward, every weight's ``.grad`` set to
    ``start_grads(weight)`` first; returns the output and ``[x.grad, weight grads...]``."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    x.requires_grad_(True)
    segs = _segments(layout)
    weights = [t for s in segs for t in (s.lora_A, s.lora_B)]
    for w in weights:
        w.grad = start_grads(w)
    out = segmented_lora_reference(x, segs, OUT, anchor=new_anchor(x.device))
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    (out * weight).sum().backward()
    return out.detach(), [x.grad] + [w.grad for w in weights]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_direct_weight_grads_equal_autograds(name):
    layout, shape = LAYOUTS[name]
    ref_out, ref_grads = _run(segmented_lora_reference, layout, shape)
    out, grads = _direct_run(layout, shape, torch.zeros_like)
    assert torch.equal(out, ref_out)
    for g, ref in zip(grads, ref_grads):
        assert torch.equal(g, ref)  # the same additions: bit for bit


def test_direct_weight_grads_add_to_what_the_grads_held():
    layout, shape = LAYOUTS["mixed ranks"]
    _, ref_grads = _run(segmented_lora_reference, layout, shape)
    _, grads = _direct_run(layout, shape, torch.ones_like)
    for g, ref in zip(grads[1:], ref_grads[1:]):
        torch.testing.assert_close(g, ref + 1.0, rtol=0, atol=1e-12)


def test_direct_weight_grads_without_a_grad_buffer_is_a_clear_error():
    layout, shape = LAYOUTS["uniform, contiguous"]
    with pytest.raises(RuntimeError, match="no .grad to add"):
        _direct_run(layout, shape, lambda w: None)


def test_direct_weight_grads_reach_weights_when_the_input_needs_no_grad():
    """The first adapted layer's input does not require grad: the anchor keeps the op in the
    graph, so the weights still get their gradients."""
    layout, shape = LAYOUTS["uniform, contiguous"]
    segs = _segments(layout)
    for s in segs:
        s.lora_A.grad, s.lora_B.grad = torch.zeros_like(s.lora_A), torch.zeros_like(s.lora_B)
    x = torch.randn(*shape, dtype=torch.float64)
    router = LoraRouter()
    with router.direct_weight_grads():
        anchor = router.anchor(x.device)
        assert anchor is not None and anchor.requires_grad
        assert router.anchor(x.device) is anchor  # one per device for the whole block
        out = segmented_lora_reference(x, segs, OUT, anchor=anchor)
    assert router.anchor(x.device) is None
    assert out.requires_grad
    out.sum().backward()
    assert all(float(s.lora_B.grad.abs().sum()) > 0 for s in segs)
    with torch.no_grad():  # no graph: the plain path, nothing to add
        out = segmented_lora_reference(x, segs, OUT, anchor=new_anchor(x.device))
        assert not out.requires_grad


def test_router_direct_blocks_nest_and_restore():
    router = LoraRouter()
    device = torch.device("cpu")
    with router.direct_weight_grads():
        outer = router.anchor(device)
        with router.direct_weight_grads():
            assert router.anchor(device) is not outer  # a fresh anchor for the inner pass
        assert router.anchor(device) is outer
    assert router.anchor(device) is None


# ------------------------------------------------------------------ dispatch
@pytest.mark.parametrize("kernel", ["auto", "torch", "triton"])
@pytest.mark.parametrize("name", ["mixed ranks", "gaps and interleaved groups"])
def test_segmented_lora_on_cpu_equals_the_loop(kernel, name):
    """On CPU tensors every kernel choice takes the torch kernel: the loop's values and
    gradients."""
    layout, shape = LAYOUTS[name]

    def op(x, segs, out_features):
        return segmented_lora(x, segs, out_features, kernel=kernel)

    out, grads = _run(op, layout, shape)
    ref_out, ref_grads = _run(_segmented_lora_loop, layout, shape)
    torch.testing.assert_close(out, ref_out, rtol=1e-6, atol=1e-6)
    for g, ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, ref, rtol=1e-6, atol=1e-6)


def test_an_unknown_kernel_is_a_value_error():
    layout, shape = LAYOUTS["mixed ranks"]
    x = torch.randn(*shape, dtype=torch.float64)
    with pytest.raises(ValueError, match="kernel must be one of auto, torch, triton, got 'cuda'"):
        segmented_lora(x, _segments(layout), OUT, kernel="cuda")
    with pytest.raises(ValueError, match="kernel must be one of"):
        LoraRouter(kernel="fast")
