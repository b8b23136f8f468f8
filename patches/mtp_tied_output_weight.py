"""Patch: GPTModel's MTP stage allocates an output-layer weight it never uses, and its checkpoint asserts on it.

Why: with pipeline parallelism, tied embeddings and multi-token prediction, the last stage builds its own copy
of the word embedding (`pre_process or mtp_process`), and `shared_embedding_or_output_weight()` returns that copy
for the output layer and the MTP heads. GPTModel.__init__ still allocates `output_layer.weight` there
(`skip_weight_param_allocation=self.pre_process and ...`), which nothing reads:
- LanguageModule.tie_embeddings_and_output_weights_state_dict asserts that the MTP stage has no output-layer
  weight ("the shared weights will be stored in embedding layer, and output layer will not have any weight"),
  so every checkpoint save and load of such a model fails (measured: AssertionError naming the state dict keys);
- the unused weight never gets a gradient: Megatron DDP's overlapped gradient reduction (on GPUs) asserts that
  every parameter of a bucket reported one (param_and_grad_buffer.reset), and the optimizer decays and stores it.
The rewrite skips that allocation on the MTP stage as on the first stage, as the upstream comments intend.
Targets: megatron-core 0.16.1.
Removable when: GPTModel skips the output weight when `mtp_process` shares the embedding (or the tie no longer
asserts).
Applied on every host (its row in patches/registry.py): the fault is the model's, not the device's.
"""
from __future__ import annotations

from ._source import Replacement, source_rewrite_patch

NAME = "mtp_tied_output_weight"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.models.gpt.gpt_model"
REPLACEMENTS = (Replacement(
    "skip_weight_param_allocation=self.pre_process\n            and self.share_embeddings_and_output_weights,",
    "skip_weight_param_allocation=(self.pre_process or self.mtp_process)\n"
    "            and self.share_embeddings_and_output_weights,"),)


check, apply, is_applied = source_rewrite_patch(NAME, TARGET_VERSIONS, MODULE, "GPTModel",
                                                 (("__init__", REPLACEMENTS),))
