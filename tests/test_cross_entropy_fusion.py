"""--cross-entropy-loss-fusion --cross-entropy-fusion-impl te: what Transformer Engine's fused cross entropy keeps
and moves (cost/memory.py kept_logit_bytes, cost/layer_kernels.py), against counts made by hand."""
from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_auto.cost.embedding import embedding_cost
from megatron_auto.cost.layer_kernels import head_memory_times
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.presets import CLUSTER_PRESETS, MODEL_PRESETS
from megatron_auto.specs.training import TrainingSpec
from test_cli import ok_json

H100 = CLUSTER_PRESETS["dgx-h100-80gb"]
MODEL = MODEL_PRESETS["llama3-8b"]
BF16 = TrainingSpec(global_batch_size=8)
TE = replace(BF16, cross_entropy_fusion="te")
TP2 = LayerStrategy(tp=2, dp=4, sp=True)


def test_te_keeps_the_logits_in_their_type_and_nothing_beside_them():
    logits = MODEL.seq_length * 2 * MODEL.vocab_size / 2  # two samples, tp 2
    plain, fused = (embedding_cost(MODEL, TP2, 2, H100, t, 1).head for t in (BF16, TE))
    assert plain.activation_bytes == 4 * logits and plain.loss_bytes == 2 * logits  # fp32 softmax + bf16 logits
    assert fused.activation_bytes == 2 * logits and fused.loss_bytes == 0
    native = embedding_cost(MODEL, TP2, 2, H100, replace(BF16, cross_entropy_fusion="native"), 1).head
    assert native == plain  # Megatron-Core's fused kernel keeps the same fp32 softmax


def test_te_moves_ten_bytes_a_logit_where_the_unfused_loss_moves_fifty_two():
    tokens, h, vocab = 8192, 4096, 128256
    logits = tokens * vocab / 2
    plain = head_memory_times(tokens, h, vocab, 2, 2, H100)
    fused = head_memory_times(tokens, h, vocab, 2, 2, H100, "te")
    bandwidth = logits / (plain[0] - fused[0]) * (38 - 6)
    assert plain[1] - fused[1] == pytest.approx((14 - 4) * logits / bandwidth, rel=1e-9)


def test_estimate_prices_it_and_says_it_in_the_flags():
    job = ["estimate", "--model", "llama3-8b", "--cluster", "dgx-h100-80gb", "--num-nodes", "1",
           "--global-batch-size", "64", "--tp", "2", "--pp", "1", "--micro-batch-size", "2", "--sequence-parallel"]
    plain = ok_json(*job)
    fused = ok_json(*job, "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te")
    assert fused["device_memory_gib"] < plain["device_memory_gib"]
    assert fused["iteration_time_s"] < plain["iteration_time_s"]
    assert fused["megatron_flags"][-3:] == ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
