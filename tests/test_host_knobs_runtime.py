"""CUDA graphs and activation offloading on megatron-auto's own runtime (tools/pretrain_gpt.py): accepted without
effect, and --auto-parallel neither prices nor chooses them (the TrainingSpec it searches keeps both off), while
`megatron-auto plan`/`estimate` price them for Megatron-LM runs (tests/test_cuda_graphs_cost.py,
tests/test_activation_offload_cost.py). Launch lines are only parsed here."""
from __future__ import annotations

from megatron_auto import train
from megatron_auto.specs.host_knobs import DEFAULT_MIN_OFFLOADED_TENSOR_SIZE

BASE = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "128",
        "--train-iters", "10", "--mock-data", "--micro-batch-size", "1", "--global-batch-size", "8"]
KNOBS = ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn", "--cuda-graph-warmup-steps", "2",
         "--fine-grained-activation-offloading", "--offload-modules", "core_attn", "attn_proj",
         "--min-offloaded-tensor-size", "1024"]


def test_the_runtime_accepts_the_flags_without_effect_and_prices_neither():
    args = train.parse_args(BASE + KNOBS)
    assert {"--cuda-graph-impl", "--cuda-graph-scope", "--fine-grained-activation-offloading",
            "--offload-modules", "--min-offloaded-tensor-size"} <= set(train.no_effect_flags(args))
    training = train.training_for_job(args, train.settings_from_args(args, 512), world_size=4)
    assert (training.cuda_graph_impl, training.cuda_graph_scope) == ("none", ())
    assert training.offload_modules == () and training.min_offloaded_tensor_size == DEFAULT_MIN_OFFLOADED_TENSOR_SIZE
