"""patches/multi_tensor_on_device: the foreach drop-ins compute what Megatron's fallbacks compute."""
from __future__ import annotations

import pytest
import torch

import patches
from patches import multi_tensor_on_device as patch
from patches._source import PatchTargetChanged


@pytest.fixture(scope="module", autouse=True)
def applied():
    return patches.apply_all(force=True)


def _tensors(seed: int, dtype=torch.float32) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shapes = ((300, 40), (7,), (1,), (64, 3, 5))
    return [torch.randn(shape, generator=generator).to(dtype) for shape in shapes]


def test_grad_norm_matches_a_float64_reference():
    """fp32 sums of squares over n elements, reduced pairwise by torch: relative error about
    log2(n) * 2^-24 (n = 12,968 here: ~1e-6); 1e-5 leaves a margin of 10 and still fails
    on any dropped or double-counted tensor (each changes the norm by more than 1e-4)."""
    from megatron.core.optimizer import clip_grads

    grads = _tensors(0)
    norm, per_tensor = clip_grads.multi_tensor_applier(clip_grads.l2_norm_impl, torch.zeros(1, dtype=torch.int),
                                                        [grads], False)
    expected = torch.cat([g.double().flatten() for g in grads]).norm()
    assert per_tensor is None and norm.shape == (1,) and norm.dtype == torch.float32
    assert torch.allclose(norm.double(), expected, rtol=1e-5, atol=0)


def test_bf16_grads_give_an_fp32_norm():
    norm, _ = patch.l2_norm_on_device(0, None, [_tensors(1, torch.bfloat16)], False)
    expected = torch.cat([g.double().flatten() for g in _tensors(1, torch.bfloat16)]).norm()
    # each per-tensor norm is rounded to bf16 (8 bits of mantissa) as Megatron's torch.norm does: 2^-8 relative
    assert norm.dtype == torch.float32 and abs(norm.item() / expected.item() - 1) < 2 ** -8


@pytest.mark.parametrize("scale", [1.0, 0.37])
def test_scaled_copy_matches_megatrons_fallback(scale):
    from megatron.core.utils import local_multi_tensor_scale

    sources = _tensors(2, torch.bfloat16)
    ours, theirs = [torch.empty_like(s, dtype=torch.float32) for s in sources], \
        [torch.empty_like(s, dtype=torch.float32) for s in sources]
    patch.scale_on_device(0, None, [sources, ours], scale)
    local_multi_tensor_scale(0, None, [sources, theirs], scale)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_in_place_scale_is_megatrons_clip():
    from megatron.core.optimizer import clip_grads

    grads, expected = _tensors(3), [g * 0.25 for g in _tensors(3)]
    clip_grads.multi_tensor_applier(clip_grads.multi_tensor_scale_impl, None, [grads, grads], 0.25)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected))


def test_megatron_clip_by_total_norm_scales_like_torch():
    """clip_grad_by_total_norm_fp32 (the patched scale) against torch's clip_grad_norm_ on copies."""
    from megatron.core.optimizer import clip_grads

    params = [torch.nn.Parameter(t) for t in _tensors(4)]
    for param, grad in zip(params, _tensors(5)):
        param.grad = grad * 3
    copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for copy, param in zip(copies, params):
        copy.grad = param.grad.clone()
    torch_norm = torch.nn.utils.clip_grad_norm_(copies, 1.0)
    total, _ = patch.l2_norm_on_device(0, None, [[p.grad for p in params]], False)
    clip_grads.clip_grad_by_total_norm_fp32(params, 1.0, total.item())
    assert abs(total.item() / torch_norm.item() - 1) < 1e-5  # see test_grad_norm_matches_a_float64_reference
    assert all(torch.allclose(p.grad, c.grad, rtol=1e-5) for p, c in zip(params, copies))


def test_a_slot_holding_something_else_is_refused(monkeypatch):
    from megatron.core.optimizer import clip_grads

    monkeypatch.setattr(clip_grads, "l2_norm_impl", lambda *args: None)
    with pytest.raises(PatchTargetChanged, match="l2_norm_impl"):
        patch.check()
    assert not patch.applies_on_cuda()
