"""What the fused kernels NVIDIA's recipes run keep for backward, and dropout at probability 0 (cost/memory.py,
cost/moe.py, cost/fp8.py): each difference is the tensor the kernel no longer keeps, byte for byte."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from megatron_auto.cli.main import main
from megatron_auto.cost.fp8 import fp8_saved_input_savings
from megatron_auto.cost.memory import (attention_score_bytes, embedding_activation_bytes, layer_activation_bytes,
                                       mlp_saved_width, rotary_table_bytes)
from megatron_auto.cost.moe import expert_saved_width
from megatron_auto.errors import UserError
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.model import model_from_dict
from megatron_auto.specs.presets import MODEL_PRESETS
from megatron_auto.specs.training import KernelFusions

LLAMA = MODEL_PRESETS["llama3-70b"]
LAYER = LLAMA.layers[0]
WITH_DROPOUT = replace(LAYER, hidden_dropout=0.1, attention_dropout=0.1)
SEQ, SAMPLES, WORD = 8192, 1, 2
TP4_SP = LayerStrategy(tp=4, sp=True)


def kept(layer, strategy=TP4_SP, backend="flash", fusions=KernelFusions()) -> float:
    return layer_activation_bytes(layer, SEQ, SAMPLES, strategy, WORD, 1, backend, frozenset(), fusions)


def test_hidden_dropout_at_zero_keeps_no_masks():
    tokens = SEQ * SAMPLES
    # Two bias-dropout-adds per layer, one byte of mask per element, split over TP by SP.
    assert kept(WITH_DROPOUT) - kept(LAYER) == pytest.approx(2 * tokens * LAYER.hidden_size / 4)
    gpt = MODEL_PRESETS["gpt3-1.7b"]
    assert gpt.layers[0].hidden_dropout == 0.1  # GPT-3 trained with Megatron-LM's default
    without = replace(gpt, layers=tuple(replace(layer, hidden_dropout=0.0) for layer in gpt.layers))
    difference = (embedding_activation_bytes(gpt, 1, LayerStrategy(), WORD)
                  - embedding_activation_bytes(without, 1, LayerStrategy(), WORD))
    assert difference == gpt.seq_length * gpt.hidden_size  # the embedding's mask


def test_attention_dropout_at_zero_keeps_no_score_mask():
    heads = LAYER.num_attention_heads
    with_mask = attention_score_bytes(WITH_DROPOUT, 1024, 1, WORD, 1, "unfused")
    assert with_mask - attention_score_bytes(LAYER, 1024, 1, WORD, 1, "unfused") == heads * 1024 * 1024
    assert attention_score_bytes(WITH_DROPOUT, 1024, 1, WORD, 1, "flash") == attention_score_bytes(
        LAYER, 1024, 1, WORD, 1, "flash")  # flash draws its mask on chip


def test_fused_bias_swiglu_keeps_its_input_and_fc2_its_input_only():
    assert (mlp_saved_width(True), mlp_saved_width(True, True)) == (4, 3)
    assert mlp_saved_width(False, True) == mlp_saved_width(False) == 2  # GeLU keeps 2f either way
    saved = kept(LAYER) - kept(LAYER, fusions=KernelFusions(bias_activation=True))
    assert saved == pytest.approx(WORD * SEQ * SAMPLES * LAYER.ffn_hidden_size / 4)
    # Experts: unfused, the probability-scaled fc2 input is one f more; the weighted fused kernel scales inside.
    assert (expert_saved_width(True, False), expert_saved_width(True, True), expert_saved_width(False, True)) == (
        5, 3, 3)


def test_fused_rope_keeps_no_per_layer_tables():
    assert rotary_table_bytes(LAYER, SEQ, WORD) == 4 * SEQ * LAYER.kv_channels * WORD
    assert rotary_table_bytes(LAYER, SEQ, WORD, rope_fusion=True) == 0.0
    assert kept(LAYER) - kept(LAYER, fusions=KernelFusions(rope=True)) == rotary_table_bytes(LAYER, SEQ, WORD)


def test_fp8_projection_copy_is_extra_where_a_flash_core_keeps_its_output():
    args = (LAYER, SEQ, SAMPLES, 4, True)
    unfused = fp8_saved_input_savings(*args, norms_kept=True, mlp_inner_kept=True)
    flash = fp8_saved_input_savings(*args, norms_kept=True, mlp_inner_kept=True, core_keeps_output=True)
    assert unfused - flash == pytest.approx(2 * SEQ * SAMPLES * LAYER.attention_width / 4)


def test_dropout_in_a_model_file_is_a_probability():
    shape = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128}
    model = model_from_dict({**shape, "hidden_dropout": 0, "attention_dropout": 0.05})
    assert (model.layers[0].hidden_dropout, model.layers[0].attention_dropout) == (0.0, 0.05)
    with pytest.raises(UserError, match="hidden_dropout must be a probability"):
        model_from_dict({**shape, "hidden_dropout": 1.5})


ESTIMATE = ["estimate", "--model", "llama3-70b", "--cluster", "dgx-h100-80gb", "--num-nodes", "8",
            "--global-batch-size", "128", "--tp", "4", "--pp", "4", "--virtual-stages", "5", "--micro-batch-size", "1",
            "--sequence-parallel", "--distributed-optimizer", "--json"]


def activations_gib(capsys, *argv: str) -> float:
    assert main([*argv]) == 0
    return json.loads(capsys.readouterr().out)["memory_breakdown"]["activations_gib"]


def test_estimate_prices_the_fusions_it_is_given(capsys):
    plain = activations_gib(capsys, *ESTIMATE)
    fused = activations_gib(capsys, *ESTIMATE, "--bias-fusions", "on")
    both = activations_gib(capsys, *ESTIMATE, "--bias-fusions", "on", "--rope-fusion")
    assert both < fused < 0.95 * plain
    assert activations_gib(capsys, *ESTIMATE, "--bias-fusions", "auto") == plain  # auto: as the runtime runs
    cpu = ["estimate", "--model", "tiny-llama", "--cluster", "cpu-gloo", "--num-nodes", "1", "--gpus-per-node", "2",
           "--global-batch-size", "4", "--tp", "2", "--pp", "1", "--json"]
    assert activations_gib(capsys, *cpu, "--bias-fusions", "on") == activations_gib(capsys, *cpu)  # CUDA kernels


def test_fp8_experts_keep_fp8_inputs_and_fp8_weight_copies():
    """TE's grouped linear layers under FP8: fc1's h-wide and fc2's f-wide inputs kept as 1-byte copies, and an
    FP8 copy and transpose of every local expert weight (2 bytes), folded into the weight by --fp8-param-gather."""
    from megatron_auto.cost.moe import expert_activation_bytes, expert_cost, expert_tokens
    from megatron_auto.specs.presets import CLUSTER_PRESETS
    from megatron_auto.specs.training import TrainingSpec

    mixtral = MODEL_PRESETS["mixtral-8x7b"].layers[0]
    strategy = LayerStrategy(tp=1, dp=8, zero=1, ep=8, etp=1)
    bf16, fp8 = TrainingSpec(global_batch_size=64), TrainingSpec(global_batch_size=64, precision="fp8")
    processed = expert_tokens(mixtral, 4096, 1, strategy, 1.0)
    kept = [expert_activation_bytes(mixtral, 4096, 1, strategy, t, False) for t in (bf16, fp8)]
    assert kept[0] - kept[1] == pytest.approx(processed * (mixtral.hidden_size + mixtral.moe.expert_ffn_hidden_size))
    cluster = CLUSTER_PRESETS["dgx-h100-80gb"]
    states = [expert_cost(mixtral, strategy, 1, 4096, cluster, t).state_bytes
              for t in (bf16, fp8, replace(fp8, fp8_param_gather=True))]
    assert states[1] - states[0] == pytest.approx(2 * mixtral.expert_parameters / 8)
    assert states[2] == pytest.approx(states[0])
