"""The precision-aware optimizer (specs/optimizer_states.py): the bytes Adam's states keep per parameter, how
`estimate` and `plan` price them, the flags a plan writes, and Megatron-Core's refusals."""
from __future__ import annotations

import json

import pytest

from megatron_auto.cli.main import main
from megatron_auto.specs.optimizer_states import OptimizerStates
from megatron_auto.specs.training import TrainingSpec

AWARE = OptimizerStates(precision_aware=True)
LOW = OptimizerStates(precision_aware=True, main_grads_dtype="bf16", exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16")
JOB = ["--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--num-nodes", "1", "--global-batch-size", "64"]
ESTIMATE = ["estimate", *JOB, "--tp", "1", "--pp", "1", "--micro-batch-size", "1", "--distributed-optimizer", "--json"]


def test_without_the_switch_adam_keeps_fp32_masters_and_moments():
    assert OptimizerStates().adam_bytes("bf16", "delayed") == 12
    assert TrainingSpec(global_batch_size=8).optimizer_bytes == 12


@pytest.mark.parametrize("states, precision, recipe, expected", [
    (AWARE, "bf16", "delayed", 2 + 4 + 4),  # FusedAdam keeps the low 16 bits of each fp32 master
    (AWARE, "fp8", "delayed", 2 + 4 + 4),  # delayed scaling: FusedAdam still holds the masters
    (AWARE, "fp8", "tensorwise", 4 + 4 + 4),  # current scaling: Megatron-Core keeps fp32 masters itself
    (AWARE, "fp16", "delayed", 4 + 4 + 4),  # the remainders need bf16 weights
    (LOW, "bf16", "delayed", 2 + 2 + 2),
    (LOW, "fp8", "blockwise", 4 + 2 + 2),
    (OptimizerStates(True, main_params_dtype="fp16", exp_avg_dtype="fp8", exp_avg_sq_dtype="fp8"),
     "fp8", "tensorwise", 2 + 1 + 1),  # fp16 masters go back to FusedAdam under any recipe
])
def test_the_states_keep_their_own_dtypes(states, precision, recipe, expected):
    assert states.adam_bytes(precision, recipe) == expected


def test_the_training_spec_takes_its_state_and_gradient_bytes_from_the_switch():
    spec = TrainingSpec(global_batch_size=8, optimizer_states=LOW)
    assert (spec.optimizer_bytes, spec.grad_bytes) == (6, 2)
    assert TrainingSpec(global_batch_size=8, optimizer_states=AWARE).grad_bytes == 4
    fp8 = TrainingSpec(global_batch_size=8, precision="fp8", fp8_recipe="tensorwise", optimizer_states=AWARE)
    assert fp8.optimizer_bytes == 12


@pytest.mark.parametrize("states, message", [
    (OptimizerStates(exp_avg_dtype="bf16"), "needs --use-precision-aware-optimizer"),
    (OptimizerStates(True, main_grads_dtype="fp16"), "--main-grads-dtype must be one of fp32, bf16"),
])
def test_megatron_cores_refusals_hold_in_the_spec(states, message):
    with pytest.raises(ValueError, match=message):
        TrainingSpec(global_batch_size=8, optimizer_states=states)
    with pytest.raises(ValueError, match="not fp32"):
        TrainingSpec.for_precision("fp32", 8, optimizer_states=AWARE)


def estimate(capsys, *flags: str) -> dict:
    assert main([*ESTIMATE, *flags]) == 0
    return json.loads(capsys.readouterr().out)


def test_estimate_prices_the_smaller_states_and_the_cheaper_step(capsys):
    """Llama 3 8B on 8 GPUs (dp 8, distributed optimizer): the remainders save 2 bytes of master per parameter
    over dp ranks; bf16 gradients and moments save 2 bytes of the unsharded gradient buffer and 4 of moments."""
    plain, aware, low = (estimate(capsys), estimate(capsys, "--use-precision-aware-optimizer"),
                         estimate(capsys, "--use-precision-aware-optimizer", "--main-grads-dtype", "bf16",
                                  "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"))
    params_gib = 8.03e9 / 2**30  # llama3-8b, about 8.03 B parameters, all on each GPU at tp 1 pp 1
    states = [run["memory_breakdown"]["states_gib"] for run in (plain, aware, low)]
    assert states[0] - states[1] == pytest.approx(2 * params_gib / 8, rel=0.02)
    assert states[1] - states[2] == pytest.approx(2 * params_gib + 4 * params_gib / 8, rel=0.02)
    assert low["breakdown"]["optimizer_s"] < aware["breakdown"]["optimizer_s"] < plain["breakdown"]["optimizer_s"]
    assert low["breakdown"]["dp_comm_s"] <= plain["breakdown"]["dp_comm_s"]


def test_the_plans_flags_carry_the_precision_aware_optimizer(capsys):
    flags = estimate(capsys, "--use-precision-aware-optimizer", "--main-grads-dtype", "bf16",
                     "--exp-avg-sq-dtype", "fp16")["megatron_flags"]
    assert flags[-5:] == ["--use-precision-aware-optimizer", "--main-grads-dtype", "bf16",
                          "--exp-avg-sq-dtype", "fp16"]
    assert "--grad-reduce-in-bf16" not in flags  # --main-grads-dtype bf16 already reduces in bf16
    # One GPU: no data parallelism, yet Megatron-Core needs the distributed optimizer for the switch.
    one = ["estimate", *JOB[:4], "--num-nodes", "1", "--gpus-per-node", "1", "--global-batch-size", "8", "--tp", "1",
           "--pp", "1", "--use-precision-aware-optimizer", "--json"]
    assert main(one) == 0
    assert json.loads(capsys.readouterr().out)["megatron_flags"].count("--use-distributed-optimizer") == 1


def test_plan_keeps_the_distributed_optimizer_and_uses_the_memory_it_saves(capsys):
    """Llama 3 8B at global batch 128 on one node: with fp32 states a pipeline stage is needed to fit; with bf16
    gradients and moments the model fits on every GPU whole, which the search finds."""
    job = ["plan", *JOB[:-1], "128", "--json"]
    assert main(job) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*job, "--use-precision-aware-optimizer", "--main-grads-dtype", "bf16", "--exp-avg-dtype", "bf16",
                 "--exp-avg-sq-dtype", "bf16"]) == 0
    low = json.loads(capsys.readouterr().out)
    assert low["pipeline_parallel"] < plain["pipeline_parallel"]
    assert low["iteration_time_s"] < plain["iteration_time_s"]
    assert "--use-distributed-optimizer" in low["megatron_flags"]


@pytest.mark.parametrize("command, flags, message", [
    ("estimate", ["--exp-avg-dtype", "bf16"], "needs --use-precision-aware-optimizer"),
    ("estimate", ["--use-precision-aware-optimizer", "--no-distributed-optimizer"], "needs the distributed optimizer"),
    ("plan", ["--use-precision-aware-optimizer", "--no-distributed-optimizer"], "needs the distributed optimizer"),
    ("plan", ["--use-precision-aware-optimizer", "--precision", "fp32"], "not fp32"),
])
def test_refusals_are_one_line_and_exit_2(capsys, command, flags, message):
    args = [*ESTIMATE[:-1]] if command == "estimate" else ["plan", *JOB]
    args = [token for token in args if token != "--distributed-optimizer" or "--no-distributed-optimizer" not in flags]
    assert main([*args, *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_plan_weighs_the_switch_under_search_and_keeps_it_where_its_plan_is_faster(capsys):
    """`--use-precision-aware-optimizer search`: the fp32-state plan and the switched one are both searched; on
    Llama 3 8B at global batch 128 the remainders alone let the model sit whole on each GPU, which is faster."""
    job = ["plan", *JOB[:-1], "128", "--json"]
    assert main(job) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*job, "--use-precision-aware-optimizer", "search"]) == 0
    searched = json.loads(capsys.readouterr().out)
    assert searched["iteration_time_s"] < plain["iteration_time_s"]
    assert "--use-precision-aware-optimizer" in searched["megatron_flags"]
    assert "--use-distributed-optimizer" in searched["megatron_flags"]
    # Where memory is plentiful the switch changes little: the plan stays what it was without it.
    small = ["plan", "--model", "gpt3-1.7b", "--cluster", "dgx-h100-80gb", "--num-nodes", "1",
             "--global-batch-size", "64", "--json"]
    assert main(small) == 0
    base = json.loads(capsys.readouterr().out)
    assert main([*small, "--use-precision-aware-optimizer", "search"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_time_s"] <= base["iteration_time_s"]


@pytest.mark.parametrize("args, message", [
    (["plan", *JOB, "--space", "hybrid", "--use-precision-aware-optimizer"], "search the megatron space"),
    (["plan", *JOB, "--space", "hybrid", "--use-precision-aware-optimizer", "search"], "search the megatron space"),
    ([*ESTIMATE[:-1], "--use-precision-aware-optimizer", "search"], "is plan's choice"),
])
def test_the_runtime_s_space_and_estimate_refuse_what_they_cannot_price(capsys, args, message):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
