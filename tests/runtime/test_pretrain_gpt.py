"""tools/pretrain_gpt.py and tools/preprocess_data.py end to end."""
from __future__ import annotations

import re
import subprocess

import pytest

from validation.launcher import launch, rank_env, run_script

TINY = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
        "--max-position-embeddings", "64"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    prefix = tmp_path_factory.mktemp("data") / "tiny"
    done = run_script(["tools/preprocess_data.py", "--input", "data/tiny_corpus.jsonl", "--output-prefix", str(prefix),
                       "--tokenizer-type", "ByteTokenizer", "--append-eod"], rank_env(0, 1, 0), timeout_s=120)
    assert done.returncode == 0, done.stderr
    assert "700 documents" in done.stdout
    return f"{prefix}_text_document"


def test_auto_parallel_training_on_four_ranks_lowers_the_loss(dataset, tmp_path):
    # With RoPE and one multi-token prediction module (--mtp-num-layers 1): the planner prices it on the last
    # stage, and every iteration logs its mtp_1 loss.
    argv = ["tools/pretrain_gpt.py", *TINY, "--position-embedding-type", "rope", "--mtp-num-layers", "1",
            "--micro-batch-size", "2", "--global-batch-size", "16",
            "--train-iters", "30", "--lr", "3e-3", "--min-lr", "3e-4", "--lr-decay-style", "cosine",
            "--lr-warmup-iters", "3", "--data-path", dataset, "--tokenizer-type", "ByteTokenizer",
            "--log-interval", "1", "--auto-parallel"]
    result = launch(4, argv, timeout_s=300, log_dir=tmp_path)
    assert result.ok, result.output[-4000:]
    losses = [float(x) for x in re.findall(r"iteration +\d+/ +30 \|.*\| lm loss: (\S+) \|", result.output)]
    assert len(losses) == 30
    assert "megatron-lm flags" in result.output  # the chosen plan is printed at start
    # The kernels of the run, named once (auto on CPU: Megatron's unfused attention, torch's foreach Adam).
    assert ("kernels: layer spec local, core attention Megatron DotProductAttention (unfused), "
            "bias-activation fusion off, bias-dropout-add fusion off") in result.output
    assert "optimizer Adam step foreach" in result.output
    assert "throughput per GPU (TFLOP/s/GPU)" in result.output and "tokens per second" in result.output
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:3]) / 3
    mtp = [float(x) for x in re.findall(r"iteration +\d+/ +30 \|.*\| mtp_1 loss: (\S+) \|", result.output)]
    assert len(mtp) == 30 and sum(mtp[-5:]) / 5 < 0.8 * sum(mtp[:3]) / 3


def _pretrain(args: list[str], world_size: int = 1, fresh: bool = False) -> subprocess.CompletedProcess:
    """One rank of pretrain_gpt.py; `fresh`: in an interpreter of its own, to see all it prints, at exit too."""
    return run_script(["tools/pretrain_gpt.py", *args], rank_env(0, world_size, 29999), 120, fresh)


def test_plan_for_another_world_size_is_refused_with_one_line(tmp_path):
    from megatron_auto.plan import save_plan
    from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags
    from megatron_auto.specs.model import uniform_model

    model = uniform_model("m", 4, 64, 4, seq_length=64, vocab_size=257)
    save_plan(plan_from_flags(model, 4, ManualParallelism(tp=2, global_batch_size=8)), tmp_path / "p.json")
    done = _pretrain([*TINY, "--train-iters", "1", "--mock-data", "--tokenizer-type", "ByteTokenizer",
                      "--auto-parallel-plan", str(tmp_path / "p.json")], fresh=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"error: plan '{tmp_path / 'p.json'}' is for 4 ranks but this job has 1"]


def test_plan_for_another_model_is_refused(tmp_path):
    from megatron_auto.plan import save_plan
    from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags
    from megatron_auto.specs.model import uniform_model

    model = uniform_model("m", 4, 128, 4, seq_length=64, vocab_size=257)
    save_plan(plan_from_flags(model, 1, ManualParallelism()), tmp_path / "p.json")
    done = _pretrain([*TINY, "--train-iters", "1", "--mock-data", "--tokenizer-type", "ByteTokenizer",
                      "--auto-parallel-plan", str(tmp_path / "p.json")])
    assert done.returncode == 2
    assert "made for another model: hidden_size 128 in the plan, 64 on the command line" in done.stderr
    assert "Traceback" not in done.stderr


def test_indivisible_parallel_flags_are_a_user_error():
    done = _pretrain([*TINY, "--train-iters", "1", "--mock-data", "--vocab-size", "256",
                      "--tensor-model-parallel-size", "3"])
    assert done.returncode == 2
    assert "not divisible" in done.stderr and "Traceback" not in done.stderr


def test_bf16_and_fp16_together_are_refused_with_one_line():
    done = _pretrain([*TINY, "--train-iters", "1", "--mock-data", "--vocab-size", "256", "--bf16", "--fp16"],
                     fresh=True)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["error: --bf16 and --fp16 are mutually exclusive: give one"]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_16_bit_runs_train_and_log_their_precision(precision):
    done = _pretrain([*TINY, "--num-layers", "2", "--train-iters", "3", "--mock-data", "--vocab-size", "256",
                      "--micro-batch-size", "2", "--log-interval", "1", f"--{precision}", "--initial-loss-scale",
                      "4096"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"precision: {precision} (fp32 main gradients and master weights" in done.stdout
    losses = [float(x) for x in re.findall(r"lm loss: (\S+) \|", done.stdout)]
    assert len(losses) == 3 and all(5.0 < loss < 7.0 for loss in losses)
    scales = re.findall(r"loss scale: (\S+) \|", done.stdout)
    assert scales == (["4096.0"] * 3 if precision == "fp16" else [])  # fp16 reports its (dynamic) scale


def test_context_parallel_training_on_two_ranks_lowers_the_loss_and_resumes(dataset, tmp_path):
    # A Megatron-LM line with --context-parallel-size 2: each rank runs half of every sequence (Megatron-Core's
    # load-balanced chunks), RoPE and GQA as Llama 3; `auto` attention resolves to the flash core CP needs.
    argv = ["tools/pretrain_gpt.py", *TINY, "--group-query-attention", "--num-query-groups", "2",
            "--position-embedding-type", "rope", "--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear",
            "--context-parallel-size", "2", "--micro-batch-size", "2", "--global-batch-size", "8",
            "--lr", "3e-3", "--min-lr", "3e-4", "--lr-decay-style", "cosine", "--lr-warmup-iters", "3",
            "--data-path", dataset, "--tokenizer-type", "ByteTokenizer", "--log-interval", "1",
            "--save", str(tmp_path / "ckpt"), "--save-interval", "20"]
    first, _, _ = train_20_then_resume_2(argv, tmp_path)
    assert "core attention torch SDPA (flash)" in first.output


def train_20_then_resume_2(argv: list[str], tmp_path):
    """Run `argv` (which saves into tmp_path/ckpt at iteration 20) on 2 ranks for 20 iterations, then resume it
    to 22: the first run's loss falls below 0.8x, the second runs iterations 21 and 22 only. Returns the
    first launch, its losses and the resumed launch."""
    first = launch(2, [*argv, "--train-iters", "20"], timeout_s=300, log_dir=tmp_path / "first")
    assert first.ok, first.output[-4000:]
    losses = [float(x) for x in re.findall(r"iteration +\d+/ +\d+ \|.*\| lm loss: (\S+) \|", first.output)]
    assert len(losses) == 20
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:3]) / 3
    resumed = launch(2, [*argv, "--train-iters", "22", "--load", str(tmp_path / "ckpt")], timeout_s=300,
                     log_dir=tmp_path / "resumed")
    assert resumed.ok, resumed.output[-4000:]
    assert re.findall(r"iteration +(\d+)/ +22 \|", resumed.output) == ["21", "22"]
    return first, losses, resumed


DEEPSEEK_STYLE = ["--multi-latent-attention", "--q-lora-rank", "32", "--kv-lora-rank", "32", "--qk-head-dim", "16",
                  "--qk-pos-emb-head-dim", "8", "--v-head-dim", "16", "--qk-layernorm", "--rotary-scaling-factor", "40",
                  "--mscale", "0.707", "--mscale-all-dim", "0.707", "--position-embedding-type", "rope",
                  "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
                  "--untie-embeddings-and-output-weights"]
"""DeepSeek-V2's attention flags (Megatron-LM's names; YaRN as its config.json), shrunk to the tiny model."""


def test_multi_latent_attention_with_mtp_trains_at_tp2_and_resumes(dataset, tmp_path):
    """A DeepSeek-V3-style launch line on 2 ranks at TP2 with SP, recomputing MLA's up projections, with one
    multi-token prediction module (--mtp-num-layers 1, weight 0.3): the loss falls on the shipped corpus, every
    iteration logs its "mtp_1 loss" after the lm loss (Megatron-LM's name), and a resumed run continues from the
    saved iteration, MTP module included."""
    argv = ["tools/pretrain_gpt.py", *TINY, *DEEPSEEK_STYLE, "--mtp-num-layers", "1", "--mtp-loss-scaling-factor",
            "0.3", "--tensor-model-parallel-size", "2",
            "--sequence-parallel", "--recompute-granularity", "selective", "--recompute-modules", "mla_up_proj",
            "core_attn", "--micro-batch-size", "4", "--global-batch-size", "8", "--lr", "3e-3", "--min-lr", "3e-4",
            "--lr-decay-style", "cosine", "--lr-warmup-iters", "3", "--data-path", dataset,
            "--tokenizer-type", "ByteTokenizer", "--log-interval", "1", "--eval-iters", "0",
            "--save", str(tmp_path / "ckpt"), "--save-interval", "20"]
    first, losses, resumed = train_20_then_resume_2(argv, tmp_path)
    assert "selective recompute re-runs: mla_up_proj core_attn" in first.output
    resumed_losses = [float(x) for x in re.findall(r"iteration +\d+/ +22 \|.*\| lm loss: (\S+) \|", resumed.output)]
    assert all(loss < 0.9 * sum(losses[:3]) / 3 for loss in resumed_losses)  # it resumed the trained weights
    mtp = [float(x) for x in re.findall(r"\| lm loss: \S+ \| mtp_1 loss: (\S+) \|", first.output)]
    resumed_mtp = [float(x) for x in re.findall(r"\| lm loss: \S+ \| mtp_1 loss: (\S+) \|", resumed.output)]
    assert len(mtp) == 20 and len(resumed_mtp) == 2
    assert sum(mtp[-5:]) / 5 < 0.8 * sum(mtp[:3]) / 3  # the MTP module learns to predict the token after next
    assert all(loss < 0.9 * sum(mtp[:3]) / 3 for loss in resumed_mtp)  # and resumes trained
