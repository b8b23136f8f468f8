"""All cost terms of one layer under one strategy, gathered in one record.

The search builds its time[L,S] and mem[L,S] tables from `layer_cost`, and
`estimate_plan` sums the same records, so both always agree.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..plan import LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.model import LayerSpec
from ..specs.training import TrainingSpec
from .communication import dp_comm_time, tp_comm_time, zero3_comm_time
from .compute import recompute_time
from .models import compute_model
from .memory import (attention_backward_extra_bytes, attention_workspace_bytes, layer_activation_bytes,
                     model_state_bytes, optimizer_temporary_bytes, zero3_gathered_bytes)


@dataclass(frozen=True)
class LayerCost:
    """One layer on one GPU of its stage. Times per micro-batch unless named per iteration."""

    forward_s: float
    backward_s: float
    recompute_s: float
    tp_comm_s: float
    zero3_exposed_s: float
    """ZeRO-3 gathers and scatters left over after overlapping with this layer's compute."""
    dp_comm_per_iteration_s: float
    """Gradient (and ZeRO-1/2 weight) traffic, once per iteration, before overlap."""
    state_bytes: float
    """Weights, gradients and optimizer states held for the whole run."""
    activation_bytes: float
    """Activations kept per micro-batch in flight."""
    transient_bytes: float
    """Extra bytes alive only while this layer runs (ZeRO-3 gathers, recomputed activations,
    the attention's backward working set)."""
    workspace_bytes: float = 0.0
    """Buffers the layer's kernels keep for the whole run, shared by all layers of a process (max, not sum)."""
    optimizer_temporary_bytes: float = 0.0
    """Temporaries the optimizer step allocates for this layer's shard (cost.memory.optimizer_temporary_bytes)."""

    @property
    def micro_batch_s(self) -> float:
        """Critical-path seconds of one micro-batch through this layer."""
        return self.forward_s + self.backward_s + self.recompute_s + self.tp_comm_s + self.zero3_exposed_s


@lru_cache(maxsize=65536)
def layer_cost(layer: LayerSpec, strategy: LayerStrategy, samples: int, seq: int,
               cluster: ClusterSpec, training: TrainingSpec) -> LayerCost:
    """Cost of `layer` with `samples` sequences per micro-batch on each of its DP ranks."""
    word = training.activation_bytes
    times = compute_model(cluster).layer_times(layer, seq, samples, strategy.tp, strategy.sp, cluster, word,
                                               training.attention_backend)
    recompute = recompute_time(times, strategy.recompute)
    compute = times.forward_s + times.backward_s + recompute
    zero3 = zero3_comm_time(layer.num_parameters, strategy, cluster, training, strategy.recompute == "full")
    backend = training.attention_backend
    activations = layer_activation_bytes(layer, seq, samples, strategy, word, cluster.dropout_mask_bytes, backend)
    rematerialised = attention_backward_extra_bytes(layer, seq, samples, strategy, backend)
    if strategy.recompute != "none":
        kept_without = layer_activation_bytes(layer, seq, samples, _no_recompute(strategy), word,
                                              cluster.dropout_mask_bytes, backend)
        rematerialised += kept_without - activations
    return LayerCost(
        forward_s=times.forward_s,
        backward_s=times.backward_s,
        recompute_s=recompute,
        tp_comm_s=tp_comm_time(layer.hidden_size, seq, samples, strategy, cluster, word),
        # FSDP prefetches the next gathers while this layer computes; on a cluster whose
        # runtime hides no communication behind compute (grad_overlap 0, cpu-gloo) it all shows.
        zero3_exposed_s=zero3 - cluster.grad_overlap * min(zero3, compute),
        dp_comm_per_iteration_s=dp_comm_time(layer.num_parameters, strategy, cluster, training),
        state_bytes=model_state_bytes(layer.num_parameters, strategy, training),
        activation_bytes=activations,
        transient_bytes=zero3_gathered_bytes(layer.num_parameters, strategy, training) + rematerialised,
        workspace_bytes=attention_workspace_bytes(layer, seq, samples, strategy, word, backend),
        optimizer_temporary_bytes=optimizer_temporary_bytes(layer.num_parameters, strategy, training),
    )


def _no_recompute(strategy: LayerStrategy) -> LayerStrategy:
    from dataclasses import replace

    return replace(strategy, recompute="none")
