"""One rank of a validation run: tools/pretrain_gpt.py, plus a peak-memory measurement.

Run by validation/validate_cost_model.py under torchrun, with pretrain_gpt's flags
after `--memory-out DIR`:

    python -m torch.distributed.run --nproc_per_node N -m validation.validation_worker --memory-out DIR \\
        <pretrain_gpt.py flags> --auto-parallel-plan PLAN.json

Every iteration but the last runs untouched (their `elapsed time per iteration (ms)`
lines are the step times); the last one runs
under torch.profiler with profile_memory=True, and this rank writes
`DIR/rank<R>.json` with its peak memory, defined as

    peak live tensor bytes = the largest "Total Allocated" of c10's CPU memory
    reporter during the step: the bytes of every tensor storage allocated since
    this process started and not yet freed (weights, gradient buffers, optimizer
    states, activations, temporaries).

c10 counts a free only on a thread that has the profiler on, unless its flag
FLAGS_caffe2_report_cpu_memory_usage is set; gloo frees the buffers of a
collective on its own worker threads, so without the flag every collective
looks like a leak (40 reduce-scatter + all-gather rounds of 1.25 MiB read as a
42 MiB peak). `track_frees_on_all_threads` sets the flag (exported by libc10)
before anything is allocated. The process's non-tensor memory (interpreter,
libraries, gloo buffers) is not counted: ClusterSpec.framework_overhead_bytes.

On CUDA no profiler runs: after the last iteration the rank writes
torch.cuda.max_memory_allocated (`peak_bytes`), max_memory_reserved
(`reserved_bytes`) and the device memory used at the peak (`device_bytes`:
reserved plus what the process holds outside torch), all over the whole run.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def track_frees_on_all_threads() -> None:
    """Set c10's FLAGS_caffe2_report_cpu_memory_usage: count CPU frees on every thread."""
    import ctypes

    import torch

    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libc10.so"))
    ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage").value = True


def peak_step_bytes(run) -> tuple[object, int, int]:
    """Run `run()` under the memory profiler; returns its result, the bytes allocated when it
    started, and the largest bytes allocated during it (c10's running total, all threads)."""
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = run()
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        prof.export_chrome_trace(trace.name)
        events = [e["args"] for e in json.load(open(trace.name))["traceEvents"] if e.get("name") == "[memory]"]
    if not events:
        return result, 0, 0
    before = events[0]["Total Allocated"] - events[0]["Bytes"]
    return result, before, max(e["Total Allocated"] for e in events)


def cuda_peaks(device) -> dict:
    """torch.cuda's peaks over the run (allocated, reserved) and the device memory used at them."""
    from megatron_auto.runtime.memory_check import measure_peak

    peak = measure_peak(device)
    return {"baseline_bytes": 0, "step_peak_bytes": peak.allocated_bytes, "peak_bytes": peak.allocated_bytes,
            "reserved_bytes": peak.reserved_bytes, "device_bytes": peak.device_bytes}


def install(memory_dir: str) -> None:
    """Wrap the session's iteration so the last one is measured (on CUDA: the run's peaks after it)."""
    import torch

    from megatron_auto.runtime import session

    original = session.run_iteration
    if torch.cuda.is_available():
        def run_iteration_cuda(job):
            result = original(job)
            if job.iteration == job.settings.train_iters:
                rank = int(os.environ.get("RANK", "0"))
                Path(memory_dir, f"rank{rank}.json").write_text(json.dumps({"rank": rank, **cuda_peaks(job.device)}))
            return result

        session.run_iteration = run_iteration_cuda
        return
    track_frees_on_all_threads()

    def run_iteration(job):
        if job.iteration + 1 < job.settings.train_iters:
            return original(job)
        result, before, peak = peak_step_bytes(lambda: original(job))
        rank = int(os.environ.get("RANK", "0"))
        Path(memory_dir, f"rank{rank}.json").write_text(json.dumps(
            {"rank": rank, "baseline_bytes": before, "step_peak_bytes": peak - before, "peak_bytes": peak}))
        return result

    session.run_iteration = run_iteration


def main() -> int:
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "--memory-out":
        sys.stderr.write("usage: python -m validation.validation_worker --memory-out DIR <pretrain_gpt flags>\n")
        return 2
    install(argv[1])
    from megatron_auto.train import main as pretrain_gpt_main

    return pretrain_gpt_main(argv[2:])


if __name__ == "__main__":
    sys.exit(main())
