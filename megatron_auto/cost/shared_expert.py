"""--moe-shared-expert-overlap: a MoE layer's shared expert beside its token dispatcher's communication.

Megatron-Core 0.16.1 (moe/token_dispatcher.py: MoEAlltoAllTokenDispatcher; moe/shared_experts.py): with the
flag, the alltoall dispatcher runs the shared expert on a CUDA stream of its own. Its input's TP gather is
issued while the tokens are permuted, fc1 once the dispatch all-to-all is issued, fc2 and its reduce-scatter
once the combine all-to-all is issued; autograd runs each backward on the stream of its forward, and
megatron-core raises the shared expert's gradient functions to the front of the backward's order. So the
shared expert's work (its GEMMs and its TP collectives) and the dispatch's communication run side by side,
and the shorter of the two hides behind the longer, as far as the cluster overlaps communication with
compute at all (ClusterSpec.grad_overlap: not on cpu-gloo, where the streams are no-ops). What is hidden is
taken off the layer's dispatch time (LayerCost.ep_comm_s); the shared expert stays in the compute.
"""
from __future__ import annotations

from ..plan import LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.model import LayerSpec
from ..specs.training import TrainingSpec
from .communication import tp_comm_time
from .compute import module_forward_shares


def overlaps_shared_expert(layer: LayerSpec, training: TrainingSpec) -> bool:
    """Whether the layer's shared expert runs beside its dispatch: a MoE layer with a shared expert, the flag,
    and the alltoall dispatcher (megatron-core's TransformerConfig refuses the overlap with any other)."""
    return (training.moe_shared_expert_overlap and layer.moe is not None
            and bool(layer.moe.shared_expert_ffn_hidden_size) and training.moe_token_dispatcher == "alltoall")


def shared_expert_seconds(layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int, cluster: ClusterSpec,
                          training: TrainingSpec, dense_pass_s: float) -> float:
    """The shared expert's work per micro-batch on its stream: its share of the dense part's compute passes
    (`dense_pass_s`: forward, backward and any replayed forward; the share is the MLP's of the analytic forward,
    compute.module_forward_shares, as selective `mlp` recompute takes it) and its half of the layer's TP
    collectives (the attention holds the other half)."""
    word = training.activation_bytes
    mlp_share = module_forward_shares(layer, seq, samples, strategy.tp, strategy.sp, cluster, word,
                                      training.attention_backend)[0]
    return mlp_share * dense_pass_s + tp_comm_time(layer.hidden_size, seq, samples, strategy, cluster, word) / 2


def hidden_dispatch_seconds(layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int,
                            cluster: ClusterSpec, training: TrainingSpec, dense_pass_s: float,
                            dispatch_s: float) -> float:
    """Seconds of the dispatch's communication (`dispatch_s`, every pass of one micro-batch) that the shared
    expert's stream hides: grad_overlap x the shorter of the two; 0 without the overlap."""
    if not overlaps_shared_expert(layer, training) or strategy.ep * strategy.expert_tp == 1:
        return 0.0
    shared = shared_expert_seconds(layer, strategy, samples, seq, cluster, training, dense_pass_s)
    return cluster.grad_overlap * min(shared, dispatch_s)
