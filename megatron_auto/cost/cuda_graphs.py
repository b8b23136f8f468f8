"""CUDA graphs (Megatron-LM's --cuda-graph-impl, --cuda-graph-scope): what they take off the host and keep on the
device.

Time. A kernel-level layer takes at least ops x GpuSpec.kernel_launch_s per pass (cost/layer_kernels.py: eager
PyTorch issues one op at a time, 25 us each on an H100 with Megatron-Core's Python around it). A replayed graph
issues its captured kernels with one launch (cudaGraphLaunch) and none of the Python, so the captured ops leave
the host's count and each graph adds one: the floor becomes (uncaptured ops + graphs) x kernel_launch_s. The GPU's
own time is unchanged. Where the GPU already outlasts the host (large shards) graphs save nothing; clusters
whose kernel_launch_s is 0 (A100, CPU) have no host term to take away.

Memory. Each captured graph keeps a static copy of its input for every micro-batch in flight: Transformer
Engine's helper (megatron/core/transformer/cuda_graphs.py, TECudaGraphHelper._get_sample_arguments) makes one
static input per (layer, micro-batch) and reuses it only once that micro-batch's backward has run, and the local
implementation clones each graph's inputs into its pool (_CudaGraphRunner.create_fwd_graph, clone_inputs=True).
Eager autograd shares that tensor with the previous module's output, so the copy is extra: one hidden state,
s b h / (tp with SP) elements, per graph. A full_iteration graph captures the whole forward and backward of an
iteration with its allocations as they are, and copies only the data batch (full_cuda_graph.py,
StaticBufferLoader): no per-layer term. The graphs' private pool is not reusable by eager allocations; the
fragmentation that leaves is not priced.

Megatron-Core 0.16.1 refuses layer graphs under full recompute (transformer_config.py: "full recompute is only
supported with full iteration CUDA graph"), so a layer with full recompute gets no graph unless the scope is
full_iteration.
"""
from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..plan import LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.model import LayerSpec
from ..specs.training import TrainingSpec
from .layer_kernels import HOST_OPS_FORWARD, HOST_OPS_MLP, HOST_OPS_NORMS

HOST_OPS_MLP_SIDE = HOST_OPS_MLP + HOST_OPS_NORMS // 2 + 3
"""Forward ops of TransformerLayer._forward_mlp in the layer of HOST_OPS_FORWARD: the pre-MLP norm, the MLP and
its bias-dropout-add (bias add, dropout, residual add); the rest is _forward_attention, the `attn` scope."""


def graphs_apply(strategy: LayerStrategy, training: TrainingSpec) -> bool:
    """Whether `training`'s CUDA graphs capture a layer run under `strategy` (none under full recompute, which
    Megatron-Core allows only with a full_iteration graph)."""
    if training.cuda_graph_impl == "none":
        return False
    return strategy.recompute != "full" or "full_iteration" in training.cuda_graph_scope


def captured_ops(layer: LayerSpec, training: TrainingSpec) -> tuple[int, int]:
    """(forward host ops the graphs capture of a layer's HOST_OPS_FORWARD, graphs replayed per pass). The whole
    layer: all in one graph; full_iteration: all, the iteration's one launch spread thin (0 per layer); attn: the
    attention side; mlp: a dense layer's MLP side; moe or moe_router: a MoE layer's MLP side (its norm, router and
    shared expert; the routed side's own floor is cost/moe.py's expert_host_seconds). moe_preprocess adds nothing
    priced."""
    scopes = training.cuda_graph_scope
    if "full_iteration" in scopes:
        return HOST_OPS_FORWARD, 0
    if not scopes:
        return HOST_OPS_FORWARD, 1
    ops, graphs = 0, 0
    if "attn" in scopes:
        ops, graphs = ops + HOST_OPS_FORWARD - HOST_OPS_MLP_SIDE, graphs + 1
    mlp_scope = ("moe", "moe_router") if layer.moe is not None else ("mlp",)
    if set(mlp_scope) & set(scopes):
        ops, graphs = ops + HOST_OPS_MLP_SIDE, graphs + 1
    return ops, graphs


def routed_side_graphed(strategy: LayerStrategy, training: TrainingSpec) -> bool:
    """Whether a graph captures a MoE layer's routed side (router, dispatch, experts, combine) with its host ops:
    a full_iteration graph, or the `moe` scope (cost/moe.py, expert_host_seconds)."""
    scopes = training.cuda_graph_scope
    return graphs_apply(strategy, training) and ("full_iteration" in scopes or "moe" in scopes)


def graphed_cluster(layer: LayerSpec, strategy: LayerStrategy, cluster: ClusterSpec,
                    training: TrainingSpec) -> ClusterSpec:
    """`cluster` with the host seconds per op that make a layer's floors (ops x kernel_launch_s, forward and
    backward alike) the graphed floor (uncaptured ops + graphs) x kernel_launch_s; `cluster` itself where no
    graph captures the layer or the cluster has no host term."""
    if not graphs_apply(strategy, training) or cluster.gpu.kernel_launch_s <= 0:
        return cluster
    ops, graphs = captured_ops(layer, training)
    if ops == 0:
        return cluster
    return _scaled_launch(cluster, (HOST_OPS_FORWARD - ops + graphs) / HOST_OPS_FORWARD)


@lru_cache(maxsize=64)
def _scaled_launch(cluster: ClusterSpec, factor: float) -> ClusterSpec:
    return replace(cluster, gpu=replace(cluster.gpu, kernel_launch_s=cluster.gpu.kernel_launch_s * factor))


def graph_static_input_bytes(layer: LayerSpec, strategy: LayerStrategy, seq: int, samples: int,
                             training: TrainingSpec) -> float:
    """Bytes per micro-batch in flight of the graphs' static input copies on one GPU: one hidden state
    (s b h, split over TP with SP) per graph that captures the layer (module docstring)."""
    if not graphs_apply(strategy, training):
        return 0.0
    graphs = captured_ops(layer, training)[1]
    return graphs * training.activation_bytes * seq * samples * layer.hidden_size / (strategy.tp if strategy.sp else 1)


def cuda_graph_flags(strategies, training: TrainingSpec) -> list[str]:
    """Megatron-LM's flags for the graphs `training` prices on layers of `strategies`: none where no layer is
    captured, or where one runs full recompute outside a full_iteration graph (Megatron-Core refuses that run;
    only a hybrid plan, which our runtime runs without graphs, can mix it with captured layers). With them, what
    Megatron-LM 0.16.1's arguments.py asserts beside them: --no-check-for-nan-in-loss-and-grad under a
    full_iteration graph, and --moe-pad-experts-for-cuda-graph-inference (read by inference alone) for local
    graphs with expert parallelism."""
    if training.cuda_graph_impl == "none" or not all(graphs_apply(s, training) for s in strategies):
        return []
    scope = ["--cuda-graph-scope", *training.cuda_graph_scope] if training.cuda_graph_scope else []
    nan_check = ["--no-check-for-nan-in-loss-and-grad"] if "full_iteration" in training.cuda_graph_scope else []
    pad = (["--moe-pad-experts-for-cuda-graph-inference"]
           if training.cuda_graph_impl == "local" and any(s.ep > 1 for s in strategies) else [])
    return ["--cuda-graph-impl", training.cuda_graph_impl, *scope, *nan_check, *pad]
