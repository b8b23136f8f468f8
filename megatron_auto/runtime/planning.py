"""Which Plan a run uses: a plan file, the search (`--auto-parallel`), or Megatron's manual flags."""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Mapping, Sequence

from ..errors import UserError
from ..plan import Plan, load_plan
from ..search.constraints import SearchConstraints
from ..specs.cluster import ClusterSpec
from ..specs.loaders import load_cluster
from ..specs.presets import with_measured_speeds
from ..specs.model import ModelSpec
from ..specs.profiles import measured_costs
from ..specs.training import TrainingSpec

logger = logging.getLogger(__name__)


def detect_cluster_name() -> str:
    """cpu-gloo without CUDA; dgx-h100-80gb or dgx-a100-80gb from the GPU's name."""
    import torch

    if not torch.cuda.is_available():
        return "cpu-gloo"
    name = torch.cuda.get_device_name(0)
    if "H100" in name or "H200" in name or "H800" in name:
        return "dgx-h100-80gb"
    if "A100" in name or "A800" in name:
        return "dgx-a100-80gb"
    raise UserError(f"no cluster preset for GPU '{name}'; pass --auto-parallel-cluster PRESET|FILE.json")


def gpus_per_node_from_env(world_size: int, environ: Mapping[str, str] = os.environ,
                           cluster_name: str | None = None) -> int | None:
    """torchrun's node shape: LOCAL_WORLD_SIZE, the ranks (GPUs) on this rank's node; None when unset.

    UserError unless it is a positive integer that divides `world_size`; on a mixed cluster (`cluster_name`), whose
    node groups may differ in node size, cluster_for_world checks it against this rank's node instead."""
    text = environ.get("LOCAL_WORLD_SIZE")
    if text is None:
        return None
    try:
        per_node = int(text)
    except ValueError:
        per_node = 0
    if per_node <= 0:
        raise UserError(f"LOCAL_WORLD_SIZE must be a positive integer (the ranks on each node), got '{text}'")
    if world_size % per_node and not (cluster_name and load_cluster(cluster_name).is_mixed):
        raise UserError(f"LOCAL_WORLD_SIZE {per_node} does not divide WORLD_SIZE {world_size}: "
                        "every node of the job must run the same number of ranks (a cluster file's node groups "
                        "describe nodes of different sizes)")
    return per_node


def cluster_for_world(cluster: ClusterSpec, world_size: int, gpus_per_node: int | None = None,
                      rank: int | None = None) -> ClusterSpec:
    """The cluster shaped to the job: `world_size / gpus_per_node` nodes of `gpus_per_node` GPUs when given
    (LOCAL_WORLD_SIZE); otherwise one partial node, or whole nodes of the cluster's own size. A mixed cluster
    (ClusterSpec.node_groups) is priced as it is: the job must have its shape, and `rank`'s node (when given)
    the size of its group's nodes (torchrun agents of different --nproc-per-node)."""
    if cluster.is_mixed:
        return _mixed_shape(cluster, world_size, gpus_per_node, rank)
    if gpus_per_node is not None:
        return _nodes_of(cluster, world_size, gpus_per_node)
    if world_size <= cluster.gpus_per_node:
        return dataclasses.replace(cluster, num_nodes=1, gpus_per_node=world_size)
    if world_size % cluster.gpus_per_node:
        raise UserError(f"world size {world_size} is not a whole number of {cluster.gpus_per_node}-GPU nodes "
                        f"of cluster '{cluster.name}'")
    return cluster.with_nodes(world_size // cluster.gpus_per_node)


def _mixed_shape(cluster: ClusterSpec, world_size: int, gpus_per_node: int | None, rank: int | None) -> ClusterSpec:
    """`cluster` itself, once the job's ranks and this rank's node size are the ones its node groups describe."""
    nodes = cluster.node_ranks()
    if world_size != cluster.world_size or gpus_per_node not in (None, *(count for _, count in nodes)):
        raise UserError(f"mixed cluster '{cluster.name}' has {cluster.node_shape()} in its groups "
                        f"({cluster.world_size} GPUs); this job has {world_size} ranks"
                        + (f" in nodes of {gpus_per_node}" if gpus_per_node else ""))
    if rank is not None and gpus_per_node is not None:
        node = next(node for node, (first, count) in enumerate(nodes) if first <= rank < first + count)
        if nodes[node][1] != gpus_per_node:
            raise UserError(f"rank {rank} runs on a node of {gpus_per_node} ranks (LOCAL_WORLD_SIZE); mixed cluster "
                            f"'{cluster.name}' puts it on node {node}, of {nodes[node][1]} GPUs: launch the nodes "
                            "in the order of its node groups")
    return cluster


def _nodes_of(cluster: ClusterSpec, world_size: int, gpus_per_node: int) -> ClusterSpec:
    """`cluster`'s GPUs and links as `world_size / gpus_per_node` nodes of `gpus_per_node` GPUs."""
    if gpus_per_node <= 0 or world_size % gpus_per_node:
        raise UserError(f"{gpus_per_node} GPUs per node do not divide world size {world_size}")
    try:
        return dataclasses.replace(cluster, num_nodes=world_size // gpus_per_node, gpus_per_node=gpus_per_node)
    except ValueError as error:
        raise UserError(f"world size {world_size}: {error}") from None


def job_cluster(world_size: int, cluster_name: str | None = None, profiles: Sequence[str] = (),
                gpus_per_node: int | None = None) -> ClusterSpec:
    """The cluster the search prices a job under: the preset (detected when not named) shaped
    to `world_size` (in nodes of `gpus_per_node` GPUs when given: cluster_for_world), with this
    device's usable memory and the measured `profiles` attached."""
    rank = int(os.environ["RANK"]) if os.environ.get("RANK", "").isdigit() else None
    cluster = cluster_for_world(load_cluster(cluster_name or detect_cluster_name()), world_size, gpus_per_node, rank)
    if not cluster.is_mixed:  # a mixed cluster's groups name their GPUs, and every rank must price the same ones
        cluster = with_device_capacity(cluster, device_total_bytes())
    if profiles:  # a profile of this job's nodes also lends their measured speeds
        cluster = with_measured_speeds(dataclasses.replace(cluster, measured=measured_costs(list(profiles))))
    return cluster


def describe_job_cluster(cluster: ClusterSpec, world_size: int, gpus_per_node: int | None) -> str:
    """One log line: the node shape priced and where it came from."""
    source = (f"LOCAL_WORLD_SIZE {gpus_per_node}" if gpus_per_node is not None
              else "LOCAL_WORLD_SIZE unset: the cluster's own node size")
    if not cluster.is_mixed:
        nodes = f"{cluster.num_nodes} node{'s' if cluster.num_nodes > 1 else ''}"
        gpus = f"{cluster.gpus_per_node} GPU{'s' if cluster.gpus_per_node > 1 else ''}"
        return f"priced {nodes} x {gpus} of {cluster.name} (WORLD_SIZE {world_size}, {source})"
    # Megatron-Core's stage s runs on ranks s x world/pp onward: the nodes' order matters
    groups = []
    for index, (group, (first, last)) in enumerate(zip(cluster.node_groups, cluster.group_node_ranks())):
        size = cluster.group_gpus_per_node(index)
        groups.append(f"{group.name} at node rank{'s' if last > first else ''} {first}"
                      + (f"-{last}" if last > first else "")
                      + (f" ({size} GPU{'s' if size > 1 else ''} each)" if cluster.nodes_differ else ""))
    return (f"priced {cluster.num_nodes} nodes of {cluster.name} (WORLD_SIZE {world_size}, {source}); "
            f"node groups: {', '.join(groups)}")


def device_total_bytes() -> int | None:
    """What torch can use of this rank's GPU (torch.cuda.mem_get_info's total); None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.mem_get_info()[1])


def with_device_capacity(cluster: ClusterSpec, total_bytes: int | None) -> ClusterSpec:
    """The cluster with the device's measured usable memory as its capacity (no change without one).

    Identical GPUs report the same total, so every rank's search prices the same capacity."""
    if not total_bytes:
        return cluster
    gpu = dataclasses.replace(cluster.gpu, usable_memory_bytes=total_bytes)
    return dataclasses.replace(cluster, gpu=gpu)


def search_for_job(model: ModelSpec, world_size: int, cluster_name: str | None, training: TrainingSpec,
                   constraints: SearchConstraints, space: str = "megatron", profiles: Sequence[str] = (),
                   choose_recompute_modules: bool = False, gpus_per_node: int | None = None) -> Plan:
    """The planner's best plan of `space` for this model on `world_size` ranks (in nodes of `gpus_per_node`
    GPUs when given: cluster_for_world), priced from the measured `profiles` (specs.profiles.measured_costs)
    when given, else analytically; with `choose_recompute_modules` it also chooses what selective
    recomputation re-runs.

    The hybrid runtime runs ZeRO 0, 1 and 3 per layer (ZeRO-3 through FSDP2), so
    the hybrid search is not held to the distributed optimizer.
    """
    from ..search import search_plan

    cluster = job_cluster(world_size, cluster_name, profiles, gpus_per_node)
    result = search_plan(model, cluster, training, space, constraints,
                         choose_recompute_modules=choose_recompute_modules)
    logger.debug("search took %.2fs over %d candidates", result.search_time_s, result.candidates_evaluated)
    return result.plan


def _model_mismatch(plan_model: ModelSpec, model: ModelSpec) -> str | None:
    """What differs between the plan's model and the flags' model, if anything that matters."""
    checks = (("num_layers", plan_model.num_layers, model.num_layers),
              ("hidden_size", plan_model.hidden_size, model.hidden_size),
              ("num_attention_heads", plan_model.layers[0].num_attention_heads, model.layers[0].num_attention_heads),
              ("seq_length", plan_model.seq_length, model.seq_length))
    for name, planned, given in checks:
        if planned != given:
            return f"{name} {planned} in the plan, {given} on the command line"
    return None


def check_plan_for_job(plan: Plan, model: ModelSpec, world_size: int, source: str) -> None:
    """UserError unless `plan` was made for this world size and model."""
    if plan.world_size != world_size:
        raise UserError(f"{source} is for {plan.world_size} ranks but this job has {world_size}")
    if plan.num_layers != model.num_layers:
        raise UserError(f"{source} places {plan.num_layers} layers but --num-layers is {model.num_layers}")
    if plan.model is not None:
        mismatch = _model_mismatch(plan.model, model)
        if mismatch:
            raise UserError(f"{source} was made for another model: {mismatch}")
    if plan.embedding.zero >= 2:
        raise UserError(f"{source} shards the embedding's gradients or weights (ZeRO-2/3); "
                        "the runtime shards the embedding with ZeRO 0 or 1 only")


def plan_from_file(path: str, model: ModelSpec, world_size: int) -> Plan:
    plan = load_plan(path)
    check_plan_for_job(plan, model, world_size, f"plan '{path}'")
    return plan
