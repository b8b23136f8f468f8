"""The word embedding (first stage) and the LM head with its loss (last stage)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ..plan import LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import TrainingSpec
from .communication import dp_cost_fields, tp_comm_time
from .flops import Gemm
from .layer_kernels import embedding_times, head_memory_times
from .models import comm_model, compute_model
from .memory import (embedding_activation_bytes, kept_logit_bytes, logits_activation_bytes, logits_transient_bytes,
                     model_state_bytes, optimizer_temporary_bytes)


@dataclass(frozen=True)
class PartCost:
    micro_batch_s: float
    backward_s: float
    tp_comm_s: float
    dp_comm_per_iteration_s: float
    state_bytes: float
    activation_bytes: float
    transient_bytes: float = 0.0
    optimizer_temporary_bytes: float = 0.0
    """The optimizer step's temporaries for this part's weights (cost.memory.optimizer_temporary_bytes)."""
    loss_bytes: float = 0.0
    """LM head: bytes beside the kept logits while the loss runs (cost.memory.logits_transient_bytes)."""
    dp_gather_per_iteration_s: float = 0.0
    """Of dp_comm_per_iteration_s, the ZeRO-1/2 weight all-gather, beside the forward (dp_comm_times)."""


@dataclass(frozen=True)
class EmbeddingCost:
    embedding: PartCost
    head: PartCost


@lru_cache(maxsize=4096)
def embedding_cost(model: ModelSpec, strategy: LayerStrategy, samples: int, cluster: ClusterSpec,
                   training: TrainingSpec, pipeline_parallel: int) -> EmbeddingCost:
    """Vocab-parallel embedding and LM head (Megatron: VocabParallelEmbedding, a
    column-parallel output layer, vocab-parallel cross entropy). With tied weights
    and p > 1 the last stage keeps its own copy of the word embedding (SC21 Sec. 3)."""
    s, h, vocab = model.seq_length, model.hidden_size, model.vocab_size
    word = training.activation_bytes
    # One collective each: the embedding's output all-reduce in forward, the LM
    # head's input-gradient all-reduce in backward (tp_comm_time counts a layer's four).
    one_collective = tp_comm_time(h, s, samples, _no_recompute(strategy), cluster, word) / 4
    embedding_forward, embedding_backward, head_forward, head_backward = _memory_bound_times(
        model, samples * s, strategy.tp, word, cluster, training.cross_entropy_fusion)
    embedding = PartCost(
        micro_batch_s=one_collective + embedding_forward + embedding_backward, backward_s=embedding_backward,
        tp_comm_s=one_collective,
        **dp_cost_fields(model.embedding_parameters, strategy, cluster, training),
        state_bytes=model_state_bytes(model.embedding_parameters, strategy, training),
        activation_bytes=embedding_activation_bytes(model, samples, strategy, word, cluster.dropout_mask_bytes),
        optimizer_temporary_bytes=optimizer_temporary_bytes(model.embedding_parameters, strategy, training),
    )
    logits = compute_model(cluster).gemm_time(Gemm(samples * s, h, vocab // strategy.tp), cluster)
    head_params = vocab * h if (pipeline_parallel > 1 or model.untie_embeddings_and_output_weights) else 0
    loss_comm = cross_entropy_comm_time(s * samples, strategy, cluster)
    head = PartCost(
        micro_batch_s=3 * logits + head_forward + head_backward + one_collective + loss_comm,
        backward_s=2 * logits + head_backward,
        tp_comm_s=one_collective + loss_comm,
        **dp_cost_fields(head_params, strategy, cluster, training),
        state_bytes=model_state_bytes(head_params, strategy, training),
        activation_bytes=logits_activation_bytes(model, samples, strategy,
                                                 kept_logit_bytes(training.cross_entropy_fusion, word)),
        optimizer_temporary_bytes=optimizer_temporary_bytes(head_params, strategy, training),
        loss_bytes=logits_transient_bytes(model, samples, strategy, word, training.cross_entropy_fusion),
    )
    return EmbeddingCost(embedding=embedding, head=head)


def _memory_bound_times(model: ModelSpec, tokens: int, tp: int, word: int,
                        cluster: ClusterSpec, fusion: str) -> tuple[float, float, float, float]:
    """(embedding forward, backward, head forward, backward) seconds of memory-bound work: priced
    kernel by kernel on `kernel_level` clusters (cost/layer_kernels.py), else not modelled."""
    if not cluster.compute.kernel_level or cluster.measured is not None:
        return 0.0, 0.0, 0.0, 0.0
    h, vocab = model.hidden_size, model.vocab_size
    return (*embedding_times(tokens, h, vocab, tp, word, cluster),
            *head_memory_times(tokens, h, vocab, tp, word, cluster, fusion))


def cross_entropy_comm_time(tokens: int, strategy: LayerStrategy, cluster: ClusterSpec) -> float:
    """The vocab-parallel cross entropy's three all-reduces over TP, of one fp32 value per token
    each: the logits' max, the target logit and the sum of exponentials (Megatron-Core
    tensor_parallel/cross_entropy.py, _VocabParallelCrossEntropy.forward)."""
    if strategy.tp == 1:
        return 0.0
    return 3 * comm_model(cluster).collective_time("all_reduce", 4.0 * tokens, strategy.tp, 1, cluster)


def _no_recompute(strategy: LayerStrategy) -> LayerStrategy:
    return replace(strategy, recompute="none")
