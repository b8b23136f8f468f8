"""--moe-router-load-balancing-type global_aux_loss (Megatron-LM 0.16.1's load-balancing loss over the global
batch: the routed tokens per expert summed over the tensor-, data- and context-parallel ranks and the micro-batches
of the step, reset by megatron-core's finalize_model_grads) runs on gloo ranks: its loss is logged and the model
trains."""
from __future__ import annotations

import re

from validation.launcher import launch

ARGV = ["tools/pretrain_gpt.py", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size",
        "8", "--train-iters", "10", "--lr", "3e-3", "--mock-data", "--tokenizer-type", "NullTokenizer",
        "--vocab-size", "512", "--log-interval", "1", "--eval-iters", "0", "--num-experts", "4",
        "--moe-router-topk", "2", "--moe-router-load-balancing-type", "global_aux_loss", "--moe-aux-loss-coeff",
        "0.01", "--moe-token-dispatcher-type", "alltoall", "--expert-model-parallel-size", "2"]


def test_the_global_load_balancing_loss_is_logged_and_the_model_trains(tmp_path):
    result = launch(2, ARGV, timeout_s=300, log_dir=tmp_path)
    assert result.ok, result.output[-4000:]
    balance = [float(x) for x in re.findall(r"global_load_balancing_loss: (\S+) \|", result.output)]
    losses = [float(x) for x in re.findall(r"iteration +\d+/ +10 \|.*\| lm loss: (\S+) \|", result.output)]
    assert len(losses) == 10 and len(balance) == 10
    assert all(0.5 < value < 2.0 for value in balance)  # E x sum(f_i P_i) sits near 1 when the load is even
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
