"""The patches of megatron-core: each still fits upstream, each does its job, and patches/registry.py's table
(kinds, where each applies, targets, removal) agrees with the patch files and with the README.

`check()` is what fails loudly when megatron-core changes under a patch: a
different version, or a target line that moved or vanished.
"""
from __future__ import annotations

import importlib
import inspect
import json
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import patches
from patches import _source, registry
from patches._checks import require_version
from patches._source import PatchTargetChanged, Replacement

REPO = Path(__file__).resolve().parents[2]


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
    assert applied == [p.NAME for p in patches.patch_modules()] == list(registry.applied_names())


def _patch_files() -> set[str]:
    """Every patch module under patches/: not the package, its table or its private helpers."""
    return {path.stem for path in (REPO / "patches").glob("*.py")
            if not path.stem.startswith("_") and path.stem != "registry"}


def test_every_patch_file_has_a_row_and_every_row_a_file():
    assert _patch_files() == set(registry.RECORDS)
    assert len(registry.RECORDS) == len(registry.PATCHES)  # one row per patch


@pytest.mark.parametrize("record", registry.PATCHES, ids=lambda r: r.name)
def test_each_row_has_a_fixed_kind_and_a_cuda_rule_that_fits_it(record):
    assert record.kind in registry.KINDS and record.on_cuda in registry.ON_CUDA and record.stage in registry.STAGES
    assert record.on_cuda in registry.KIND_ON_CUDA[record.kind]
    assert bool(record.cuda_condition) == (record.on_cuda == "when-needed")


@pytest.mark.parametrize("record", registry.PATCHES, ids=lambda r: r.name)
def test_each_row_is_what_its_module_says(record):
    """The row's targets and removal condition are the module's docstring's; a row whose module decides on CUDA
    has the module's applies_on_cuda(), and only the CPU-only rows' modules say they apply only without CUDA."""
    module = importlib.import_module(f"patches.{record.name}")
    doc = " ".join(inspect.getdoc(module).split())
    assert f"Removable when: {record.removable_when}" in doc
    assert all(f"Targets: megatron-core {version}" in doc for version in record.targets)
    assert ("Applied only when CUDA is absent" in doc) == (record.on_cuda == "no")
    if record.stage == "apply":
        assert module.NAME == record.name and module.TARGET_VERSIONS == record.targets
        assert hasattr(module, "applies_on_cuda") == (record.on_cuda == "when-needed")


def test_readme_patch_table_is_the_registrys():
    readme = (REPO / "README.md").read_text()
    assert registry.readme_section(readme) == registry.readme_table(), \
        "README.md's patch table differs from patches/registry.py: run `python -m patches`"


CUDA_HOST_PROBE = """
import json
import torch
torch.cuda.is_available = lambda: True  # before megatron-core imports: a GPU host, as far as the patches can tell
import patches
from patches import registry
applied = patches.apply_all()
modules = {m.NAME: m for m in patches.patch_modules()}
print(json.dumps({"applied": applied, "cpu_only_applied": [r.name for r in registry.PATCHES
                                                           if r.on_cuda == "no" and modules[r.name].is_applied()]}))
"""


def test_cpu_only_patches_are_no_ops_where_cuda_is_present():
    """DESIGN.md: the CPU/gloo enablement is a no-op when CUDA is present. In a fresh interpreter that sees CUDA
    (and, on this host, neither apex nor Transformer Engine), apply_all leaves every CPU-only patch unapplied
    and applies exactly the rows that apply on CUDA."""
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", CUDA_HOST_PROBE], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["cpu_only_applied"] == []
    assert report["applied"] == [r.name for r in registry.PATCHES if r.stage == "apply" and r.on_cuda != "no"]


def test_on_cuda_only_the_torch_fallback_fixes_apply(monkeypatch):
    from megatron.core import optimizer
    from megatron.core.models.gpt import gpt_layer_specs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(optimizer, "USING_PYTORCH_OPTIMIZER", True)  # no apex, no TE: torch's Adam
    monkeypatch.setattr(gpt_layer_specs, "HAVE_APEX", False)  # and torch's norms in the local spec
    monkeypatch.setattr(gpt_layer_specs, "HAVE_TE", False)
    from megatron.core.transformer.moe import moe_utils

    monkeypatch.setattr(moe_utils, "HAVE_TE", False)  # and no TE for the MoE router's GEMM
    on_any_gpu = [r.name for r in registry.PATCHES if r.stage == "apply" and r.on_cuda == "yes"]
    without_te_or_apex = [r.name for r in registry.PATCHES if r.stage == "apply" and r.on_cuda != "no"]
    assert patches.apply_all() == without_te_or_apex  # every fallback and fix: no CPU-only patch
    assert {"torch_norm_sequence_parallel", "torch_norm_zero_centered_gamma"} <= set(without_te_or_apex)
    monkeypatch.setattr(optimizer, "USING_PYTORCH_OPTIMIZER", False)  # apex/TE FusedAdam and norms
    monkeypatch.setattr(gpt_layer_specs, "HAVE_APEX", True)
    monkeypatch.setattr(gpt_layer_specs, "HAVE_TE", True)  # TE's layer spec: no WrappedTorchNorm
    for module, attribute in (("clip_grads", "l2_norm_impl"), ("clip_grads", "multi_tensor_scale_impl"),
                              ("optimizer", "multi_tensor_scale_impl")):  # and apex's multi-tensor kernels
        monkeypatch.setattr(getattr(optimizer, module), attribute, lambda *args: None)
    from megatron.core.tensor_parallel import layers  # and apex's fused_weight_gradient_mlp_cuda

    monkeypatch.setattr(layers, "fused_weight_gradient_mlp_cuda", object(), raising=False)
    monkeypatch.setattr(layers, "_grad_accum_fusion_available", True)
    monkeypatch.setattr(moe_utils, "HAVE_TE", True)
    from megatron.core.tensor_parallel import random as tp_random

    monkeypatch.setattr(tp_random, "HAVE_TE", True)  # and TE's fp8 state for CheckpointWithoutOutput
    from megatron.core.extensions import transformer_engine

    monkeypatch.setattr(transformer_engine, "HAVE_TE", True)  # and TE's modules for multi-latent attention
    assert patches.apply_all() == on_any_gpu  # the fixes that bite on any device
    assert len(on_any_gpu) == 8 and all(registry.RECORDS[name].kind != "cpu-gloo" for name in on_any_gpu)


def _upstream_new(cls):
    """`cls.__new__` as megatron-core defines it, under every patch's wrapper."""
    new = cls.__dict__["__new__"]
    new = getattr(new, "__func__", new)
    while getattr(new, "__wrapped_original__", None) is not None:
        new = new.__wrapped_original__
    return new


def test_on_a_gpu_without_te_or_apex_the_local_specs_sequence_parallel_norm_builds(monkeypatch):
    """A GPU host without Transformer Engine runs Megatron-Core's local spec (runtime/kernels.py), whose norms are
    WrappedTorchNorm (all of them without apex; RMSNorm with apex too: LocalSpecProvider.layer_norm), and
    upstream's WrappedTorchNorm refuses sequence parallelism: TP2 with SP stopped at the first norm. Simulated
    here (CUDA reported present, neither TE nor apex): apply_all applies torch_norm_sequence_parallel, and the
    spec's norm builds with its parameters marked for the TP gradient sum."""
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from patches import torch_norm_sequence_parallel

    monkeypatch.setattr(WrappedTorchNorm, "__new__", staticmethod(_upstream_new(WrappedTorchNorm)))  # unpatched
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpt_layer_specs, "HAVE_TE", False)
    monkeypatch.setattr(gpt_layer_specs, "HAVE_APEX", False)
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, tensor_model_parallel_size=2,
                               sequence_parallel=True, normalization="RMSNorm", use_cpu_initialization=True)
    norm_spec = gpt_layer_specs.get_gpt_layer_local_spec(normalization="RMSNorm").submodules.input_layernorm
    assert norm_spec is WrappedTorchNorm
    with pytest.raises(AssertionError, match="sequence parallel not supported"):
        build_module(norm_spec, config=config, hidden_size=8)  # what such a GPU ran into
    assert "torch_norm_sequence_parallel" in patches.apply_all()
    norm = build_module(norm_spec, config=config, hidden_size=8)
    assert isinstance(norm, torch.nn.RMSNorm) and all(p.sequence_parallel for p in norm.parameters())
    monkeypatch.setattr(gpt_layer_specs, "HAVE_APEX", True)  # apex: the local spec's RMSNorm is still torch's
    assert torch_norm_sequence_parallel.applies_on_cuda()
    monkeypatch.setattr(gpt_layer_specs, "HAVE_TE", True)  # TE: the runtime builds TE's spec, TENorm
    assert not torch_norm_sequence_parallel.applies_on_cuda()


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


def test_moe_dispatcher_streams_and_events_are_no_ops():
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    stream = token_dispatcher.torch.cuda.Stream()
    stream.wait_stream(token_dispatcher.torch.cuda.current_stream())
    stream.record_event().synchronize()  # what the alltoall dispatcher waits on
    assert moe_utils.torch.zeros(2, device="cuda").device.type == "cpu"


def test_moe_split_sizes_become_numpy_on_the_cpu():
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    splits = moe_utils.maybe_move_tensor_to_cpu(torch.tensor([3, 1]), as_numpy=True, record_stream=True)
    assert list(splits) == [3, 1] and not torch.is_tensor(splits)  # all_to_all_single takes these
    counts = torch.tensor([2, 2])
    assert moe_utils.maybe_move_tensor_to_cpu(counts) is counts
    assert token_dispatcher.maybe_move_tensor_to_cpu is moe_utils.maybe_move_tensor_to_cpu


def test_moe_router_gating_runs_without_transformer_engine():
    from megatron.core.transformer.moe import moe_utils

    inp, weight = torch.randn(3, 4, requires_grad=True), torch.randn(2, 4, requires_grad=True)
    logits = moe_utils.router_gating_linear(inp, weight, None, torch.float32)
    assert torch.allclose(logits, inp @ weight.t())
    logits.sum().backward()
    assert torch.allclose(weight.grad, inp.detach().sum(0).expand(2, 4))


def test_expert_bias_is_added_out_of_place():
    from megatron.core.transformer.mlp import MLP

    source = inspect.getsource(MLP.forward.__wrapped_original__)
    assert "output += output_bias" in source  # upstream's in-place add, which the rewrite replaces
    assert MLP.forward.__megatron_auto_patched__


def test_a_gated_mlp_adds_a_zero_offset_no_more_and_both_mlp_rewrites_run():
    """glu_offset_copy and expert_bias_inplace rewrite the same MLP.forward: the function runs with both
    replacements, each made on upstream's text. Its saved bytes are measured in
    tests/runtime/test_recompute_modules.py (a SwiGLU MLP keeps 4f per token)."""
    from megatron.core.transformer.mlp import MLP
    from patches import expert_bias_inplace, glu_offset_copy

    assert "x_linear + self.config.glu_linear_offset\n" in inspect.getsource(MLP.forward.__wrapped_original__)
    assert expert_bias_inplace.is_applied() and glu_offset_copy.is_applied()
    installed = MLP.forward.__megatron_auto_replacements__
    assert set(expert_bias_inplace.REPLACEMENTS + glu_offset_copy.REPLACEMENTS) == set(installed)


def test_uneven_gather_and_reduce_scatter_over_one_gloo_rank_and_padding(monkeypatch):
    from megatron.core.tensor_parallel import mappings
    from patches import gloo_uneven_gather

    assert mappings._gather_along_first_dim is gloo_uneven_gather.gather_uneven
    group = SimpleNamespace(size=lambda: 2, rank=lambda: 1)
    monkeypatch.setattr(gloo_uneven_gather, "_on_gloo", lambda g: True)

    def fake_gather(out, inp, group):  # rank 0 holds [10, 11, pad], rank 1 holds ours padded
        out.copy_(torch.cat([torch.tensor([[10.0], [11.0], [0.0]]), inp]))

    def fake_reduce_scatter(out, inp, group):  # rank 1's padded slot, doubled (two equal ranks)
        out.copy_(2 * inp[3:6])

    monkeypatch.setattr(torch.distributed, "all_gather_into_tensor", fake_gather)
    monkeypatch.setattr(torch.distributed, "reduce_scatter_tensor", fake_reduce_scatter)
    ours = torch.tensor([[1.0], [2.0], [3.0]])
    gathered = mappings._gather_along_first_dim(ours, group, output_split_sizes=[2, 3])
    assert gathered.view(-1).tolist() == [10.0, 11.0, 1.0, 2.0, 3.0]
    scattered = mappings._reduce_scatter_along_first_dim(torch.arange(5.0).view(5, 1), group,
                                                         input_split_sizes=[3, 2])
    assert scattered.view(-1).tolist() == [6.0, 8.0]


def test_moe_aux_loss_mean_without_avg(monkeypatch):
    from megatron.core.transformer.moe import moe_utils

    upstream = inspect.getsource(moe_utils.reduce_aux_losses_tracker_across_ranks.__wrapped_original__)
    assert upstream.count("ReduceOp.AVG") == 2  # what gloo lacks, and the rewrite replaces
    pp, dp, tp = (SimpleNamespace(name=n) for n in ("pp", "dp", "tp"))
    ops = []

    def all_reduce(values, group=None, op=None):  # dp holds two ranks with equal values: a sum doubles
        ops.append(op)
        if group is dp:
            values *= 2

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setitem(moe_utils._MOE_LAYER_WISE_LOGGING_TRACKER, "probe", {
        "values": torch.tensor([1.5, 3.0]), "reduce_group": tp, "avg_group": None, "reduce_group_has_dp": False})
    moe_utils.reduce_aux_losses_tracker_across_ranks(["probe"], SimpleNamespace(pp=pp, dp=dp))
    assert moe_utils._MOE_LAYER_WISE_LOGGING_TRACKER["probe"]["values"].tolist() == [1.5, 3.0]  # the mean
    assert ops == [None, None, None]  # pp, tp and dp: sums only


def test_expert_row_parallel_bias_is_not_summed_over_tp():
    from megatron.core.transformer import TransformerConfig
    from megatron.core.tensor_parallel.layers import RowParallelLinear

    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, sequence_parallel=True,
                               tensor_model_parallel_size=2, use_cpu_initialization=True)
    group = SimpleNamespace(size=lambda: 1, rank=lambda: 0)
    layers = {is_expert: RowParallelLinear(8, 8, config=config, init_method=torch.nn.init.zeros_, bias=True,
                                           input_is_parallel=True, skip_bias_add=False, is_expert=is_expert,
                                           tp_group=group) for is_expert in (False, True)}
    assert layers[False].bias.sequence_parallel is True  # a dense bias: summed over TP, as upstream
    assert layers[True].bias.sequence_parallel is False


def test_per_token_aux_losses_weigh_the_tp_groups_tokens(monkeypatch):
    """Under per-token loss a router rank attaches its losses x its TP group's tokens: the load-balancing
    loss x (its tokens x tp_cp size), the z-loss likewise (upstream: x its own tokens)."""
    from megatron.core.transformer.moe import router as router_module

    attached = []
    monkeypatch.setattr(router_module.MoEAuxLossAutoScaler, "apply",
                        lambda activation, loss: attached.append(float(loss)) or activation)
    config = SimpleNamespace(num_layers=1, mtp_num_layers=None, moe_z_loss_coeff=1.0)
    router = SimpleNamespace(config=config, layer_number=None, training=True, calculate_per_token_loss=True,
                             tp_cp_group=SimpleNamespace(size=lambda: 2))
    router_module.TopKRouter.attach_and_log_load_balancing_loss(router, torch.zeros(3), 1.0, torch.tensor(0.5),
                                                                "probe", None, valid_token_count=3)
    router_module.TopKRouter.apply_z_loss(router, torch.zeros(3, 2))
    z_mean = math.log(2) ** 2 / 2  # z-loss of 3 zero-logit tokens, coefficient 1 / tp_cp size
    assert attached == pytest.approx([0.5 * 3 * 2, z_mean * 3 * 2])


def test_checkpoint_without_output_leaves_fp8_to_transformer_engine(monkeypatch):
    """Without TE the checkpoint of --recompute-modules layernorm takes its plain path (upstream its default
    fp8=False still set the fp8 flag and reached TE's undefined FP8GlobalStateManager); with TE it is as
    upstream (tests/runtime/test_recompute_modules.py runs the recompute)."""
    from megatron.core.tensor_parallel import random as tp_random

    assert tp_random.CheckpointWithoutOutput().fp8 is False
    monkeypatch.setattr(tp_random, "HAVE_TE", True)
    assert tp_random.CheckpointWithoutOutput().fp8 is True



@pytest.mark.parametrize("cp", [2, 4])
def test_rotary_positions_of_a_context_parallel_rank_are_its_chunks(cp):
    from megatron.core.models.common.embeddings import rotary_pos_embedding

    from megatron_auto.runtime.context_parallel import chunks_of_rank

    positions = torch.arange(4.0 * cp).view(-1, 1, 1, 1)  # [s, 1, 1, dim] as RotaryEmbedding returns
    for rank in range(cp):
        group = SimpleNamespace(size=lambda: cp, rank=lambda rank=rank: rank)
        kept = rotary_pos_embedding.get_pos_emb_on_this_cp_rank(positions, 0, group)
        assert torch.equal(kept, chunks_of_rank(positions, rank, cp))
