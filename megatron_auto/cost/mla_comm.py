"""The tensor-parallel collectives that multi-latent attention (DeepSeek-V2, arXiv 2405.04434) runs
beyond a SelfAttention layer's, priced by the communication model (its element-wise copies and kept
bytes: cost/mla.py).

The layer is Megatron-Core 0.16.1's MLASelfAttention on the local spec (megatron/core/transformer/
multi_latent_attention.py).
"""
from __future__ import annotations

from ..plan import LayerStrategy
from ..specs.cluster import ClusterSpec
from ..specs.model import LayerSpec
from .models import comm_model


def mla_tp_comm_time(layer: LayerSpec, seq: int, samples: int, strategy: LayerStrategy, cluster: ClusterSpec,
                     activation_bytes: int, up_recomputed: bool = False) -> float:
    """TP collectives of one micro-batch that multi-latent attention runs beyond the four h-wide ones of
    communication.tp_comm_time, forward plus backward (0 for other layers or TP 1).

    Each column-parallel linear on the hidden state reduces its input gradient (SP: gathers its input and
    reduce-scatters that gradient), and MLA has two (the query's and the key/value down projection) where
    SelfAttention has one. The down projections' outputs are all-gathered over TP (gather_from_tensor_model_
    parallel_region; its backward is a split); the up projections reduce their latent inputs' gradients.
    Under SP the gathered latents are scattered back to sequence shards (backward: all-gather) and each up
    projection all-gathers its input's sequence (backward: reduce-scatter), and every sequence-parallel input
    is gathered again in backward for the weight gradient, exposed as in tp_comm_time. The rotated key part
    (d_r channels of the whole sequence, shared by every head) has its gradient all-reduced over TP, which
    megatron-core 0.16.1 leaves out and patches/mla_tensor_parallel.py adds. Full recompute
    replays the forward's collectives; selective recompute of mla_up_proj (`up_recomputed`) the up
    projections' sequence gathers."""
    if layer.mla is None or strategy.tp == 1:
        return 0.0
    comm, t = comm_model(cluster), strategy.tp
    mla, h = layer.mla, layer.hidden_size

    def collective(kind: str, width: int) -> float:
        return comm.collective_time(kind, seq * samples * width * activation_bytes, t, 1, cluster) if width else 0.0

    q_latent, kv_latent = mla.q_lora_rank or 0, mla.kv_lora_rank
    forward = collective("all_gather", q_latent) + collective("all_gather", kv_latent + mla.qk_pos_emb_head_dim)
    if strategy.sp:
        forward += sum(collective("all_gather", width) for width in (h, q_latent, kv_latent))
        backward = sum(collective("reduce_scatter", width) + collective("all_gather", width)
                       for width in (q_latent, kv_latent)) + collective("reduce_scatter", h)
        regathers = sum(collective("all_gather", width) for width in (h, q_latent, kv_latent))
        backward += regathers * (1.0 - comm.grad_overlap)
    else:
        backward = sum(collective("all_reduce", width) for width in (h, q_latent, kv_latent))
    backward += collective("all_reduce", mla.qk_pos_emb_head_dim)
    replayed = forward if strategy.recompute == "full" else 0.0
    if up_recomputed and strategy.recompute == "selective" and strategy.sp:
        replayed = collective("all_gather", q_latent) + collective("all_gather", kv_latent)
    return forward + replayed + backward
