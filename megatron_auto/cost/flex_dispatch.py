"""The flex token dispatcher (Megatron-LM's --moe-token-dispatcher-type flex, DeepEP or HybridEP kernels).

Megatron-Core 0.16.1's MoEFlexTokenDispatcher (moe/token_dispatcher.py, moe/fused_a2a.py) hands the routed
tokens to DeepEP's "normal" kernels or NVIDIA's HybridEP. Both send a token across the network once to each
node that hosts at least one of its experts, to the GPU of the same local index there, and forward it over
NVLink to the GPUs of that node that need it (DeepEP README, "normal kernels": NVLink and RDMA forwarding;
Megatron-Core MoE README, dispatchers table: "removes redundant tokens during cross-node communication").
The alltoall dispatcher sends each of a token's k copies on its own, so a token whose experts share a node
crosses the network more than once (DeepSeek-V3 report, arXiv 2412.19437, Sec. 3.2.2, node-limited routing).

Balanced routing is assumed, as the rest of the MoE model does: a token's k experts are k distinct experts
drawn uniformly, and with group-limited routing (--moe-router-num-groups G, --moe-router-group-topk g) drawn
from g groups chosen uniformly, each chosen group assumed to receive at least one (so a node is reached
exactly when one of its groups is chosen).
"""
from __future__ import annotations

from math import comb

from ..specs.cluster import ClusterSpec
from ..specs.model import MoESpec
from .collectives import all_to_all_time


def node_reach_probability(moe: MoESpec, nodes: int) -> float:
    """The chance that a given one of the EP group's `nodes` nodes hosts at least one of a token's experts
    (each node holds E / nodes experts, contiguous, as Megatron-Core places them)."""
    experts, k = moe.num_experts, moe.router_topk
    per_node = experts // nodes
    uniform = 1.0 - comb(experts - per_node, k) / comb(experts, k)
    groups, chosen = moe.router_num_groups, moe.router_group_topk
    if not groups or groups % nodes:
        return uniform
    groups_per_node = groups // nodes
    return min(uniform, 1.0 - comb(groups - groups_per_node, chosen) / comb(groups, chosen))


def flex_all_to_all_time(token_bytes: float, moe: MoESpec, ep: int, stride: int, cluster: ClusterSpec) -> float:
    """One dispatch (or combine) of a rank's tokens, `token_bytes` in all (one copy of each, load imbalance
    included), over an EP group of `ep` ranks `stride` apart. Across nodes each token crosses the network once
    per other node it reaches; the k copies then spread over NVLink, 1/per_node of them staying on the GPU that
    received them. The slower of the two paths sets the time. A group inside one node moves what alltoall
    moves."""
    link = cluster.link_for_group(ep, stride)
    per_node = cluster.gpus_per_node // stride if cluster.gpus_per_node % stride == 0 else 0
    copies = moe.router_topk * token_bytes
    if link is cluster.intra_node or per_node < 1 or ep % per_node:
        return all_to_all_time(copies, ep, link)
    nodes = ep // per_node
    remote = token_bytes * (nodes - 1) * node_reach_probability(moe, nodes)
    intra, inter = cluster.intra_node, cluster.inter_node
    local = copies * (per_node - 1) / per_node / intra.effective_bandwidth + intra.latency_s if per_node > 1 else 0.0
    return max(local, remote / inter.effective_bandwidth + inter.latency_s)
