"""Multi-token prediction's kept activations: what the runtime's GPTModel saves for backward with D MTP depths
beyond what it saves without them is what the cost model counts for them (cost.mtp: D transformer layers,
mtp_kept_bytes per depth and the depths' fp32 softmaxes), measured in fp32 on CPU at TP1 and at TP2 with SP."""
from __future__ import annotations

import pytest

from validation.launcher import run_cases
from megatron_auto.cost.layer_cost import layer_cost
from megatron_auto.cost.mtp import mtp_cost
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.model import MLASpec, uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS
from megatron_auto.specs.training import TrainingSpec

BATCH = 2  # mtp_saved_worker.py's
ROPE_GPT = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, vocab_size=128,
                position_embedding_type="rope")
# LayerNorm throughout: torch's eager RMSNorm keeps its normalized input too on CPU, which no formula counts yet.
SWIGLU_UNTIED = dict(ROPE_GPT, swiglu=True, add_bias_linear=False, num_query_groups=2, ffn_hidden_size=128,
                     untie_embeddings_and_output_weights=True)
DEEPSEEK_LIKE = dict(ROPE_GPT, swiglu=True, add_bias_linear=False, ffn_hidden_size=128, qk_layernorm=True,
                     mla=dict(kv_lora_rank=32, qk_head_dim=16, qk_pos_emb_head_dim=8, v_head_dim=12, q_lora_rank=24),
                     num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=48, moe_shared_expert_intermediate_size=32,
                     moe_layer_freq=[0, 1])
CASES = [{"name": "gpt-tied-d1", "model": dict(ROPE_GPT, mtp_num_layers=1)},
         {"name": "swiglu-untied-d2", "model": dict(SWIGLU_UNTIED, mtp_num_layers=2)},
         {"name": "mla-moe-d1", "model": dict(DEEPSEEK_LIKE, mtp_num_layers=1)}]
CPU = CLUSTER_PRESETS["cpu-gloo"]


def case_model(case: dict):
    keywords = dict(case["model"])
    if "mla" in keywords:
        keywords["mla"] = MLASpec(**keywords["mla"])
    return uniform_model(case["name"], **keywords)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    """{tp: results}: one launch on one rank (TP1), one on two (TP2 with SP)."""
    tmp = tmp_path_factory.mktemp("mtp_saved")
    return {tp: run_cases(tmp, tp, "mtp_saved_worker.py", CASES, 300) for tp in (1, 2)}


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_mtp_keeps_what_the_cost_model_counts(measured, case, tp):
    """Exact but for one s x s bool causal mask per MTP layer, which the unfused core keeps and the layer
    formula leaves out on purpose for every layer (tests/runtime/test_recompute_modules.py; the flash core
    that GPUs run keeps none). At TP2 with SP this also checks the shards, the whole gathered input the MTP
    layer's slice keeps alive and the vocab-parallel embedding's mask."""
    model = case_model(case)
    training = TrainingSpec(BATCH, precision="fp32", param_bytes=4, attention_backend="unfused")
    strategy = LayerStrategy(tp=tp, dp=1, sp=tp > 1)
    layer = layer_cost(model.mtp_layer, strategy, BATCH, model.seq_length, CPU, training).activation_bytes
    part = mtp_cost(model, strategy, BATCH, CPU, training, 1)
    depths, seq = model.mtp_num_layers, model.seq_length
    result = measured[tp][case["name"]]
    assert result["mtp"] - result["plain"] == depths * (layer + seq * seq) + part.activation_bytes + part.loss_bytes
