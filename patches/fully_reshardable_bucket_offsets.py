"""Patch: the distributed optimizer's `fully_reshardable` save reads every bucket after the first at
the wrong offset.

Why: `get_parameter_state_dp_zero` packs a buffer's fp32 masters and Adam moments bucket by bucket
with each bucket's end padding stripped, while `sharded_param_state_fully_reshardable` slices that
packed tensor at the parameter's offsets in the padded buffer (`param_index_map`). Every parameter
in a bucket after the first is then saved from a window shifted by the padding before it (and the
last ones, running off the end, are zero-filled with a warning). One bucket has no such padding,
which is why it passes on CPU with one bucket per buffer; on GPUs the runtime overlaps the gradient
reduction (runtime/config.ddp_config), which splits each buffer into 40M-parameter buckets, and
Megatron puts a pipeline's shared word embedding in a bucket of its own. Seen here: without this
patch, `validation/check_checkpoint_masters.py` on the fp32 checkpoint of a tied-embedding model at PP2 with
two virtual stages finds 15 of 16 masters equal to their weights, the embedding's not
(tests/runtime/test_hybrid_checkpoints.py, the virtual-pipeline test). The rewrite moves each parameter's window back by
the end padding of the buckets before its own; values inside a first bucket are unchanged.
Upstream fixed the same in NVIDIA/Megatron-LM pull request 5077.
Targets: megatron-core 0.16.1.
Removable when: the megatron-core in use contains that fix.
Applied on every host (its row in patches/registry.py): the save is wrong on GPUs too.
"""
from __future__ import annotations

from ._source import Replacement, source_rewrite_patch

NAME = "fully_reshardable_bucket_offsets"
TARGET_VERSIONS = ("0.16.1",)
REPLACEMENTS = (Replacement(  # the method's source, dedented by its class's indentation
    """                _,
            ) in buffer.param_index_map.items():
""",
    """                bucket_id,
            ) in buffer.param_index_map.items():
                # Offsets in the padded buffer -> in the world tensors, which drop each bucket's end padding.
                padding_before = buffer.buckets[bucket_id].offset - sum(
                    bucket.numel_unpadded for bucket in buffer.buckets[:bucket_id])
                param_world_start -= padding_before
                param_world_end -= padding_before
"""),)


check, apply, is_applied = source_rewrite_patch(NAME, TARGET_VERSIONS, "megatron.core.optimizer.distrib_optimizer",
                                                "DistributedOptimizer",
                                                (("sharded_param_state_fully_reshardable", REPLACEMENTS),))
