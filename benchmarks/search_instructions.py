"""Instructions one `megatron-auto plan` search executes, counted by valgrind's callgrind: a measure of the search's
cost that this virtual machine's drifting pace does not move (its CPU seconds swing by up to 1.7x within an hour).

Command (about 5 minutes per job on this machine; needs valgrind on PATH):
    .venv/bin/python -m benchmarks.search_instructions --model deepseek-v3 --cluster dgx-h100-80gb \
        --num-nodes 128 --global-batch-size 8192

Two fresh interpreters run under callgrind: one loads the job and searches it as `plan` does with its default flags,
the other only loads the job. The difference is the search's instructions. Prints one line; writes nothing.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

from megatron_auto.cli.job import load_job
from megatron_auto.cli.parser import build_parser
from megatron_auto.search import search_plan


def _job_argv(args: argparse.Namespace) -> list[str]:
    return ["plan", "--model", args.model, "--cluster", args.cluster, "--num-nodes", str(args.num_nodes),
            "--global-batch-size", str(args.global_batch_size)]


def _counted(argv: list[str]) -> int:
    """Instructions callgrind counts in a fresh interpreter running this module with `argv`."""
    done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-m",
                           "benchmarks.search_instructions", *argv], capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError("callgrind printed no instruction count")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--num-nodes", type=int, required=True)
    parser.add_argument("--global-batch-size", type=int, required=True)
    parser.add_argument("--inside", choices=("search", "load"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inside:  # the run under callgrind
        job = load_job(build_parser().parse_args(_job_argv(args)))
        if args.inside == "search":
            search_plan(*job, "megatron", choose_recompute_modules=True)
        return 0
    if shutil.which("valgrind") is None:
        sys.stderr.write("search_instructions: valgrind is not installed\n")
        return 2
    rest = sys.argv[1:] if argv is None else argv
    searched, loaded = _counted([*rest, "--inside", "search"]), _counted([*rest, "--inside", "load"])
    sys.stdout.write(f"{' '.join(_job_argv(args)[1:])}: {(searched - loaded) / 1e9:.2f} G instructions in the search "
                     f"({searched / 1e9:.2f} G with loading the job)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
