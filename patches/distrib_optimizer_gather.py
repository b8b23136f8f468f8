"""Patch: the distributed optimizer's state gather moves shards with `.cuda()`.

Why: saving the distributed optimizer in the `fully_reshardable` checkpoint
format (the one that reshards over TP/PP/DP and world size) gathers each
bucket's shards with `send_tensor = send_tensor.cuda()` when it uses the main
(non-gloo) data-parallel group; on a CPU-only torch that raises. The patch
rewrites the statement to move the shard to `torch.cuda.current_device()`,
which the `hardcoded_cuda_device` patch answers with the CPU in this module.
Targets: megatron-core 0.16.1.
Removable when: megatron-core moves the shard to the group's device instead of CUDA.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

from ._source import Replacement, source_rewrite_patch

NAME = "distrib_optimizer_gather"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.optimizer.distrib_optimizer"
FUNCTION = "get_parameter_state_dp_zero"
REPLACEMENTS = (Replacement("send_tensor = send_tensor.cuda()",
                            "send_tensor = send_tensor.to(torch.cuda.current_device())"),)


check, apply, is_applied = source_rewrite_patch(NAME, TARGET_VERSIONS, MODULE, "DistributedOptimizer",
                                                 ((FUNCTION, REPLACEMENTS),))
