"""Each private-torch-API wrapper and its public fallback give the same results."""

from __future__ import annotations

import pytest
import torch

from twinkle.model import torch_compat as compat

pytestmark = pytest.mark.unit


def _tensors(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for shape in ((3, 4), (7,), (2, 2, 5))]


def test_foreach_norm_fallback_equals_torch():
    tensors = _tensors()
    fast, slow = compat.foreach_norm(tensors), compat._loop_norm(tensors)
    torch.testing.assert_close(torch.stack(list(fast)), torch.stack(slow))


def test_foreach_mul_and_add_fallbacks_equal_torch():
    a, b = _tensors(1), _tensors(1)
    compat.foreach_mul_(a, [0.5, 2.0, -1.0])
    compat._loop_mul_(b, [0.5, 2.0, -1.0])
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)
    sources = _tensors(2)
    compat.foreach_add_(a, sources)
    compat._loop_add_(b, sources)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y)
    with pytest.raises(ValueError):
        compat._loop_add_(b, sources[:1])  # lengths must agree, as torch's kernel requires


def test_hook_checks_see_hooks_and_are_conservative_without_registries():
    param = torch.nn.Parameter(torch.zeros(2))
    assert not compat.param_has_grad_hooks(param)
    handle = param.register_post_accumulate_grad_hook(lambda p: None)
    assert compat.param_has_grad_hooks(param)
    handle.remove()
    assert not compat.param_has_grad_hooks(param)
    optimizer = torch.optim.AdamW([param], lr=1e-3)
    assert not compat.optimizer_has_step_hooks(optimizer)
    optimizer.register_step_post_hook(lambda *a: None)
    assert compat.optimizer_has_step_hooks(optimizer)

    class NoRegistries:  # what a torch without the private attributes would look like
        pass

    assert compat.param_has_grad_hooks(NoRegistries())
    assert compat.optimizer_has_step_hooks(NoRegistries())


def test_tensor_version_tracks_in_place_changes_and_never_matches_without_a_counter():
    t = torch.zeros(3)
    before = compat.tensor_version(t)
    t.add_(1)
    assert compat.tensor_version(t) != before

    class NoCounter:
        pass

    thing = NoCounter()
    assert compat.tensor_version(thing) != compat.tensor_version(thing)


def test_functional_adam_is_torchs():
    from torch.optim.adam import adam

    assert compat.adam_functional is adam
