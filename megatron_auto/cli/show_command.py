"""`megatron-auto show`: print a plan file as a table (or as its canonical JSON); --png draws it."""
from __future__ import annotations

import argparse
import sys
from typing import Optional

from .. import serde
from ..errors import UserError
from ..plan import Plan, load_plan
from ..report import node_group_lines, plan_table
from ..specs import ClusterSpec, load_cluster
from ..specs.presets import CLUSTER_PRESETS, with_node_speeds


def show_cluster(plan: Plan, name: Optional[str], node_speeds: Optional[list[float]]) -> Optional[ClusterSpec]:
    """The mixed cluster whose node groups `show` names and draws: --cluster (a preset or file), else the preset
    the plan names (a plan file records only its cluster's name), sized to the plan's GPUs and with --node-speeds
    applied; None when the cluster is not known or has no node groups."""
    if name is None and plan.cluster not in CLUSTER_PRESETS:
        if node_speeds:
            raise UserError(f"--node-speeds: the plan's cluster '{plan.cluster}' is not a preset; give --cluster")
        return None
    cluster = load_cluster(name or plan.cluster)
    if not cluster.is_mixed and plan.world_size % cluster.gpus_per_node == 0:
        cluster = cluster.with_nodes(plan.world_size // cluster.gpus_per_node)
    if node_speeds:
        try:
            cluster = with_node_speeds(cluster, tuple(node_speeds))
        except ValueError as error:
            raise UserError(f"--node-speeds: {error}") from None
    if not cluster.is_mixed:
        return None
    if cluster.world_size != plan.world_size:
        if name is None:
            return None  # a cluster of the preset's name but not its size: not the preset
        raise UserError(f"--cluster '{name}' has {cluster.world_size} GPUs, the plan {plan.world_size}")
    return cluster


def run_show(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    cluster = show_cluster(plan, args.cluster, args.node_speeds)
    groups = node_group_lines(plan, cluster) if cluster is not None else []
    sys.stdout.write(serde.dumps(plan) if args.json else plan_table(plan) + "".join(f"{line}\n" for line in groups))
    if args.png:
        from ..report_png import draw_plan_png  # matplotlib is needed only here

        draw_plan_png(plan, args.png, cluster)
        sys.stderr.write(f"wrote {args.png}\n")
    return 0
