"""Fine-grained activation offloading (Megatron-LM's --fine-grained-activation-offloading --offload-modules):
the saved inputs of the named modules go to pinned host memory in forward and come back in backward.

What leaves (megatron/core/pipeline_parallel/fine_grained_activation_offload.py, Megatron-Core 0.16.1): each
offloaded module's input as autograd saves it, tensor by tensor, when it has at least --min-offloaded-tensor-size
elements (ChunkOffloadHandler.tensor_need_offloading_checker). Nothing is offloaded from a layer under full
recompute (the checkpoint keeps only the layer's input), nor from a module that selective recompute re-runs
(its input is then the checkpoint's, which this model keeps on the device).

When. After a module's forward, its group is copied on a device-to-host stream (on_group_commit_forward) while
the next modules compute; at the start of a group's backward the next group to be needed is reloaded on a
host-to-device stream (on_group_start_backward -> bulk_reload), one group ahead, and the compute waits for it
only at that group's backward (on_group_commit_backward). So per layer the copy is exposed only where it
outlasts the layer's own pass: max(0, bytes / host link - forward) in forward, the same against the backward (with
the layer's recomputation, which runs in it) in backward (PCIe is full duplex: the two directions do not
contend). The copies' HBM traffic (at most ~2% of an H100's) is not priced.

What stays. The device holds a layer's offloaded bytes while they are copied out and again once reloaded: the
reload one group ahead means the layer in backward and the next one (two layers' worth), and
post_warmup_callback keeps the last group of each module name on the device so that the first backward does not
wait (one more layer, the first in backward). Two layers' offloaded bytes are priced as transient while a layer
runs; the rest leaves the kept activations.
"""
from __future__ import annotations

from ..plan import LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.host_knobs import DEFAULT_MIN_OFFLOADED_TENSOR_SIZE
from ..specs.model import LayerSpec
from ..specs.training import TrainingSpec
from .memory import qkv_kept_width
from .moe import expert_tokens, experts_recomputed

RESIDENT_LAYERS = 2
"""Layers' offloaded bytes on the device while a layer runs (module docstring)."""


def offloaded_tensors(layer: LayerSpec, strategy: LayerStrategy, seq: int, samples: int,
                      training: TrainingSpec) -> dict[str, tuple[float, float]]:
    """(elements, bytes) per micro-batch on one GPU of each offloaded module's saved input, by module, before the
    size threshold. Widths as cost/memory.py keeps them: the norms' inputs and the QKV input h per token (split
    over TP with SP), the core's Q, K, V and the projection's input over TP, and a MoE layer's routed copies
    (cost/moe.py): the experts' fc1 input h (an FP8 copy of 1 byte under fp8) and the activation's input,
    fc1's output, (2 with SwiGLU) f / etp."""
    if strategy.recompute == "full" or not training.offload_modules:
        return {}
    recomputed = training.selective_modules(layer) if strategy.recompute == "selective" else frozenset()
    word, tokens = training.activation_bytes, seq * samples
    hidden = tokens * layer.hidden_size / (strategy.tp if strategy.sp else 1)
    widths = {"attn_norm": hidden, "mlp_norm": hidden,
              "attn_proj": tokens * layer.attention_width / strategy.tp}
    if "layernorm" not in recomputed:
        widths["qkv_linear"] = hidden
    if "core_attn" not in recomputed:
        widths["core_attn"] = tokens * qkv_kept_width(layer, True, "mla_up_proj" in recomputed,
                                                      training.fused_norms) / strategy.tp
    tensors = {name: (elements, word * elements) for name, elements in widths.items()}
    if layer.moe is not None and not experts_recomputed(layer, strategy, training):
        copies = expert_tokens(layer, seq, samples, strategy, training.moe_load_imbalance)
        fc1_in = copies * layer.hidden_size
        act_in = copies * (2 if layer.swiglu else 1) * layer.moe.expert_ffn_hidden_size / strategy.expert_tp
        tensors["expert_fc1"] = (fc1_in, (1 if training.fp8 else word) * fc1_in)
        tensors["moe_act"] = (act_in, word * act_in)
    return {name: tensors[name] for name in training.offload_modules if name in tensors}


def offloaded_bytes(layer: LayerSpec, strategy: LayerStrategy, seq: int, samples: int,
                    training: TrainingSpec) -> float:
    """Bytes per micro-batch that leave one GPU for the host: the offloaded inputs at or above the size threshold."""
    tensors = offloaded_tensors(layer, strategy, seq, samples, training).values()
    return sum(size for elements, size in tensors if elements >= training.min_offloaded_tensor_size)


def offload_exposed_seconds(offloaded: float, forward_s: float, backward_s: float,
                            cluster: ClusterSpec) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch the copies add to a layer: each direction's copy beyond the
    pass it runs beside (module docstring)."""
    if offloaded <= 0:
        return 0.0, 0.0
    if cluster.gpu.host_link_bytes_per_s <= 0:
        raise ValueError(f"GPU {cluster.gpu.name} has no host link bandwidth (GpuSpec.host_link_bytes_per_s)")
    copy = offloaded / cluster.gpu.host_link_bytes_per_s
    return max(0.0, copy - forward_s), max(0.0, copy - backward_s)


def offload_flags(training: TrainingSpec) -> list[str]:
    """Megatron-LM's flags for the offloading `training` prices."""
    if not training.offload_modules:
        return []
    size = training.min_offloaded_tensor_size
    threshold = ["--min-offloaded-tensor-size", str(size)] if size != DEFAULT_MIN_OFFLOADED_TENSOR_SIZE else []
    return ["--fine-grained-activation-offloading", "--offload-modules", *training.offload_modules, *threshold]
