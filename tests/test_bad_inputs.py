"""Catalogue of bad inputs to plan, estimate and show: each exits 2 with one line on stderr.

Every case runs the command line in-process (megatron_auto.cli.main.main) with one
bad value in a model, cluster, plan or profile file, or on the command line, and
checks: exit status 2, exactly one line on stderr, no traceback, and that the
`--out` file written before is left as it was.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Callable

import pytest

from megatron_auto import serde
from megatron_auto.cli.main import main
from megatron_auto.limits import MAX_GLOBAL_BATCH, MAX_GPUS, MAX_LAYERS
from megatron_auto.specs.presets import CLUSTER_PRESETS

MODEL = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128}
CLUSTER = serde.to_dict(CLUSTER_PRESETS["cpu-gloo"])
A100 = serde.to_dict(CLUSTER_PRESETS["dgx-a100-80gb"])
LAYER = {"hidden_size": 64, "num_attention_heads": 4, "num_query_groups": 4, "ffn_hidden_size": 256}
CURVE = {"op": "all_reduce", "group_size": 2, "stride": 1, "inter_node": False,
         "message_bytes": [4096, 16384], "seconds": [1e-4, 3e-4]}
CLUSTER_PROFILE = {"kind": "cluster-profile", "name": "m", "backend": "gloo", "device": "cpu", "world_size": 2,
                   "gpus_per_node": 2, "curves": [CURVE]}
TIMING = {"tp": 1, "micro_batch": 1, "seq_length": 32, "forward_s": 1e-3, "backward_s": 2e-3,
          "attention_core_forward_s": 1e-4, "activation_bytes": 1000, "param_bytes": 1000}
MODEL_PROFILE = {"kind": "model-profile", "name": "m", "device": "cpu", "precision": "fp32",
                 "concurrent_processes": 2, "layers": [{"layer": LAYER, "timings": [TIMING]}]}
SENTINEL = "an earlier plan that a failed command must leave alone\n"


def edited(record: dict, path: str, value: object) -> dict:
    """A deep copy of `record` with the dotted `path` (list indices as digits) set to `value`."""
    record = copy.deepcopy(record)
    *parents, last = path.split(".")
    node = record
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    node[int(last) if isinstance(node, list) else last] = value
    return record


def text(record: object) -> str:
    """JSON as Python writes it: NaN and Infinity come out as the bare words json.loads accepts."""
    return json.dumps(record)


NON_UTF8 = b'{"num_layers": 2, "name": "caf\xe9"}'


@pytest.fixture(scope="module")
def plan_json(tmp_path_factory) -> dict:
    """A valid plan file's content, as `plan` writes it (tiny-gpt on 2 CPU processes)."""
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main(["plan", "--model", "tiny-gpt", "--cluster", "cpu-gloo", "--gpus-per-node", "2",
                 "--global-batch-size", "8", "--out", str(out)]) == 0
    return json.loads(out.read_text())


# (id, file kind, content: str | bytes | a function of the valid plan's dict, extra args)
MODEL_CASES = [
    ("model-not-utf8", NON_UTF8),
    ("model-not-json", '{"num_layers": 2,'),
    ("model-empty-file", ""),
    ("model-a-list", "[1, 2]"),
    ("model-nested-too-deep", "[" * 100_000),
    ("model-ffn-zero", text({**MODEL, "ffn_hidden_size": 0})),
    ("model-query-groups-zero", text({**MODEL, "num_query_groups": 0})),
    ("model-a-million-layers", text({**MODEL, "num_layers": 1_000_000})),
    ("model-layers-above-cap", text({**MODEL, "num_layers": MAX_LAYERS + 1})),
    ("model-zero-layers", text({**MODEL, "num_layers": 0})),
    ("model-negative-hidden", text({**MODEL, "hidden_size": -64})),
    ("model-fractional-heads", text({**MODEL, "num_attention_heads": 4.5})),
    ("model-nan-seq-length", text({**MODEL, "seq_length": float("nan")})),
    ("model-vocab-beyond-2-53", text({**MODEL, "vocab_size": 2**60})),
    ("model-rotary-base-zero", text({**MODEL, "rotary_base": 0})),
    ("model-name-a-number", text({**MODEL, "name": 7})),
    ("model-rich-too-many-layers", text({"seq_length": 32, "vocab_size": 128, "layers": [LAYER] * (MAX_LAYERS + 1)})),
    ("model-rich-layer-negative-ffn", text({"seq_length": 32, "vocab_size": 128,
                                            "layers": [{**LAYER, "ffn_hidden_size": -1}]})),
    ("model-moe-topk-above-experts", text({**MODEL, "num_experts": 2, "moe_router_topk": 3})),
    ("model-moe-experts-zero", text({**MODEL, "num_experts": 0})),
    ("model-moe-flag-without-experts", text({**MODEL, "moe_router_topk": 2})),
    ("model-moe-layer-freq-wrong-length", text({**MODEL, "num_experts": 4, "moe_layer_freq": [1, 1, 1]})),
    ("model-moe-layer-freq-not-0-1", text({**MODEL, "num_experts": 4, "moe_layer_freq": [1, 2]})),
    ("model-moe-layer-freq-zero", text({**MODEL, "num_experts": 4, "moe_layer_freq": 0})),
    ("model-moe-aux-coeff-nan", text({**MODEL, "num_experts": 4, "moe_aux_loss_coeff": float("nan")})),
    ("model-moe-balancing-unknown", text({**MODEL, "num_experts": 4, "moe_router_load_balancing_type": "x"})),
    ("model-rich-moe-topk-zero", text({"seq_length": 32, "vocab_size": 128,
                                       "layers": [{**LAYER, "moe": {"num_experts": 4, "router_topk": 0}}]})),
]
CLUSTER_CASES = [
    ("cluster-not-utf8", NON_UTF8),
    ("cluster-peak-flops-zero", text(edited(CLUSTER, "gpu.peak_flops", 0))),
    ("cluster-peak-flops-nan", text(edited(CLUSTER, "gpu.peak_flops", float("nan")))),
    ("cluster-peak-flops-inf", text(edited(CLUSTER, "gpu.peak_flops", float("inf")))),
    ("cluster-memory-bandwidth-zero", text(edited(CLUSTER, "gpu.memory_bandwidth_bytes_per_s", 0))),
    ("cluster-memory-negative", text(edited(CLUSTER, "gpu.memory_bytes", -1))),
    ("cluster-kernel-launch-negative", text(edited(CLUSTER, "gpu.kernel_launch_s", -1e-6))),
    ("cluster-intra-bandwidth-zero", text(edited(CLUSTER, "intra_node.bandwidth_bytes_per_s", 0))),
    ("cluster-inter-latency-negative", text(edited(CLUSTER, "inter_node.latency_s", -1e-5))),
    ("cluster-link-efficiency-zero", text(edited(CLUSTER, "intra_node.efficiency", 0))),
    ("cluster-link-efficiency-above-one", text(edited(CLUSTER, "inter_node.efficiency", 1.5))),
    ("cluster-max-fraction-zero", text(edited(CLUSTER, "compute.max_fraction", 0))),
    ("cluster-max-fraction-above-one", text(edited(CLUSTER, "compute.max_fraction", 2.0))),
    ("cluster-half-dim-nan", text(edited(CLUSTER, "compute.half_dim", float("nan")))),
    ("cluster-flash-fraction-zero", text(edited(CLUSTER, "compute.flash_fraction", 0))),
    # positive, so loaded, but the cost model's inf x 0 makes a NaN prediction
    ("cluster-peak-flops-tiny", text(edited(A100, "gpu.peak_flops", 1e-300))),
    ("cluster-gpus-per-node-zero", text(edited(CLUSTER, "gpus_per_node", 0))),
    ("cluster-too-many-gpus", text(edited(CLUSTER, "num_nodes", MAX_GPUS))),
    ("cluster-grad-overlap-above-one", text(edited(CLUSTER, "grad_overlap", 1.5))),
    ("cluster-framework-overhead-negative", text(edited(CLUSTER, "framework_overhead_bytes", -1))),
]
PROFILE_CASES = [
    ("profile-not-utf8", NON_UTF8),
    ("profile-curve-seconds-negative", text(edited(CLUSTER_PROFILE, "curves.0.seconds.0", -1e-4))),
    ("profile-curve-seconds-nan", text(edited(CLUSTER_PROFILE, "curves.0.seconds.1", float("nan")))),
    ("profile-curve-group-zero", text(edited(CLUSTER_PROFILE, "curves.0.group_size", 0))),
    ("profile-overlap-above-one", text(edited(CLUSTER_PROFILE, "grad_overlap_fraction", 3.0))),
    ("profile-step-overhead-negative", text(edited(CLUSTER_PROFILE, "step_overhead_s", -1.0))),
    ("profile-forward-inf", text(edited(MODEL_PROFILE, "layers.0.timings.0.forward_s", float("inf")))),
    ("profile-timing-tp-zero", text(edited(MODEL_PROFILE, "layers.0.timings.0.tp", 0))),
    ("profile-concurrent-zero", text(edited(MODEL_PROFILE, "concurrent_processes", 0))),
]
PLAN_CASES: list[tuple[str, Callable[[dict], str | bytes]]] = [
    ("plan-not-utf8", lambda plan: NON_UTF8),
    ("plan-world-size-zero", lambda plan: text(edited(plan, "world_size", 0))),
    ("plan-batch-negative", lambda plan: text(edited(plan, "global_batch_size", -8))),
    ("plan-batch-above-cap", lambda plan: text(edited(plan, "global_batch_size", MAX_GLOBAL_BATCH * 2))),
    ("plan-prediction-nan", lambda plan: text(edited(plan, "prediction.iteration_time_s", float("nan")))),
    ("plan-breakdown-negative", lambda plan: text(edited(plan, "prediction.breakdown.bubble_s", -1.0))),
    ("plan-layer-tp-zero", lambda plan: text(edited(plan, "chunks.0.layers.0.tp", 0))),
    ("plan-ep-on-a-dense-layer", lambda plan: text(edited(plan, "chunks.0.layers.0.ep", 2))),
    ("plan-layer-ep-zero", lambda plan: text(edited(plan, "chunks.0.layers.0.ep", 0))),
    ("plan-embedding-etp", lambda plan: text(edited(plan, "embedding.etp", 1))),
    ("plan-too-many-layers", lambda plan: text(edited(plan, "chunks.0.layers",
                                                      plan["chunks"][0]["layers"] * (MAX_LAYERS + 1)))),
]


def run_failing(argv: list[str], capsys, out: Path) -> str:
    """Run the CLI, expecting a user error; returns its one stderr line."""
    out.write_text(SENTINEL)
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        status = exit_.code
    stderr = capsys.readouterr().err
    assert status == 2, stderr
    assert "Traceback" not in stderr
    assert len(stderr.splitlines()) == 1 and stderr.endswith("\n"), stderr
    assert out.read_text() == SENTINEL  # a failed command leaves the earlier file alone
    return stderr


def write(path: Path, content: str | bytes) -> str:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


JOB = ["--global-batch-size", "8"]


@pytest.mark.parametrize("content", [c for _, c in MODEL_CASES], ids=[i for i, _ in MODEL_CASES])
def test_bad_model_file(tmp_path, capsys, content):
    model = write(tmp_path / "model.json", content)
    out = tmp_path / "plan.json"
    line = run_failing(["plan", "--model", model, "--cluster", "cpu-gloo", *JOB, "--out", str(out)], capsys, out)
    assert "model" in line


@pytest.mark.parametrize("content", [c for _, c in CLUSTER_CASES], ids=[i for i, _ in CLUSTER_CASES])
def test_bad_cluster_file(tmp_path, capsys, content):
    cluster = write(tmp_path / "cluster.json", content)
    out = tmp_path / "plan.json"
    line = run_failing(["plan", "--model", "tiny-gpt", "--cluster", cluster, *JOB, "--out", str(out)], capsys, out)
    assert "cluster" in line


@pytest.mark.parametrize("content", [c for _, c in PROFILE_CASES], ids=[i for i, _ in PROFILE_CASES])
def test_bad_profile_file(tmp_path, capsys, content):
    profile = write(tmp_path / "profile.json", content)
    out = tmp_path / "plan.json"
    line = run_failing(["estimate", "--model", "tiny-gpt", "--cluster", "cpu-gloo", "--gpus-per-node", "2", *JOB,
                        "--tp", "1", "--pp", "1", "--profile", profile, "--out", str(out)], capsys, out)
    assert "profile" in line


@pytest.mark.parametrize("make", [m for _, m in PLAN_CASES], ids=[i for i, _ in PLAN_CASES])
@pytest.mark.parametrize("command", ["show", "estimate"])
def test_bad_plan_file(tmp_path, capsys, plan_json, make, command):
    plan = write(tmp_path / "bad_plan.json", make(plan_json))
    out = tmp_path / "plan.json"
    argv = ["show", plan] if command == "show" else ["estimate", "--plan", plan, "--out", str(out)]
    line = run_failing(argv, capsys, out)
    assert "plan" in line


CLI_CASES = [
    ("num-nodes-above-cap", ["plan", "--model", "tiny-gpt", "--cluster", "dgx-a100-80gb",
                             "--num-nodes", str(MAX_GPUS // 8 + 1), *JOB]),
    ("gpus-per-node-above-cap", ["plan", "--model", "tiny-gpt", "--cluster", "cpu-gloo",
                                 "--gpus-per-node", str(MAX_GPUS + 1), *JOB]),
    ("batch-above-cap", ["plan", "--model", "tiny-gpt", "--cluster", "cpu-gloo",
                         "--global-batch-size", str(MAX_GLOBAL_BATCH + 1)]),
    ("estimate-batch-above-cap", ["estimate", "--model", "tiny-gpt", "--cluster", "cpu-gloo", "--tp", "1",
                                  "--pp", "1", "--global-batch-size", str(MAX_GLOBAL_BATCH + 1)]),
    ("memory-budget-nan", ["plan", "--model", "tiny-gpt", "--cluster", "cpu-gloo", *JOB,
                           "--memory-budget-gib", "nan"]),
    ("memory-budget-below-a-byte", ["plan", "--model", "tiny-gpt", "--cluster", "cpu-gloo", *JOB,
                                    "--memory-budget-gib", "1e-300"]),
    ("moe-load-imbalance-below-one", ["plan", "--model", "tiny-mixtral", "--cluster", "cpu-gloo", *JOB,
                                      "--moe-load-imbalance", "0.5"]),
    ("moe-dispatcher-unknown", ["plan", "--model", "tiny-mixtral", "--cluster", "cpu-gloo", *JOB,
                                "--moe-token-dispatcher-type", "deepep"]),
    ("ep-on-a-dense-model", ["estimate", "--model", "tiny-gpt", "--cluster", "cpu-gloo", "--gpus-per-node", "2",
                             "--tp", "1", "--pp", "1", "--ep", "2", *JOB]),
    ("ep-not-dividing-experts", ["estimate", "--model", "tiny-mixtral", "--cluster", "cpu-gloo",
                                 "--gpus-per-node", "8", "--tp", "1", "--pp", "1", "--ep", "8", *JOB]),
    ("etp-not-dividing-the-stage", ["plan", "--model", "tiny-mixtral", "--cluster", "cpu-gloo", "--gpus-per-node",
                                    "4", "--etp", "8", *JOB]),
]


@pytest.mark.parametrize("argv", [a for _, a in CLI_CASES], ids=[i for i, _ in CLI_CASES])
def test_bad_command_line_value(tmp_path, capsys, argv):
    out = tmp_path / "plan.json"
    run_failing([*argv, "--out", str(out)], capsys, out)


@pytest.mark.parametrize("flag", ["--model", "--cluster", "--profile"])
@pytest.mark.parametrize("problem", ["missing", "a-directory"])
def test_unreadable_file(tmp_path, capsys, flag, problem):
    path = tmp_path / "input.json"
    if problem == "a-directory":
        path.mkdir()
    argv = {"--model": "tiny-gpt", "--cluster": "cpu-gloo", flag: str(path)}
    out = tmp_path / "plan.json"
    line = run_failing(["plan", *[x for pair in argv.items() for x in pair], *JOB, "--out", str(out)], capsys, out)
    assert "cannot read" in line and str(path) in line


def test_sequence_parallel_at_tp_1_is_turned_off_with_one_warning(capsys):
    """Megatron-LM (arguments.py) disables SP when TP is 1 and warns; so does estimate."""
    argv = ["estimate", "--model", "tiny-gpt", "--cluster", "cpu-gloo", "--gpus-per-node", "2", *JOB,
            "--tp", "1", "--pp", "1", "--micro-batch-size", "1", "--virtual-stages", "1", "--json"]
    assert main([*argv, "--sequence-parallel"]) == 0
    with_sp = capsys.readouterr()
    assert main(argv) == 0
    without_sp = capsys.readouterr()
    warnings = with_sp.err.splitlines()
    assert len(warnings) == 1 and "sequence-parallel" in warnings[0] and "Traceback" not in with_sp.err
    assert without_sp.err == ""
    assert json.loads(with_sp.out) == json.loads(without_sp.out)
