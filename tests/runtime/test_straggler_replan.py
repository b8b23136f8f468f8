"""Issue 39: a straggler found at run time re-plans the job, which goes on from a checkpoint under the new plan.

Four gloo ranks, each a node of its own (LOCAL_WORLD_SIZE 1), train a 16-layer GPT in a pipeline of 4; the
test-only switch MEGATRON_AUTO_SLOW_RANK=2:3:5 makes every rank's forward and backward passes last five times their
compute, their CPU seconds (the ranks sleep the rest, as a GPU leaves its host idle: four ranks then share this
machine's two cores without time-slicing them, and the passes outweigh the runtime's work between them) and rank
2's three times as long again (runtime.stragglers). benchmarks/bench_stragglers.py measures the drop of the step time
this way with rank 2 twice as slow (about 16% at base 5) and with less of the passes emulated: a drop that size is
within the step time's noise on two cores shared by three test workers, three times as slow is not. One launch
(validation/launch_lines.py) runs three command lines:
- `replan`: --auto-parallel with --save, the watch every 3 iterations: two windows in a row find node 2 at about
  a third of its speed, the job saves, re-plans with that node's measured speed and resumes under the new plan, and
  its step time drops;
- `reference`: the same job with the watch off (the slow switch acts only through the watch's clock), which
  trains under its first plan to the end: the uninterrupted run the re-planned one must match;
- `manual`: the same pipeline from the launch line's flags: the watch logs its finding and the plan it would
  use, and the job keeps its flags.
"""
from __future__ import annotations

import json
import math
import re

import pytest

from benchmarks.bench_stragglers import before_and_after, iterations, replans
from validation.launcher import launch
from megatron_auto.pipeline_layout import chunk_layers_of_layout

ITERATIONS = 14
MODEL = ["--num-layers", "16", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
         "--max-position-embeddings", "128", "--micro-batch-size", "2", "--global-batch-size", "16",
         "--lr", "3e-3", "--mock-data", "--tokenizer-type", "NullTokenizer",
         "--vocab-size", "512", "--log-interval", "1", "--eval-iters", "0", "--hidden-dropout", "0",
         "--attention-dropout", "0", "--pipeline-model-parallel-size", "4"]
WATCH = ["--auto-parallel-straggler-interval", "3"]
RUN, SHORT = ["--train-iters", str(ITERATIONS)], ["--train-iters", "10"]
LOSS_RTOL = 2e-5
"""The re-planned run against the uninterrupted one. Both compute every layer alike in fp32 with one data-parallel
replica; the new plan differs in its pipeline split and micro-batch size, which reorders the sums of the loss over
micro-batches and of the gradient norm over stages (a few ulps, fp32 epsilon 6e-8), and the checkpoint it resumes
from holds the fp32 weights and Adam states exactly. The same bound as the layouts of test_equivalence.py against
one process; the iteration log prints the loss to 7 digits (about 2e-7 relative here)."""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    """{name: (exit code, the last rank's log of that command line)}."""
    tmp = tmp_path_factory.mktemp("stragglers")
    lines = [{"name": "replan", "argv": [*MODEL, *RUN, "--auto-parallel", "--save", str(tmp / "replan"), *WATCH]},
             {"name": "reference", "argv": [*MODEL, *RUN, "--auto-parallel", "--save", str(tmp / "reference"),
                                            "--auto-parallel-straggler-interval", "0"]},
             {"name": "manual", "argv": [*MODEL, *SHORT, "--save", str(tmp / "manual"), *WATCH]}]
    (tmp / "runs.json").write_text(json.dumps(lines))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MEGATRON_AUTO_SLOW_RANK", "2:3:5")
        result = launch(4, ["validation/launch_lines.py", str(tmp / "runs.json"), str(tmp / "codes.json")],
                        timeout_s=900, log_dir=tmp / "logs", local_world_size=1)
    assert result.ok, result.output[-8000:]
    codes = json.loads((tmp / "codes.json").read_text())
    logs = dict(re.findall(r"#### launch line (\S+) start\n(.*?)#### launch line \1 exit",
                           (tmp / "logs" / "rank3.log").read_text(), re.S))
    return {name: (codes[name], logs.get(name, "")) for name in codes}


def test_the_job_replans_off_the_slow_rank_and_matches_the_uninterrupted_run(runs):
    code, log = runs["replan"]
    assert code == 0, log[-4000:]
    found = replans(log)
    assert found, log[-4000:]
    _, measured, layout = found[0]
    slowdown = float(re.search(r"rank 2 \(node 2\) at (\S+)x", measured).group(1))
    assert 2.2 < slowdown < 3.9, measured  # three times as slow, within the CPU's noise
    assert re.search(r"measured node speeds: 1, 1, 0\.\d+, 1", measured), measured
    chunks = chunk_layers_of_layout(layout, 4, 16)
    stage_layers = [sum(chunks[stage::4]) for stage in range(4)]  # chunk c on stage c % 4, interleaved or not
    assert sum(stage_layers) == 16 and stage_layers[2] < min(stage_layers[:2] + stage_layers[3:]), layout
    ours, reference = iterations(log), iterations(runs["reference"][1])
    assert sorted(ours) == sorted(reference) == list(range(1, ITERATIONS + 1))
    for step in ours:
        assert math.isclose(ours[step][1], reference[step][1], rel_tol=LOSS_RTOL), (step, ours[step], reference[step])


def test_the_step_time_drops_after_the_replan(runs):
    """The fastest step after the re-plan beats the fastest before it. The least of each window is the step least
    slowed by whatever else runs on the machine (another test file's ranks add time, never take it away); a
    median moved with that load, and failed once when the steps before the re-plan ran on a quiet machine and
    those after it beside another file's compute. Without the re-plan stage 2 keeps its 4 layers at a third of its
    speed and every step's floor stays where it was (bench_stragglers' medians at twice as slow: 4.2 s before, 3.5 s
    after, 2.6 s with no straggler; here about 7.7 s before and 3.6 s after, beside two other workers). Each pass
    lasts five times its CPU seconds, which the other worker's load does not stretch (runtime/stragglers.py); as
    five times its wall time it did, and this failed twice in about 15 runs. With rank 2 twice as slow, not three
    times, it failed once in five runs beside two other test workers."""
    before, after = before_and_after(runs["replan"][1])
    assert len(before) >= 4 and len(after) >= 4
    assert min(after) < min(before), (before, after)


def test_with_manual_flags_the_watch_logs_the_plan_and_keeps_the_flags(runs):
    code, log = runs["manual"]
    assert code == 0, log[-4000:]
    found = re.search(r"stragglers: .*rank 2 \(node 2\).*kept the running plan: this job does not re-plan by "
                      r"itself \(it needs --auto-parallel and --save\)\. The plan: megatron-lm flags: .*"
                      r"--pipeline-model-parallel-layout", log)
    assert found, log[-4000:]
    assert "re-planned" not in log and len(iterations(log)) == 10
