"""tools/pretrain_gpt.py --auto-parallel-dry-run: a launch line's plan and prediction, without a run."""
from __future__ import annotations

import json
import logging
import re

import pytest

from megatron_auto import train
from megatron_auto.cli.main import main as megatron_auto

# A Llama-3 8B launch line (bf16, TP4 x PP2, distributed optimizer) on 64 H100s, asked from a machine without them.
LINE = ["--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size", "14336", "--num-attention-heads", "32",
        "--group-query-attention", "--num-query-groups", "8", "--seq-length", "8192",
        "--max-position-embeddings", "8192", "--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear",
        "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights", "--mock-data",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", "128256", "--micro-batch-size", "1",
        "--global-batch-size", "128", "--lr", "3e-4", "--train-iters", "10", "--bf16", "--use-distributed-optimizer",
        "--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "2",
        "--auto-parallel-cluster", "dgx-h100-80gb", "--auto-parallel-dry-run"]
# The same model as a megatron-auto model file.
LLAMA3_8B = {"num_layers": 32, "hidden_size": 4096, "ffn_hidden_size": 14336, "num_attention_heads": 32,
             "num_query_groups": 8, "seq_length": 8192, "vocab_size": 128256, "swiglu": True,
             "normalization": "RMSNorm", "add_bias_linear": False, "position_embedding_type": "rope",
             "untie_embeddings_and_output_weights": True}


def dry_run(monkeypatch, capsys, *extra: str) -> str:
    import torch

    monkeypatch.setenv("WORLD_SIZE", "64")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert train.main(LINE + list(extra)) == 0
    assert not torch.distributed.is_initialized()  # no process group, no model, no data
    return capsys.readouterr().out


def iteration_times(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"  iteration time +(\S+) s", text)]


def test_the_line_is_priced_as_megatron_auto_estimate_prices_the_same_flags(monkeypatch, capsys, tmp_path):
    printed = dry_run(monkeypatch, capsys)
    assert "kernels priced      flash attention, fused optimizer" in printed  # the H100s' kernels, not this CPU's
    assert "the launch line's own" not in printed  # without --auto-parallel the line's flags are the plan
    (tmp_path / "llama.json").write_text(json.dumps(LLAMA3_8B))
    assert megatron_auto(["estimate", "--model", str(tmp_path / "llama.json"), "--cluster", "dgx-h100-80gb",
                          "--num-nodes", "8", "--global-batch-size", "128", "--precision", "bf16",
                          "--transformer-impl", "local", "--tp", "4", "--pp", "2", "--micro-batch-size", "1",
                          "--virtual-stages", "1", "--distributed-optimizer", "--json"]) == 0
    estimated = json.loads(capsys.readouterr().out)
    assert iteration_times(printed) == [round(estimated["iteration_time_s"], 3)]


def test_under_auto_parallel_the_plan_is_set_against_the_lines_own_flags(monkeypatch, capsys):
    printed = dry_run(monkeypatch, capsys, "--auto-parallel")
    planned, own = iteration_times(printed)
    ratio = float(re.search(r"the plan is predicted (\S+)x as fast", printed).group(1))
    # The search holds the line's TP and PP as constraints and may only do better than the line's own flags.
    assert own == iteration_times(dry_run(monkeypatch, capsys))[0]
    assert planned <= own and ratio == pytest.approx(own / planned, rel=2e-3)
    assert "--tensor-model-parallel-size 4" in printed and "--pipeline-model-parallel-size 2" in printed


def test_flags_that_form_no_layout_are_said_beside_the_plan(monkeypatch, capsys):
    # Under --auto-parallel the split flags give way to the planner's split (a warning); the line's own do not split.
    printed = dry_run(monkeypatch, capsys, "--auto-parallel", "--account-for-embedding-in-pipeline-split")
    assert ("not a layout here: 32 layers and 1 counted for the embedding/loss do not split evenly over 2 pipeline "
            "stages") in printed
    assert len(iteration_times(printed)) == 1


def test_other_ranks_print_nothing(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "64")
    monkeypatch.setenv("RANK", "3")
    assert train.main(LINE) == 0
    assert capsys.readouterr().out == ""


def test_a_plan_file_is_priced_and_set_against_the_lines_own_flags(monkeypatch, capsys, tmp_path):
    (tmp_path / "llama.json").write_text(json.dumps(LLAMA3_8B))
    plan = tmp_path / "tp8.json"
    assert megatron_auto(["estimate", "--model", str(tmp_path / "llama.json"), "--cluster", "dgx-h100-80gb",
                          "--num-nodes", "8", "--global-batch-size", "128", "--precision", "bf16", "--tp", "8",
                          "--pp", "1", "--micro-batch-size", "1", "--out", str(plan)]) == 0
    capsys.readouterr()
    printed = dry_run(monkeypatch, capsys, "--auto-parallel-plan", str(plan))
    assert "--tensor-model-parallel-size 8" in printed and "the launch line's own parallelism flags" in printed
    planned, own = iteration_times(printed)
    assert own == iteration_times(dry_run(monkeypatch, capsys))[0] and planned != own


def priced_on_nodes(monkeypatch, capsys, caplog, local_world_size: str | None, *extra: str) -> tuple[str, str]:
    """The dry run's stdout and its log on 16 ranks, LOCAL_WORLD_SIZE of them per node (unset: None)."""
    import torch

    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.delenv("RANK", raising=False)
    if local_world_size is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pretrain_gpt"):
        assert train.main(LINE + list(extra)) == 0
    assert not torch.distributed.is_initialized()
    return capsys.readouterr().out, caplog.text


def test_the_node_shape_is_torchruns_local_world_size(monkeypatch, capsys, caplog):
    # The line's own TP 4 x PP 2: TP inside 8-GPU nodes, across two 2-GPU nodes (InfiniBand, not NVLink).
    eight, eight_log = priced_on_nodes(monkeypatch, capsys, caplog, "8")
    two, two_log = priced_on_nodes(monkeypatch, capsys, caplog, "2")
    unset, unset_log = priced_on_nodes(monkeypatch, capsys, caplog, None)
    assert "priced 2 nodes x 8 GPUs of dgx-h100-80gb (WORLD_SIZE 16, LOCAL_WORLD_SIZE 8)" in eight_log
    assert "priced 8 nodes x 2 GPUs of dgx-h100-80gb (WORLD_SIZE 16, LOCAL_WORLD_SIZE 2)" in two_log
    assert "priced 2 nodes x 8 GPUs of dgx-h100-80gb (WORLD_SIZE 16, LOCAL_WORLD_SIZE unset" in unset_log
    assert iteration_times(two)[0] > iteration_times(eight)[0]
    assert iteration_times(unset) == iteration_times(eight)  # unset: the preset's 8-GPU nodes, as before


def test_a_plan_file_and_the_lines_flags_are_priced_on_the_same_node_shape(monkeypatch, capsys, caplog, tmp_path):
    (tmp_path / "llama.json").write_text(json.dumps(LLAMA3_8B))
    plan = tmp_path / "tp8.json"
    assert megatron_auto(["estimate", "--model", str(tmp_path / "llama.json"), "--cluster", "dgx-h100-80gb",
                          "--num-nodes", "2", "--global-batch-size", "128", "--precision", "bf16", "--tp", "8",
                          "--pp", "1", "--micro-batch-size", "1", "--out", str(plan)]) == 0
    capsys.readouterr()
    times = {}
    for per_node in ("8", "2"):
        printed, log = priced_on_nodes(monkeypatch, capsys, caplog, per_node, "--auto-parallel-plan", str(plan))
        assert f"LOCAL_WORLD_SIZE {per_node})" in log
        times[per_node] = iteration_times(printed)  # the plan's, then the line's own flags'
        assert times[per_node][1] == iteration_times(priced_on_nodes(monkeypatch, capsys, caplog, per_node)[0])[0]
    assert times["2"][0] > times["8"][0] and times["2"][1] > times["8"][1]


@pytest.mark.parametrize("local_world_size, message", [
    ("3", "LOCAL_WORLD_SIZE 3 does not divide WORLD_SIZE 16"),
    ("0", "LOCAL_WORLD_SIZE must be a positive integer"),
    ("two", "LOCAL_WORLD_SIZE must be a positive integer")])
def test_a_bad_local_world_size_is_one_line_and_exit_2(monkeypatch, capsys, local_world_size, message):
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", local_world_size)
    monkeypatch.delenv("RANK", raising=False)
    assert train.main(LINE) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("error: ") and message in error
