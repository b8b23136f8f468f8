"""ClusterSpec: nodes of identical accelerators joined by two tiers of links."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Optional

from ..serde import CachedHash, checked
from ..errors import UserError
from ..limits import MAX_GPUS
from .model import _check_version
from .profiles import MeasuredCosts

CLUSTER_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator (or, for cpu-gloo, one CPU process)."""

    name: str
    """Marketing name, for the report."""
    memory_bytes: int = checked(positive=True)
    """Device memory."""
    peak_flops: float = checked(positive=True)
    """Dense 16-bit tensor FLOP/s from the datasheet (fp32 FLOP/s for CPU processes)."""
    memory_bandwidth_bytes_per_s: float = checked(positive=True)
    """HBM (or DRAM share) bandwidth, for memory-bound element-wise kernels."""
    kernel_launch_s: float = 0.0
    """Host seconds to issue one eager PyTorch op of a Megatron-Core layer: with small shards the GPU
    waits on the host and a layer takes at least ops x this (cost/layer_kernels.py); 0: not modelled."""
    usable_memory_bytes: int = 0
    """Device memory that processes can use (torch.cuda.mem_get_info's total); 0: memory_bytes."""
    fp8_peak_flops: float = 0.0
    """Dense FP8 tensor FLOP/s from the datasheet; 0: no FP8 tensor cores (cost/fp8.py)."""
    mxfp8: bool = False
    """Tensor cores for MXFP8 microscaling (Blackwell and later): --fp8-recipe mxfp8 runs."""
    sm_count: int = 0
    """Streaming multiprocessors, for the share that communication kernels take from a GEMM beside them
    (cost/tp_overlap.py); 0: not modelled."""
    collective_sms: int = 0
    """SMs one NCCL collective holds while it runs beside compute (one thread block per channel), for what hidden
    traffic slows the compute beside it (cost/comm_interference.py); 0: not modelled."""

    host_link_bytes_per_s: float = 0.0
    """Achieved copy bandwidth between device and pinned host memory, each direction (PCIe), for activations
    offloaded to the host (cost/activation_offload.py); 0: not modelled, and offloading is refused."""

    @property
    def capacity_bytes(self) -> int:
        """The usable device memory: the default memory budget."""
        return self.usable_memory_bytes or self.memory_bytes


@dataclass(frozen=True)
class LinkSpec:
    """One tier of the network, as seen by one GPU."""

    bandwidth_bytes_per_s: float = checked(positive=True)
    """Datasheet bandwidth per GPU, one direction."""
    latency_s: float
    """Start-up latency of one collective step."""
    efficiency: float = checked(positive=True, at_most=1.0, default=0.8)
    """Fraction of the datasheet bandwidth that collectives reach (bus bandwidth / peak)."""

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth_bytes_per_s * self.efficiency


@dataclass(frozen=True)
class ComputeEfficiency:
    """Achievable fraction of peak for a GEMM, as a function of its shape.

    A GEMM of shape (m, k, n) reaches `max_fraction * prod(d / (d + half_dim))`
    of peak over its three dimensions: large tiles saturate, and sharding a
    dimension by TP pulls it toward `half_dim`, where it costs half; issued alone
    it takes at least `latency_s`. See docs/cost_model.md for the calibrations
    (A100: Megatron SC21 Table 1; H100: measured GEMMs and layers).
    """

    max_fraction: float = checked(positive=True, at_most=1.0)
    """Ceiling of achieved/peak for very large GEMMs."""
    half_dim: float
    """GEMM dimension at which that dimension alone halves the efficiency."""
    latency_s: float = 0.0
    """Floor of one GEMM issued alone: eager back-to-back GEMMs never run faster than the host issues them."""
    kernel_level: bool = False
    """Price a layer kernel by kernel (cost/layer_kernels.py: element-wise passes, the attention core per
    backend, weight-gradient accumulation, the host's per-op floor), as fitted on H100 measurements;
    False: the aggregate SC21-era model the A100 constants were fitted with."""
    flash_fraction: float = checked(positive=True, at_most=1.0, default=0.35)
    """Fraction of peak that the flash attention kernel reaches on the FLOPs it runs (kernel_level only)."""


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of one kind in a mixed cluster (issue 39): their accelerator, links and GEMM model, and how fast
    they run against that model."""

    name: str
    """The group's label, for the report (e.g. a preset name)."""
    num_nodes: int = checked(positive=True)
    """Nodes in the group; the groups take consecutive node ranks in the order listed."""
    gpu: GpuSpec
    intra_node: LinkSpec
    inter_node: LinkSpec
    """The group's NICs, per GPU; traffic between groups runs at the slower group's."""
    compute: ComputeEfficiency
    speed_factor: float = checked(positive=True, at_most=1.0, default=1.0)
    """Measured pace against the datasheet model (a throttled GPU runs at 0.8): its peak FLOP/s and memory
    bandwidth are taken at this share (ClusterSpec.group_view)."""
    gpus_per_node: Optional[int] = None
    """GPUs (ranks) in each of the group's nodes; None: the cluster's gpus_per_node."""


@dataclass(frozen=True)
class ClusterSpec(CachedHash):
    """num_nodes x gpus_per_node identical GPUs; TP/SP traffic prefers the intra-node tier. A mixed cluster also
    lists its node_groups: then `gpu`, `intra_node` and `compute` are an envelope no group exceeds (used only for
    the search's bounds) and each pipeline stage is priced on its own group (stage_cluster)."""

    __hash__ = CachedHash.__hash__  # dataclass(frozen=True) would otherwise replace it

    name: str
    """Preset name or the user's label."""
    num_nodes: int
    """Nodes in the job."""
    gpus_per_node: int
    """GPUs in one node, joined by the intra-node tier; on a mixed cluster the largest node's (the envelope: see
    common_node_gpus for the node size every node holds)."""
    gpu: GpuSpec
    """The accelerator."""
    intra_node: LinkSpec
    """NVLink/NVSwitch (or shared memory for CPU processes)."""
    inter_node: LinkSpec
    """InfiniBand (per GPU)."""
    compute: ComputeEfficiency
    """GEMM efficiency model, calibrated per GPU type."""
    framework_overhead_bytes: int = 0
    """Allocated memory the framework's tensors hold regardless of the plan (inside the caching allocator;
    the CUDA context, NCCL and the allocator's reserve are the fields below)."""
    grad_overlap: float = checked(at_most=1.0, default=1.0)
    """Share of the overlap window that the runtime hides communication in: 1 where Megatron-Core's
    DDP reduces buckets during the backward (overlap_grad_reduce, on CUDA) and FSDP prefetches
    ZeRO-3 gathers behind compute; 0 on cpu-gloo, where neither overlaps."""
    dropout_mask_bytes: int = 1
    """Bytes per element of a dropout mask kept for backward: 1 on CUDA (ATen's fused native_dropout
    keeps a bool mask); on CPU ATen's `_dropout_impl` keeps its scaled noise in the input's dtype."""
    schema_version: int = CLUSTER_SCHEMA_VERSION
    """Version of this record's layout."""
    measured: Optional[MeasuredCosts] = None
    """Profiles from `megatron-auto profile-cluster/profile-model` (`--profile`); None: analytic model."""
    cuda_context_bytes: int = 0
    """Device memory outside the caching allocator that every process holds: the CUDA context and
    the cuBLAS workspace (0 on cpu-gloo)."""
    nccl_communicator_bytes: int = 0
    """Device memory of one NCCL communicator, outside the caching allocator (0 on cpu-gloo)."""
    allocator_reserve_fraction: float = 0.0
    """What the caching allocator reserves above the allocated peak, as a fraction of that peak."""
    memory_margin: float = 0.0
    """Default safety margin: a plan fits when its device memory stays below budget x (1 - margin)."""
    node_groups: tuple[NodeGroup, ...] = ()
    """A mixed cluster's groups of nodes, in node-rank order (issue 39); empty: every node as above."""

    def __post_init__(self) -> None:
        _check_version(self.schema_version, CLUSTER_SCHEMA_VERSION, "cluster spec")
        if self.num_nodes <= 0 or self.gpus_per_node <= 0:
            raise ValueError("num_nodes and gpus_per_node must be positive")
        grouped = sum(group.num_nodes for group in self.node_groups)
        if self.node_groups and grouped != self.num_nodes:
            raise ValueError(f"the node groups hold {grouped} nodes, the cluster {self.num_nodes}")
        sizes = [self.group_gpus_per_node(index) for index in range(len(self.node_groups))]
        if sizes and max(sizes) != self.gpus_per_node or min(sizes, default=1) <= 0:
            raise ValueError(f"the node groups have nodes of {sorted(set(sizes))} GPUs: the cluster's gpus_per_node "
                             f"({self.gpus_per_node}) must be the largest of them")
        if self.world_size > MAX_GPUS:
            raise ValueError(f"{self.num_nodes} nodes x {self.gpus_per_node} GPUs is more than the {MAX_GPUS} GPUs "
                             f"megatron-auto plans for (megatron_auto/limits.py)")

    @property
    def world_size(self) -> int:
        if self.node_groups:
            return sum(group.num_nodes * self.group_gpus_per_node(i) for i, group in enumerate(self.node_groups))
        return self.num_nodes * self.gpus_per_node

    @property
    def common_node_gpus(self) -> int:
        """The most GPUs that a group of consecutive ranks can hold and stay inside one node wherever it lands:
        gpus_per_node, or on a mixed cluster the greatest common divisor of its groups' node sizes (a TP group of
        4 tiles nodes of 8 and of 4; one of 8 would straddle the 4-GPU nodes)."""
        if not self.node_groups:
            return self.gpus_per_node
        return math.gcd(*(self.group_gpus_per_node(index) for index in range(len(self.node_groups))))

    def group_gpus_per_node(self, index: int) -> int:
        """GPUs in each node of node group `index` (NodeGroup.gpus_per_node, or the cluster's)."""
        size = self.node_groups[index].gpus_per_node
        return self.gpus_per_node if size is None else size

    @property
    def nodes_differ(self) -> bool:
        """Whether the node groups' nodes hold different numbers of GPUs."""
        return len({self.group_gpus_per_node(index) for index in range(len(self.node_groups))}) > 1

    def node_shape(self) -> str:
        """The nodes in words: '4 nodes of 8 GPUs', or group by group where they differ ('2 nodes of 8 GPUs +
        2 nodes of 4 GPUs')."""
        def nodes(count: int, size: int) -> str:
            return f"{count} node{'s' if count > 1 else ''} of {size} GPU{'s' if size > 1 else ''}"
        if not self.nodes_differ:
            return nodes(self.num_nodes, self.gpus_per_node)
        return " + ".join(nodes(group.num_nodes, self.group_gpus_per_node(index))
                          for index, group in enumerate(self.node_groups))

    def node_ranks(self) -> tuple[tuple[int, int], ...]:
        """(first rank, ranks) of every node, in node-rank order (torchrun numbers the ranks node by node)."""
        sizes = [self.group_gpus_per_node(index) for index, group in enumerate(self.node_groups)
                 for _ in range(group.num_nodes)]
        sizes = sizes or [self.gpus_per_node] * self.num_nodes
        return tuple((sum(sizes[:node]), size) for node, size in enumerate(sizes))

    @property
    def is_mixed(self) -> bool:
        return bool(self.node_groups)

    def group_view(self, index: int) -> "ClusterSpec":
        """Node group `index` as a uniform cluster of its own: its GPU (peaks at its speed_factor), links and
        GEMM model, with this cluster's memory terms. One object per group, so that the cost model's caches,
        keyed on the cluster, serve every plan priced on it."""
        return _group_view(self, index)

    def _build_group_view(self, index: int) -> "ClusterSpec":
        group = self.node_groups[index]
        gpu = replace(group.gpu, peak_flops=group.gpu.peak_flops * group.speed_factor,
                      fp8_peak_flops=group.gpu.fp8_peak_flops * group.speed_factor,
                      memory_bandwidth_bytes_per_s=group.gpu.memory_bandwidth_bytes_per_s * group.speed_factor)
        return replace(self, name=f"{self.name}:{group.name}", num_nodes=group.num_nodes,
                       gpus_per_node=self.group_gpus_per_node(index), gpu=gpu, intra_node=group.intra_node,
                       inter_node=group.inter_node, compute=group.compute, node_groups=())

    def group_node_ranks(self) -> tuple[tuple[int, int], ...]:
        """(first, last) node rank of each node group, in the order listed."""
        ends = [sum(group.num_nodes for group in self.node_groups[:i + 1]) for i in range(len(self.node_groups))]
        return tuple((end - group.num_nodes, end - 1) for end, group in zip(ends, self.node_groups))

    def stage_spans(self, pipeline_parallel: int) -> tuple[tuple[int, ...], ...]:
        """The node groups that the ranks of each of `pipeline_parallel` stages lie in (Megatron's rank order puts
        stage s on ranks s x world/pp onward). A uniform cluster: group 0 for every stage."""
        if not self.node_groups:
            return ((0,),) * pipeline_parallel
        return _stage_spans(self, pipeline_parallel)

    def _spans(self, pipeline_parallel: int) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(group for group, _ in shares) for shares in self.stage_rank_shares(pipeline_parallel))

    def stage_rank_shares(self, pipeline_parallel: int) -> tuple[tuple[tuple[int, float], ...], ...]:
        """Per stage, (node group, the share of the stage's ranks in it) for each group its ranks lie in, in
        node-rank order (Megatron's rank order puts stage s on ranks s x world/pp onward). A uniform cluster: each
        stage wholly in group 0."""
        if not self.node_groups:
            return (((0, 1.0),),) * pipeline_parallel
        per_stage, owners = self.world_size // pipeline_parallel, []
        for index, group in enumerate(self.node_groups):
            owners += [index] * (group.num_nodes * self.group_gpus_per_node(index))
        stages = [owners[stage * per_stage:(stage + 1) * per_stage] for stage in range(pipeline_parallel)]
        return tuple(tuple((group, ranks.count(group) / per_stage) for group in sorted(set(ranks)))
                     for ranks in stages)

    def stage_groups(self, pipeline_parallel: int) -> tuple[int, ...]:
        """The group that sets each stage's pace: its own, or of the groups a stage's ranks straddle the one
        whose GPUs run slowest (stage_cluster). A uniform cluster: group 0 for every stage."""
        if not self.node_groups:
            return (0,) * pipeline_parallel
        return tuple(_slowest(self, span) for span in self.stage_spans(pipeline_parallel))

    def stage_clusters(self, pipeline_parallel: int) -> tuple["ClusterSpec", ...]:
        """The cluster each of `pipeline_parallel` stages runs on (stage_cluster): this one for every stage of a
        uniform cluster. One tuple per depth, so that the cost model's caches, keyed on the views, serve every plan."""
        if not self.node_groups:
            return (self,) * pipeline_parallel
        return _stage_clusters(self, pipeline_parallel)

    def stage_cluster(self, stage: int, pipeline_parallel: int) -> "ClusterSpec":
        """The cluster that stage `stage` of `pipeline_parallel` runs on: this one; on a mixed cluster its node
        group's view, or for a stage whose ranks straddle groups the slowest one's, with the least memory and the
        slowest links among them (every step of a stage waits for its slowest rank)."""
        if not self.node_groups:
            return self
        span = self.stage_spans(pipeline_parallel)[stage]
        return self.group_view(span[0]) if len(span) == 1 else _span_view(self, span)

    def _build_span_view(self, span: tuple[int, ...]) -> "ClusterSpec":
        views = [self.group_view(index) for index in span]
        slowest = self.group_view(_slowest(self, span))
        gpu = replace(slowest.gpu, memory_bytes=min(view.gpu.memory_bytes for view in views),
                      usable_memory_bytes=min(view.gpu.capacity_bytes for view in views))
        return replace(slowest, name=f"{self.name}:{'+'.join(self.node_groups[i].name for i in span)}",
                       num_nodes=sum(self.node_groups[i].num_nodes for i in span), gpu=gpu,
                       gpus_per_node=math.gcd(*(self.group_gpus_per_node(i) for i in span)),
                       intra_node=min((v.intra_node for v in views), key=lambda link: link.effective_bandwidth),
                       inter_node=min((v.inter_node for v in views), key=lambda link: link.effective_bandwidth))

    def with_nodes(self, num_nodes: int) -> "ClusterSpec":
        if num_nodes <= 0:
            raise UserError(f"--num-nodes must be positive, got {num_nodes}")
        if self.node_groups and num_nodes != self.num_nodes:
            raise UserError(f"--num-nodes {num_nodes}: mixed cluster '{self.name}' has the {self.num_nodes} nodes of "
                            "its groups; leave --num-nodes out or give that")
        try:
            return replace(self, num_nodes=num_nodes)
        except ValueError as error:
            raise UserError(f"--num-nodes {num_nodes}: {error}") from None

    def link_for_group(self, group_size: int, stride: int = 1) -> LinkSpec:
        """The slowest tier that groups of `group_size` ranks, `stride` apart, cross.

        In Megatron's rank order such groups tile blocks of group_size x stride
        consecutive ranks; every block stays inside a node only when it divides
        the node (a TP group of 6 on 8-GPU nodes straddles two nodes in places,
        and a collective runs at the pace of its slowest group).
        """
        block = group_size * stride
        inside = self.num_nodes == 1 or (block <= self.gpus_per_node and self.gpus_per_node % block == 0)
        return self.intra_node if inside else self.inter_node

    def ring_link_for_group(self, group_size: int, stride: int = 1) -> LinkSpec:
        """The link a ring collective (all-reduce, all-gather, reduce-scatter) of such groups runs at.

        Inside a node, the NVLink tier. Across nodes, NCCL's rings pass the data between a node's ranks over
        NVLink and cross each node boundary once per channel, with the channels spread over the node's NICs:
        a group with k ranks in each node moves its bytes through k NICs at once, so the ring runs at k times
        one GPU's inter-node bandwidth, and never faster than NVLink (NCCL's ring algorithm, S. Jeaugey, "NCCL
        2.0", GTC 2017: bus bandwidth across nodes is the per-node network bandwidth over the ranks that share
        it; nccl-tests' busbw reaches ~8 x 50 GB/s on 8-GPU DGX H100 nodes without SHARP)."""
        link = self.link_for_group(group_size, stride)
        return link if link is self.intra_node else _ring_link_across_nodes(self, group_size, stride)


@lru_cache(maxsize=4096)
def _ring_link_across_nodes(cluster: ClusterSpec, group_size: int, stride: int) -> LinkSpec:
    """ClusterSpec.ring_link_for_group of a group that crosses nodes, memoised (the search prices thousands of
    collectives over a few group shapes)."""
    link = cluster.inter_node
    per_node = max(1, min(group_size, cluster.gpus_per_node // stride))
    bandwidth = min(per_node * link.effective_bandwidth, cluster.intra_node.effective_bandwidth)
    return replace(link, bandwidth_bytes_per_s=bandwidth / link.efficiency)


@lru_cache(maxsize=256)
def _group_view(cluster: ClusterSpec, index: int) -> ClusterSpec:
    return cluster._build_group_view(index)


@lru_cache(maxsize=256)
def _stage_spans(cluster: ClusterSpec, pipeline_parallel: int) -> tuple[tuple[int, ...], ...]:
    return cluster._spans(pipeline_parallel)


@lru_cache(maxsize=256)
def _stage_clusters(cluster: ClusterSpec, pipeline_parallel: int) -> tuple[ClusterSpec, ...]:
    return tuple(cluster.stage_cluster(stage, pipeline_parallel) for stage in range(pipeline_parallel))


@lru_cache(maxsize=256)
def _span_view(cluster: ClusterSpec, span: tuple[int, ...]) -> ClusterSpec:
    return cluster._build_span_view(span)


def _slowest(cluster: ClusterSpec, span: tuple[int, ...]) -> int:
    """Of the node groups `span`, the one whose GPUs reach the fewest FLOP/s on large GEMMs."""
    def pace(index: int) -> float:
        view = cluster.group_view(index)
        return view.gpu.peak_flops * view.compute.max_fraction
    return min(span, key=pace)
