"""The run's kernels (runtime/kernels.py, runtime/attention.py): chosen per host, and computing what
Megatron's own kernels compute.

Launches (gloo, CPU): kernels_worker.py on 1 and 2 ranks (TP = the world size) compares SDPA core
attention with Megatron's DotProductAttention, the fused layer with the unfused one, and the fused
Adam step with the foreach one; equivalence_worker.py runs the stock runtime with `flash` on one
process and on TP2/PP2/DP2 layouts of four.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from validation.launcher import run_cases
from worker_stats import thread_bound
from megatron_auto.runtime import kernels
from megatron_auto.specs.model import uniform_model
from test_equivalence import BATCH, STEPS, assert_matches_reference

GPT = uniform_model("k", 2, 64, 4, 32, 256).layers[0]
LLAMA = uniform_model("k", 2, 64, 4, 32, 256, num_query_groups=2, swiglu=True, add_bias_linear=False,
                      normalization="RMSNorm").layers[0]
GELU_NO_BIAS = uniform_model("k", 2, 64, 4, 32, 256, add_bias_linear=False).layers[0]

# fp32 attention computed two ways (one fused kernel vs scores, softmax, matmul) differs by rounding:
# relative errors of a few 1e-7 were measured; 1e-5 leaves 20x margin and is far below any real
# difference (a wrong scale or mask changes outputs by O(1e-1)).
FP32_RTOL = 1e-5
# Megatron's fused bias-GeLU is the tanh approximation of GeLU: it differs from erf-GeLU by at most
# 4.7e-4 in value and 8.7e-4 in derivative (computed in float64 over [-8, 8]); gradients through it
# differ relatively by up to ~1e-3 (1.4e-4 measured), so 2e-3.
TANH_GELU_RTOL = 2e-3
# Adam's fused and foreach steps run the same fp32 formulas in different orders: after 3 steps
# parameters of magnitude ~1 differ by ~1e-6 (a few ulps; measured 1.3e-6). A real difference in the
# step (bias correction, weight decay) moves them by O(lr) = 1e-3 per step; 1e-5 sits between.
ADAM_ATOL = 1e-5
# Uniform causal attention over 128 positions, dropout 0.5: row i's output is 2 x (kept of i+1)/(i+1),
# of variance 1/(i+1); the mean over batch 4 x (4 or 2 heads per rank) x 128 rows has a standard
# deviation of sqrt(mean(1/(i+1)) / rows) <= 0.0065, so 0.03 is over 4 standard deviations (and seeded).
DROPOUT_MEAN_ATOL = 0.03


def test_auto_runs_flash_fused_without_bias_fusions():
    gpu, cpu = kernels.choose_kernels(GPT, on_gpu=True), kernels.choose_kernels(GPT, on_gpu=False)
    assert (gpu.attention, gpu.optimizer_impl, gpu.bias_activation_fusion, gpu.bias_dropout_fusion) == \
        ("flash", "fused", False, False)
    assert (cpu.attention, cpu.optimizer_impl, cpu.bias_activation_fusion, cpu.bias_dropout_fusion) == \
        ("unfused", "foreach", False, False)
    assert kernels.choose_kernels(GPT, "flash", "fused", on_gpu=False).attention == "flash"
    assert kernels.choose_kernels(GPT, "local", on_gpu=True).attention == "unfused"
    assert cpu.layer_spec == "local"


def test_bias_fusions_on_run_on_gpus_and_each_can_be_turned_off():
    on = kernels.choose_kernels(GPT, on_gpu=True, bias_fusions="on")
    assert (on.bias_activation_fusion, on.bias_dropout_fusion) == (True, True)
    assert not kernels.choose_kernels(GPT, on_gpu=False, bias_fusions="on").bias_dropout_fusion
    assert not kernels.choose_kernels(GPT, on_gpu=True, bias_fusions="off").bias_activation_fusion
    chosen = kernels.choose_kernels(GPT, on_gpu=True, fusions=(False, True), bias_fusions="on")
    assert (chosen.bias_activation_fusion, chosen.bias_dropout_fusion) == (False, True)
    chosen = kernels.choose_kernels(LLAMA, on_gpu=True, fusions=(True, False), bias_fusions="on")
    assert (chosen.bias_activation_fusion, chosen.bias_dropout_fusion) == (True, False)
    with pytest.raises(ValueError, match="bias fusions must be one of"):
        kernels.choose_kernels(GPT, on_gpu=True, bias_fusions="yes")


@pytest.mark.parametrize("layer, activation_fusion", [(GPT, True), (LLAMA, True), (GELU_NO_BIAS, False)])
def test_fusion_flags_make_a_valid_transformer_config(layer, activation_fusion):
    from megatron.core.transformer import TransformerConfig

    chosen = kernels.choose_kernels(layer, on_gpu=True, bias_fusions="on")
    assert chosen.bias_activation_fusion is activation_fusion
    config = TransformerConfig(
        num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=layer.num_query_groups,
        ffn_hidden_size=layer.ffn_hidden_size, gated_linear_unit=layer.swiglu, add_bias_linear=layer.add_bias_linear,
        activation_func=torch.nn.functional.silu if layer.swiglu else torch.nn.functional.gelu,
        **kernels.config_flags(chosen))  # __post_init__ refuses fusions that cannot run
    assert (config.bias_activation_fusion, config.bias_dropout_fusion) == (activation_fusion, True)
    assert not config.masked_softmax_fusion


def test_transformer_engine_gets_the_requested_backend(monkeypatch):
    from megatron.core.transformer.enums import AttnBackend

    monkeypatch.setattr(kernels, "transformer_engine_available", lambda: True)
    chosen = kernels.choose_kernels(GPT, "local", on_gpu=True)
    assert chosen.layer_spec == "transformer_engine"
    assert kernels.config_flags(chosen)["attention_backend"] == AttnBackend.unfused
    assert "attention_backend" not in kernels.config_flags(kernels.choose_kernels(GPT, "flash", on_gpu=False))
    assert "Transformer Engine (unfused)" in chosen.describe()


@pytest.mark.parametrize("backend, core", [("flash", "SDPAttention"), ("unfused", "DotProductAttention")])
def test_local_spec_swaps_the_core_attention(backend, core):
    spec = kernels.layer_spec(GPT, kernels.choose_kernels(GPT, backend, on_gpu=False))
    assert spec.submodules.self_attention.submodules.core_attention.__name__ == core
    # The shared upstream spec object is not modified.
    again = kernels.layer_spec(GPT, kernels.choose_kernels(GPT, "unfused", on_gpu=False))
    assert again.submodules.self_attention.submodules.core_attention.__name__ == "DotProductAttention"


def test_the_log_line_names_every_kernel():
    line = kernels.choose_kernels(GPT, "flash", "fused", on_gpu=False).describe()
    assert line == ("kernels: layer spec local, core attention torch SDPA (flash), bias-activation fusion off, "
                    "bias-dropout-add fusion off, masked-softmax fusion off, optimizer Adam step fused, "
                    "weight-gradient accumulation fusion off")
    fused = kernels.choose_kernels(GPT, "flash", "fused", on_gpu=False, grad_accumulation_fusion="on")
    assert fused.describe().endswith("weight-gradient accumulation fusion on (torch GEMM, "
                                     "patches/wgrad_accumulation_torch.py)")


def test_the_log_line_names_the_mla_core():
    from megatron_auto.specs.presets import MODEL_PRESETS

    mla = MODEL_PRESETS["tiny-mla"].layers[0]
    line = kernels.choose_kernels(mla, "unfused", on_gpu=False).describe()
    assert "core attention MLADotProductAttention (unfused, MLA's head widths)," in line
    assert "core attention torch SDPA (flash)," in kernels.choose_kernels(mla, "flash", on_gpu=False).describe()
    assert "core attention Megatron DotProductAttention (unfused)," in kernels.choose_kernels(
        GPT, "unfused", on_gpu=False).describe()


@pytest.mark.parametrize("requested, apex, checked, fused", [
    ("auto", False, False, False), ("auto", True, False, True), ("auto", False, True, True),
    ("on", False, False, True), ("off", True, True, False)])
def test_grad_accumulation_fusion_follows_megatron_lm_where_apex_imports(monkeypatch, requested, apex, checked,
                                                                        fused):
    """`auto` fuses with apex's extension, or with the torch stand-in once its check passed on this GPU."""
    monkeypatch.setattr(kernels, "apex_wgrad_available", lambda: apex)
    monkeypatch.setattr(kernels, "torch_wgrad_checked", lambda: checked)
    chosen = kernels.choose_kernels(GPT, on_gpu=True, grad_accumulation_fusion=requested)
    assert chosen.grad_accumulation_fusion is fused
    assert kernels.config_flags(chosen)["gradient_accumulation_fusion"] is fused
    with pytest.raises(ValueError, match="grad accumulation fusion"):
        kernels.choose_kernels(GPT, on_gpu=True, grad_accumulation_fusion="yes")


def test_grad_accumulation_fusion_auto_stays_off_on_cpu(monkeypatch):
    monkeypatch.setattr(kernels, "torch_wgrad_checked", lambda: True)
    assert not kernels.choose_kernels(GPT, on_gpu=False).grad_accumulation_fusion
    assert kernels.choose_kernels(GPT, on_gpu=False, grad_accumulation_fusion="on").grad_accumulation_fusion


@pytest.mark.parametrize("cuda, problem, checked", [(False, None, False), (True, None, True),
                                                    (True, "left main_grad 57 off", False)])
def test_torch_wgrad_checked_runs_the_stand_ins_check_on_the_gpu(monkeypatch, caplog, cuda, problem, checked):
    """No CUDA: nothing to check, off. With CUDA the stand-in's accumulation_error decides, once per process,
    and a failed check is logged (`auto` then leaves the fusion off)."""
    from patches import wgrad_accumulation_torch

    devices = []
    monkeypatch.setattr(kernels, "apex_wgrad_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(wgrad_accumulation_torch, "accumulation_error",
                        lambda device: devices.append(device) or problem)
    kernels.torch_wgrad_checked.cache_clear()
    try:
        assert kernels.torch_wgrad_checked() is checked
        assert kernels.torch_wgrad_checked() is checked
    finally:
        kernels.torch_wgrad_checked.cache_clear()
    assert devices == ([torch.device("cuda", 0)] if cuda else [])
    assert ("stays off under auto" in caplog.text) is bool(problem)


def test_sdpa_core_refuses_what_it_does_not_run():
    from megatron.core.transformer import TransformerConfig

    from megatron_auto.runtime.attention import check_supported

    base = dict(num_layers=1, hidden_size=64, num_attention_heads=4)
    check_supported(TransformerConfig(**base))
    with pytest.raises(ValueError, match="sliding-window"):
        check_supported(TransformerConfig(**base, window_size=(8, 0)))
    with pytest.raises(ValueError, match="softmax"):
        check_supported(TransformerConfig(**base, softmax_type="off-by-one"))


def _adam_wrapped(impl: str, params):
    adam = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)
    kernels.use_optimizer_impl(SimpleNamespace(optimizer=adam), impl)
    return adam


def test_optimizer_impl_switches_torch_adam_and_survives_a_load():
    torch.manual_seed(0)
    start = [torch.randn(5, 3), torch.randn(7)]
    runs = {}
    for impl in ("foreach", "fused"):
        params = [p.clone().requires_grad_() for p in start]
        adam = _adam_wrapped(impl, params)
        for step in range(3):
            for p in params:
                p.grad = torch.sin(p.detach() * (step + 1))
            adam.step()
        runs[impl] = (adam, params)
    assert all(g["fused"] and not g["foreach"] for g in runs["fused"][0].param_groups)
    for got, want in zip(runs["fused"][1], runs["foreach"][1]):
        assert torch.allclose(got, want, rtol=0, atol=ADAM_ATOL)
    fused = runs["fused"][0]
    fused.load_state_dict(runs["foreach"][0].state_dict())  # the saved groups say foreach
    assert all(g["fused"] and not g["foreach"] for g in fused.param_groups)
    steps = [s["step"] for s in fused.state.values()]
    assert len({id(s) for s in steps}) == len(steps) and all(s.dtype == torch.float32 for s in steps)


def test_optimizer_impl_leaves_other_optimizers_alone():
    sgd = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    assert kernels.use_optimizer_impl(SimpleNamespace(optimizer=sgd), "fused") == 0
    assert "fused" not in sgd.param_groups[0] or not sgd.param_groups[0]["fused"]


KERNEL_CASES = [
    {"name": "core_causal", "kind": "core"},
    {"name": "core_gqa_with_mask", "kind": "core", "groups": 2, "mask": True},
    {"name": "core_layer_scaling", "kind": "core", "layer_scaling": True, "layer_number": 3, "softmax_scale": 0.3},
    # Multi-latent attention's shapes (tiny MLA: query/key heads 16 + 8 wide, values 12) and a YaRN-style scale
    # mscale^2 / sqrt(24) as MLASelfAttention passes it; the unfused core is runtime.attention's MLA subclass.
    *[{"name": f"core_mla_{core}", "kind": "core", "core": core, "k_width": 24, "v_width": 12,
       "softmax_scale": 1.3**2 / 24**0.5} for core in ("sdpa", "mla_unfused")],
    {"name": "layer_flash_gpt", "kind": "layer", "attention": "flash"},
    {"name": "layer_flash_llama", "kind": "layer", "attention": "flash", "swiglu": True, "groups": 2},
    {"name": "dropout", "kind": "dropout", "dropout": 0.5},
]
ONE_RANK_CASES = KERNEL_CASES + [
    {"name": "layer_fused_gelu", "kind": "layer", "attention": "flash", "fused": True},
    {"name": "layer_fused_swiglu", "kind": "layer", "attention": "unfused", "fused": True, "swiglu": True,
     "groups": 2},
    {"name": "optimizer_dp1", "kind": "optimizer", "flags": {"global_batch_size": 4, "micro_batch_size": 1}},
]
CP_CASES = [
    {"name": "cp_core_causal", "kind": "cp_core"},
    {"name": "cp_core_gqa_layer_scaling", "kind": "cp_core", "groups": 2, "layer_scaling": True, "layer_number": 3},
]
CP_MODEL_CASES = [
    {"name": "cp_model_learned_positions", "kind": "cp_model", "position": "learned_absolute"},
    {"name": "cp_model_rope_llama", "kind": "cp_model", "position": "rope", "swiglu": True, "groups": 2},
]
ONE_RANK_CASES += CP_MODEL_CASES
TWO_RANK_CASES = KERNEL_CASES + CP_CASES + CP_MODEL_CASES + [
    {"name": "optimizer_tp2", "kind": "optimizer",
     "flags": {"global_batch_size": 4, "micro_batch_size": 1, "tp": 2}},
    {"name": "optimizer_distopt_dp2", "kind": "optimizer",
     "flags": {"global_batch_size": 4, "micro_batch_size": 1, "distributed_optimizer": True}},
]


@pytest.fixture(scope="module")
def kernel_results(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("kernels")
    return {1: run_cases(tmp, 1, "kernels_worker.py", ONE_RANK_CASES, timeout_s=300),
            2: run_cases(tmp, 2, "kernels_worker.py", TWO_RANK_CASES, timeout_s=300)}


@pytest.mark.parametrize("world", [1, 2])
def test_case_after_case_ends_with_the_threads_of_the_first(kernel_results, world):
    """Each case's Megatron groups (and a training case's session's) are destroyed and forgotten before the
    next (distributed.destroy_parallel_groups): every case ends with its process groups' threads within
    worker_stats.thread_bound of the first case's (its count plus less than one gloo group's threads). The
    count is of the groups' own threads: the fused-kernel cases start torch.compile's worker pool once (2
    threads on this 2-core machine, sized by the host elsewhere), which is no leak."""
    closed = [result["group_threads_closed"] for result in kernel_results[world].values()]
    assert len(closed) > 3 and max(closed) <= thread_bound(closed), (thread_bound(closed), closed)


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("name", ["core_causal", "core_gqa_with_mask", "core_layer_scaling"])
def test_sdpa_core_matches_megatron_values_and_gradients(kernel_results, world, name):
    result = kernel_results[world][name]
    assert result["shape_ok"]
    assert result["output"] < FP32_RTOL
    assert max(result["grads"]) < FP32_RTOL  # d/dq, d/dk, d/dv


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("core", ["sdpa", "mla_unfused"])
def test_cores_take_multi_latent_attentions_head_widths(kernel_results, world, core):
    """Query/key heads 24 wide, values 12 (MLA's k_channels, v_channels): SDPA and the unfused MLA core compute
    what Megatron's DotProductAttention computes on those widths (its forward takes any; its context view is
    set to the value width), values and q/k/v gradients, within FP32_RTOL, at TP1 and TP2 (2 of 4 heads)."""
    result = kernel_results[world][f"core_mla_{core}"]
    assert result["core"] == {"sdpa": "SDPAttention", "mla_unfused": "MLADotProductAttention"}[core]
    assert result["shape_ok"] and result["width"] == HEADS_PER_RANK[world] * 12
    assert result["output"] < FP32_RTOL
    assert max(result["grads"]) < FP32_RTOL


@pytest.mark.parametrize("backend, core", [("flash", "SDPAttention"), ("unfused", "MLADotProductAttention")])
def test_local_spec_runs_mla_with_a_core_that_takes_its_widths(backend, core):
    """Megatron-Core 0.16.1's DotProductAttention does not take MLA's k_channels/v_channels: unfused MLA runs
    runtime.attention.MLADotProductAttention, flash runs SDPAttention, both under MLASelfAttention."""
    from megatron_auto.specs.presets import MODEL_PRESETS

    layer = MODEL_PRESETS["tiny-mla"].layers[0]
    spec = kernels.layer_spec(layer, kernels.choose_kernels(layer, backend, on_gpu=False))
    assert spec.submodules.self_attention.module.__name__ == "MLASelfAttention"
    assert spec.submodules.self_attention.submodules.core_attention.__name__ == core


HEADS_PER_RANK = {1: 4, 2: 2}


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_context_parallel_chunks_are_megatrons_and_gather_back_in_order(cp):
    from megatron.core.utils import get_batch_on_this_cp_rank

    from megatron_auto.runtime import context_parallel

    sequence = torch.arange(2 * cp * 3).view(1, -1)  # [batch, seq] as Megatron's batch
    mine = [context_parallel.chunks_of_rank(sequence, r, cp, seq_dim=1) for r in range(cp)]
    for rank, chunks in enumerate(mine):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("megatron.core.parallel_state.get_context_parallel_world_size", lambda: cp)
            patch.setattr("megatron.core.parallel_state.get_context_parallel_rank", lambda: rank)
            assert torch.equal(get_batch_on_this_cp_rank({"tokens": sequence})["tokens"], chunks)
    gathered = torch.cat(mine, dim=1).view(2 * cp, 3)
    assert torch.equal(gathered[context_parallel.sequence_order(cp)].view(1, -1), sequence)


@pytest.mark.parametrize("name", [case["name"] for case in CP_CASES])
def test_context_parallel_sdpa_matches_whole_sequence_attention(kernel_results, name):
    # Each of 2 ranks holds chunks r and 3-r of 4; the CP group all-gathers K and V. Same fp32 bound as the
    # single-device cores: only the order of the sums differs.
    result = kernel_results[2][name]
    assert result["cp_size"] == 2 and result["shape_ok"]
    assert result["output"] < FP32_RTOL
    assert max(result["grads"]) < FP32_RTOL  # d/dq, d/dk, d/dv of this rank's chunks


@pytest.mark.parametrize("name", [case["name"] for case in CP_MODEL_CASES])
def test_context_parallel_gpt_matches_the_one_rank_model(kernel_results, name):
    # Two ranks each run half of every sequence (chunks r and 3-r of 4) through the same weights; the summed
    # loss and gradients are the one-rank run's up to the order of fp32 sums (FP32_RTOL, as above). RoPE
    # positions come from Megatron's per-rank selection (patches/rope_cp_rank_cpu.py on the CPU).
    one, two = kernel_results[1][name], kernel_results[2][name]
    assert two["tokens_per_rank"] * 2 == one["tokens_per_rank"]
    assert two["loss"] == pytest.approx(one["loss"], rel=FP32_RTOL)
    assert two["param_grad_norms"] == pytest.approx(one["param_grad_norms"], rel=FP32_RTOL)
    # A projection sums ~1e5 gradient entries times N(0, 1) weights: rounding of a few 1e-7 per entry adds up
    # to ~1e-6 of the largest projection (2e-6 measured); 1e-4 of it leaves 50x margin, and a wrong position
    # on one rank moved them by 1e-2.
    scale = max(abs(p) for p in one["projections"])
    assert max(abs(a - b) for a, b in zip(two["projections"], one["projections"])) < FP32_RTOL * scale * 10


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("name", ["layer_flash_gpt", "layer_flash_llama"])
def test_layer_on_sdpa_matches_the_local_layer(kernel_results, world, name):
    result = kernel_results[world][name]
    assert result["core"] == "SDPAttention"
    assert max(result["output"], result["input_grad"], result["param_grad"]) < FP32_RTOL


@pytest.mark.parametrize("world", [1, 2])
def test_attention_dropout_runs_in_the_kernel_under_the_tp_rng_fork(kernel_results, world):
    result = kernel_results[world]["dropout"]
    assert result["eval_max_error"] < FP32_RTOL  # no dropout outside training
    assert result["changed_fraction"] > 0.5  # dropout changed the training output ...
    assert abs(result["mean"] - 1.0) < DROPOUT_MEAN_ATOL  # ... and kept its expected value
    assert result["default_rng_untouched"] and result["tracker_advanced"]
    if world == 2:
        assert result["ranks_differ"]  # each TP rank draws its own masks (seed + TP rank)


@pytest.mark.parametrize("name, rtol", [("layer_fused_gelu", TANH_GELU_RTOL), ("layer_fused_swiglu", FP32_RTOL)])
def test_fused_bias_activation_and_dropout_add_match_the_unfused_layer(kernel_results, name, rtol):
    result = kernel_results[1][name]
    assert result["fused_calls"] == {"activation": 1, "bias_dropout_add": 2}
    assert max(result["output"], result["input_grad"], result["param_grad"]) < rtol


@pytest.mark.parametrize("world, name", [(1, "optimizer_dp1"), (2, "optimizer_tp2"), (2, "optimizer_distopt_dp2")])
def test_fused_adam_step_matches_foreach_inside_megatrons_optimizer(kernel_results, world, name):
    result = kernel_results[world][name]
    assert result["foreach_flags"] == [[False, True]] and result["fused_flags"] == [[True, False]]
    assert result["max_abs_param"] > 0.5  # the parameters compared are not all tiny
    assert result["max_abs_diff"] < ADAM_ATOL
    if "flags_after_load" in result:
        assert result["flags_after_load"] == [[True, False]] and result["distinct_steps"]
        assert result["step_values"] == [3.0]


def _flash(**extra) -> dict:
    return {"settings": {"attention_backend": "flash", **extra}}


@pytest.fixture(scope="module")
def flash_runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("flash_equivalence")
    flags = {"global_batch_size": 8, "micro_batch_size": 2}
    references = run_cases(tmp, 1, "equivalence_worker.py", [
        {"name": "reference", "flags": flags, "save_initial": str(tmp / "init"), **_flash()},
        {"name": "llama_reference", "model": "llama", "flags": flags, "save_initial": str(tmp / "init_llama"),
         **_flash()},
        {"name": "unfused_reference", "flags": flags, "load_weights": str(tmp / "init"),
         "settings": {"attention_backend": "unfused"}},
    ], timeout_s=240)
    init = {"load_weights": str(tmp / "init")}
    parallel = run_cases(tmp, 4, "equivalence_worker.py", [
        {"name": "tp2_dp2_selective_recompute", "flags": {**BATCH, "tp": 2,
                                                          "recompute_granularity": "selective"}, **init, **_flash()},
        {"name": "pp2_dp2_fused_adam", "flags": {**BATCH, "pp": 2}, **init,
         **_flash(optimizer_impl="fused", grad_accumulation_fusion="on")},
        {"name": "llama_tp2_sp_dp2", "model": "llama", "flags": {**BATCH, "tp": 2,
                                                                 "sequence_parallel": True},
         "load_weights": str(tmp / "init_llama"), **_flash(grad_accumulation_fusion="on")},
    ], timeout_s=360)
    return {**references, **parallel}


def test_flash_runtime_learns_like_the_unfused_one(flash_runs):
    flash, unfused = flash_runs["reference"], flash_runs["unfused_reference"]
    assert flash["iterations"] == list(range(1, STEPS + 1)) and len(set(flash["losses"])) == STEPS
    for ours, theirs in zip(flash["losses"], unfused["losses"]):
        assert math.isclose(ours, theirs, rel_tol=FP32_RTOL)


@pytest.mark.parametrize("name, reference", [("tp2_dp2_selective_recompute", "reference"),
                                             ("pp2_dp2_fused_adam", "reference"),
                                             ("llama_tp2_sp_dp2", "llama_reference")])
def test_flash_layouts_match_one_process(flash_runs, name, reference):
    assert_matches_reference(flash_runs[name], flash_runs[reference])


def test_fused_weight_gradient_accumulation_matches_the_hooks(flash_runs):
    """PP2 and TP2+SP (all-gathered inputs) accumulate weight gradients in the GEMM
    (--grad-accumulation-fusion on) over 2 micro-batches per rank; the one-process references take
    Megatron DDP's hook path. The fp32 sums differ only in order, so the layouts' tolerance
    (test_equivalence.RTOL) holds, and a dropped or doubled micro-batch would break it."""
    assert flash_runs["reference"]["wgrad_fused_linears"] == 0
    # GPT: QKV, proj, fc1, fc2 per layer (2 layers, PP2: 1 per rank) and the LM head on the last stage
    assert flash_runs["pp2_dp2_fused_adam"]["wgrad_fused_linears"] >= 4
    assert flash_runs["llama_tp2_sp_dp2"]["wgrad_fused_linears"] >= 8


HYBRID_FLASH_PLAN = {"chunks": [[{"tp": 2, "dp": 2, "sp": True, "zero": 1}, {"dp": 4, "zero": 3},
                                 {"tp": 4, "recompute": "selective"}, {"dp": 4, "zero": 0}]],
                     "embedding": {"tp": 2, "dp": 2, "zero": 0}}
"""Per-layer layouts: TP2xDP2 with SP and ZeRO-1, ZeRO-3 (FSDP2), TP4 recomputing its core attention, DDP."""


@pytest.fixture(scope="module")
def hybrid_flash_runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("hybrid_flash")
    flash = {"settings": {"attention_backend": "flash", "optimizer_impl": "fused", "grad_accumulation_fusion": "on"}}
    reference = run_cases(tmp, 1, "hybrid_worker.py", [
        {"name": "reference", "reference": True, "init": str(tmp / "init.pt"), **flash}], timeout_s=150)
    hybrid = run_cases(tmp, 4, "hybrid_worker.py", [
        {"name": "hybrid", "plan": HYBRID_FLASH_PLAN, "init": str(tmp / "init.pt"), **flash}], timeout_s=240)
    return {**reference, **hybrid}


def test_hybrid_runtime_runs_the_same_kernels_and_matches_one_process(hybrid_flash_runs):
    reference, hybrid = hybrid_flash_runs["reference"], hybrid_flash_runs["hybrid"]
    for run in (reference, hybrid):
        assert {k: run["kernels"][k] for k in ("cores", "adam_flags")} == {"cores": ["SDPAttention"],
                                                                            "adam_flags": [[True, False]]}
    # DDP parts fuse the weight-gradient accumulation; the ZeRO-3 (FSDP2) part has no main_grad and does not.
    assert reference["kernels"]["wgrad_fusion"] == [[False, True]]
    assert hybrid["kernels"]["wgrad_fusion"] == [[False, True], [True, False]]
    assert len(set(reference["losses"])) == STEPS
    for key in ("losses", "grad_norms"):
        for ours, theirs in zip(hybrid[key], reference[key]):
            assert math.isclose(ours, theirs, rel_tol=FP32_RTOL)
