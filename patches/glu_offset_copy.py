"""Patch: a gated MLP keeps no copy of its linear half when the GLU offset is zero.

Why: `MLP.forward`'s glu (SwiGLU and the other gated units, without Megatron's bias-activation
fusion, the runtime's default: megatron_auto/kernel_choice.py) multiplies the activation by
`x_linear + config.glu_linear_offset`. The add runs at the default offset 0.0 too, so it allocates a
new f-wide tensor, which the product then keeps for its backward: one f-wide activation per token in
every gated MLP, dense or expert, that holds nothing the linear half (a view of fc1's output, kept
anyway) does not. Measured in the runtime's layer: a SwiGLU MLP keeps 5f per token with the add and
4f without (tests/runtime/test_recompute_modules.py; cost.memory.mlp_saved_width). The rewrite adds
the offset only when it is not zero; values and gradients are the same (x + 0.0 is x up to the sign
of a zero, and the add's gradient is the identity).
Targets: megatron-core 0.16.1.
Removable when: MLP.forward skips the add at offset zero.
Applied on every host (its row in patches/registry.py): the memory is kept on GPUs too.
"""
from __future__ import annotations

from ._source import Replacement, source_rewrite_patch

NAME = "glu_offset_copy"
TARGET_VERSIONS = ("0.16.1",)
REPLACEMENTS = (Replacement("x_linear + self.config.glu_linear_offset",
                            "(x_linear + self.config.glu_linear_offset if self.config.glu_linear_offset "
                            "else x_linear)"),)


check, apply, is_applied = source_rewrite_patch(NAME, TARGET_VERSIONS, "megatron.core.transformer.mlp", "MLP",
                                                (("forward", REPLACEMENTS),))
