"""`estimate --use-megatron-fsdp` (Megatron-FSDP's sharding strategies as ZeRO stages) and
`--recompute-num-layers`, through the CLI, the plan's Megatron-LM flags and the runtime's refusal."""
from __future__ import annotations

import pytest

from megatron_auto.errors import UserError
from megatron_auto.runtime.layout import layout_from_plan
from megatron_auto.cli.estimate_command import estimate_flags
from megatron_auto.cli.parser import parse_args
from test_cli import assert_user_error, ok_json, run_cli

JOB = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--num-nodes", "1", "--global-batch-size",
       "128", "--tp", "1", "--pp", "1", "--micro-batch-size", "1", "--distributed-optimizer"]


def test_each_sharding_strategy_shards_more_state():
    device = [ok_json(*JOB, *extra)["device_memory_gib"] for extra in (
        [], ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim"],
        ["--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"], ["--use-megatron-fsdp"])]
    assert device[0] == device[1] > device[2] > device[3]  # optim is the distributed optimizer's ZeRO-1


def test_the_plan_says_megatron_fsdp_in_megatron_lm_flags():
    plan = ok_json(*JOB, "--use-megatron-fsdp")
    flags = plan["megatron_flags"]
    assert "--use-megatron-fsdp" in flags
    assert flags[flags.index("--data-parallel-sharding-strategy") + 1] == "optim_grads_params"
    assert "--use-megatron-fsdp" not in ok_json(*JOB)["megatron_flags"]


def test_the_runtime_refuses_a_megatron_fsdp_plan_with_its_reason():
    plan, _ = estimate_flags(parse_args([*JOB, "--use-megatron-fsdp"]))
    with pytest.raises(UserError, match="Megatron-FSDP .* is priced by plan and estimate, not run here"):
        layout_from_plan(plan)


def test_recomputing_fewer_layers_keeps_more_and_takes_less_time():
    every = ok_json(*JOB, "--recompute", "full")
    five = ok_json(*JOB, "--recompute", "full", "--recompute-num-layers", "5")
    assert five["iteration_time_s"] < every["iteration_time_s"]
    assert five["device_memory_gib"] > every["device_memory_gib"]
    flags = five["megatron_flags"]
    assert flags[flags.index("--recompute-num-layers") + 1] == "5"


def test_recompute_num_layers_needs_full_recomputation():
    assert_user_error(run_cli(*JOB, "--recompute-num-layers", "5"), "needs --recompute full")


PLAN = ["plan", "--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--num-nodes", "8", "--global-batch-size",
        "128"]


def test_plan_searches_under_megatron_fsdp_and_estimate_prices_its_flags_alike():
    """`plan --use-megatron-fsdp`: every layer sharded as the strategy says, the rest searched; its flags, given to
    estimate, price the same iteration."""
    planned = ok_json(*PLAN, "--use-megatron-fsdp")
    flags = planned["megatron_flags"]
    assert flags[flags.index("--data-parallel-sharding-strategy") + 1] == "optim_grads_params"
    values = dict(zip(flags[::2], flags[1::2]))
    again = ok_json("estimate", *PLAN[1:], "--tp", values["--tensor-model-parallel-size"],
                    "--pp", values["--pipeline-model-parallel-size"], "--cp", values.get("--context-parallel-size", "1"),
                    "--micro-batch-size", values["--micro-batch-size"], "--use-megatron-fsdp",
                    *(["--sequence-parallel"] if "--sequence-parallel" in flags else []))
    assert again["iteration_time_s"] == pytest.approx(planned["iteration_time_s"], rel=1e-9)
    # The optim strategy is the distributed optimizer: no Megatron-FSDP flag, ZeRO-1 kept.
    optim = ok_json(*PLAN, "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim")["megatron_flags"]
    assert "--use-megatron-fsdp" not in optim and "--use-distributed-optimizer" in optim
