"""MoE on the command line: plan and estimate take Megatron's expert flags and the MoE run options, and print
and write ep/etp and the Megatron flags line."""
from __future__ import annotations

import json

import pytest

from megatron_auto.cli.main import main
from megatron_auto.megatron_flags import megatron_flags
from megatron_auto.plan import load_plan

CPU4 = ["--cluster", "cpu-gloo", "--gpus-per-node", "4", "--global-batch-size", "8"]


def run_json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_of_a_moe_model_reports_expert_degrees_and_megatron_flags(capsys, tmp_path):
    out = tmp_path / "plan.json"
    result = run_json(capsys, ["plan", "--model", "tiny-mixtral", *CPU4, "--out", str(out)])
    plan = load_plan(out)
    moe = {(s.ep, s.expert_tp) for s in plan.layer_strategies}
    assert len(moe) == 1 and (result["ep"], result["etp"]) == moe.pop()
    flags = result["megatron_flags"]
    assert flags[flags.index("--expert-model-parallel-size") + 1] == str(result["ep"])
    assert flags[flags.index("--expert-tensor-parallel-size") + 1] == str(result["etp"])


def test_estimate_with_expert_flags_puts_them_on_the_moe_layers_only(capsys, tmp_path):
    out = tmp_path / "plan.json"
    run_json(capsys, ["estimate", "--model", "tiny-deepseek-moe", *CPU4, "--tp", "2", "--pp", "1",
                      "--sequence-parallel", "--ep", "2", "--etp", "1", "--out", str(out)])
    plan = load_plan(out)
    assert [(s.ep, s.etp) for s in plan.layer_strategies] == [(1, None), (2, 1), (2, 1), (2, 1)]
    assert megatron_flags(plan)[-4:] == ["--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "1"]


def test_text_report_names_the_expert_layout(capsys):
    assert main(["estimate", "--model", "tiny-mixtral", *CPU4, "--tp", "1", "--pp", "1", "--ep", "4"]) == 0
    text = capsys.readouterr().out
    assert "expert parallel     ep 4, expert tp 1 (MoE layers)" in text
    assert "ep comm" in text


@pytest.mark.parametrize("option, value", [("--moe-load-imbalance", "2.0"),
                                           ("--moe-token-dispatcher-type", "allgather")])
def test_moe_run_options_change_the_prediction(capsys, option, value):
    base = ["estimate", "--model", "tiny-mixtral", *CPU4, "--tp", "1", "--pp", "1", "--ep", "4",
            "--micro-batch-size", "2"]
    default = run_json(capsys, base)
    changed = run_json(capsys, [*base, option, value])
    assert changed["breakdown"]["ep_comm_s"] != default["breakdown"]["ep_comm_s"]
    if option == "--moe-load-imbalance":
        assert changed["iteration_time_s"] > default["iteration_time_s"]


def test_dense_model_plans_carry_no_expert_flags(capsys):
    result = run_json(capsys, ["plan", "--model", "tiny-gpt", *CPU4])
    assert (result["ep"], result["etp"]) == (1, None)
    assert "--expert-model-parallel-size" not in result["megatron_flags"]


def test_hybrid_space_plans_moe_models(capsys, tmp_path):
    out = tmp_path / "plan.json"
    run_json(capsys, ["plan", "--model", "tiny-deepseek-moe", *CPU4, "--space", "hybrid", "--out", str(out)])
    plan = load_plan(out)
    dense, *moe = plan.layer_strategies
    assert (dense.ep, dense.etp) == (1, None)
    assert all(s.sp or s.tp == 1 for s in moe)


def test_hybrid_space_keeps_moe_layers_at_zero_0_or_1(capsys, tmp_path):
    """The hybrid runtime shards experts with Megatron's DDP and distributed optimizer over their expert-DP
    group, not FSDP2: the search offers MoE layers no ZeRO-2/3 (dense layers keep it), and a plan file that
    gives one anyway is refused with one line before any process starts."""
    from megatron_auto.errors import UserError
    from megatron_auto.plan import Chunk, LayerStrategy, Plan
    from megatron_auto.runtime.hybrid.hybrid_runtime import check_supported
    from megatron_auto.search.tables import _allowed
    from megatron_auto.specs.loaders import load_model

    out = tmp_path / "plan.json"
    run_json(capsys, ["plan", "--model", "tiny-deepseek-moe", "--cluster", "dgx-h100-80gb", "--num-nodes", "2",
                      "--global-batch-size", "64", "--space", "hybrid", "--out", str(out)])
    plan = load_plan(out)
    model = load_model("tiny-deepseek-moe")
    assert all(s.zero < 2 for layer, s in zip(model.layers, plan.layer_strategies) if layer.moe is not None)
    dense, moe = model.layers[0], model.layers[1]
    assert _allowed(dense, LayerStrategy(dp=8, zero=3), (None, None))
    assert not _allowed(moe, LayerStrategy(dp=8, zero=3), (None, None))
    assert _allowed(moe, LayerStrategy(dp=8, zero=1, ep=8), (None, None))
    zero3 = Plan(space="hybrid", world_size=2, pipeline_parallel=1, global_batch_size=4, num_micro_batches=1,
                 chunks=(Chunk(tuple(LayerStrategy(dp=2, zero=3) for _ in model.layers)),),
                 embedding=LayerStrategy(dp=2, zero=1))
    with pytest.raises(UserError, match="layer 1 has ZeRO-3"):
        check_supported(zero3, model)
