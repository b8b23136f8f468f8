"""The runtime's memory proof (runtime.memory_check) and early-OOM re-planning (runtime.oom, runtime.fit)."""
from __future__ import annotations

import math
import re

from validation.launcher import launch
from megatron_auto.runtime import memory_check, oom
from megatron_auto.specs.training import GIB

# Big enough that the planner's pick (dp2, ZeRO-1, micro-batch 4) has a leaner alternative (micro-batch 2)
# 17% below it on cpu-gloo, whose 256 MiB framework overhead dominates smaller models.
MODEL = ["--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "512",
         "--max-position-embeddings", "512", "--global-batch-size", "8", "--train-iters", "4", "--mock-data",
         "--vocab-size", "512", "--log-interval", "1", "--distributed-timeout-minutes", "0.25"]
# Every rank's collectives time out after 15 s, the vote after 90 s: a hang would outlast this.
LAUNCH_TIMEOUT_S = 240


def test_lowered_budget_scales_by_the_overshoot():
    # predicted 60 GiB, ran out of an 80 GiB device under an 80 GiB budget: the model under-counts
    # by at least 80/60, so the new budget is 80 * 60/80 = 60 GiB, then 5% under the failed plan.
    assert oom.lowered_budget(80 * GIB, 60 * GIB, 80 * GIB) == int(60 * GIB * 0.95)
    # A budget below the device (a margin) is scaled, not the device: 70 * 40/80 = 35 GiB.
    assert oom.lowered_budget(70 * GIB, 40 * GIB, 80 * GIB) == int(35 * GIB)


def test_lowered_budget_never_returns_the_failed_plan():
    for predicted in (1 * GIB, 50 * GIB, 79 * GIB, 90 * GIB):
        assert oom.lowered_budget(80 * GIB, predicted, 80 * GIB) < predicted


def test_injection_is_parsed_from_the_environment():
    assert oom.injected_oom({}) is None
    assert oom.injected_oom({oom.INJECT_ENV: "1:2"}) == oom.InjectedOom(1, 2, 1.0)
    assert oom.injected_oom({oom.INJECT_ENV: "0:1:1.5"}) == oom.InjectedOom(0, 1, 1.5)


def test_verdict_takes_the_lowest_budget_and_refuses_a_restart_after_an_nccl_failure():
    votes = [oom.Vote(False, True), oom.Vote(True, True, 5e9, 6e9, 8e9), oom.Vote(True, True, 4e9, 7e9, 8e9)]
    failure = oom.verdict(votes, iteration=1, on_cuda=False)
    assert (failure.rank, failure.budget_bytes, failure.restartable) == (2, 4_000_000_000, True)
    assert not oom.verdict(votes, iteration=1, on_cuda=True).restartable  # rank 0's collective failed
    assert oom.verdict(votes[1:], iteration=1, on_cuda=True).restartable
    assert oom.verdict([oom.Vote(False, False)] * 2, iteration=1, on_cuda=True) is None


def test_vote_round_trips_through_its_tensor():
    vote = oom.Vote(True, True, 3.5e9, 4e9, 8.5e10)
    assert oom.Vote.from_tensor(vote.as_tensor()) == vote
    assert math.isinf(oom.Vote.from_tensor(oom.Vote(False, False).as_tensor()).budget_bytes)


def test_memory_report_warns_above_five_percent():
    measured = memory_check.MeasuredPeak(allocated_bytes=60 * GIB, reserved_bytes=62 * GIB,
                                         outside_torch_bytes=2 * GIB)
    predicted = memory_check.PredictedPeak
    line, warned = memory_check.memory_report(0, 0, measured, predicted(60 * GIB, 60 * GIB), iteration=2)
    assert warned and line.startswith("WARNING") and "64.00 GiB" in line and "106.7%" in line
    line, warned = memory_check.memory_report(0, 0, measured, predicted(57 * GIB, 70 * GIB), iteration=2)
    assert warned and "105.3%" in line  # allocated 60/57 = 5.3% over warns on its own
    line, warned = memory_check.memory_report(0, 0, measured, predicted(58 * GIB, 61 * GIB), iteration=2)
    assert not warned and "measured peak allocated 60.00 GiB" in line  # 3.4% and 64/61 = 4.9%: within


def test_memory_report_on_cpu_says_not_measured():
    line, warned = memory_check.memory_report(3, 1, None, memory_check.PredictedPeak(GIB, 2 * GIB), iteration=2)
    assert not warned and "not measured on CPU" in line and "rank 3 (stage 1)" in line


def test_stage_of_rank_follows_megatron_rank_order():
    from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags
    from megatron_auto.specs.model import uniform_model

    model = uniform_model("m", 4, 64, 4, seq_length=32, vocab_size=128)
    plan = plan_from_flags(model, 8, ManualParallelism(tp=2, pp=2, global_batch_size=8))
    assert [memory_check.stage_of_rank(plan, r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def _last_iteration_lines(output: str) -> list[float]:
    return [float(x) for x in re.findall(r"iteration +\d+/ +4 \|.*\| lm loss: (\S+) \|", output)]


def test_injected_oom_under_auto_parallel_replans_and_trains(tmp_path, monkeypatch):
    monkeypatch.setenv(oom.INJECT_ENV, "1:1:1.1")
    result = launch(2, ["tools/pretrain_gpt.py", *MODEL, "--auto-parallel"], LAUNCH_TIMEOUT_S, tmp_path)
    assert result.ok, result.output[-5000:]
    assert result.seconds < LAUNCH_TIMEOUT_S
    replanned = re.search(r"re-planned under a ([0-9.]+) GiB budget; starting again with: (.*)", result.output)
    assert replanned, result.output[-5000:]
    first_flags = re.search(r"megatron-lm flags\n((?:  --.*\n)+)", result.output).group(1).split()
    first_flags = [f for f in first_flags if f != "\\"]
    predicted = float(re.search(r"plan predicted ([0-9.]+) GiB", result.output).group(1))
    assert float(replanned.group(1)) < predicted
    assert replanned.group(2).split("flags: ")[1].split() != first_flags
    losses = _last_iteration_lines(result.output)
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)  # iterations 1-4 of the new plan
    assert "memory after iteration 2, rank 1 (stage 0)" in result.output


def test_injected_oom_with_manual_flags_exits_2_naming_the_plan(tmp_path, monkeypatch):
    monkeypatch.setenv(oom.INJECT_ENV, "0:1:1.1")
    save = tmp_path / "ckpt"
    # dp2 with 4-sample micro-batches, the heaviest layout of this model
    result = launch(2, ["tools/pretrain_gpt.py", *MODEL, "--micro-batch-size", "4", "--save", str(save)],
                    LAUNCH_TIMEOUT_S, tmp_path / "logs")
    assert result.returncodes == (2, 2), result.output[-5000:]
    plan_file = save / "auto_parallel_replan.json"
    for rank_output in result.output.split("===== rank ")[1:]:
        errors = [line for line in rank_output.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"--auto-parallel-plan {plan_file}" in errors[0], rank_output[-3000:]
        assert "Traceback" not in rank_output
    from megatron_auto.plan import load_plan
    from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags

    replanned = load_plan(plan_file)
    flags_plan = plan_from_flags(replanned.model, 2, ManualParallelism(micro_batch_size=4, global_batch_size=8))
    assert replanned.world_size == 2
    assert (replanned.chunks, replanned.num_micro_batches) != (flags_plan.chunks, flags_plan.num_micro_batches)


def test_replan_that_fits_nothing_is_one_line(tmp_path, monkeypatch):
    # The smallest model's plans all sit at the 256 MiB framework overhead: nothing fits 5% under it.
    monkeypatch.setenv(oom.INJECT_ENV, "1:1")
    tiny = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--max-position-embeddings", "32", "--global-batch-size", "4", "--train-iters", "2", "--mock-data",
            "--vocab-size", "128", "--distributed-timeout-minutes", "0.25", "--auto-parallel"]
    result = launch(2, ["tools/pretrain_gpt.py", *tiny], LAUNCH_TIMEOUT_S, tmp_path)
    assert result.returncodes == (2, 2), result.output[-5000:]
    assert "no plan fits the lowered budget of" in result.output and "Traceback" not in result.output


def test_cuda_peak_adds_what_the_process_holds_outside_torch(monkeypatch):
    import torch

    # A fake 80 GiB device: 70 GiB in use, of which torch's allocator reserves 66 GiB now.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 66 * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 68 * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 64 * GIB)
    peak = memory_check.measure_peak(torch.device("cuda", 0))
    assert (peak.allocated_bytes, peak.reserved_bytes, peak.outside_torch_bytes) == (64 * GIB, 68 * GIB, 4 * GIB)
    assert peak.device_bytes == 72 * GIB
    assert oom.device_capacity_bytes(torch.device("cuda", 0), 60 * GIB, None) == 80 * GIB
    assert memory_check.measure_peak(torch.device("cpu")) is None


def test_the_search_prices_the_capacity_the_device_reports(monkeypatch):
    import torch

    from megatron_auto.runtime import planning
    from megatron_auto.specs.loaders import load_cluster

    preset = load_cluster("dgx-h100-80gb").gpu.capacity_bytes
    assert planning.job_cluster(1, "dgx-h100-80gb").gpu.capacity_bytes == preset  # CPU: the preset's
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (1 * GIB, 70 * GIB))  # a smaller card
    assert planning.job_cluster(1, "dgx-h100-80gb").gpu.capacity_bytes == 70 * GIB
