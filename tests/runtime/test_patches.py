"""The CPU/gloo patches of megatron-core: each still fits upstream, and each does its job.

`check()` is what fails loudly when megatron-core changes under a patch: a
different version, or a target line that moved or vanished.
"""
from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

import patches
from patches import _source
from patches._checks import require_version
from patches._source import PatchTargetChanged, Replacement


@pytest.fixture(scope="module", autouse=True)
def applied():
    return patches.apply_all(force=True)


@pytest.mark.parametrize("patch", patches.patch_modules(), ids=lambda p: p.NAME)
def test_patch_still_fits_upstream_and_is_applied(patch):
    patch.check()  # raises PatchTargetChanged if megatron-core moved under the patch
    assert patch.is_applied()


@pytest.mark.parametrize("patch", patches.patch_modules(), ids=lambda p: p.NAME)
def test_patch_documents_why_versions_and_removal(patch):
    doc = inspect.getdoc(patch)
    assert "Why:" in doc and "Targets: megatron-core" in doc and "Removable when:" in doc
    assert patch.TARGET_VERSIONS == ("0.16.1",)


def test_apply_all_lists_every_patch(applied):
    assert applied == [p.NAME for p in patches.patch_modules()]


def test_on_cuda_only_the_torch_fallback_fixes_apply(monkeypatch):
    from megatron.core import optimizer
    from megatron.core.models.gpt import gpt_layer_specs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(optimizer, "USING_PYTORCH_OPTIMIZER", True)  # no apex, no TE: torch's Adam
    monkeypatch.setattr(gpt_layer_specs, "HAVE_APEX", False)  # and torch's norms in the local spec
    monkeypatch.setattr(gpt_layer_specs, "HAVE_TE", False)
    assert patches.apply_all() == ["torch_norm_zero_centered_gamma", "distrib_optimizer_torch_adam_step",
                                   "multi_tensor_on_device", "wgrad_accumulation_torch"]
    monkeypatch.setattr(optimizer, "USING_PYTORCH_OPTIMIZER", False)  # apex/TE FusedAdam and norms
    monkeypatch.setattr(gpt_layer_specs, "HAVE_APEX", True)
    for module, attribute in (("clip_grads", "l2_norm_impl"), ("clip_grads", "multi_tensor_scale_impl"),
                              ("optimizer", "multi_tensor_scale_impl")):  # and apex's multi-tensor kernels
        monkeypatch.setattr(getattr(optimizer, module), attribute, lambda *args: None)
    from megatron.core.tensor_parallel import layers  # and apex's fused_weight_gradient_mlp_cuda

    monkeypatch.setattr(layers, "fused_weight_gradient_mlp_cuda", object(), raising=False)
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", True)
    assert patches.apply_all() == []


def test_other_megatron_core_version_is_refused(monkeypatch):
    import megatron.core

    monkeypatch.setattr(megatron.core, "__version__", "0.99.0")
    with pytest.raises(PatchTargetChanged, match="targets megatron-core 0.16.1, but 0.99.0"):
        require_version("x", ("0.16.1",))
    with pytest.raises(PatchTargetChanged):
        patches.check_all()


def test_source_rewrite_refuses_text_that_moved():
    from megatron.core.optimizer import clip_grads

    with pytest.raises(PatchTargetChanged, match="expected 1 occurrence"):
        _source.patched_source(clip_grads, "count_zeros_fp32", (Replacement("no such line", "x"),))


def test_cuda_current_device_is_the_cpu_in_patched_modules():
    from megatron.core import utils
    from megatron.core.tensor_parallel import mappings

    assert mappings.torch.cuda.current_device() == torch.device("cpu")
    buffer = utils.GlobalMemoryBuffer().get_tensor((2, 3), torch.float32, "test")
    assert buffer.device.type == "cpu" and buffer.shape == (2, 3)
    assert torch.cuda.is_available() is False  # the real torch is untouched


def test_rng_tracker_forks_the_cpu_generator():
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    tracker = CudaRNGStatesTracker()
    tracker.add("tp", 7)
    torch.manual_seed(0)
    outside_before = torch.get_rng_state()
    with tracker.fork("tp"):
        first = torch.rand(4)
    assert torch.equal(torch.get_rng_state(), outside_before)  # default stream restored
    torch.manual_seed(7)
    assert torch.equal(first, torch.rand(4))  # the tracked state was seed 7


def test_grad_buffer_streams_are_no_ops():
    from megatron.core.distributed import param_and_grad_buffer

    stream = param_and_grad_buffer.torch.cuda.default_stream()
    stream.wait_stream(stream)
    with param_and_grad_buffer.torch.cuda.stream(stream):
        pass


def test_hardcoded_cuda_devices_map_to_cpu():
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.transformer.utils import get_default_causal_mask

    assert get_default_causal_mask(4).device.type == "cpu"
    assert schedules.torch.zeros([], dtype=torch.int, device="cuda").device.type == "cpu"


def test_clip_grads_accepts_cpu_float_tensors():
    from megatron.core.optimizer import clip_grads, optimizer

    param = torch.nn.Parameter(torch.ones(4))
    param.grad = torch.full((4,), 2.0)
    clip_grads.clip_grad_by_total_norm_fp32([param], max_norm=1.0, total_norm=4.0)
    assert torch.allclose(param.grad, torch.full((4,), 0.5), atol=1e-5)
    assert optimizer.clip_grad_by_total_norm_fp32 is clip_grads.clip_grad_by_total_norm_fp32


def test_torch_norm_accepts_sequence_parallel_and_marks_params():
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, tensor_model_parallel_size=2,
                               sequence_parallel=True, use_cpu_initialization=True)
    norm = WrappedTorchNorm(config, 8)
    assert isinstance(norm, torch.nn.LayerNorm)
    assert all(getattr(p, "sequence_parallel", False) for p in norm.parameters())
    assert config.sequence_parallel is True


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_torch_norm_zero_centered_gamma_scales_by_one_plus_weight(normalization):
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, normalization=normalization,
                               layernorm_zero_centered_gamma=True, use_cpu_initialization=True)
    norm = WrappedTorchNorm(config, 8)
    plain = WrappedTorchNorm(TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2,
                                               normalization=normalization, use_cpu_initialization=True), 8)
    x = torch.randn(3, 8)
    assert torch.equal(norm.weight, torch.zeros(8))  # gamma - 1 starts at zero: gamma = 1
    assert torch.allclose(norm(x), plain(x), atol=1e-6)
    with torch.no_grad():
        norm.weight.fill_(0.5)
        plain.weight.fill_(1.5)
    assert torch.allclose(norm(x), plain(x), atol=1e-6)
    assert config.layernorm_zero_centered_gamma is True


def test_embedding_sync_keeps_weight_on_cpu():
    from megatron.core.models.common.language_module.language_module import LanguageModule

    source = inspect.getsource(LanguageModule.setup_embeddings_and_output_layer.__wrapped_original__)
    assert "weight.data.cuda()" in source  # what upstream does, and what the rewrite removes
    assert LanguageModule.setup_embeddings_and_output_layer.__megatron_auto_patched__


def test_virtual_stages_with_batched_p2p_are_refused_over_gloo():
    from patches.vpp_batched_p2p_guard import VirtualPipelineBatchedP2PError, refuse_if_batched_over_gloo

    with pytest.raises(VirtualPipelineBatchedP2PError, match="gloo"):
        refuse_if_batched_over_gloo(SimpleNamespace(batch_p2p_comm=True))
    refuse_if_batched_over_gloo(SimpleNamespace(batch_p2p_comm=False))


def test_distributed_optimizer_step_is_per_parameter():
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    source = inspect.getsource(DistributedOptimizer.load_state_dict.__wrapped_original__)
    assert 's["step"] = step\n' in source  # the shared-tensor line upstream still has
    assert DistributedOptimizer.load_state_dict.__megatron_auto_patched__


def test_fp16_loss_scaler_lives_on_the_cpu():
    from megatron.core.optimizer.grad_scaler import DynamicGradScaler

    def scaler():
        return DynamicGradScaler(initial_scale=2.0**16, min_scale=1.0, growth_factor=2.0, backoff_factor=0.5,
                                 growth_interval=2, hysteresis=1)

    first = scaler()
    assert first.scale.device.type == "cpu"
    first.update(found_inf=True)
    assert float(first.scale) == 2.0**15  # backed off, on the CPU
    resumed = scaler()
    resumed.load_state_dict(first.state_dict())  # upstream moves the scale with .cuda()
    assert resumed.scale.device.type == "cpu" and float(resumed.scale) == 2.0**15
