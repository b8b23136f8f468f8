"""--auto-parallel --auto-parallel-space hybrid with checkpoints: every plan of the job runs on the hybrid
runtime, so a restart that re-plans reads the checkpoints the job wrote (runtime/planning.as_hybrid)."""
from __future__ import annotations

from launcher import load_pretrain_gpt

pretrain_gpt = load_pretrain_gpt("pretrain_gpt_hybrid_plans")

FLAGS = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--micro-batch-size", "1", "--global-batch-size", "4",
         "--train-iters", "1", "--lr", "1e-4", "--mock-data", "--tokenizer-type", "NullTokenizer",
         "--vocab-size", "128", "--auto-parallel", "--auto-parallel-space", "hybrid",
         "--auto-parallel-cluster", "cpu-gloo"]


def _plan(extra: list[str]):
    args = pretrain_gpt.parse_args(FLAGS + extra)
    model = pretrain_gpt.model_from_args(args, 128)
    return pretrain_gpt.choose_plan(args, model, 2, pretrain_gpt.settings_from_args(args, 128))


def test_a_megatron_space_winner_runs_as_the_same_hybrid_plan_when_the_job_checkpoints(tmp_path):
    searched = _plan([])
    assert searched.space == "megatron"  # on cpu-gloo the uniform plan wins (test_hybrid_pretrain)
    for extra in (["--save", str(tmp_path)], ["--load", str(tmp_path)]):
        converted = _plan(extra)
        assert converted.space == "hybrid"
        assert converted.layer_strategies == searched.layer_strategies and converted.embedding == searched.embedding
        assert (converted.pipeline_parallel, converted.num_micro_batches) == (searched.pipeline_parallel,
                                                                              searched.num_micro_batches)


def test_the_megatron_space_keeps_its_runtime_with_checkpoints(tmp_path):
    args = [*FLAGS[:-4], "--auto-parallel-cluster", "cpu-gloo", "--save", str(tmp_path)]
    args = pretrain_gpt.parse_args(args)
    model = pretrain_gpt.model_from_args(args, 128)
    assert pretrain_gpt.choose_plan(args, model, 2, pretrain_gpt.settings_from_args(args, 128)).space == "megatron"
