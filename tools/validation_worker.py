"""One rank of a validation run: tools/pretrain_gpt.py, plus a peak-memory measurement.

Run by tools/validate_cost_model.py under torchrun, with pretrain_gpt's flags
after `--memory-out DIR`. Every iteration but the last runs untouched (their
`elapsed time per iteration (ms)` lines are the step times); the last one runs
under torch.profiler with profile_memory=True, and this rank writes
`DIR/rank<R>.json` with its peak memory, defined as

    peak live tensor bytes = (bytes of the distinct tensor storages reachable
    from Python before the step: weights, gradient buffers, optimizer states)
    + (the largest running sum of the profiler's allocation/free events in the step,
       each op's net self allocation placed at its start: an op's own temporaries freed
       before it returns are not seen)

i.e. what the cost model's memory terms count, without the process's non-tensor
memory (the interpreter, libraries, gloo buffers: ClusterSpec.framework_overhead_bytes).
"""
from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def live_tensor_bytes() -> int:
    """Bytes of the distinct storages of every tensor the garbage collector can see."""
    import torch

    storages = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        except Exception:  # noqa: BLE001 - half-built or exotic objects: skip them
            continue
    return sum(storages.values())


def peak_step_bytes(run) -> tuple[object, int]:
    """Run `run()` under the memory profiler; returns its result and the peak of the running sum."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = run()
    # Each allocation and free is attributed to the innermost op that made it (its "self"
    # memory; '[memory]' entries are those outside any op), placed at that op's start.
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    running = peak = 0
    for event in events:
        running += event.self_cpu_memory_usage
        peak = max(peak, running)
    return result, peak


def install(memory_dir: str) -> None:
    """Wrap the session's iteration so the last one is measured."""
    from megatron_auto.runtime import session

    original = session.run_iteration

    def run_iteration(job):
        if job.iteration + 1 < job.settings.train_iters:
            return original(job)
        baseline = live_tensor_bytes()
        result, peak = peak_step_bytes(lambda: original(job))
        rank = int(os.environ.get("RANK", "0"))
        Path(memory_dir, f"rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "baseline_bytes": baseline, "step_peak_bytes": peak, "peak_bytes": baseline + peak}))
        return result

    session.run_iteration = run_iteration


def main() -> int:
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "--memory-out":
        sys.stderr.write("usage: validation_worker.py --memory-out DIR <pretrain_gpt flags>\n")
        return 2
    install(argv[1])
    import pretrain_gpt

    return pretrain_gpt.main(argv[2:])


if __name__ == "__main__":
    sys.exit(main())
