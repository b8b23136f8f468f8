"""--recompute-modules: the bytes each module's selective recompute frees in the runtime's layer are the
bytes the cost model takes off (cost.memory.layer_activation_bytes), the gradients are unchanged, and a
run recomputing them trains as the plain run does."""
from __future__ import annotations

import re

import pytest

from launcher import launch, run_cases
from megatron_auto.cost.memory import layer_activation_bytes
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.presets import CLUSTER_PRESETS

SEQ, BATCH = 16, 2  # recompute_modules_worker.py's
GPT = dict(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=SEQ, vocab_size=128)
# SwiGLU, no linear biases, GQA; LayerNorm, whose saved tensors are ATen's on every device (torch's eager
# RMSNorm keeps its normalized input too on CPU, which the formula does not count yet).
SWIGLU = dict(GPT, swiglu=True, add_bias_linear=False, num_query_groups=2, ffn_hidden_size=128)
CASES = [
    {"name": "gpt-core_attn", "model": GPT, "modules": ["core_attn"]},
    {"name": "gpt-layernorm", "model": GPT, "modules": ["layernorm"]},
    {"name": "gpt-core_attn-layernorm", "model": GPT, "modules": ["core_attn", "layernorm"]},
    {"name": "swiglu-mlp", "model": SWIGLU, "modules": ["mlp"]},
    {"name": "swiglu-mlp-layernorm", "model": SWIGLU, "modules": ["mlp", "layernorm"]},
    {"name": "swiglu-all", "model": SWIGLU, "modules": ["core_attn", "mlp", "layernorm"]},
]


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> dict:
    return run_cases(tmp_path_factory.mktemp("recompute_modules"), 1, "recompute_modules_worker.py", CASES, 300)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_each_module_frees_the_bytes_the_cost_model_takes_off(measured, case):
    """Measured saved bytes (storages alive once the forward returned) without recompute minus with it,
    against the formula's same difference, fp32 on CPU (cpu-gloo's 4-byte dropout masks; dropout is
    outside every recomputed module, so it cancels). Exact for mlp and layernorm: the formula counts whole
    tensors. With core_attn the checkpoint also frees the cached s x s causal mask, which the formula
    leaves out on purpose (one per run, shared by the layers), and keeps one 4-byte scalar input."""
    layer = uniform_model(case["name"], **case["model"]).layers[0]
    mask = CLUSTER_PRESETS["cpu-gloo"].dropout_mask_bytes

    def formula(recompute: str) -> float:
        return layer_activation_bytes(layer, SEQ, BATCH, LayerStrategy(tp=1, dp=1, recompute=recompute), 4, mask,
                                      "unfused", frozenset(case["modules"]))

    result = measured[case["name"]]
    freed = result["none"] - result["selective"]
    causal_mask = SEQ * SEQ if "core_attn" in case["modules"] else 0
    assert freed == formula("none") - formula("selective") + causal_mask - (4 if causal_mask else 0)
    # The same fp32 ops on the same inputs; recomputing a norm moves its gradient's add into a hook, which
    # may reorder one sum: a few ulps of the largest gradient (fp32 epsilon 2^-23).
    assert result["gradient_max_diff"] <= 8 * 2.0**-23 * result["gradient_max"]


def _losses(output: str) -> list[str]:
    return re.findall(r"iteration +\d+/ +\d+ \|.*\| lm loss: (\S+) \|", output)


def test_a_run_recomputing_every_module_trains_as_the_plain_one(tmp_path):
    """TP2 with SP on 2 ranks, Llama-style (no linear biases): recomputing core_attn, mlp and layernorm
    re-runs the same fp32 ops on the same inputs and dropout streams; only a norm gradient's summation order
    may move (a few fp32 ulps, as above), which Adam carries into the weights at lr x that relative change:
    the logged losses (about 5.5, printed to 7 digits) agree within 1e-5."""
    job = ["tools/pretrain_gpt.py", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
           "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "2",
           "--global-batch-size", "8", "--train-iters", "4", "--lr", "3e-3", "--mock-data", "--tokenizer-type",
           "NullTokenizer", "--vocab-size", "128", "--log-interval", "1", "--eval-iters", "0", "--swiglu",
           "--normalization", "RMSNorm", "--disable-bias-linear", "--tensor-model-parallel-size", "2",
           "--sequence-parallel"]
    plain = launch(2, job, 300, tmp_path / "plain")
    recomputed = launch(2, job + ["--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp",
                                  "layernorm"], 300, tmp_path / "recomputed")
    assert plain.ok and recomputed.ok, (plain.output + recomputed.output)[-5000:]
    assert "selective recompute re-runs: core_attn mlp layernorm" in recomputed.output
    plain_losses, recomputed_losses = _losses(plain.output), _losses(recomputed.output)
    assert len(plain_losses) == 4 and len(recomputed_losses) == 4
    assert all(abs(float(a) - float(b)) <= 1e-5 for a, b in zip(plain_losses, recomputed_losses))
