"""Core attention on torch's scaled_dot_product_attention, for Megatron-Core's local layer spec.

A drop-in for megatron.core.transformer.dot_product_attention.DotProductAttention
(same constructor and forward; SelfAttention builds it as `core_attention`):
query [sq, b, np, hn], key/value [sk, b, ng, hn] in, context [sq, b, np * hn] out.
Where DotProductAttention materialises the [b, np, sq, sk] scores, softmax and
dropout (and keeps them for backward), SDPA runs one kernel (flash, memory-efficient
or cuDNN on CUDA) that keeps only the output and the row statistics. Measured on an
H100 (data/reference/h100/README.md, GPT 1.7B shape): the same PyTorch script took
2.41 s per step with attention written the unfused way and foreach AdamW, 0.883 s with
SDPA and fused AdamW.

Semantics kept from DotProductAttention:
- softmax scale: 1/sqrt(hn) or `softmax_scale`; with apply_query_key_layer_scaling
  Megatron divides it by the layer number and multiplies the scores back by the
  same factor inside the fp32 softmax, so the scale applied is the unscaled one;
- causal masking when no mask is passed (is_causal, nothing materialised); a
  passed boolean mask (True = masked out) is used as given, as Megatron's softmax does;
- attention dropout on the probabilities, inside the kernel, drawn from the
  tensor-parallel RNG tracker's fork unless sequence parallelism is on;
- grouped-query attention: key/value groups shared by np/ng query heads;
- multi-latent attention (MLASelfAttention builds its core with `k_channels`, the query/key head width
  qk_head_dim + qk_pos_emb_head_dim, and `v_channels`, the value head width, as Transformer Engine's
  DotProductAttention takes them): SDPA takes values of another width than the queries (Ev != E) and the
  context is np x v_channels wide; MLA passes its own softmax scale. Megatron-Core 0.16.1's unfused
  DotProductAttention takes neither keyword: MLADotProductAttention below is it with both;
- context parallelism (config.context_parallel_size > 1, causal mask only): the keys and values are
  all-gathered over the CP group (runtime/context_parallel.py), whatever cp_comm_type asks, since the
  communication patterns Megatron offers all compute the same attention.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from megatron.core import tensor_parallel
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide

from .context_parallel import context_parallel_attention


def megatron_softmax_scale(config: TransformerConfig, head_width: int, layer_number: int,
                           softmax_scale: Optional[float]) -> tuple[float, float]:
    """(scale on the QK^T product, factor the softmax multiplies back): DotProductAttention's pair."""
    scale = 1.0 / math.sqrt(head_width) if softmax_scale is None else softmax_scale
    coeff = float(layer_number) if config.apply_query_key_layer_scaling else 1.0
    return scale / coeff, coeff


def head_widths(config: TransformerConfig, tp: int, k_channels: Optional[int],
                v_channels: Optional[int]) -> tuple[int, int]:
    """(query/key channels per head, context channels on one of `tp` shards): kv_channels for both widths, or
    MLA's k_channels and v_channels (the context is np x v_channels wide)."""
    key = k_channels or config.kv_channels
    return key, divide((v_channels or config.kv_channels) * config.num_attention_heads, tp)


def check_supported(config: TransformerConfig) -> None:
    """ValueError for configurations this core does not run (DotProductAttention or TE does)."""
    if config.context_parallel_size > 1 and config.cp_comm_type not in (None, "p2p", "all_gather", "a2a"):
        raise ValueError(f"SDPA core attention runs context parallelism one way (all-gathered keys and values), "
                         f"which computes what cp_comm_type {config.cp_comm_type!r} asks only for p2p, all_gather "
                         "or a2a")
    if config.softmax_type != "vanilla":
        raise ValueError(f"SDPA core attention runs the vanilla softmax, not {config.softmax_type!r}")
    if config.window_size is not None:
        raise ValueError("SDPA core attention does not run sliding-window attention")


class SDPAttention(MegatronModule):
    """DotProductAttention's interface, computed by torch.nn.functional.scaled_dot_product_attention."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str, attention_dropout: Optional[float] = None,
                 softmax_scale: Optional[float] = None, k_channels: Optional[int] = None,
                 v_channels: Optional[int] = None, cp_comm_type: Optional[str] = None,
                 pg_collection: Optional[ProcessGroupCollection] = None):
        super().__init__(config=config)
        check_supported(config)
        self.config: TransformerConfig = config
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp", "cp"])
        self.pg_collection = pg_collection
        self.tp_group = pg_collection.tp
        self.cp_group = getattr(pg_collection, "cp", None) if config.context_parallel_size > 1 else None
        tp = pg_collection.tp.size()
        self.hidden_size_per_attention_head, self.hidden_size_per_partition = head_widths(
            config, tp, k_channels, v_channels)
        self.num_attention_heads_per_partition = divide(config.num_attention_heads, tp)
        self.num_query_groups_per_partition = divide(config.num_query_groups, tp)
        self.softmax_scale, coeff = megatron_softmax_scale(config, self.hidden_size_per_attention_head,
                                                           self.layer_number, softmax_scale)
        self.kernel_scale = self.softmax_scale * coeff
        """What multiplies QK^T before the softmax: Megatron's scale times its layer-scaling factor."""
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout
        self.softmax_offset = None  # DotProductAttention's attribute for the vanilla softmax

    def _mask(self, attention_mask: Optional[Tensor], mask_type: AttnMaskType, sq: int, sk: int):
        """(attn_mask for SDPA, is_causal): FusedScaleMaskSoftmax's choice of mask, without building one."""
        if attention_mask is not None:
            return ~attention_mask, False  # Megatron masks where True; SDPA attends where True
        if mask_type == AttnMaskType.causal and sq > 1:
            if sq != sk:
                raise ValueError("causal mask is only for self attention (sq == sk)")
            return None, True
        return None, False

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: bool) -> Tensor:
        dropout_p = self.dropout_p if self.training else 0.0
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal, scale=self.kernel_scale,
            enable_gqa=k.size(1) != q.size(1))

    def _core(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], causal: bool) -> Tensor:
        """One kernel over the whole sequence, or the context-parallel split of it (runtime/context_parallel.py)."""
        if self.cp_group is not None:
            return context_parallel_attention(q, k, v, self.cp_group, self._attend)
        return self._attend(q, k, v, mask, causal)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                attn_mask_type: Optional[AttnMaskType] = None, attention_bias: Optional[Tensor] = None,
                packed_seq_params=None) -> Tensor:
        """[sq, b, np, hn] queries, [sk, b, ng, hn] keys/values -> [sq, b, np * hn] context."""
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPA core attention takes no packed sequences or attention bias")
        sq, batch = query.size(0), query.size(1)
        mask_type = attn_mask_type or self.attn_mask_type
        # [s, b, n, hn] -> [b, n, s, hn]: SDPA's layout (a strided view; the kernels take it).
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        if self.cp_group is not None:
            if attention_mask is not None or mask_type != AttnMaskType.causal:
                raise ValueError("context parallelism runs the causal mask only (no attention mask passed)")
            mask, causal = None, True
        else:
            mask, causal = self._mask(attention_mask, mask_type, sq, key.size(0))
        if self.training and self.dropout_p > 0 and not self.config.sequence_parallel:
            with tensor_parallel.get_cuda_rng_tracker().fork():
                context = self._core(q, k, v, mask, causal)
        else:
            context = self._core(q, k, v, mask, causal)
        # [b, np, sq, hn] -> [sq, b, np * hn]
        return context.permute(2, 0, 1, 3).reshape(sq, batch, -1)


class MLADotProductAttention(DotProductAttention):
    """Megatron-Core's unfused DotProductAttention with multi-latent attention's `k_channels` and `v_channels`.

    MLASelfAttention passes both to its core (megatron/core/transformer/multi_latent_attention.py); 0.16.1's
    DotProductAttention has no such keywords, so Megatron-Core's local spec with MLA fails to build. Its forward
    is width-agnostic (scores from q and k of one width, context from v of another) except for the final view
    to hidden_size_per_partition, which is np x v_channels here; the default scale (MLA passes its own) is
    1/sqrt(k_channels), as in Transformer Engine's DotProductAttention."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: AttnMaskType,
                 attention_type: str, attention_dropout: Optional[float] = None,
                 softmax_scale: Optional[float] = None, k_channels: Optional[int] = None,
                 v_channels: Optional[int] = None, cp_comm_type: Optional[str] = None,
                 pg_collection: Optional[ProcessGroupCollection] = None):
        super().__init__(config, layer_number, attn_mask_type, attention_type, attention_dropout=attention_dropout,
                         softmax_scale=softmax_scale, cp_comm_type=cp_comm_type, pg_collection=pg_collection)
        self.hidden_size_per_attention_head, self.hidden_size_per_partition = head_widths(
            config, self.pg_collection.tp.size(), k_channels, v_channels)
        self.softmax_scale, _ = megatron_softmax_scale(config, self.hidden_size_per_attention_head,
                                                       self.layer_number, softmax_scale)
