"""Checkpoints of hybrid-space plans: a bit-identical resume under the same plan, a resume under another plan
and world size, and resumes across the two runtimes in both directions.

The plan of the saving runs puts every kind of part optimizer on 2 gloo ranks: layer 0 at TP2 + SP (ZeRO-0),
layer 1 at DP2 ZeRO-3 (FSDP2 shards), layer 2 at DP2 ZeRO-0, layer 3 and the
embedding/head at DP2 ZeRO-1 (Megatron's distributed optimizer). Runs go through tools/pretrain_gpt.py.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

from checkpoint_files import checkpoint_tensors, logged_losses
from validation.launcher import launch, run_script
from megatron_auto import train
from megatron_auto.plan import Chunk, LayerStrategy, Plan, save_plan

TINY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "256",
        "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3", "--log-interval", "1",
        "--eval-iters", "0"]
NO_DROPOUT = ["--hidden-dropout", "0", "--attention-dropout", "0"]
DP2_ZERO1 = LayerStrategy(dp=2, zero=1)
SAVING_LAYERS = (LayerStrategy(tp=2, sp=True), LayerStrategy(dp=2, zero=3), LayerStrategy(dp=2), DP2_ZERO1)

LOSS_RTOL = 1e-5
"""Another plan sums the same fp32 products in another order (TP partial sums, DP and ZeRO-3 reductions over
2 or 4 ranks, pipeline stages): over two steps the loss moves by a few fp32 roundings of values near 6
(measured 1.7e-7 relative at most). 1e-5 leaves a factor of 50 and stays far below what a tensor loaded
wrongly does: a layer left at its fresh initialisation moves the loss by more than 1e-2."""


def _plan_file(folder: Path, name: str, world_size: int, chunks, embedding: LayerStrategy, pp: int = 1) -> Path:
    model = train.model_from_args(train.parse_args([*TINY, "--train-iters", "6"]), 256)
    path = folder / name
    save_plan(Plan(space="hybrid", world_size=world_size, pipeline_parallel=pp, global_batch_size=4,
                   num_micro_batches=pp, chunks=chunks, embedding=embedding, model=model), path)
    return path


def _run(world_size: int, args: list[str], log_dir: Path, ok: bool = True):
    result = launch(world_size, ["tools/pretrain_gpt.py", *TINY, *args], 300, log_dir)
    assert result.ok == ok, result.output[-4000:]
    return result


def _saved_run(folder: Path, extra: list[str]):
    """6 iterations of the saving plan on 2 ranks, a checkpoint every 2: (checkpoint root, plan, losses)."""
    plan = _plan_file(folder, "plan.json", 2, (Chunk(SAVING_LAYERS),), DP2_ZERO1)
    result = _run(2, ["--auto-parallel-plan", str(plan), "--train-iters", "6", "--save-interval", "2",
                      "--save", str(folder / "ckpt"), *extra], folder / "logs")
    return folder / "ckpt", plan, logged_losses(result.output)


@pytest.fixture(scope="module")
def with_dropout(tmp_path_factory):
    return _saved_run(tmp_path_factory.mktemp("hybrid_dropout"), [])


@pytest.fixture(scope="module")
def without_dropout(tmp_path_factory):
    return _saved_run(tmp_path_factory.mktemp("hybrid_no_dropout"), NO_DROPOUT)


def test_same_plan_resume_is_bit_identical(with_dropout, tmp_path):
    """Dropout 0.1 (Megatron's default) in every part, the TP2 layer's inside its SP region too: the per-part
    dropout streams, the Adam state of all three part-optimizer kinds and the fp32 masters come back exactly."""
    reference, plan, reference_losses = with_dropout
    result = _run(2, ["--auto-parallel-plan", str(plan), "--train-iters", "6", "--load", str(reference),
                      "--ckpt-step", "4", "--save", str(tmp_path / "ckpt")], tmp_path / "logs")
    assert "resumed from iteration 4 of" in result.output
    losses = logged_losses(result.output)
    assert losses == {i: reference_losses[i] for i in (5, 6)}
    ours = checkpoint_tensors(tmp_path / "ckpt" / "iter_0000006")
    theirs = checkpoint_tensors(reference / "iter_0000006")
    assert ours.keys() == theirs.keys() and len(ours) > 150
    assert any(name.startswith("optimizer.state.exp_avg_sq.decoder.layers.1.") for name in ours)  # the ZeRO-3 layer
    assert [name for name in ours if not torch.equal(ours[name], theirs[name])] == []


def test_without_the_saved_streams_the_resume_differs(with_dropout, tmp_path):
    """The control of the test above: --no-load-rng draws other dropout masks."""
    reference, plan, _ = with_dropout
    _run(2, ["--auto-parallel-plan", str(plan), "--train-iters", "6", "--load", str(reference), "--ckpt-step", "4",
             "--no-load-rng", "--save", str(tmp_path / "ckpt")], tmp_path / "logs")
    ours = checkpoint_tensors(tmp_path / "ckpt" / "iter_0000006")
    theirs = checkpoint_tensors(reference / "iter_0000006")
    assert any(not torch.equal(ours[name], theirs[name]) for name in ours)


def test_overlapped_weight_gather_trains_and_resumes_bit_identically(with_dropout, tmp_path):
    """--overlap-param-gather (on by default with CUDA): the ZeRO-1 parts all-gather their updated weights
    during the next forward. The math is the plain gather's: the same losses, and every checkpoint tensor equal,
    since each save gathers first (runtime.step.sync_parameters); a resume from iteration 4 goes on exactly."""
    reference, plan, reference_losses = with_dropout
    overlap = ["--auto-parallel-plan", str(plan), "--train-iters", "6", "--overlap-param-gather"]
    result = _run(2, [*overlap, "--save-interval", "2", "--save", str(tmp_path / "ckpt")], tmp_path / "logs")
    assert "all-gathered during the next forward" in result.output
    assert logged_losses(result.output) == reference_losses
    for iteration in ("iter_0000002", "iter_0000004"):
        ours = checkpoint_tensors(tmp_path / "ckpt" / iteration)
        theirs = checkpoint_tensors(reference / iteration)
        assert [name for name in ours if not torch.equal(ours[name], theirs[name])] == []
    resumed = _run(2, [*overlap, "--load", str(tmp_path / "ckpt"), "--ckpt-step", "4"], tmp_path / "resumed")
    assert logged_losses(resumed.output) == {i: reference_losses[i] for i in (5, 6)}


def _assert_losses_match(losses: dict, reference: dict, iterations) -> None:
    assert sorted(losses) == list(iterations), losses
    for iteration in iterations:
        ours, = {float(x) for x in losses[iteration]}
        theirs, = {float(x) for x in reference[iteration]}
        assert ours == pytest.approx(theirs, rel=LOSS_RTOL), (iteration, ours, theirs)


def test_another_plan_and_world_size_resume_the_weights_and_optimizer_state(without_dropout, tmp_path):
    """Two pipeline stages of 2 ranks, every layer under another layout (the ZeRO-3 layer now ZeRO-1, a
    ZeRO-0 one now ZeRO-3, the TP2 one on the other stage): iterations 5 and 6 match the uninterrupted run
    within LOSS_RTOL, so every weight, fp32 master and Adam moment was read into its new shard."""
    reference, _, reference_losses = without_dropout
    chunks = (Chunk((DP2_ZERO1, LayerStrategy(tp=2, sp=True))), Chunk((LayerStrategy(dp=2, zero=3), DP2_ZERO1)))
    plan = _plan_file(tmp_path, "other.json", 4, chunks, DP2_ZERO1, pp=2)
    result = _run(4, ["--auto-parallel-plan", str(plan), "--train-iters", "6", "--load", str(reference),
                      "--ckpt-step", "4", *NO_DROPOUT], tmp_path / "logs")
    _assert_losses_match(logged_losses(result.output), reference_losses, (5, 6))


MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48", "--moe-layer-freq",
       "([0]*1+[1]*3)", "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-2",
       "--swiglu", "--disable-bias-linear", "--normalization", "RMSNorm", "--global-batch-size", "8",
       "--micro-batch-size", "1", "--lr", "3e-3", *NO_DROPOUT]


def _moe_plan(folder: Path, name: str, layers, embedding: LayerStrategy) -> Path:
    model = train.model_from_args(train.parse_args([*TINY, *MOE, "--train-iters", "3"]), 256)
    save_plan(Plan(space="hybrid", world_size=4, pipeline_parallel=1, global_batch_size=8, num_micro_batches=2,
                   chunks=(Chunk(layers),), embedding=embedding, model=model), folder / name)
    return folder / name


def test_moe_layers_resume_under_other_expert_degrees(tmp_path):
    """A DeepSeek-style model (dense layer 0, MoE after) saved with its MoE layers at EP4, EP2 (ZeRO-0) and
    TP2 + SP with EP2 x ETP1, resumed at EP2 x ETP2, EP4 and EP1: the experts' shards and their own
    optimizer's state move to other ranks, and iteration 3 matches within LOSS_RTOL. (The embedding keeps
    TP2, so the padded vocabulary, and with it the softmax, is the same.)"""
    tp2 = LayerStrategy(tp=2, dp=2, sp=True, zero=1)
    saving = _moe_plan(tmp_path, "saving.json", (tp2, LayerStrategy(dp=4, zero=1, ep=4), LayerStrategy(dp=4, ep=2),
                                                  LayerStrategy(tp=2, dp=2, sp=True, zero=1, ep=2, etp=1)), tp2)
    resuming = _moe_plan(tmp_path, "resuming.json", (LayerStrategy(dp=4, zero=3),
                                                     LayerStrategy(tp=2, dp=2, sp=True, ep=2, etp=2),
                                                     LayerStrategy(dp=4, zero=1, ep=4), LayerStrategy(dp=4, zero=1)),
                         LayerStrategy(tp=2, dp=2))
    first = _run(4, [*MOE, "--auto-parallel-plan", str(saving), "--train-iters", "3", "--save-interval", "2",
                     "--save", str(tmp_path / "ckpt")], tmp_path / "saving")
    again = _run(4, [*MOE, "--auto-parallel-plan", str(resuming), "--train-iters", "3", "--load",
                     str(tmp_path / "ckpt"), "--ckpt-step", "2"], tmp_path / "resuming")
    _assert_losses_match(logged_losses(again.output), logged_losses(first.output), (3,))


STOCK_TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--make-vocab-size-divisible-by", "64"]
"""A stock layout whose padded vocabulary (384) is the hybrid plans' with their embedding at TP1: rows added
by another padding would start from their initialisation, and the losses would leave the uninterrupted run's."""


def test_a_megatron_space_plan_resumes_a_hybrid_checkpoint(without_dropout, tmp_path):
    """The stock runtime reads the hybrid runtime's per-layer keys and its per-parameter optimizer state: at
    TP2 + SP x DP2 with the distributed optimizer on 4 ranks, iterations 5 and 6 match the uninterrupted
    hybrid run within LOSS_RTOL."""
    reference, _, reference_losses = without_dropout
    result = _run(4, [*STOCK_TP2, "--use-distributed-optimizer", "--train-iters", "6", "--load", str(reference),
                      "--ckpt-step", "4", *NO_DROPOUT], tmp_path / "logs")
    assert "written by a hybrid-space run, read into this megatron-space (stock runtime) run" in result.output
    _assert_losses_match(logged_losses(result.output), reference_losses, (5, 6))


@pytest.fixture(scope="module")
def stock_fp32(tmp_path_factory):
    """4 iterations of the stock runtime at DP2 with Megatron's fp32 optimizer (no master copies), a checkpoint
    every 2: (checkpoint root, losses)."""
    folder = tmp_path_factory.mktemp("stock_fp32")
    stock = _run(2, ["--train-iters", "4", "--save-interval", "2", "--save", str(folder / "ckpt"), *NO_DROPOUT],
                 folder / "logs")
    return folder / "ckpt", logged_losses(stock.output)


def test_a_hybrid_plan_resumes_a_megatron_space_checkpoint(stock_fp32, tmp_path):
    """The hybrid runtime reads Megatron-LM's stacked layer keys, one load pass per TP degree (the plan mixes
    TP2 and TP1 layers), and the fp32 optimizer's state, which has no master copies: iterations 3 and 4 match
    the uninterrupted stock run (DP2) within LOSS_RTOL."""
    root, stock_losses = stock_fp32
    plan = _plan_file(tmp_path, "plan.json", 2, (Chunk(SAVING_LAYERS),), DP2_ZERO1)
    result = _run(2, ["--auto-parallel-plan", str(plan), "--train-iters", "4", "--load", str(root),
                      "--ckpt-step", "2", *NO_DROPOUT], tmp_path / "hybrid")
    assert "written by a megatron-space (stock runtime) run, read into this hybrid-space run" in result.output
    _assert_losses_match(logged_losses(result.output), stock_losses, (3, 4))


def test_an_fp32_megatron_lm_checkpoint_converts_to_a_bf16_hybrid_plan_with_fp32_masters(stock_fp32, tmp_path):
    """Megatron's fp32 optimizer saves no masters; converted to the saving plan in bf16, every part kind's fp32
    master is the stored fp32 weight bit for bit (read a second time in each TP load pass), not the bf16 weight
    that rounds it, and every weight is that value in bf16."""
    root, _ = stock_fp32
    plan = _plan_file(tmp_path, "plan.json", 2, (Chunk(SAVING_LAYERS),), DP2_ZERO1)
    converted = launch(2, ["tools/convert_checkpoint.py", *TINY, "--bf16", "--train-iters", "4",
                           "--auto-parallel-plan", str(plan), "--load", str(root), "--ckpt-step", "2",
                           "--save", str(tmp_path / "hybrid")], 300, tmp_path / "logs")
    assert converted.ok, converted.output[-4000:]
    stock = checkpoint_tensors(root / "iter_0000002")
    hybrid = checkpoint_tensors(tmp_path / "hybrid" / "iter_0000002")
    mismatched, rounded = [], []
    for name, master in hybrid.items():
        if not name.startswith("optimizer.state.param."):
            continue
        weight_name = name[len("optimizer.state.param."):]
        stacked, layer = _stacked_name(weight_name)
        original = stock[stacked] if layer is None else stock[stacked][layer]
        if not (torch.equal(master, original) and torch.equal(hybrid[weight_name], original.bfloat16())):
            mismatched.append(name)
        rounded += [name] if torch.equal(master, hybrid[weight_name].float()) else []
    assert mismatched == [] and rounded == [] and len([n for n in hybrid if ".param." in n]) > 40


def _stacked_name(name: str) -> tuple[str, int | None]:
    """A hybrid checkpoint's per-layer tensor name as Megatron-LM's stacked name and the layer's index."""
    match = re.search(r"decoder\.layers\.(\d+)\.", name)
    if match is None:
        return name, None
    return name[:match.start()] + "decoder.layers." + name[match.end():], int(match.group(1))


def test_convert_checkpoint_writes_a_hybrid_checkpoint_in_megatron_lm_layout(without_dropout, tmp_path):
    """tools/convert_checkpoint.py under Megatron flags (DP2, distributed optimizer): every tensor of the hybrid
    iteration, weights, fp32 masters and Adam moments, lands bit for bit in its layer's row of Megatron-LM's
    stacked key, and the iteration and schedule carry over."""
    reference, _, _ = without_dropout
    result = launch(2, ["tools/convert_checkpoint.py", *TINY, "--train-iters", "6", "--use-distributed-optimizer",
                        "--load", str(reference), "--ckpt-step", "4", "--save", str(tmp_path / "stock")],
                    300, tmp_path / "logs")
    assert result.ok, result.output[-4000:]
    hybrid = checkpoint_tensors(reference / "iter_0000004")
    stock = checkpoint_tensors(tmp_path / "stock" / "iter_0000004")
    assert not any(re.search(r"decoder\.layers\.\d", name) for name in stock)
    mismatched = []
    for name, tensor in hybrid.items():
        stacked, layer = _stacked_name(name)
        converted = stock[stacked] if layer is None else stock[stacked][layer]
        if not torch.equal(converted, tensor):
            mismatched.append(name)
    assert mismatched == [] and len(hybrid) > 150
    assert {_stacked_name(name)[0] for name in hybrid} == set(stock)
    common = torch.load(tmp_path / "stock" / "iter_0000004" / "common.pt", weights_only=False)
    assert (common["checkpoint_format"], common["iteration"]) == ("megatron", 4)


def test_convert_checkpoint_without_a_checkpoint_is_one_line(tmp_path):
    result = launch(1, ["tools/convert_checkpoint.py", *TINY, "--train-iters", "6", "--load", str(tmp_path / "none"),
                        "--save", str(tmp_path / "out")], 120, tmp_path / "logs")
    assert not result.ok
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert errors == [f"error: --load {tmp_path / 'none'}: no checkpoint there to convert"], result.output[-2000:]


@pytest.mark.parametrize("precision", ["--bf16", "--fp16"])
def test_a_16_bit_megatron_lm_checkpoint_converts_to_a_hybrid_plan_bit_for_bit(precision, tmp_path):
    """Megatron's non-distributed 16-bit optimizer names its fp32 masters `fp32_param`, the hybrid runtime
    `param`: converted under the saving plan (a TP2 layer, ZeRO-3, ZeRO-0 and ZeRO-1 parts), every 16-bit
    weight, fp32 master and Adam moment of the stock iteration lands in its layer's own key unchanged, and
    fp16's loss scaler and the Adam step carry over."""
    _run(2, [precision, "--train-iters", "2", "--save-interval", "2", "--save", str(tmp_path / "stock")],
         tmp_path / "stock_logs")
    plan = _plan_file(tmp_path, "plan.json", 2, (Chunk(SAVING_LAYERS),), DP2_ZERO1)
    converted = launch(2, ["tools/convert_checkpoint.py", *TINY, precision, "--train-iters", "2",
                           "--auto-parallel-plan", str(plan), "--load", str(tmp_path / "stock"),
                           "--save", str(tmp_path / "hybrid")], 300, tmp_path / "logs")
    assert converted.ok, converted.output[-4000:]
    stock = checkpoint_tensors(tmp_path / "stock" / "iter_0000002")
    hybrid = checkpoint_tensors(tmp_path / "hybrid" / "iter_0000002")
    assert any(name.startswith("optimizer.state.fp32_param.") for name in stock)
    mismatched = []
    for name, tensor in hybrid.items():
        stacked, layer = _stacked_name(name.replace("optimizer.state.param.", "optimizer.state.fp32_param."))
        original = stock[stacked] if layer is None else stock[stacked][layer]
        if original.dtype != tensor.dtype or not torch.equal(original, tensor):
            mismatched.append(name)
    assert mismatched == [] and len(hybrid) > 150
    assert {_stacked_name(name.replace(".param.", ".fp32_param."))[0] for name in hybrid} == set(stock)
    stock_common, hybrid_common = (torch.load(tmp_path / run / "iter_0000002" / "common.pt", weights_only=False)
                                   for run in ("stock", "hybrid"))
    # megatron-core writes the step only once it is > 0 (checkpoint.restore_zero_adam_step).
    stock_step = stock_common["optimizer"]["optimizer"].get("state", {}).get("common_step", 0)
    assert hybrid_common["optimizer"]["step"] == int(stock_step)
    assert hybrid_common["optimizer"]["grad_scaler"] == stock_common["optimizer"].get("grad_scaler")
    assert (hybrid_common["optimizer"]["grad_scaler"] is not None) == (precision == "--fp16")


def test_a_virtual_pipeline_checkpoint_saves_and_resumes_under_a_hybrid_plan(tmp_path):
    """The stock runtime at PP2 with two virtual stages per rank (one layer each) and the distributed optimizer:
    its chunks' state dicts share top-level names, and the first stage's tied word embedding sits in a gradient
    bucket of its own, after the padding of the bucket before it (patches/fully_reshardable_bucket_offsets.py).
    In fp32 every saved master equals its saved weight exactly (validation/check_checkpoint_masters.py), and the
    hybrid saving plan resumes iteration 2: iterations 3 and 4 match within LOSS_RTOL."""
    virtual = ["--micro-batch-size", "1", "--pipeline-model-parallel-size", "2",
               "--num-layers-per-virtual-pipeline-stage", "1", "--use-distributed-optimizer"]
    stock = _run(2, [*virtual, "--train-iters", "4", "--save-interval", "2", "--save", str(tmp_path / "ckpt"),
                     *NO_DROPOUT], tmp_path / "stock")
    check = run_script(["-m", "validation.check_checkpoint_masters", str(tmp_path / "ckpt" / "iter_0000002")],
                       dict(os.environ), timeout_s=120)
    assert check.returncode == 0 and " 16 of 16 masters equal their weights" in check.stdout, check.stdout + check.stderr
    plan = _plan_file(tmp_path, "plan.json", 2, (Chunk(SAVING_LAYERS),), DP2_ZERO1)
    result = _run(2, ["--auto-parallel-plan", str(plan), "--train-iters", "4", "--load", str(tmp_path / "ckpt"),
                      "--ckpt-step", "2", *NO_DROPOUT], tmp_path / "hybrid")
    _assert_losses_match(logged_losses(result.output), logged_losses(stock.output), (3, 4))
