"""tools/pretrain_gpt.py --auto-parallel --auto-parallel-space hybrid trains end to end on 4 gloo ranks."""
from __future__ import annotations

import re

from validation.launcher import launch
from megatron_auto import train

TINY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32", "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "256"]


def test_hybrid_auto_parallel_trains_on_four_ranks(tmp_path):
    argv = ["tools/pretrain_gpt.py", *TINY, "--micro-batch-size", "2", "--global-batch-size", "8",
            "--train-iters", "6", "--lr", "3e-3", "--log-interval", "1", "--auto-parallel",
            "--auto-parallel-space", "hybrid", "--auto-parallel-cluster", "cpu-gloo"]
    result = launch(4, argv, timeout_s=180, log_dir=tmp_path)
    assert result.ok, result.output[-4000:]
    losses = [float(x) for x in re.findall(r"iteration +\d+/ +6 \|.*\| lm loss: (\S+) \|", result.output)]
    assert len(losses) == 6 and all(0 < x < 10 for x in losses)
    assert losses[-1] < losses[0], f"loss did not go down: {losses}"
    # The hybrid space contains the megatron one: on cpu-gloo, where nothing hides
    # communication, the uniform ZeRO-1 plan wins; the table names the winner's space.
    assert re.search(r"plan \((hybrid|megatron) space\)", result.output), result.output[-4000:]



MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48", "--moe-layer-freq",
       "([0]*1+[1]*3)", "--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "1e-2",
       "--swiglu", "--disable-bias-linear", "--normalization", "RMSNorm"]
MOE_RUN = [*TINY, *MOE, "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "4", "--lr", "3e-3",
           "--log-interval", "1"]


def _moe_losses(output: str) -> list[tuple[float, float]]:
    found = re.findall(r"iteration +\d+/ +4 \|.*\| lm loss: (\S+) \|.*seq_load_balancing_loss: (\S+)", output)
    return [(float(lm), float(balance)) for lm, balance in found]


def test_hybrid_plan_of_a_moe_model_runs_from_the_command_line(tmp_path):
    """A DeepSeek-style model (dense first layer, MoE after) under a hybrid plan file: the dense layer at
    TP2 + SP, the MoE layers at DP4 with EP4 (the second re-running its MoE layer in backward, selective
    recompute of `moe`) and at TP2 + SP with EP2 x ETP1; the log names the per-layer layouts, what selective
    recompute re-runs, and Megatron-LM's load-balancing loss."""
    from megatron_auto.plan import Chunk, LayerStrategy, Plan, save_plan

    tp2 = LayerStrategy(tp=2, dp=2, sp=True, zero=1)
    layers = (tp2, LayerStrategy(dp=4, zero=1, ep=4), LayerStrategy(dp=4, zero=1, ep=4, recompute="selective"),
              LayerStrategy(tp=2, dp=2, sp=True, zero=1, ep=2, etp=1))
    args = train.parse_args(MOE_RUN + ["--mock-data"])
    model = train.model_from_args(args, 256)
    save_plan(Plan(space="hybrid", world_size=4, pipeline_parallel=1, global_batch_size=8, num_micro_batches=2,
                   chunks=(Chunk(layers),), embedding=tp2, model=model), tmp_path / "plan.json")
    argv = ["tools/pretrain_gpt.py", *MOE_RUN, "--auto-parallel-plan", str(tmp_path / "plan.json"),
            "--recompute-modules", "moe"]
    result = launch(4, argv, timeout_s=180, log_dir=tmp_path / "logs")
    assert result.ok, result.output[-4000:]
    assert "plan (hybrid space)" in result.output and "tp1·dp4·z1·ep4" in result.output, result.output[-4000:]
    assert "selective recompute re-runs: moe" in result.output, result.output[-4000:]
    losses = _moe_losses(result.output)
    assert len(losses) == 4 and all(0 < lm < 10 and balance > 0 for lm, balance in losses), result.output[-4000:]


def test_hybrid_auto_parallel_trains_a_moe_model_on_four_ranks(tmp_path):
    """--auto-parallel over the hybrid space plans the MoE model (per-layer expert degrees) and trains it."""
    argv = ["tools/pretrain_gpt.py", *MOE_RUN, "--auto-parallel", "--auto-parallel-space", "hybrid",
            "--auto-parallel-cluster", "cpu-gloo"]
    result = launch(4, argv, timeout_s=180, log_dir=tmp_path)
    assert result.ok, result.output[-4000:]
    assert re.search(r"plan \((hybrid|megatron) space\)", result.output), result.output[-4000:]
    losses = _moe_losses(result.output)
    assert len(losses) == 4 and all(0 < lm < 10 and balance > 0 for lm, balance in losses), result.output[-4000:]
