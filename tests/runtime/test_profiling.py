"""profile-cluster, profile-model and validation/validate_cost_model.py end to end on tiny sizes.

Every launch holds /tmp/megatron-auto-heavy.lock, as all heavy jobs here do, unless the
test run itself holds it already (validation/heavy_lock.py: a nested flock would wait forever).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from validation.launcher import REPO, free_port, rank_env, run_script

from megatron_auto.specs.profiles import COLLECTIVES, load_profile
from validation.heavy_lock import held_lock_fds, lock_prefix


def _torchrun(ranks: int, args: list[str], port: int) -> subprocess.CompletedProcess:
    command = [*lock_prefix(), sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
               "--master_port", str(port), "-m", "megatron_auto", *args]
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "MEGATRON_AUTO_PROGRESS": "1"}
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, env=env,
                          pass_fds=held_lock_fds())


def test_profile_cluster_on_two_ranks_writes_every_collective(tmp_path):
    out = tmp_path / "cluster.json"
    done = _torchrun(2, ["profile-cluster", "--out", str(out), "--min-bytes", "1024", "--max-bytes", "16384",
                         "--iters", "2"], 29561)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "profiling collectives [" in done.stderr or "wrote" in done.stderr
    profile = load_profile(str(out))
    assert {c.op for c in profile.curves} == set(COLLECTIVES)
    assert profile.world_size == 2 and profile.backend == "gloo"
    for curve in profile.curves:
        assert curve.message_bytes == (1024, 4096, 16384) and all(s > 0 for s in curve.seconds)
    assert 0.0 <= profile.grad_overlap_fraction <= 1.0


def test_profile_model_measures_each_tp_shard(tmp_path):
    out = tmp_path / "model.json"
    done = _torchrun(1, ["profile-model", "--model", "tiny-gpt", "--out", str(out), "--tp", "1", "2",
                         "--micro-batch-size", "1", "2", "--iters", "2"], 29562)
    assert done.returncode == 0, done.stderr[-3000:]
    profile = load_profile(str(out))
    timings = {(t.tp, t.micro_batch): t for t in profile.layers[0].timings}
    assert set(timings) == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert all(t.forward_s > 0 and t.backward_s > 0 and t.attention_core_forward_s > 0 for t in timings.values())
    # The TP shard holds half the matmul weights (LayerNorms and row-parallel biases stay whole).
    assert timings[(2, 1)].param_bytes < 0.6 * timings[(1, 1)].param_bytes
    # Saved activations grow with the micro-batch.
    assert timings[(1, 2)].activation_bytes > 1.8 * timings[(1, 1)].activation_bytes
    assert profile.optimizer_s_per_state_byte > 0


@pytest.mark.parametrize("backend, port", [("unfused", 29563), ("flash", 29564)])
def test_profile_model_measures_grouped_query_attention_on_either_core(tmp_path, backend, port):
    out = tmp_path / "model.json"
    done = _torchrun(1, ["profile-model", "--model", "tiny-llama", "--out", str(out), "--tp", "1", "2",
                         "--micro-batch-size", "1", "--iters", "1", "--attention-backend", backend], port)
    assert done.returncode == 0, done.stderr[-3000:]
    timings = load_profile(str(out)).layers[0].timings
    assert [t.tp for t in timings] == [1, 2] and all(t.attention_core_forward_s > 0 for t in timings)


def test_validation_pipeline_on_two_ranks(tmp_path):
    done = subprocess.run([sys.executable, "-m", "validation.validate_cost_model", "--tiny", "--out-dir",
                           str(tmp_path), "--results", str(tmp_path / "r.json"), "--benchmarks", str(tmp_path / "b.md")],
                          cwd=REPO, capture_output=True, text=True, timeout=300, pass_fds=held_lock_fds())
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "r.json").read_text())
    assert len(results["rows"]) == 2 and any("planner pick" in r["name"] for r in results["rows"])
    assert all(r["measured_s"] > 0 and r["measured_bytes"] > 0 for r in results["rows"])
    assert (tmp_path / "cost_model_validation.png").stat().st_size > 1000
    assert "Cost model: predicted vs measured" in (tmp_path / "b.md").read_text()


def test_profile_model_builds_the_layer_in_bf16(tmp_path):
    from megatron_auto.specs.loaders import load_model

    out = tmp_path / "model_bf16.json"
    done = _torchrun(1, ["profile-model", "--model", "tiny-gpt", "--out", str(out), "--tp", "1",
                         "--micro-batch-size", "1", "--iters", "1", "--precision", "bf16"], 29563)
    assert done.returncode == 0, done.stderr[-3000:]
    profile = load_profile(str(out))
    timing = profile.layers[0].timings[0]
    assert profile.precision == "bf16" and timing.forward_s > 0 and timing.backward_s > 0
    # Every weight (LayerNorms too) in 2 bytes, as Megatron-LM's Float16Module casts the model.
    assert timing.param_bytes == 2 * load_model("tiny-gpt").layers[0].num_parameters


_BASE = dict(num_layers=1, hidden_size=64, num_attention_heads=4, seq_length=16, vocab_size=128)
_LLAMA = dict(_BASE, num_query_groups=2, swiglu=True, normalization="RMSNorm", add_bias_linear=False,
              position_embedding_type="rope", rotary_base=500000, ffn_hidden_size=128)
_LAYER_CASES = [
    dict(name="gpt-flash", model=_BASE, attention="flash", precision="bf16"),
    dict(name="gpt-unfused-fp32", model=_BASE, attention="unfused", precision="fp32"),
    dict(name="llama-rope-flash", model=_LLAMA, attention="flash", precision="bf16"),
    dict(name="llama-rope-unfused-half-rotary", model=_LLAMA, attention="unfused", precision="bf16",
         rotary_percent=0.5),
    dict(name="qwen-qkv-bias-qk-norm", model=dict(_LLAMA, add_qkv_bias=True, qk_layernorm=True,
                                                   apply_layernorm_1p=True), attention="flash", precision="bf16"),
]


@pytest.fixture(scope="module")
def layer_traces(tmp_path_factory) -> dict:
    from validation.launcher import run_cases

    return run_cases(tmp_path_factory.mktemp("layer_bench"), 1, "layer_bench_worker.py", _LAYER_CASES, 300)


@pytest.mark.parametrize("name", [case["name"] for case in _LAYER_CASES])
def test_profile_model_times_the_layer_that_training_runs(layer_traces, name):
    """profile-model's layer (profiling/layer_bench.py) holds the runtime's parameters and dispatches the
    runtime's aten ops, in order, forward and backward: its norms, biases, RoPE and core attention alike.
    (It used to build every layer with LayerNorm and linear biases and without RoPE.)"""
    runtime, bench = layer_traces[name]["runtime"], layer_traces[name]["bench"]
    assert bench["params"] == runtime["params"]
    assert bench["forward"] == runtime["forward"]
    assert bench["backward"] == runtime["backward"]
    if "rope" in name:  # the rotation runs in the layer (GPTModel hands each layer the table)
        assert "cos" in runtime["forward"] and "sin" in runtime["forward"]
    if name.startswith("llama"):
        assert not any(p[0].endswith(".bias") for p in runtime["params"])


def _profile_model_alone(args: list[str], fresh: bool = False) -> subprocess.CompletedProcess:
    """profile-model in one process without torchrun (it then runs as a world of one); forked from the
    launcher's fork server unless `fresh` (a refusal's "one line and nothing more" needs the interpreter's exit)."""
    return run_script(["-m", "megatron_auto", "profile-model", *args],
                      {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONWARNINGS": "ignore"}, 300, fresh)


def test_profile_model_times_the_dense_layers_of_a_moe_model_with_the_runs_kernels(tmp_path):
    from megatron_auto.specs.loaders import load_model

    out = tmp_path / "moe.json"
    done = _profile_model_alone(["--model", "tiny-deepseek-moe", "--out", str(out), "--tp", "1",
                                 "--micro-batch-size", "1", "--iters", "1", "--grad-accumulation-fusion", "on",
                                 "--attention-backend", "flash"])
    assert done.returncode == 0, done.stderr[-3000:]
    measuring = next(line for line in done.stderr.splitlines() if line.startswith("measuring kernels:"))
    assert "core attention torch SDPA (flash)" in measuring and "accumulation fusion on" in measuring
    assert "mixture-of-experts layers are not timed" in done.stderr
    dense = [layer for layer in load_model("tiny-deepseek-moe").layers if layer.moe is None]
    assert [entry.layer for entry in load_profile(str(out)).layers] == dense[:1]


def test_profile_model_refuses_a_model_without_dense_layers_in_one_line(tmp_path):
    done = _profile_model_alone(["--model", "tiny-mixtral", "--out", str(tmp_path / "m.json"), "--tp", "1"], fresh=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0 and "mixture of experts" in done.stderr
    assert not (tmp_path / "m.json").exists()


def test_count_host_ops_prints_each_layer_and_core():
    """validation/count_host_ops.py: one row per shape and core; SDPA's flash core dispatches a fraction of the
    unfused core's ops (its scores, softmax and dropout stay inside one kernel)."""
    done = run_script(["-m", "validation.count_host_ops"], {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                                            "PYTHONWARNINGS": "ignore", "MASTER_PORT": "29574"}, 300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split(" | ") for line in done.stdout.splitlines()[2:]]
    assert [(row[0].lstrip("| "), row[1]) for row in rows] == [
        (shape, core) for shape in ("GPT", "LLaMA-style (RMSNorm, SwiGLU, RoPE, GQA)") for core in ("unfused", "flash")]
    ops = {(row[0].lstrip("| "), row[1]): [int(n) for part in row[2:] for n in part.strip(" |").split(" / ")]
           for row in rows}
    for shape in ("GPT", "LLaMA-style (RMSNorm, SwiGLU, RoPE, GQA)"):
        unfused, flash = ops[(shape, "unfused")], ops[(shape, "flash")]
        assert flash[2] < unfused[2] / 2 and flash[0] < unfused[0]


def test_the_moe_and_mla_host_op_constants_are_the_counts_of_megatron_core():
    """cost/moe.py's and cost/layer_kernels.py's op counts are what validation/count_moe_host_ops.py counts now."""
    from megatron_auto.cost.layer_kernels import MLA_HOST_OPS
    from megatron_auto.cost.moe import (HOST_OPS_GROUPED_FC2_BIAS, HOST_OPS_PREPROCESS, HOST_OPS_ROUTED,
                                        HOST_OPS_ROUTER)

    done = run_script(["-m", "validation.count_moe_host_ops"], {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                                                "PYTHONWARNINGS": "ignore", "MASTER_PORT": "29575"}, 300)
    assert done.returncode == 0, done.stderr[-3000:]
    numbers = [[int(n) for n in re.findall(r"\d+", line)] for line in done.stdout.splitlines()]
    table = {dispatcher: [row for row, line in zip(numbers, done.stdout.splitlines()) if f"| {dispatcher} |" in line]
             for dispatcher in HOST_OPS_ROUTED}
    for dispatcher, (forward, per_forward, backward, per_backward) in HOST_OPS_ROUTED.items():
        four, eight, base = table[dispatcher]
        assert four == [4, forward + 4 * per_forward, backward + 4 * per_backward, *HOST_OPS_ROUTER,
                        HOST_OPS_PREPROCESS[dispatcher]]
        assert eight[:3] == [8, forward + 8 * per_forward, backward + 8 * per_backward]
        assert base == [forward, per_forward, backward, per_backward]
    bias = next(row for row, line in zip(numbers, done.stdout.splitlines()) if "_apply_bias" in line)
    forward, per_forward, backward, per_backward = HOST_OPS_GROUPED_FC2_BIAS
    assert bias == [4, forward + 4 * per_forward, backward + 4 * per_backward,
                    8, forward + 8 * per_forward, backward + 8 * per_backward]
    layers = {line.split(" | ")[0].lstrip("| "): row[-2:] for row, line in zip(numbers, done.stdout.splitlines())
              if "attention |" in line or "MLA" in line}
    standard = layers["standard attention"]
    assert [a - b for a, b in zip(layers["MLA with q_lora_rank"], standard)] == list(MLA_HOST_OPS[True])
    assert [a - b for a, b in zip(layers["MLA without"], standard)] == list(MLA_HOST_OPS[False])


def test_layer_memory_check_matches_the_formula_on_the_cpu(tmp_path):
    """validation/check_layer_memory.py, which a GPU session runs (gpu_session.sh memory), exactly on the CPU."""
    out = tmp_path / "layer_memory.json"
    done = run_script(["-m", "validation.check_layer_memory", "--out", str(out)], rank_env(0, 1, free_port()), 300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 5 and all(row["measured_bytes"] == row["predicted_bytes"] for row in rows), rows
