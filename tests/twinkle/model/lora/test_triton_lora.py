"""Triton segmented multi-LoRA kernels against the torch reference (forward and every gradient).

Without CUDA the kernels run in the Triton interpreter. ``TRITON_INTERPRET`` is set here before
Triton is imported; ``triton_kernel`` also decorates its kernels lazily for the setting read at
the first launch (once per process, ``twinkle.env.triton_interpret``), so another test module that
imported Triton (or ``triton_kernel``) earlier in the same pytest process does not leave
compiled-only kernels behind (checked by ``test_kernels_follow_env``). A test that changes the
variable calls ``twinkle.env.refresh()`` so that the next launch reads it again.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

_HAS_CUDA = torch.cuda.is_available()
if not _HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"

triton = pytest.importorskip("triton")

from twinkle import env  # noqa: E402
from twinkle.model.lora import LoraRouter, triton_kernel  # noqa: E402
from twinkle.model.lora.ops import LoraSegment, segmented_lora_reference  # noqa: E402
from twinkle.model.lora.triton_kernel import (  # noqa: E402
    segmented_lora_triton,
    triton_available,
)

pytestmark = pytest.mark.unit

IN, OUT = 40, 48  # deliberately not multiples of the block sizes


@pytest.fixture(autouse=True)
def _interpret_without_cuda(monkeypatch):
    if not _HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    env.refresh()
    yield
    env.refresh()


def _device() -> torch.device:
    return torch.device("cuda" if _HAS_CUDA else "cpu")


def _make(shape, spans, dtype, device, in_f=IN, out_f=OUT, seed=0):
    """x of ``shape`` and one segment per ``(start, end, rank)``; values O(1) at the output."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, in_f, generator=gen).to(device=device, dtype=dtype)
    segs = []
    for i, (start, end, rank) in enumerate(spans):
        a = (torch.randn(rank, in_f, generator=gen) / in_f**0.5).to(device=device, dtype=dtype)
        b = (torch.randn(out_f, rank, generator=gen) / rank**0.5).to(device=device, dtype=dtype)
        segs.append(LoraSegment(start, end, a, b, scaling=0.5 + 0.25 * i))
    return x, segs


def _run(fn, x, segs, out_f, grad_out, upcast=False, dropouts=None):
    """Forward + backward through ``fn``; returns [y, dx, dA_0, dB_0, dA_1, ...] (detached)."""
    cast = (lambda t: t.detach().float()) if upcast else (lambda t: t.detach().clone())
    xl = cast(x).requires_grad_()
    leaf_segs = [
        LoraSegment(
            s.start,
            s.end,
            cast(s.lora_A).requires_grad_(),
            cast(s.lora_B).requires_grad_(),
            s.scaling,
            dropouts[i] if dropouts else None,
        )
        for i, s in enumerate(segs)
    ]
    y = fn(xl, leaf_segs, out_f)
    y.backward(grad_out.to(y.dtype))
    out = [y.detach(), xl.grad]
    for s in leaf_segs:
        out.extend([s.lora_A.grad, s.lora_B.grad])
    return out


def _compare(x, segs, out_f=OUT, *, rtol, atol, upcast_ref):
    """Triton vs reference (reference in fp32 on the same, already rounded, inputs if upcast)."""
    gen = torch.Generator().manual_seed(123)
    grad_out = torch.randn(*x.shape[:-1], out_f, generator=gen).to(x.device)
    got = _run(segmented_lora_triton, x, segs, out_f, grad_out.to(x.dtype))
    ref = _run(segmented_lora_reference, x, segs, out_f, grad_out.to(x.dtype), upcast=upcast_ref)
    names = ["y", "dx"] + [f"{n}{i}" for i in range(len(segs)) for n in ("dA", "dB")]
    assert got[0].dtype == x.dtype and got[0].shape == (*x.shape[:-1], out_f)
    for name, g, r in zip(names, got, ref):
        assert g is not None, name
        assert g.dtype == x.dtype, name
        scale = r.abs().max().item() if upcast_ref else 1.0
        torch.testing.assert_close(g.float(), r.float(), rtol=rtol, atol=atol * scale, msg=name)
    return got


CASES = {
    # heterogeneous ranks, gaps before, between and after the segments, 2-D input
    "hetero_gaps_2d": ((150,), [(5, 40, 8), (40, 107, 16), (110, 131, 32), (133, 147, 64)]),
    # one segment over every row
    "full_span": ((70,), [(0, 70, 16)]),
    # 3-D [rows, T, in] with gaps; segments cover whole rows
    "gaps_3d": ((9, 7), [(1, 3, 64), (4, 8, 8), (8, 9, 32)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fp32_matches_reference(case):
    shape, spans = CASES[case]
    x, segs = _make(shape, spans, torch.float32, _device())
    got = _compare(x, segs, rtol=1e-5, atol=1e-5, upcast_ref=False)
    # rows outside every segment: exactly zero output and zero input gradient
    covered = torch.zeros(shape[0], dtype=torch.bool)
    for s, e, _ in spans:
        covered[s:e] = True
    assert torch.count_nonzero(got[0][~covered.to(got[0].device)]) == 0
    assert torch.count_nonzero(got[1][~covered.to(got[1].device)]) == 0


@pytest.mark.parametrize("case", sorted(CASES))
def test_bf16_inputs_fp32_accumulation(case):
    shape, spans = CASES[case]
    x, segs = _make(shape, spans, torch.bfloat16, _device())
    # bf16 output rounding is ~4e-3 relative; fp32 accumulation keeps the rest well below 2e-2
    _compare(x, segs, rtol=2e-2, atol=2e-2, upcast_ref=True)


def test_dropout_mask_goes_through_torch():
    x, segs = _make((60,), [(0, 25, 8), (30, 60, 32)], torch.float32, _device())
    gen = torch.Generator().manual_seed(7)
    grad_out = torch.randn(60, OUT, generator=gen).to(x.device)
    dropouts = [torch.nn.Dropout(0.5).train(), None]
    torch.manual_seed(11)
    got = _run(segmented_lora_triton, x, segs, OUT, grad_out, dropouts=dropouts)
    torch.manual_seed(11)
    ref = _run(segmented_lora_reference, x, segs, OUT, grad_out, dropouts=dropouts)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)
    # the mask really applied: some of segment 0's input gradient is exactly zero, none of segment 1's
    assert (got[1][:25] == 0).float().mean() > 0.3
    assert (got[1][30:] == 0).float().mean() < 0.01


def test_frozen_weights_and_input_without_grad():
    x, segs = _make((20,), [(0, 10, 8), (12, 20, 16)], torch.float32, _device())
    segs[0].lora_A.requires_grad_(True)
    y = segmented_lora_triton(x, segs, OUT)
    y.sum().backward()
    ref_a = segs[0].lora_A.detach().clone().requires_grad_()
    ref_segs = [LoraSegment(0, 10, ref_a, segs[0].lora_B, segs[0].scaling), segs[1]]
    segmented_lora_reference(x, ref_segs, OUT).sum().backward()
    torch.testing.assert_close(segs[0].lora_A.grad, ref_a.grad, rtol=1e-5, atol=1e-5)
    assert segs[0].lora_B.grad is None and x.grad is None


def _direct_triton(x, segs, grad_out, start_grads):
    """Forward inside a router's ``direct_weight_grads`` block with its anchor, and backward,
    each weight's ``.grad`` set to ``start_grads(weight)`` first; returns
    (y, dx, [dA_0, dB_0, ...], anchor's grad)."""
    router = LoraRouter()
    xl = x.detach().clone().requires_grad_()
    leaves = []
    for s in segs:
        a = s.lora_A.detach().clone().requires_grad_()
        b = s.lora_B.detach().clone().requires_grad_()
        a.grad, b.grad = start_grads(a), start_grads(b)
        leaves.append(LoraSegment(s.start, s.end, a, b, s.scaling))
    with router.direct_weight_grads():
        anchor = router.anchor(x.device)
        y = segmented_lora_triton(xl, leaves, OUT, anchor=anchor)
    y.backward(grad_out)
    return y.detach(), xl.grad, [w.grad for s in leaves for w in (s.lora_A, s.lora_B)], anchor.grad


@pytest.mark.parametrize("case", sorted(CASES))
def test_direct_weight_grads_equal_autograds(case):
    """Given an anchor the Triton path adds the weight gradients to .grad itself:
    bit for bit what autograd accumulates, on top of what .grad held."""
    shape, spans = CASES[case]
    x, segs = _make(shape, spans, torch.float32, _device())
    gen = torch.Generator().manual_seed(5)
    grad_out = torch.randn(*shape, OUT, generator=gen).to(x.device)
    ref = _run(segmented_lora_triton, x, segs, OUT, grad_out)
    y, dx, grads, anchor_grad = _direct_triton(x, segs, grad_out, torch.zeros_like)
    assert torch.equal(y, ref[0]) and torch.equal(dx, ref[1])
    for got, want in zip(grads, ref[2:]):
        assert torch.equal(got, want)
    assert anchor_grad is None  # the anchor only carries the graph
    _, _, on_ones, _ = _direct_triton(x, segs, grad_out, torch.ones_like)
    for got, want in zip(on_ones, ref[2:]):
        assert torch.equal(got, want + 1)


def test_direct_weight_grads_without_a_grad_buffer_is_a_clear_error():
    x, segs = _make((20,), [(0, 10, 8), (12, 20, 16)], torch.float32, _device())
    grad_out = torch.ones(20, OUT, device=x.device)
    with pytest.raises(RuntimeError, match="no .grad to add"):
        _direct_triton(x, segs, grad_out, lambda w: None)


def test_no_segments_and_empty_segments_give_zeros():
    x, segs = _make((6, 3), [(2, 2, 8)], torch.float32, _device())
    for s in ([], segs):
        y = segmented_lora_triton(x, s, OUT)
        assert y.shape == (6, 3, OUT) and torch.count_nonzero(y) == 0


def test_bad_segments_raise():
    x, segs = _make((10,), [(0, 6, 8), (5, 10, 8)], torch.float32, _device())
    with pytest.raises(ValueError, match="non-overlapping"):
        segmented_lora_triton(x, segs, OUT)
    x, segs = _make((10,), [(0, 6, 8)], torch.float32, _device())
    with pytest.raises(ValueError, match="do not fit"):
        segmented_lora_triton(x, segs, OUT + 1)


@pytest.mark.skipif(_HAS_CUDA, reason="CPU-only behaviour")
def test_cpu_without_interpreter_raises(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    env.refresh()
    x, segs = _make((4,), [(0, 4, 8)], torch.float32, "cpu")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        segmented_lora_triton(x, segs, OUT)


def test_kernels_follow_env(monkeypatch):
    """Kernels are decorated for the interpreter setting read at launch, not at import."""
    from triton.runtime.interpreter import InterpretedFunction

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    env.refresh()
    assert all(isinstance(k, InterpretedFunction) for k in triton_kernel._kernels())
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    env.refresh()
    assert not any(isinstance(k, InterpretedFunction) for k in triton_kernel._kernels())


def test_triton_available_and_missing_triton_is_a_clear_error():
    assert triton_available()
    script = textwrap.dedent(
        """
        import sys
        sys.modules["triton"] = None  # make "import triton" fail
        import torch
        from twinkle.model.lora.ops import LoraSegment
        from twinkle.model.lora import triton_kernel
        assert not triton_kernel.triton_available()
        seg = LoraSegment(0, 2, torch.zeros(4, 8), torch.zeros(8, 4), 1.0)
        try:
            triton_kernel.segmented_lora_triton(torch.zeros(2, 8), [seg], 8)
        except RuntimeError as exc:
            assert "triton" in str(exc)
            print("OK")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "OK"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_larger_sizes(dtype):
    in_f, out_f = 1024, 1536
    ranks = [8, 16, 32, 64, 8, 16, 32, 64]
    spans, cursor = [], 3
    for r in ranks:
        spans.append((cursor, cursor + 60, r))
        cursor += 63  # 3-row gaps
    x, segs = _make((cursor + 5, 8), spans, dtype, torch.device("cuda"), in_f=in_f, out_f=out_f)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    _compare(x, segs, out_f, rtol=tol, atol=tol, upcast_ref=dtype != torch.float32)
