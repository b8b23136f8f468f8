"""What hidden collectives cost the compute beside them (cost/comm_interference.py): the SMs an NCCL kernel holds."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from pytest import approx

from megatron_auto.cli.main import main
from megatron_auto.cost.comm_interference import dispatch_interference_share, interference_seconds, interference_share
from megatron_auto.cost.estimate import estimate_plan
from megatron_auto.cost.layer_cost import dense_part_cost, layer_cost
from megatron_auto.cost.moe import expert_cost
from megatron_auto.cost.pipeline import exposed_dp_time
from megatron_auto.cost.shared_expert import hidden_dispatch_seconds, shared_expert_seconds
from megatron_auto.plan import LayerStrategy
from megatron_auto.search.uniform import UniformConfig, build_uniform_plan
from megatron_auto.specs.loaders import load_cluster, load_model
from megatron_auto.specs.profiles import ClusterProfile, MeasuredCosts
from megatron_auto.specs.training import TrainingSpec
from test_moe_cost import B, BF16, S, SHARED, TOY, TP2_EP2

H100 = load_cluster("dgx-h100-80gb", 1)
QUIET = replace(H100, gpu=replace(H100.gpu, collective_sms=0))
"""The same cluster with the term off."""


def test_the_share_is_the_collective_s_sms_over_the_gpu_s_and_nothing_where_either_is_unknown():
    assert interference_share(H100) == approx(24 / 132)
    assert interference_seconds(2.0, H100) == approx(2.0 * 24 / 132)
    assert interference_share(QUIET) == 0.0
    assert interference_share(replace(H100, gpu=replace(H100.gpu, sm_count=0))) == 0.0
    assert interference_share(load_cluster("cpu-gloo", 1)) == 0.0  # gloo runs no NCCL kernels
    assert interference_seconds(-1.0, H100) == 0.0
    # A measured overlap share already holds what the compute lost beside the traffic.
    profile = ClusterProfile(name="measured", backend="nccl", device="H100", world_size=8, gpus_per_node=8,
                             curves=(), grad_overlap_fraction=0.9)
    assert interference_share(replace(H100, measured=MeasuredCosts(cluster=profile))) == 0.0


@pytest.mark.parametrize("comm, backward", [(1.0, 2.0), (1.0, 0.4)])
def test_hidden_gradient_traffic_costs_its_share_and_exposed_traffic_costs_itself(comm, backward):
    """Only the hidden part (the window's overlap) is charged at the share: exposed traffic has no compute
    beside it."""
    hidden = min(comm, backward)
    assert exposed_dp_time(comm, backward, 1.0, 0.25) == approx(comm - hidden + 0.25 * hidden)
    assert exposed_dp_time(comm, backward, 0.5, 0.25) == approx(comm - 0.5 * hidden * 0.75)
    assert exposed_dp_time(comm, backward) == approx(comm - hidden)


def test_a_data_parallel_plan_pays_the_share_of_the_gradient_traffic_it_hides():
    """Llama 2 7B on 8 H100s at dp 8: the gradient reduce-scatter and the parameter all-gather run beside the
    backward of the layers below; the plan's sync term grows by the share of what is hidden, nothing else."""
    model, training = load_model("llama2-7b"), TrainingSpec(global_batch_size=64)
    plan = build_uniform_plan(model, H100, training, UniformConfig(tp=1, pp=1, micro_batch_size=1, distributed_optimizer=True))
    loud, quiet = (estimate_plan(plan, model, cluster, training) for cluster in (H100, QUIET))
    serial = estimate_plan(plan, model, replace(QUIET, grad_overlap=0.0), training)
    hidden = serial.breakdown.dp_comm_s - quiet.breakdown.dp_comm_s
    assert hidden > 0
    assert loud.breakdown.dp_comm_s - quiet.breakdown.dp_comm_s == approx(hidden * 24 / 132, rel=1e-9)
    assert replace(loud.breakdown, dp_comm_s=0.0) == replace(quiet.breakdown, dp_comm_s=0.0)


def test_the_dispatch_the_shared_expert_hides_costs_its_share():
    """The all-to-all that the shared expert's stream hides still holds SMs beside the shared expert."""
    overlap = replace(BF16, moe_shared_expert_overlap=True)
    toy = replace(TOY, gpu=replace(TOY.gpu, sm_count=100, collective_sms=20))
    plain, overlapped = (layer_cost(SHARED, TP2_EP2, B, S, toy, t) for t in (BF16, overlap))
    dense = dense_part_cost(SHARED, TP2_EP2, B, S, toy, overlap)
    dispatch = expert_cost(SHARED, TP2_EP2, B, S, toy, overlap).comm_s
    passes = dense.forward_s + dense.backward_s + dense.recompute_s
    hidden = min(shared_expert_seconds(SHARED, TP2_EP2, B, S, toy, overlap, passes), dispatch)
    assert 0 < hidden == approx(hidden_dispatch_seconds(SHARED, TP2_EP2, B, S, toy, overlap, passes, dispatch))
    assert plain.ep_comm_s - overlapped.ep_comm_s == approx(hidden * (1 - 0.2))


def test_the_weight_gathers_fsdp_prefetches_cost_their_share():
    """ZeRO-3 (Megatron-FSDP) gathers the next layer's weights beside this layer's compute, every micro-batch."""
    layer, strategy = load_model("llama2-7b").layers[0], LayerStrategy(tp=1, dp=8, zero=3)
    loud, quiet, serial = (layer_cost(layer, strategy, 1, 4096, cluster, TrainingSpec(global_batch_size=64))
                           for cluster in (H100, QUIET, replace(QUIET, grad_overlap=0.0)))
    hidden = serial.zero3_exposed_s - quiet.zero3_exposed_s
    assert hidden > 0
    assert loud.zero3_exposed_s - quiet.zero3_exposed_s == approx(hidden * 24 / 132)


def test_the_flex_dispatcher_s_kernels_hold_the_sms_they_are_configured_with():
    """DeepEP and HybridEP run their own kernels on moe_deepep_num_sms / moe_hybridep_num_sms SMs (megatron-core
    0.16.1's defaults 20 and 16), not on NCCL's channels."""
    flex = TrainingSpec(64, moe_token_dispatcher="flex")
    assert dispatch_interference_share(H100, TrainingSpec(64)) == approx(24 / 132)
    assert dispatch_interference_share(H100, flex) == approx(20 / 132)
    assert dispatch_interference_share(H100, replace(flex, moe_flex_backend="hybridep")) == approx(16 / 132)
    assert dispatch_interference_share(H100, replace(flex, moe_flex_backend="hybridep",
                                                     moe_hybridep_num_sms=32)) == approx(32 / 132)
    assert dispatch_interference_share(QUIET, flex) == 0.0
    with pytest.raises(ValueError, match="must be at least 1"):
        replace(flex, moe_deepep_num_sms=0)


def test_a_plan_with_other_than_megatron_cores_count_writes_the_flag(capsys):
    argv = ["estimate", "--model", "tiny-mixtral", "--cluster", "dgx-h100-80gb", "--num-nodes", "2",
            "--global-batch-size", "64", "--tp", "1", "--pp", "1", "--ep", "4", "--micro-batch-size", "1",
            "--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "hybridep", "--json"]
    assert main(argv) == 0
    assert "--moe-hybridep-num-sms" not in json.loads(capsys.readouterr().out)["megatron_flags"]
    assert main([*argv, "--moe-hybridep-num-sms", "32"]) == 0
    flags = json.loads(capsys.readouterr().out)["megatron_flags"]
    assert flags[flags.index("--moe-hybridep-num-sms") + 1] == "32"
    with pytest.raises(SystemExit) as refused:  # argparse's one line, exit status 2
        main([*argv, "--moe-hybridep-num-sms", "0"])
    assert refused.value.code == 2
