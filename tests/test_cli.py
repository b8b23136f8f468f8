"""The `megatron-auto` command line, run as a subprocess: happy paths, JSON keys, plan files, errors."""
from __future__ import annotations

import ast
import re
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_auto import serde
from megatron_auto.errors import UserError
from megatron_auto.specs.presets import CLUSTER_PRESETS

REPO = Path(__file__).resolve().parents[1]
CONTRACT_KEYS = {"iteration_time_s", "tflops_per_gpu", "peak_memory_gib", "fits"}
TINY = ["--model", "tiny-gpt-8l", "--cluster", "cpu-gloo", "--global-batch-size", "16"]


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "MEGATRON_AUTO_PROGRESS": "0"}
    return subprocess.run([sys.executable, "-m", "megatron_auto", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def ok(*args: str) -> subprocess.CompletedProcess:
    result = run_cli(*args)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result


def ok_json(*args: str) -> dict:
    return json.loads(ok(*args, "--json").stdout)


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit 2, exactly one line on stderr, no traceback, nothing on stdout."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stderr.endswith("\n") and result.stderr.count("\n") == 1, result.stderr
    assert result.stdout == ""
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


@pytest.fixture
def cluster_file(tmp_path: Path) -> Path:
    """A 2-node x 2-GPU cluster written as JSON, the way a user would describe their own."""
    data = serde.to_dict(CLUSTER_PRESETS["dgx-a100-80gb"])
    data.update(name="two-by-two", num_nodes=2, gpus_per_node=2)
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    """A model in Megatron's compact form."""
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
                                "seq_length": 32, "vocab_size": 128}))
    return path


# ---------------------------------------------------------------- estimate

def test_estimate_json_has_contract_keys_and_reports_what_it_picked():
    data = ok_json("estimate", *TINY, "--tp", "2", "--pp", "2")
    assert CONTRACT_KEYS <= data.keys()
    assert isinstance(data["fits"], bool) and data["fits"]
    assert data["iteration_time_s"] > 0 and data["tflops_per_gpu"] > 0 and data["peak_memory_gib"] > 0
    assert set(data["picked"]) == {"micro_batch_size", "virtual_stages"}
    assert data["picked"]["micro_batch_size"] == data["micro_batch_size"]
    assert data["plan"]["pipeline_parallel"] == 2
    assert "--tensor-model-parallel-size" in data["megatron_flags"]


def test_estimate_with_every_flag_given_picks_nothing():
    data = ok_json("estimate", *TINY, "--tp", "2", "--pp", "2", "--dp", "2", "--micro-batch-size", "2",
                   "--virtual-stages", "2", "--recompute", "full", "--sequence-parallel",
                   "--distributed-optimizer")
    assert data["picked"] == {}
    assert (data["micro_batch_size"], data["virtual_stages"], data["num_micro_batches"]) == (2, 2, 4)
    flags = data["megatron_flags"]
    assert "--sequence-parallel" in flags and "--use-distributed-optimizer" in flags
    assert flags[flags.index("--recompute-granularity") + 1] == "full"


def test_estimate_table_names_the_pick_and_the_megatron_flags():
    out = ok("estimate", *TINY, "--tp", "2", "--pp", "2", "--micro-batch-size", "1").stdout
    assert out.startswith("picked virtual stages ")
    assert "iteration time" in out and "megatron-lm flags" in out
    assert "--tensor-model-parallel-size 2" in out and "--micro-batch-size 1" in out


def chunk_layers(data: dict) -> list[int]:
    return [len(chunk["layers"]) for chunk in data["plan"]["chunks"]]


def test_estimate_prices_megatron_lms_first_and_last_stage_sizes():
    job = ["estimate", "--model", "gpt3-1.7b", "--cluster", "dgx-a100-80gb", "--global-batch-size", "32",
           "--tp", "2", "--pp", "4", "--micro-batch-size", "1"]
    uneven = ok_json(*job, "--decoder-first-pipeline-num-layers", "4", "--decoder-last-pipeline-num-layers", "4")
    even = ok_json(*job, "--virtual-stages", "1")
    # 24 layers: 4 and 4 at the ends, the 16 others evenly over the 2 middle stages; one chunk per stage
    # is all Megatron builds for unequal stages.
    assert chunk_layers(uneven) == [4, 8, 8, 4] and chunk_layers(even) == [6] * 4
    assert uneven["picked"] == {"virtual_stages": 1}
    assert uneven["iteration_time_s"] > even["iteration_time_s"]  # the middle stages carry 8 layers, not 6
    flags = uneven["megatron_flags"]
    assert flags[flags.index("--decoder-first-pipeline-num-layers") + 1] == "4"
    assert flags[flags.index("--decoder-last-pipeline-num-layers") + 1] == "4"


def test_estimate_prices_the_splits_that_count_the_embedding_and_the_loss():
    job = ["estimate", "--model", "gpt3-3.6b", "--cluster", "dgx-a100-80gb", "--num-nodes", "2",
           "--global-batch-size", "64", "--tp", "2", "--pp", "4", "--micro-batch-size", "1",
           "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    # 30 layers + 2 counted = 32: 8 per stage; in chunks of 4 the first and the last hold 3.
    interleaved = ok_json(*job, "--virtual-stages", "2")
    assert chunk_layers(interleaved) == [3, 4, 4, 4, 4, 4, 4, 3]
    flags = interleaved["megatron_flags"]
    assert flags[flags.index("--num-layers-per-virtual-pipeline-stage") + 1] == "4"
    assert "--account-for-embedding-in-pipeline-split" in flags and "--account-for-loss-in-pipeline-split" in flags
    # Without interleaving the same flags make the first and the last stage one layer short.
    assert chunk_layers(ok_json(*job, "--virtual-stages", "1")) == [7, 8, 8, 7]
    picked = ok_json(*job)
    assert picked["picked"]["virtual_stages"] in (1, 2, 4, 8)
    assert picked["iteration_time_s"] == min(ok_json(*job, "--virtual-stages", str(v))["iteration_time_s"]
                                             for v in (1, 2, 4))  # chunks of 1 would leave the ends empty


def test_estimate_prices_a_pipeline_layout_as_the_split_flags_it_spells():
    job = ["estimate", "--model", "gpt3-3.6b", "--cluster", "dgx-a100-80gb", "--num-nodes", "2",
           "--global-batch-size", "64", "--tp", "2", "--pp", "4", "--micro-batch-size", "1"]
    counted = ok_json(*job, "--virtual-stages", "2", "--account-for-embedding-in-pipeline-split",
                      "--account-for-loss-in-pipeline-split")
    spelled = ok_json(*job, "--pipeline-model-parallel-layout", "Et*3|(t*4|)*6,t*3L")
    assert chunk_layers(spelled) == [3, 4, 4, 4, 4, 4, 4, 3] and spelled["picked"] == {}
    assert spelled["iteration_time_s"] == counted["iteration_time_s"]
    assert spelled["megatron_flags"] == counted["megatron_flags"]  # written back as the split flags
    odd = ok_json(*job, "--pipeline-model-parallel-layout", "Et*2|t*5|t*3|t*4|(t*4|)*3,t*4L")
    assert chunk_layers(odd) == [2, 5, 3, 4, 4, 4, 4, 4]
    flags = odd["megatron_flags"]
    assert flags[flags.index("--pipeline-model-parallel-layout") + 1] == "Et*2|t*5|t*3|t*4|t*4|t*4|t*4|t*4L"


def test_estimate_prices_a_layout_whose_chunks_hold_only_the_embedding_or_the_loss():
    """Megatron-Core builds a chunk without decoder layers (the embedding, MTP or loss alone); estimate prices the
    layout as written and writes it back; the runtime refuses the plan in one line (it builds every chunk with a
    decoder layer)."""
    from megatron_auto.plan import Plan
    from megatron_auto.runtime.layout import layout_from_plan

    job = ["estimate", "--model", "gpt3-3.6b", "--cluster", "dgx-a100-80gb", "--num-nodes", "2",
           "--global-batch-size", "64", "--tp", "2", "--pp", "4", "--micro-batch-size", "1"]
    data = ok_json(*job, "--pipeline-model-parallel-layout", "E|(t*4|)*6,t*6L")
    assert chunk_layers(data) == [0, 4, 4, 4, 4, 4, 4, 6] and data["picked"] == {}
    flags = data["megatron_flags"]
    assert flags[flags.index("--pipeline-model-parallel-layout") + 1] == "E|t*4|t*4|t*4|t*4|t*4|t*4|t*6L"
    assert data["stage_time_s"][0] < data["stage_time_s"][3]  # stage 0: the embedding and 4 layers; 3: 10 and the head
    with pytest.raises(UserError, match="chunk 0 holds no decoder layer"):
        layout_from_plan(serde.from_dict(Plan, data["plan"]))


def test_estimate_memory_budget_is_reported_and_can_fail_to_fit():
    data = ok_json("estimate", *TINY, "--tp", "2", "--pp", "2", "--micro-batch-size", "1",
                   "--virtual-stages", "1", "--memory-budget-gib", "0.01")
    assert data["memory_budget_gib"] == pytest.approx(0.01)
    assert data["fits"] is False


def test_estimate_reads_model_and_cluster_files(model_file, cluster_file):
    data = ok_json("estimate", "--model", str(model_file), "--cluster", str(cluster_file),
                   "--global-batch-size", "8", "--tp", "2", "--pp", "2")
    assert data["world_size"] == 4 and CONTRACT_KEYS <= data.keys()
    data = ok_json("estimate", "--model", str(model_file), "--cluster", str(cluster_file), "--num-nodes", "4",
                   "--global-batch-size", "8", "--tp", "2", "--pp", "2")
    assert data["world_size"] == 8


def test_estimate_175b_on_1024_gpus_matches_the_contract_example():
    data = ok_json("estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--num-nodes", "128",
                   "--global-batch-size", "1536", "--tp", "8", "--pp", "16", "--recompute", "full")
    assert data["fits"] and data["world_size"] == 1024
    assert 50 < data["tflops_per_gpu"] < 312


# ---------------------------------------------------------------- plan files: show, estimate --plan

def test_plan_file_round_trips_through_show_and_estimate(tmp_path):
    path = tmp_path / "plan.json"
    written = ok_json("estimate", *TINY, "--tp", "2", "--pp", "2", "--out", str(path))
    assert json.loads(path.read_text()) == written["plan"]
    assert not (tmp_path / "plan.json.tmp").exists()
    table = ok("show", str(path)).stdout
    assert "pipeline parallel   2" in table and "layers" in table and "iteration time" in table
    assert ok("show", str(path), "--json").stdout == path.read_text()
    rescored = ok_json("estimate", "--plan", str(path))
    assert rescored["iteration_time_s"] == pytest.approx(written["iteration_time_s"], rel=1e-12)
    assert rescored["plan"] == written["plan"]


def test_estimate_plan_takes_model_and_cluster_from_flags(tmp_path):
    path = tmp_path / "plan.json"
    ok("estimate", *TINY, "--tp", "2", "--pp", "2", "--out", str(path))
    data = json.loads(path.read_text())
    data.update(model=None, cluster="")
    path.write_text(json.dumps(data))
    assert_user_error(run_cli("estimate", "--plan", str(path)), "--model")
    assert_user_error(run_cli("estimate", "--plan", str(path), "--model", "tiny-gpt-8l"), "--cluster")
    scored = ok_json("estimate", "--plan", str(path), "--model", "tiny-gpt-8l", "--cluster", "cpu-gloo")
    assert CONTRACT_KEYS <= scored.keys()


def test_estimate_plan_asks_for_the_cluster_when_its_name_is_no_preset(tmp_path, model_file, cluster_file):
    path = tmp_path / "plan.json"
    ok("estimate", "--model", str(model_file), "--cluster", str(cluster_file), "--global-batch-size", "8",
       "--tp", "2", "--pp", "2", "--out", str(path))
    assert_user_error(run_cli("estimate", "--plan", str(path)), "'two-by-two'", "give --cluster")
    assert ok_json("estimate", "--plan", str(path), "--cluster", str(cluster_file))["world_size"] == 4


def test_estimate_plan_sizes_the_cluster_to_the_plan(tmp_path):
    path = tmp_path / "plan.json"
    ok("estimate", "--model", "gpt3-175b", "--cluster", "dgx-a100-80gb", "--num-nodes", "128",
       "--global-batch-size", "1536", "--tp", "8", "--pp", "16", "--micro-batch-size", "1",
       "--virtual-stages", "1", "--recompute", "full", "--out", str(path))
    assert ok_json("estimate", "--plan", str(path))["world_size"] == 1024


# ---------------------------------------------------------------- plan (needs megatron_auto.search.search_plan)

def test_plan_json_has_contract_keys_and_search_time(tmp_path):
    data = ok_json("plan", *TINY)
    assert CONTRACT_KEYS | {"search_time_s", "candidates_evaluated", "plan"} <= data.keys()
    assert data["fits"] is True and data["search_time_s"] >= 0
    assert data["plan"]["space"] == "megatron" and data["megatron_flags"]


def test_plan_table_and_out_file_round_trip(tmp_path):
    path = tmp_path / "plan.json"
    result = ok("plan", *TINY, "--out", str(path))
    assert "pipeline parallel" in result.stdout and "megatron-lm flags" in result.stdout
    assert ok("show", str(path)).stdout == result.stdout
    stored = json.loads(path.read_text())["prediction"]
    rescored = ok_json("estimate", "--plan", str(path))
    assert rescored["iteration_time_s"] == pytest.approx(stored["iteration_time_s"], rel=1e-9)


def test_plan_output_is_byte_identical_for_identical_inputs(tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    out_a = ok("plan", *TINY, "--out", str(first)).stdout
    out_b = ok("plan", *TINY, "--out", str(second)).stdout
    assert first.read_bytes() == second.read_bytes()
    assert out_a == out_b


def test_plan_hybrid_space_is_no_slower_than_megatron():
    megatron = ok_json("plan", *TINY)
    hybrid = ok_json("plan", *TINY, "--space", "hybrid")
    assert hybrid["plan"]["space"] in ("hybrid", "megatron")
    assert hybrid["iteration_time_s"] <= megatron["iteration_time_s"] * (1 + 1e-9)


def test_plan_on_a_cluster_file(model_file, cluster_file):
    data = ok_json("plan", "--model", str(model_file), "--cluster", str(cluster_file), "--global-batch-size", "8")
    assert data["world_size"] == 4 and data["fits"]


def test_plan_with_impossible_budget_reports_the_minimum():
    result = run_cli("plan", *TINY, "--memory-budget-gib", "0.001")
    assert_user_error(result, "GiB")


# ---------------------------------------------------------------- user errors: exit 2, one line

def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _wrong_version_plan(tmp_path: Path) -> str:
    path = tmp_path / "good.json"
    ok("estimate", *TINY, "--tp", "2", "--pp", "2", "--out", str(path))
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    return _write(tmp_path, "v99.json", json.dumps(data))


ERROR_CASES = {
    "unknown model preset": (["estimate", "--model", "gpt5", "--cluster", "cpu-gloo", "--global-batch-size", "8",
                              "--tp", "1", "--pp", "1"], ["unknown model preset 'gpt5'"]),
    "unknown cluster preset": (["estimate", "--model", "tiny-gpt", "--cluster", "tpu", "--global-batch-size", "8",
                                "--tp", "1", "--pp", "1"], ["unknown cluster preset 'tpu'"]),
    "heads not divisible by tp": (["estimate", "--model", "tiny-gpt", "--cluster", "cpu-gloo",
                                   "--global-batch-size", "8", "--tp", "8", "--pp", "1"], ["tp=8", "heads"]),
    "tp x pp does not divide the world": (["estimate", *TINY, "--tp", "3", "--pp", "1"], ["world size 8"]),
    "dp does not match the world": (["estimate", *TINY, "--tp", "2", "--pp", "2", "--dp", "4"], ["--dp 4"]),
    "batch does not split": (["estimate", *TINY, "--tp", "2", "--pp", "2", "--micro-batch-size", "3"], ["batch"]),
    "estimate without tp": (["estimate", *TINY, "--pp", "2"], ["--tp"]),
    "plan missing required flags": (["plan", "--model", "tiny-gpt"], ["required", "--cluster"]),
    "bad integer": (["estimate", *TINY, "--tp", "two", "--pp", "1"], ["--tp", "'two'"]),
    "non-positive nodes": (["plan", *TINY, "--num-nodes", "0"], ["--num-nodes"]),
    "negative budget": (["plan", *TINY, "--memory-budget-gib", "-3"], ["--memory-budget-gib"]),
    "bad space": (["plan", *TINY, "--space", "galaxy"], ["--space", "galaxy"]),
    "unknown subcommand": (["train"], ["invalid choice"]),
    "no subcommand": ([], ["required"]),
    "unknown flag": (["estimate", *TINY, "--tp", "1", "--pp", "1", "--frobnicate"], ["--frobnicate"]),
    "missing plan file": (["show", "/nonexistent/plan.json"], ["cannot read plan file"]),
    "layout flags with --plan": (["estimate", "--plan", "x.json", "--tp", "2"], ["--tp", "--plan"]),
    "split flags with --plan": (["estimate", "--plan", "x.json", "--account-for-loss-in-pipeline-split"],
                                ["--account-for-loss-in-pipeline-split", "--plan"]),
    "both kinds of split flags": (["estimate", *TINY, "--tp", "2", "--pp", "2", "--decoder-first-pipeline-num-layers",
                                   "3", "--account-for-loss-in-pipeline-split"], ["cannot go with"]),
    "first stage leaves an uneven rest": (["estimate", *TINY, "--tp", "1", "--pp", "4",
                                           "--decoder-first-pipeline-num-layers", "3"], ["remaining pipeline stages"]),
    "layout with the virtual stages": (["estimate", *TINY, "--tp", "2", "--pp", "2", "--virtual-stages", "2",
                                        "--pipeline-model-parallel-layout", "Et|t*3|t*3|tL"],
                                       ["--pipeline-model-parallel-layout cannot go with --virtual-stages"]),
    "layout of the wrong layer count": (["estimate", *TINY, "--tp", "2", "--pp", "2",
                                         "--pipeline-model-parallel-layout", "Et|t*3|t*3|t*2L"],
                                        ["places 9 decoder layers; the model has 8"]),
    "counted layers do not split": (["estimate", *TINY, "--tp", "2", "--pp", "2", "--virtual-stages", "2",
                                     "--account-for-embedding-in-pipeline-split"], ["counted for the embedding"]),
}


@pytest.mark.parametrize("args, fragments", ERROR_CASES.values(), ids=list(ERROR_CASES))
def test_user_errors_exit_2_with_one_line(args, fragments):
    assert_user_error(run_cli(*args), *fragments)


def test_malformed_plan_files_exit_2_with_one_line(tmp_path):
    assert_user_error(run_cli("show", _write(tmp_path, "bad.json", "{not json")), "not valid JSON")
    assert_user_error(run_cli("show", _write(tmp_path, "list.json", "[1, 2]")), "expected a JSON object")
    assert_user_error(run_cli("show", _write(tmp_path, "empty.json", "{}")), "missing required key")
    assert_user_error(run_cli("show", _wrong_version_plan(tmp_path)), "schema_version 99")
    assert_user_error(run_cli("estimate", "--plan", _wrong_version_plan(tmp_path)), "schema_version 99")


def test_inconsistent_plan_exits_2(tmp_path):
    path = tmp_path / "plan.json"
    ok("estimate", *TINY, "--tp", "2", "--pp", "2", "--out", str(path))
    data = json.loads(path.read_text())
    data["world_size"] = 6
    assert_user_error(run_cli("show", _write(tmp_path, "six.json", json.dumps(data))), "each stage has 3 GPUs")
    assert_user_error(run_cli("estimate", "--plan", str(path), "--num-nodes", "2"), "8 GPUs", "16")
    assert_user_error(run_cli("estimate", "--plan", str(path), "--global-batch-size", "32"), "global batch")


def test_malformed_model_and_cluster_files_exit_2(tmp_path):
    model = _write(tmp_path, "m.json", json.dumps({"num_layers": 4, "hidden_size": 64}))
    assert_user_error(run_cli("estimate", "--model", model, "--cluster", "cpu-gloo", "--global-batch-size", "8",
                              "--tp", "1", "--pp", "1"), "missing required key")
    cluster = _write(tmp_path, "c.json", json.dumps({"name": "x", "num_nodes": 1}))
    assert_user_error(run_cli("plan", "--model", "tiny-gpt", "--cluster", cluster, "--global-batch-size", "8"),
                      "missing required key")


def test_unwritable_out_file_exits_2(tmp_path):
    target = str(tmp_path / "no-such-dir" / "plan.json")
    assert_user_error(run_cli("estimate", *TINY, "--tp", "2", "--pp", "2", "--out", target), "cannot write")


# ---------------------------------------------------------------- entry points and the no-print rule

def test_help_and_version_exit_0():
    assert "plan" in ok("--help").stdout and "estimate" in ok("--help").stdout
    assert "--global-batch-size" in ok("plan", "--help").stdout
    assert ok("--version").stdout.startswith("megatron-auto ")


def test_console_script_points_at_main():
    text = (REPO / "pyproject.toml").read_text()
    target = re.search(r'^megatron-auto\s*=\s*"([^"]+)"', text, re.MULTILINE).group(1)
    module, function = target.split(":")
    assert (module, function) == ("megatron_auto.cli.main", "main")
    from megatron_auto.cli import main as main_module

    assert callable(getattr(main_module, function))


def test_the_library_never_prints():
    offenders = []
    for path in (REPO / "megatron_auto").rglob("*.py"):
        if "cli" in path.relative_to(REPO / "megatron_auto").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []
