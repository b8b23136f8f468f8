"""Resumes under another of Megatron's optimizers: a run that adds or drops --use-distributed-optimizer (as a
re-planned ZeRO level does), or that changes its precision, reads the checkpoint's optimizer state per
parameter in model space (runtime/model_space_optimizer.py).

Runs go through tools/pretrain_gpt.py and tools/convert_checkpoint.py on 2 gloo ranks (DP2, the layout where
the distributed optimizer shards), without dropout.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from checkpoint_files import checkpoint_tensors, logged_losses
from validation.launcher import launch

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "256",
        "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3", "--log-interval", "1",
        "--eval-iters", "0", "--hidden-dropout", "0", "--attention-dropout", "0", "--train-iters", "4"]
DISTRIBUTED = ["--use-distributed-optimizer"]

LOSS_RTOL = 1e-5
"""The resumed run steps the same fp32 masters with the same fp32 gradients as the uninterrupted one; the
distributed optimizer and the non-distributed one differ only in which rank computes each element's update and
in summing two ranks' gradients by reduce-scatter rather than all-reduce. That moves a loss near 6 by a few
fp32 roundings at most (measured: equal to every printed digit); 1e-5 stays far below what a state read
wrongly does: with the Adam moments read as zeros, iteration 4 moves by 4e-4 relative (both tests fail then)."""


def _run(tool: str, args: list[str], log_dir: Path):
    result = launch(2, [tool, *TINY, *args], 300, log_dir)
    assert result.ok, result.output[-4000:]
    return result


def _saved(folder: Path, flags: list[str]):
    """4 iterations under `flags`, a checkpoint every 2: (checkpoint root, losses)."""
    result = _run("tools/pretrain_gpt.py", [*flags, "--save-interval", "2", "--save", str(folder / "ckpt")],
                  folder / "logs")
    return folder / "ckpt", logged_losses(result.output)


@pytest.fixture(scope="module")
def fp32_plain(tmp_path_factory):
    """Megatron's fp32 optimizer, which keeps no master weights."""
    return _saved(tmp_path_factory.mktemp("fp32_plain"), [])


@pytest.fixture(scope="module")
def bf16_distributed(tmp_path_factory):
    return _saved(tmp_path_factory.mktemp("bf16_distributed"), ["--bf16", *DISTRIBUTED])


def _assert_resumes(saved, flags: list[str], log_dir: Path, written_by: str) -> None:
    root, reference = saved
    result = _run("tools/pretrain_gpt.py", [*flags, "--load", str(root), "--ckpt-step", "2"], log_dir)
    assert f"written by Megatron's {written_by}; its optimizer state is read per parameter" in result.output
    losses = logged_losses(result.output)
    assert sorted(losses) == [3, 4], losses
    for iteration in (3, 4):
        ours, = {float(loss) for loss in losses[iteration]}
        theirs, = {float(loss) for loss in reference[iteration]}
        assert ours == pytest.approx(theirs, rel=LOSS_RTOL), (iteration, ours, theirs)


def test_adding_the_distributed_optimizer_resumes_as_if_uninterrupted(fp32_plain, tmp_path):
    _assert_resumes(fp32_plain, DISTRIBUTED, tmp_path, "fp32 optimizer, read into this run's distributed one")


def test_dropping_the_distributed_optimizer_resumes_as_if_uninterrupted(bf16_distributed, tmp_path):
    _assert_resumes(bf16_distributed, ["--bf16"], tmp_path, "distributed optimizer, read into this run's 16-bit one")


@pytest.mark.parametrize("flags, master_kind", [(["--bf16"], "fp32_param"), (["--bf16", *DISTRIBUTED], "param")])
def test_an_fp32_checkpoint_read_in_bf16_keeps_its_weights_as_the_fp32_masters(fp32_plain, flags, master_kind, tmp_path):
    """Megatron's fp32 optimizer saves no masters: a bf16 run takes its fp32 masters from the stored fp32
    weights, not from its bf16 weights (which round them to 8 bits of mantissa). Converted to the bf16 run's
    layout, every master equals the fp32 weight bit for bit, every weight is that value in bf16, and the Adam
    moments carry over unchanged."""
    root, _ = fp32_plain
    _run("tools/convert_checkpoint.py", [*flags, "--load", str(root), "--ckpt-step", "2",
                                         "--save", str(tmp_path / "bf16")], tmp_path / "logs")
    source = checkpoint_tensors(root / "iter_0000002")
    converted = checkpoint_tensors(tmp_path / "bf16" / "iter_0000002")
    weights = [name for name in source if not name.startswith("optimizer.")]
    assert len(weights) > 10
    for name in weights:
        assert converted[name].dtype == torch.bfloat16 and torch.equal(converted[name], source[name].bfloat16()), name
        master = converted[f"optimizer.state.{master_kind}.{name}"]
        assert master.dtype == torch.float32 and torch.equal(master, source[name]), name
        assert not torch.equal(master, converted[name].float()), name  # the bf16 weights would not do
        for moment in ("exp_avg", "exp_avg_sq"):
            key = f"optimizer.state.{moment}.{name}"
            assert torch.equal(converted[key], source[key]), key
