"""Patch: multi-latent attention's latents under tensor parallelism: the shared RoPE key's gradient, and the group.

Why: on Megatron-Core's local spec, MLASelfAttention's key/value down projection is column-parallel: each TP
rank computes its columns of [kv latent | RoPE key] and all-gathers them (get_query_key_value_tensors). Every
rank's heads then use the whole RoPE key (one per token, shared by all heads), so each rank's gradient of it
holds only its own heads' share; the all-gather's backward keeps each rank's columns of that partial gradient,
so the down projection's RoPE-key rows miss the other ranks' heads (measured: one MLA layer at TP2, its
down-projection gradient 1.6e-5 off one process's, its input norm's 9e-5; a 4-layer model's gradient norm
5e-5 off after 5 steps). The latent part is right: its up projection all-reduces its input gradient. The
rewrite passes the RoPE key through copy_to_tensor_model_parallel_region (identity forward, gradient summed
over the TP group). It also names the attention's own TP group in the latents' all-gathers and sequence-
parallel scatters, which upstream leaves to parallel_state's group: the hybrid runtime gives each layer's
attention a TP group of its own (pg_collection) while parallel_state's is of size 1.
Targets: megatron-core 0.16.1.
Removable when: MLASelfAttention reduces the RoPE key's gradient over TP and uses self.tp_group in its
mappings.
Applied on every host (its row in patches/registry.py): the local spec's column-parallel down projection runs on GPUs too
(Transformer Engine's spec duplicates the down projection instead, which this rewrite leaves alone).
"""
from __future__ import annotations

from ._source import Replacement, source_rewrite_patch

NAME = "mla_tensor_parallel"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.transformer.multi_latent_attention"
REPLACEMENTS = (
    Replacement("q_compressed = gather_from_tensor_model_parallel_region(q_compressed)",
                "q_compressed = gather_from_tensor_model_parallel_region(q_compressed, group=self.tp_group)"),
    Replacement("q_compressed = scatter_to_sequence_parallel_region(q_compressed)",
                "q_compressed = scatter_to_sequence_parallel_region(q_compressed, group=self.tp_group)"),
    Replacement("kv_combined = gather_from_tensor_model_parallel_region(kv_combined)",
                "kv_combined = gather_from_tensor_model_parallel_region(kv_combined, group=self.tp_group)"),
    Replacement("""        if self.config.sequence_parallel:
            # kv_compressed:[s / TP, b, kv_lora_rank]
            kv_compressed = scatter_to_sequence_parallel_region(kv_compressed)""",
                """        k_pos_emb = tensor_parallel.copy_to_tensor_model_parallel_region(
            k_pos_emb, group=self.tp_group)
        if self.config.sequence_parallel:
            kv_compressed = scatter_to_sequence_parallel_region(kv_compressed, group=self.tp_group)"""),
)


check, apply, is_applied = source_rewrite_patch(NAME, TARGET_VERSIONS, MODULE, "MLASelfAttention",
                                                 (("get_query_key_value_tensors", REPLACEMENTS),))
