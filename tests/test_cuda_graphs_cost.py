"""Issue 37, item 2: CUDA graphs (--cuda-graph-impl, --cuda-graph-scope) priced (cost/cuda_graphs.py): the captured
ops leave the layer's host floor, each graph keeps a static input per micro-batch in flight, full recompute gets
no layer graph, and `plan --cuda-graph-impl search` keeps graphs where they pay, with the flags that run them."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from megatron_auto.cli.main import main
from megatron_auto.cost.cuda_graphs import HOST_OPS_MLP_SIDE
from megatron_auto.cost.layer_cost import kept_activation_bytes, layer_cost
from megatron_auto.cost.layer_kernels import HOST_OPS_BACKWARD, HOST_OPS_FORWARD
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.model import LayerSpec
from megatron_auto.specs.presets import CLUSTER_PRESETS
from megatron_auto.specs.training import TrainingSpec

H100 = CLUSTER_PRESETS["dgx-h100-80gb"]
NO_HOST = replace(H100, gpu=replace(H100.gpu, kernel_launch_s=0.0))  # the GPU's own time, no host floor
LAUNCH = H100.gpu.kernel_launch_s
SMALL = LayerSpec(512, 8, 8, 2048)  # a host-bound shard at tp 8
TP8 = LayerStrategy(tp=8, dp=1, sp=True)
EAGER = TrainingSpec(global_batch_size=8)
GRAPHS = replace(EAGER, cuda_graph_impl="transformer_engine")


def graphed(*scopes: str, impl: str = "transformer_engine") -> TrainingSpec:
    return replace(EAGER, cuda_graph_impl=impl, cuda_graph_scope=scopes)


def approx(value):
    return pytest.approx(value, rel=1e-12, abs=0.0)


def test_a_whole_layer_graph_leaves_one_launch_of_the_host_floor():
    gpu = layer_cost(SMALL, TP8, 1, 256, NO_HOST, EAGER)
    eager, whole = (layer_cost(SMALL, TP8, 1, 256, H100, spec) for spec in (EAGER, GRAPHS))
    assert eager.forward_s == approx(HOST_OPS_FORWARD * LAUNCH) and eager.forward_s > gpu.forward_s  # host-bound
    assert eager.backward_s == approx(HOST_OPS_BACKWARD * LAUNCH) and eager.backward_s > gpu.backward_s
    assert whole.forward_s == approx(max(LAUNCH, gpu.forward_s))
    assert whole.backward_s == approx(max(HOST_OPS_BACKWARD / HOST_OPS_FORWARD * LAUNCH, gpu.backward_s))


def test_an_attention_graph_keeps_the_mlp_sides_ops_on_the_host():
    attention = layer_cost(SMALL, TP8, 1, 256, H100, graphed("attn"))
    assert attention.forward_s == approx((HOST_OPS_MLP_SIDE + 1) * LAUNCH)
    both = layer_cost(SMALL, TP8, 1, 256, H100, graphed("attn", "mlp"))
    gpu = layer_cost(SMALL, TP8, 1, 256, NO_HOST, EAGER)
    assert both.forward_s == approx(max(2 * LAUNCH, gpu.forward_s))
    # A dense layer has no MoE side: moe_router captures nothing of it.
    assert layer_cost(SMALL, TP8, 1, 256, H100, graphed("attn", "moe_router")).forward_s == approx(attention.forward_s)


def test_graphs_change_no_time_where_the_gpu_outlasts_the_host_or_there_is_no_host_term():
    big, tp1 = LayerSpec(8192, 64, 64, 32768), LayerStrategy(tp=1, dp=1)
    eager, whole = (layer_cost(big, tp1, 4, 4096, H100, spec) for spec in (EAGER, GRAPHS))
    assert (whole.forward_s, whole.backward_s) == (eager.forward_s, eager.backward_s)
    a100 = CLUSTER_PRESETS["dgx-a100-80gb"]
    assert layer_cost(SMALL, TP8, 1, 256, a100, GRAPHS).forward_s == layer_cost(SMALL, TP8, 1, 256, a100,
                                                                                 EAGER).forward_s


@pytest.mark.parametrize("spec, graphs", [(GRAPHS, 1), (graphed("attn", "mlp"), 2), (graphed("attn"), 1),
                                          (graphed("full_iteration", impl="local"), 0)])
def test_each_graph_keeps_one_hidden_state_per_micro_batch_in_flight(spec, graphs):
    samples, seq = 2, 256
    static = graphs * 2 * seq * samples * SMALL.hidden_size / 8  # bf16, s b h split over TP 8 with SP
    eager, captured = (layer_cost(SMALL, TP8, samples, seq, H100, s) for s in (EAGER, spec))
    assert captured.activation_bytes - eager.activation_bytes == approx(static)
    assert kept_activation_bytes(SMALL, TP8, samples, seq, H100, spec) == approx(captured.activation_bytes)


def test_full_recompute_gets_layer_graphs_only_from_a_full_iteration_graph():
    full = replace(TP8, recompute="full")
    assert layer_cost(SMALL, full, 1, 256, H100, GRAPHS) == layer_cost(SMALL, full, 1, 256, H100, EAGER)
    iteration = layer_cost(SMALL, full, 1, 256, H100, graphed("full_iteration", impl="local"))
    assert iteration.forward_s < layer_cost(SMALL, full, 1, 256, H100, EAGER).forward_s


@pytest.mark.parametrize("impl, scopes, words", [
    ("local", ("attn",), "partial scopes need transformer_engine"),
    ("transformer_engine", ("full_iteration",), "only with --cuda-graph-impl local"),
    ("transformer_engine", ("moe", "moe_router"), "both moe and moe_router"),
    ("transformer_engine", ("moe_preprocess",), "needs moe_router"),
    ("transformer_engine", ("mamba",), "not priced"),
    ("none", ("attn",), "needs --cuda-graph-impl"),
])
def test_what_megatron_core_refuses_is_refused(impl, scopes, words):
    with pytest.raises(ValueError, match=words):
        replace(EAGER, cuda_graph_impl=impl, cuda_graph_scope=scopes)


HOST_BOUND = ["--model", "gpt3-1.7b", "--cluster", "dgx-h100-80gb", "--num-nodes", "1", "--global-batch-size",
              "64", "--tp", "8", "--micro-batch-size", "1"]


def _run(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_takes_megatron_lms_spellings_and_the_plan_carries_the_flags(capsys):
    flags = ["estimate", *HOST_BOUND, "--pp", "1", "--sequence-parallel"]
    eager = _run(capsys, *flags)
    older = _run(capsys, *flags, "--enable-cuda-graph", "--cuda-graph-warmup-steps", "3")
    scoped = _run(capsys, *flags, "--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn")
    assert older["iteration_time_s"] < scoped["iteration_time_s"] < eager["iteration_time_s"]
    assert older["megatron_flags"][-2:] == ["--cuda-graph-impl", "local"]
    assert scoped["megatron_flags"][-4:] == ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn"]
    assert "--cuda-graph-impl" not in eager["megatron_flags"]
    iteration = _run(capsys, *flags, "--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration",
                     "--recompute", "full")
    assert iteration["megatron_flags"][-5:] == ["--cuda-graph-impl", "local", "--cuda-graph-scope", "full_iteration",
                                                "--no-check-for-nan-in-loss-and-grad"]  # arguments.py asserts it


@pytest.mark.parametrize("extra, words", [
    (["--recompute", "full", "--cuda-graph-impl", "transformer_engine"], "full_iteration"),
    (["--cuda-graph-impl", "search"], "plan's choice"),
    (["--enable-cuda-graph", "--cuda-graph-impl", "local"], "do not give --enable-cuda-graph"),
    (["--cuda-graph-impl", "local", "--cuda-graph-scope", "attn"], "partial scopes"),
])
def test_estimate_refuses_in_one_line(capsys, extra, words):
    assert main(["estimate", *HOST_BOUND, "--pp", "1", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "\n" not in err


def test_plan_refuses_full_recompute_beside_layer_graphs_in_one_line(capsys):
    assert main(["plan", *HOST_BOUND, "--recompute", "full", "--enable-cuda-graph"]) == 2
    err = capsys.readouterr().err.strip()
    assert "full_iteration" in err and "\n" not in err


def test_plan_search_keeps_graphs_where_they_pay_and_not_in_the_hybrid_space(capsys):
    eager = _run(capsys, "plan", *HOST_BOUND)
    chosen = _run(capsys, "plan", *HOST_BOUND, "--cuda-graph-impl", "search")
    assert chosen["iteration_time_s"] < eager["iteration_time_s"]
    assert chosen["megatron_flags"][-2:] == ["--cuda-graph-impl", "transformer_engine"]
    assert "--cuda-graph-impl" not in eager["megatron_flags"]
    assert main(["plan", *HOST_BOUND, "--cuda-graph-impl", "search", "--space", "hybrid"]) == 2
    assert "megatron-auto's runtime" in capsys.readouterr().err
