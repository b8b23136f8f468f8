"""The parallelism flags: Megatron-LM's distributed group (constraints on the search under --auto-parallel)
and the auto-parallel flags of this project."""
from __future__ import annotations

import argparse

from megatron_auto.cli.parser import margin_fraction


def add_distributed_args(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's _add_distributed_args: the layout's degrees, its pipeline split, SP and the optimizer."""
    group = parser.add_argument_group("distributed (constraints under --auto-parallel)")
    group.add_argument("--tensor-model-parallel-size", type=int)
    group.add_argument("--pipeline-model-parallel-size", type=int)
    group.add_argument("--context-parallel-size", type=int, default=1,
                       help="each sequence split over this many ranks (dense models; the core attention runs flash)")
    group.add_argument("--num-layers-per-virtual-pipeline-stage", type=int)
    group.add_argument("--num-virtual-stages-per-pipeline-rank", type=int, metavar="V",
                       help="model chunks per pipeline rank (the same layout as "
                            "--num-layers-per-virtual-pipeline-stage, counted the other way)")
    group.add_argument("--decoder-first-pipeline-num-layers", type=int)
    group.add_argument("--decoder-last-pipeline-num-layers", type=int)
    group.add_argument("--account-for-embedding-in-pipeline-split", action="store_true",
                       help="the pipeline split counts the embedding as a layer: the first chunk builds one fewer")
    group.add_argument("--account-for-loss-in-pipeline-split", action="store_true",
                       help="the pipeline split counts the output layer and loss as a layer: the last chunk "
                            "builds one fewer")
    group.add_argument("--pipeline-model-parallel-layout", metavar="LAYOUT",
                       help="the layers of every model chunk, as Megatron-LM spells it (e.g. \"Et|(tt|)*3,tL\")")
    group.add_argument("--sequence-parallel", action="store_true", default=None)
    group.add_argument("--use-distributed-optimizer", action="store_true", default=None)
    group.add_argument("--overlap-param-gather", action="store_true", default=None,
                       help="all-gather the distributed optimizer's updated weights during the next forward "
                            "(default: on with CUDA, off on CPU)")
    group.add_argument("--distributed-timeout-minutes", type=float, default=10.0)


def add_auto_parallel_args(parser: argparse.ArgumentParser) -> None:
    """--auto-parallel and its companions: the planner chooses the layout, or runs a saved plan."""
    group = parser.add_argument_group("auto-parallel")
    group.add_argument("--auto-parallel", action="store_true", help="let the planner choose the parallelism")
    group.add_argument("--auto-parallel-cluster", help="cluster preset or JSON (default: detected)")
    group.add_argument("--auto-parallel-plan", help="run this plan file (megatron or hybrid space)")
    group.add_argument("--auto-parallel-dry-run", action="store_true",
                       help="print the plan, its prediction and (with --auto-parallel or a plan file) the line's own "
                            "parallelism flags priced alike, then exit: no process group, no data, no training. "
                            "The world size is WORLD_SIZE's and a node LOCAL_WORLD_SIZE GPUs (unset: the cluster's "
                            "own node size); on a machine without the job's GPUs, name the cluster with "
                            "--auto-parallel-cluster")
    group.add_argument("--auto-parallel-profile", nargs="+", metavar="FILE", default=[],
                       help="cluster and/or model profile JSON (megatron-auto profile-cluster / profile-model):"
                            " the search prices plans from these measurements")
    group.add_argument("--auto-parallel-space", choices=("megatron", "hybrid"), default="megatron",
                       help="search space of --auto-parallel: one layout (megatron) or per-layer layouts (hybrid)")
    group.add_argument("--auto-parallel-memory-margin", type=margin_fraction, metavar="FRACTION",
                       help="safety margin of --auto-parallel: a plan fits when its predicted device memory is at "
                            "most the GPU's capacity x (1 - FRACTION) (default: the cluster's, as megatron-auto "
                            "plan --memory-margin)")
    group.add_argument("--auto-parallel-straggler-interval", type=non_negative_int, metavar="ITERATIONS",
                       default=100,
                       help="every this many iterations the ranks compare their forward and backward seconds with "
                            "their stages' predictions; a node slower than the job's median by more than the "
                            "threshold re-plans the job (--auto-parallel with --save: a checkpoint, the plan for the "
                            "measured speeds, a resume) or is logged with the plan it would use; 0: off (default 100)")
    group.add_argument("--auto-parallel-straggler-threshold", type=margin_fraction, metavar="FRACTION",
                       default=0.2,
                       help="how far from the job's median a rank's busy time per predicted second may be before "
                            "its node counts as a straggler (default 0.2)")


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value
