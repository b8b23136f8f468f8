"""--cp-comm-type: how Transformer Engine's attention runs context parallelism (p2p ring, all_gather, a2a), what
each exchanges and keeps (cost/context_parallel.py), what TE refuses (a window on its ring, heads a2a cannot
split), the flag in the plan, and `plan --cp-comm-type search`."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from megatron_auto.cli.main import main
from megatron_auto.cost.communication import group_all_to_all_time
from megatron_auto.cost.context_parallel import (cp_comm_problem, cp_exchange_time, gathered_kv_transient_bytes,
                                                 kv_bytes, kv_exchange_time, qkvo_all_to_all_time,
                                                 ring_kv_exchange_time)
from megatron_auto.cost.layer_cost import layer_cost
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.loaders import load_cluster
from megatron_auto.specs.model import model_from_dict
from megatron_auto.specs.presets import MODEL_PRESETS
from megatron_auto.specs.training import TrainingSpec

LLAMA = MODEL_PRESETS["llama3-70b"]  # 64 query heads, 8 key/value groups of 128
LAYER = LLAMA.layers[0]
H100 = load_cluster("dgx-h100-80gb", 2)
LOCAL = TrainingSpec(global_batch_size=64)
TE = replace(LOCAL, fused_norms=True)
CP4 = LayerStrategy(tp=2, dp=2, cp=4, zero=1, sp=True)
WINDOWED = {"num_layers": 4, "hidden_size": 2880, "num_attention_heads": 64, "num_query_groups": 8,
            "kv_channels": 64, "ffn_hidden_size": 2880, "swiglu": True, "seq_length": 32768, "vocab_size": 32768,
            "position_embedding_type": "rope", "normalization": "RMSNorm", "add_bias_linear": False,
            "window_size": [127, 0], "window_attn_skip_freq": 2}


def test_a2a_exchanges_each_ranks_q_k_v_and_output_both_ways_and_again_under_recompute():
    tokens = 8192 / 4  # a rank's share of one sequence
    qkv = 2 * tokens * (64 / 2 * 128 + 8 / 2 * 256)  # bf16: its TP shard's query heads, and K and V of its groups
    out = 2 * tokens * 64 / 2 * 128
    one_way = group_all_to_all_time(qkv, 4, 2, H100) + group_all_to_all_time(out, 4, 2, H100)
    assert qkvo_all_to_all_time(LAYER, 8192, 1, CP4, H100, 2, replayed=False) == pytest.approx(2 * one_way)
    assert qkvo_all_to_all_time(LAYER, 8192, 1, CP4, H100, 2, replayed=True) == pytest.approx(3 * one_way)
    a2a = replace(TE, cp_comm_type="a2a")
    assert layer_cost(LAYER, CP4, 1, 8192, H100, a2a).cp_comm_s == pytest.approx(2 * one_way)
    full = replace(CP4, recompute="full")
    assert layer_cost(LAYER, full, 1, 8192, H100, a2a).cp_comm_s == pytest.approx(3 * one_way)


def test_each_type_exchanges_what_runs_and_the_local_spec_gathers_whatever_the_type():
    word = 2
    gathered_once = kv_exchange_time(LAYER, 8192, 1, CP4, H100, word, gathers=1)
    for kind in ("p2p", "all_gather", "a2a"):  # the local spec's attention reads no cp_comm_type
        assert cp_exchange_time(LAYER, 8192, 1, CP4, H100, replace(LOCAL, cp_comm_type=kind), False) == gathered_once
    # TE's all_gather gathers K and V again in the backward (it keeps the local ones), and once more under recompute.
    all_gather = replace(TE, cp_comm_type="all_gather")
    assert cp_exchange_time(LAYER, 8192, 1, CP4, H100, all_gather, False) == \
        kv_exchange_time(LAYER, 8192, 1, CP4, H100, word, gathers=2)
    assert cp_exchange_time(LAYER, 8192, 1, CP4, H100, all_gather, True) == \
        kv_exchange_time(LAYER, 8192, 1, CP4, H100, word, gathers=3)
    assert cp_exchange_time(LAYER, 8192, 1, CP4, H100, TE, False) == \
        ring_kv_exchange_time(LAYER, 8192, 1, CP4, H100, TE, regather=False)
    # Only all_gather holds the whole sequence's K and V beside its core, and does not keep them.
    assert gathered_kv_transient_bytes(LAYER, 8192, 1, CP4, all_gather) == kv_bytes(LAYER, 8192, 1, CP4, word) > 0
    for spec in (TE, replace(TE, cp_comm_type="a2a"), replace(LOCAL, cp_comm_type="all_gather")):
        assert gathered_kv_transient_bytes(LAYER, 8192, 1, CP4, spec) == 0.0
    ring, gather = (layer_cost(LAYER, CP4, 1, 8192, H100, spec) for spec in (TE, all_gather))
    assert gather.activation_bytes == ring.activation_bytes
    assert gather.transient_bytes == pytest.approx(ring.transient_bytes + kv_bytes(LAYER, 8192, 1, CP4, word))


def test_the_ring_hides_what_the_all_gather_and_the_all_to_alls_leave_on_the_attentions_path():
    # Llama 3 70B at 64K tokens on two nodes, TP2 x CP8: the ring's transfers fit behind its core steps.
    strategy = LayerStrategy(tp=2, dp=1, cp=8, zero=1, sp=True)
    seconds = {kind: layer_cost(LAYER, strategy, 1, 65536, H100, replace(TE, cp_comm_type=kind)).cp_comm_s
               for kind in ("p2p", "all_gather", "a2a")}
    assert seconds["p2p"] < seconds["a2a"] and seconds["p2p"] < seconds["all_gather"]
    assert all(value > 0 for value in (seconds["a2a"], seconds["all_gather"]))


def test_transformer_engine_refuses_a_window_on_its_ring_and_heads_a2a_cannot_split():
    windowed = model_from_dict(WINDOWED)
    problem = cp_comm_problem(windowed, 1, 2, TE)
    assert "needs --cp-comm-type a2a or all_gather" in problem
    for kind in ("a2a", "all_gather"):
        assert cp_comm_problem(windowed, 1, 2, replace(TE, cp_comm_type=kind)) is None
    assert cp_comm_problem(windowed, 1, 2, LOCAL) is None  # the local spec's all-gather runs any window
    assert cp_comm_problem(windowed, 1, 1, TE) is None
    a2a = replace(TE, cp_comm_type="a2a")
    assert "8 query heads and 1 key/value groups over the 2" in cp_comm_problem(LLAMA, 8, 2, a2a)  # TP8 shard
    assert cp_comm_problem(LLAMA, 2, 4, a2a) is None and cp_comm_problem(LLAMA, 1, 8, a2a) is None
    assert cp_comm_problem(LLAMA, 8, 2, TE) is None  # the ring splits no heads


def test_an_unknown_type_is_refused_by_the_training_spec():
    with pytest.raises(ValueError, match="a2a\\+p2p is not priced"):
        TrainingSpec(global_batch_size=8, cp_comm_type="a2a+p2p")


def _estimate(path, *extra: str) -> list[str]:
    return ["estimate", "--model", str(path), "--cluster", "dgx-h100-80gb", "--num-nodes", "1",
            "--global-batch-size", "16", "--tp", "1", "--pp", "1", "--micro-batch-size", "1", *extra]


def test_estimate_writes_the_type_into_the_plans_flags_and_refuses_search(tmp_path, capsys):
    path = tmp_path / "oss.json"
    path.write_text(json.dumps(WINDOWED))
    times = {}
    for kind in ("a2a", "all_gather"):
        assert main(_estimate(path, "--cp", "4", "--cp-comm-type", kind, "--json")) == 0
        result = json.loads(capsys.readouterr().out)
        assert result["megatron_flags"][-2:] == ["--cp-comm-type", kind]
        times[kind] = result["breakdown"]["cp_comm_s"]
    assert times["a2a"] != times["all_gather"]
    assert main(_estimate(path, "--cp-comm-type", "a2a", "--json")) == 0  # no CP: no flag
    assert "--cp-comm-type" not in json.loads(capsys.readouterr().out)["megatron_flags"]
    assert main(_estimate(path, "--cp", "4", "--cp-comm-type", "search")) == 2
    err = capsys.readouterr().err
    assert "--cp-comm-type search is plan's choice" in err and err.count("\n") == 1


def _plan(path, *extra: str) -> list[str]:
    return ["plan", "--model", str(path), "--cluster", "dgx-h100-80gb", "--num-nodes", "1",
            "--global-batch-size", "16", *extra]


def test_plan_search_weighs_the_types_that_run_where_the_ring_cannot(tmp_path, capsys):
    path = tmp_path / "oss.json"
    path.write_text(json.dumps(WINDOWED))
    assert main(_plan(path, "--cp", "4")) == 2  # the ring with a window, pinned: one line, not "no plan fits"
    err = capsys.readouterr().err
    assert "needs --cp-comm-type a2a or all_gather" in err and err.count("\n") == 1
    assert main(_plan(path, "--cp", "4", "--cp-comm-type", "search", "--json")) == 0
    flags = json.loads(capsys.readouterr().out)["megatron_flags"]
    kind = flags[flags.index("--cp-comm-type") + 1]
    assert kind in ("a2a", "all_gather")
    estimates = {}
    for other in ("a2a", "all_gather"):
        assert main(_plan(path, "--cp", "4", "--cp-comm-type", other, "--json")) == 0
        estimates[other] = json.loads(capsys.readouterr().out)["iteration_time_s"]
    assert estimates[kind] == min(estimates.values())


@pytest.mark.parametrize("extra, fragment", [
    (("--transformer-impl", "local"), "the local spec's (--transformer-impl local) all-gathers"),
    (("--space", "hybrid"), "which the hybrid space does not plan"),
])
def test_plan_search_is_refused_where_no_type_changes_what_runs(tmp_path, capsys, extra, fragment):
    path = tmp_path / "oss.json"
    path.write_text(json.dumps(WINDOWED))
    assert main(_plan(path, "--cp-comm-type", "search", *extra)) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


def test_a_learnable_softmax_adds_a_weight_a_head_and_runs_under_cp_with_a2a_only(tmp_path, capsys):
    """GPT-OSS's sinks (Megatron-Core softmax_type learnable): one offset a head, core_attention.softmax_offset.
    Transformer Engine runs a softmax other than the vanilla one on its fused attention, under CP with a2a only
    (attn_forward_func_with_cp)."""
    sinks = model_from_dict({**WINDOWED, "softmax_type": "learnable"})
    plain = model_from_dict(WINDOWED)
    assert sinks.layers[0].num_parameters - plain.layers[0].num_parameters == 64
    for kind in ("p2p", "all_gather"):
        assert "learnable softmax under context parallelism needs --cp-comm-type a2a" in cp_comm_problem(
            sinks, 1, 2, replace(TE, cp_comm_type=kind))
    assert cp_comm_problem(sinks, 1, 2, replace(TE, cp_comm_type="a2a")) is None
    assert cp_comm_problem(model_from_dict({**WINDOWED, "softmax_type": "off-by-one"}), 1, 2, TE) is not None
    path = tmp_path / "oss.json"
    path.write_text(json.dumps({**WINDOWED, "softmax_type": "learnable"}))
    assert main(_plan(path, "--cp", "4", "--cp-comm-type", "search", "--json")) == 0
    flags = json.loads(capsys.readouterr().out)["megatron_flags"]
    assert flags[flags.index("--cp-comm-type") + 1] == "a2a"
    path.write_text(json.dumps({**WINDOWED, "softmax_type": "sinks"}))
    assert main(_plan(path)) == 2
    err = capsys.readouterr().err
    assert "softmax_type must be one of vanilla, off-by-one, learnable" in err and err.count("\n") == 1
