"""Patch: the first/last-stage embedding sync that moves the shared weight with `.cuda()`.

Why: with pipeline parallelism and tied embeddings,
`LanguageModule.setup_embeddings_and_output_layer` does
`weight.data = weight.data.cuda()` before all-reducing the shared word
embedding between the first and last stage; on a CPU-only torch `.cuda()`
raises. The patch rewrites that one statement to keep the weight where it is.
Targets: megatron-core 0.16.1.
Removable when: megatron-core stops moving the weight (it is already on its device).
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

from ._source import Replacement, source_rewrite_patch

NAME = "embedding_weight_sync"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.models.common.language_module.language_module"
FUNCTION = "setup_embeddings_and_output_layer"
REPLACEMENTS = (Replacement("weight.data = weight.data.cuda()", "weight.data = weight.data.contiguous()"),)


check, apply, is_applied = source_rewrite_patch(NAME, TARGET_VERSIONS, MODULE, "LanguageModule",
                                                 ((FUNCTION, REPLACEMENTS),))
