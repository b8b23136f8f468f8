"""--overlap-param-gather: the distributed optimizer's weight all-gather moves from its step into the next
forward (Megatron DDP's forward pre-hooks). On by default with CUDA; here forced on over gloo, where the
same hooks and collectives run. The math is unchanged, so the losses must match the plain run bit for bit,
and a checkpoint saved right after a step must hold the gathered weights (its first resumed iteration ran
on stale ones before runtime.step.sync_parameters)."""
from __future__ import annotations

import dataclasses
import re

from validation.launcher import launch

from megatron_auto.parallel_dims import ParallelDims
from megatron_auto.runtime.config import overlaps_param_gather
from megatron_auto.runtime.layout import MegatronLayout
from megatron_auto.runtime.settings import TrainSettings

JOB = ["tools/pretrain_gpt.py", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
       "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "2",
       "--global-batch-size", "8", "--train-iters", "6", "--lr", "3e-3", "--mock-data",
       "--tokenizer-type", "NullTokenizer", "--vocab-size", "128", "--log-interval", "1",
       "--use-distributed-optimizer", "--bf16"]
OVERLAP_LINE = "the updated weights are all-gathered during the next forward"


def _losses(output: str) -> dict[int, str]:
    """{iteration: the logged loss, as printed}."""
    return {int(i): loss for i, loss in re.findall(r"iteration +(\d+)/ +6 \|.*?\| lm loss: (\S+) \|", output)}


def _run(tmp_path, name: str, extra: list[str]) -> str:
    result = launch(2, [*JOB, *extra], timeout_s=240, log_dir=tmp_path / name)
    assert result.ok, result.output[-4000:]
    return result.output


def test_overlapped_gather_trains_like_the_plain_one_and_resumes_exactly(tmp_path):
    plain = _run(tmp_path, "plain", [])
    assert OVERLAP_LINE not in plain  # off on CPU unless asked
    save = ["--overlap-param-gather", "--save", str(tmp_path / "ckpt"), "--save-interval", "3"]
    first = _run(tmp_path, "first", [*save, "--exit-interval", "3"])
    assert OVERLAP_LINE in first
    resumed = _run(tmp_path, "resumed", ["--overlap-param-gather", "--load", str(tmp_path / "ckpt")])
    expected = _losses(plain)
    assert sorted(expected) == list(range(1, 7))
    assert {**_losses(first), **_losses(resumed)} == expected


def test_overlap_is_on_with_cuda_or_when_asked_and_needs_the_distributed_optimizer(monkeypatch):
    import torch

    distopt = MegatronLayout(ParallelDims(dp=2), micro_batch_size=1, num_micro_batches=1,
                             global_batch_size=2, distributed_optimizer=True)
    plain = dataclasses.replace(distopt, distributed_optimizer=False)
    assert not overlaps_param_gather(distopt, TrainSettings())  # CPU: off by default
    assert overlaps_param_gather(distopt, TrainSettings(overlap_param_gather=True))
    assert not overlaps_param_gather(plain, TrainSettings(overlap_param_gather=True))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert overlaps_param_gather(distopt, TrainSettings())
    assert not overlaps_param_gather(distopt, TrainSettings(overlap_param_gather=False))
