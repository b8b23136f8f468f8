"""--overlap-moe-expert-parallel-comm: one micro-batch's token dispatch beside another's compute.

Megatron-Core 0.16.1 runs the combined 1F1B schedule (pipeline_parallel/combined_1f1b.py; per layer,
models/common/model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run): in each steady-state step
the forward of one micro-batch and the backward of another go through a layer together, its communication
on one stream and its compute on another, in three phases:

    communication: combine backward | dispatch forward, dispatch backward | combine forward
    compute:       attention forward | experts backward, experts forward  | attention backward

so a phase lasts as long as the longer of its two sides. "attention" is the layer's dense part without its
shared expert (attention, norms, router); "experts" the routed experts with the shared expert
(fine_grained_callables.py). Each all-to-all (a dispatch or a combine) is half a dispatch pass of
cost/moe.py. A `moe` recompute replay's third pass is not in the merged step and stays exposed.

The schedule's warm-up forwards and cool-down backwards run alone: what they would hide shows again once per
iteration (cost/estimate.py, unmerged_ep_seconds). Left out: the SMs the communication kernels take from the
compute.
"""
from __future__ import annotations

from ..plan import LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.model import LayerSpec
from ..specs.training import TrainingSpec
from .compute import module_forward_shares


def ep_overlap_applies(layer: LayerSpec, strategy: LayerStrategy, training: TrainingSpec) -> bool:
    """The flag, a MoE layer and an EP group of more than one rank (Megatron-Core refuses ep 1), not under full
    recomputation (refused too)."""
    return training.moe_ep_overlap and layer.moe is not None and strategy.ep > 1 and strategy.recompute != "full"


def ep_overlap_runs(plan, model, training: TrainingSpec) -> bool:
    """Whether the plan runs the combined 1F1B schedule: the flag and a MoE layer with ep > 1."""
    return training.moe_ep_overlap and any(layer.moe is not None and strategy.ep > 1 for layer, strategy
                                           in zip(model.layers, plan.layer_strategies))


def ep_overlap_layout_problem(pipeline_parallel: int, virtual_stages: int, recompute: str) -> str:
    """Why Megatron-Core 0.16.1 refuses --overlap-moe-expert-parallel-comm with this layout, or ''
    (transformer_config.py)."""
    if pipeline_parallel > 1 and virtual_stages == 1:
        return "--overlap-moe-expert-parallel-comm needs virtual pipeline stages when pp > 1 (as in Megatron-Core)"
    if recompute == "full":
        return "--overlap-moe-expert-parallel-comm does not run with full recomputation (as in Megatron-Core)"
    return ""


def exposed_steady_state(all_to_all_s: float, attention_s: tuple[float, float], experts_s: tuple[float, float]
                         ) -> float:
    """Seconds the communication adds beyond the compute in one merged step of one layer: the three phases,
    with `attention_s` and `experts_s` as (forward, backward)."""
    attention_forward, attention_backward = attention_s
    return (max(0.0, all_to_all_s - attention_forward) + max(0.0, 2 * all_to_all_s - sum(experts_s))
            + max(0.0, all_to_all_s - attention_backward))


def hidden_ep_seconds(layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int, cluster: ClusterSpec,
                      training: TrainingSpec, dense_s: tuple[float, float], experts_s: tuple[float, float],
                      dispatch_pass_s: float) -> float:
    """Seconds of one micro-batch's dispatch and combine (forward and backward passes, `dispatch_pass_s` each)
    that the merged step hides, as far as the cluster overlaps communication at all (grad_overlap: 0 on
    cpu-gloo). `dense_s` and `experts_s` are the dense part's and the routed experts' (forward, backward)."""
    if not ep_overlap_applies(layer, strategy, training) or dispatch_pass_s <= 0:
        return 0.0
    shared = module_forward_shares(layer, seq, samples, strategy.tp, strategy.sp, cluster,
                                   training.activation_bytes, training.attention_backend)[0]
    attention = tuple((1 - shared) * seconds for seconds in dense_s)
    experts = tuple(expert + shared * dense for expert, dense in zip(experts_s, dense_s))
    half = dispatch_pass_s / 2
    exposed = exposed_steady_state(half, attention, experts)
    return cluster.grad_overlap * (2 * dispatch_pass_s - exposed)
