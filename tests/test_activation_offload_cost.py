"""Issue 37, item 2: fine-grained activation offloading (--fine-grained-activation-offloading --offload-modules)
priced (cost/activation_offload.py): the modules' saved inputs leave the kept activations, two layers' worth stay
while a layer runs, the PCIe copies show only where they outlast the pass they run beside, recomputed modules and
small tensors stay, and `plan --fine-grained-activation-offloading search` keeps it where it pays."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from megatron_auto.cli.main import main
from megatron_auto.cost.activation_offload import RESIDENT_LAYERS, offloaded_bytes
from megatron_auto.cost.layer_cost import kept_activation_bytes, layer_cost
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.model import LayerSpec
from megatron_auto.specs.presets import CLUSTER_PRESETS, H100_HOST_LINK_BYTES_PER_S
from megatron_auto.specs.training import TrainingSpec
from test_moe_cost import LAYER as MOE_LAYER

H100 = CLUSTER_PRESETS["dgx-h100-80gb"]
GPT = LayerSpec(1024, 16, 16, 4096)  # no GQA, no RoPE: Q, K, V are views of one 3h-wide QKV output
TP2 = LayerStrategy(tp=2, dp=4, sp=True)
S, B, WORD = 1024, 2, 2
KEPT = TrainingSpec(global_batch_size=8)
CORE = replace(KEPT, offload_modules=("core_attn", "attn_proj"))


def approx(value):
    return pytest.approx(value, rel=1e-12, abs=0.0)


def test_the_attention_cores_inputs_and_the_projections_input_leave():
    # core_attn: the 3h-wide QKV output over TP; attn_proj: the h-wide core output over TP.
    assert offloaded_bytes(GPT, TP2, S, B, CORE) == approx(WORD * S * B * (3 + 1) * 1024 / 2)
    norms = replace(KEPT, offload_modules=("attn_norm", "mlp_norm", "qkv_linear"))
    assert offloaded_bytes(GPT, TP2, S, B, norms) == approx(3 * WORD * S * B * 1024 / 2)  # h-wide, SP split


def test_the_kept_bytes_drop_and_two_layers_worth_stay_transient():
    off = offloaded_bytes(GPT, TP2, S, B, CORE)
    kept, offloaded = (layer_cost(GPT, TP2, B, S, H100, spec) for spec in (KEPT, CORE))
    assert kept.activation_bytes - offloaded.activation_bytes == approx(off)
    assert offloaded.transient_bytes - kept.transient_bytes == approx(RESIDENT_LAYERS * off)
    assert kept_activation_bytes(GPT, TP2, B, S, H100, CORE) == approx(offloaded.activation_bytes)


def test_the_copies_show_only_beyond_the_pass_they_run_beside():
    off = offloaded_bytes(GPT, TP2, S, B, CORE)
    kept = layer_cost(GPT, TP2, B, S, H100, KEPT)
    slow = replace(H100, gpu=replace(H100.gpu, host_link_bytes_per_s=off / (3 * kept.backward_s)))
    copy = 3 * kept.backward_s  # longer than either pass
    hidden, shown = (layer_cost(GPT, TP2, B, S, cluster, CORE) for cluster in (H100, slow))
    assert H100.gpu.host_link_bytes_per_s == H100_HOST_LINK_BYTES_PER_S == 0.8 * 64e9
    assert (hidden.forward_s, hidden.backward_s) == (kept.forward_s, kept.backward_s)  # PCIe keeps up here
    assert shown.forward_s == approx(copy) and shown.backward_s == approx(copy)


def test_recomputed_modules_and_small_tensors_stay_on_the_device():
    full, core = replace(TP2, recompute="full"), replace(TP2, recompute="selective")
    assert offloaded_bytes(GPT, full, S, B, CORE) == 0.0
    assert offloaded_bytes(GPT, core, S, B, CORE) == approx(WORD * S * B * 1024 / 2)  # attn_proj alone
    elements = S * B * 1024 / 2  # attn_proj's input
    assert offloaded_bytes(GPT, TP2, S, B, replace(CORE, min_offloaded_tensor_size=int(elements) + 1)) == \
        approx(WORD * S * B * 3 * 1024 / 2)  # the 3h-wide core input still goes
    assert offloaded_bytes(GPT, TP2, S, B, replace(CORE, min_offloaded_tensor_size=10**9)) == 0.0


def test_a_moe_layers_routed_copies_leave_with_expert_fc1_and_moe_act():
    ep4 = LayerStrategy(tp=1, dp=8, ep=4)
    copies = 2 * 512 * 2  # top-2 of 512 tokens x 2 samples, balanced
    experts = replace(KEPT, offload_modules=("expert_fc1", "moe_act"))
    assert offloaded_bytes(MOE_LAYER, ep4, 512, 2, experts) == approx(WORD * copies * (1024 + 2 * 2048))
    fp8 = replace(experts, precision="fp8", offload_modules=("expert_fc1",))
    assert offloaded_bytes(MOE_LAYER, ep4, 512, 2, fp8) == approx(copies * 1024)  # TE keeps fc1's input in FP8
    assert offloaded_bytes(GPT, TP2, S, B, experts) == 0.0  # a dense layer has no experts


@pytest.mark.parametrize("modules, words", [
    (("attn_proj",), "needs core_attn"), (("core_attn", "core_attn"), "twice"), (("router",), "not one of")])
def test_what_megatron_core_refuses_is_refused(modules, words):
    with pytest.raises(ValueError, match=words):
        replace(KEPT, offload_modules=modules)


def test_an_offloaded_module_may_not_sit_in_a_graphs_scope():
    with pytest.raises(ValueError, match="scope may not contain"):
        replace(CORE, cuda_graph_impl="transformer_engine")
    with pytest.raises(ValueError, match="scope may not contain"):
        replace(CORE, cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",))
    assert replace(CORE, cuda_graph_impl="transformer_engine", cuda_graph_scope=("mlp",)).offload_modules


JOB = ["--model", "llama2-7b", "--cluster", "dgx-h100-80gb", "--num-nodes", "1", "--global-batch-size", "64",
       "--tp", "1", "--pp", "1", "--micro-batch-size", "1", "--recompute", "none"]
ALL_DENSE = ["--offload-modules", "core_attn", "attn_proj", "attn_norm", "mlp_norm", "qkv_linear"]


def _run(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_prices_megatron_lms_flags_and_the_plan_carries_them(capsys):
    kept = _run(capsys, "estimate", *JOB)
    offloaded = _run(capsys, "estimate", *JOB, "--fine-grained-activation-offloading", *ALL_DENSE,
                     "--min-offloaded-tensor-size", "4096")
    assert offloaded["peak_memory_gib"] < kept["peak_memory_gib"]
    assert offloaded["megatron_flags"][-9:] == ["--fine-grained-activation-offloading", *ALL_DENSE,
                                                "--min-offloaded-tensor-size", "4096"]
    assert "--fine-grained-activation-offloading" not in kept["megatron_flags"]


@pytest.mark.parametrize("extra, words", [
    (["--fine-grained-activation-offloading"], "needs --offload-modules"),
    (["--fine-grained-activation-offloading", "search", *ALL_DENSE], "plan's choice"),
    (["--fine-grained-activation-offloading", *ALL_DENSE, "--transformer-impl", "local"], "transformer_engine"),
    (["--fine-grained-activation-offloading", "--offload-modules", "attn_proj"], "needs core_attn"),
])
def test_estimate_refuses_in_one_line(capsys, extra, words):
    assert main(["estimate", *JOB, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


def test_a_cluster_without_a_host_link_refuses_offloading(capsys):
    argv = ["estimate", "--model", "tiny-gpt", "--cluster", "cpu-gloo", "--num-nodes", "1", "--gpus-per-node", "2",
            "--global-batch-size", "4", "--tp", "1", "--pp", "1", "--transformer-impl", "transformer_engine",
            "--fine-grained-activation-offloading", "--offload-modules", "core_attn"]
    assert main(argv) == 2
    assert "host link" in capsys.readouterr().err


def test_plan_search_keeps_offloading_where_only_it_fits(capsys):
    """At 56 GiB with no recomputation, no plan fits with every activation kept; offloading fits one."""
    budget = ["--memory-budget-gib", "56"]
    assert main(["plan", *JOB, *budget]) == 2
    assert "no plan fits" in capsys.readouterr().err
    chosen = _run(capsys, "plan", *JOB, *budget, "--fine-grained-activation-offloading", "search", *ALL_DENSE)
    assert chosen["fits"] and "--fine-grained-activation-offloading" in chosen["megatron_flags"]
