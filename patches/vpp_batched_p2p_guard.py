"""Patch: refuse virtual pipeline stages with batched p2p over gloo.

Why: the interleaved 1F1B schedule with `batch_p2p_comm=True` posts send and
receive pairs through `torch.distributed.batch_isend_irecv`; over gloo the
pairs of neighbouring virtual stages can match the wrong peer operation, and
the run continues with silently wrong losses. Megatron-LM's argument checks
forbid the combination too. The patch wraps the interleaved schedule so that
it raises a clear error before the first micro-batch instead.
Targets: megatron-core 0.16.1.
Removable when: never for gloo while batch_isend_irecv keeps its gloo semantics;
drop it once Megatron-Core itself refuses the combination.
Applied only when CUDA is absent (patches.apply_all).
"""
from __future__ import annotations

import functools
import importlib

import torch

from ._checks import require_text, require_version

NAME = "vpp_batched_p2p_guard"
TARGET_VERSIONS = ("0.16.1",)
MODULE = "megatron.core.pipeline_parallel.schedules"
FUNCTION = "forward_backward_pipelining_with_interleaving"
MESSAGE = ("virtual pipeline stages with batched p2p (batch_p2p_comm=True) give wrong results over gloo; "
           "set batch_p2p_comm=False (overlap_p2p_comm=True) or use one virtual stage")


class VirtualPipelineBatchedP2PError(ValueError):
    """The interleaved schedule was asked to batch p2p over gloo."""


def refuse_if_batched_over_gloo(config, pp_group=None) -> None:
    """Raise VirtualPipelineBatchedP2PError for batch_p2p_comm on a gloo pipeline group."""
    if not getattr(config, "batch_p2p_comm", False):
        return
    if torch.distributed.is_initialized() and torch.distributed.get_backend(pp_group) != "gloo":
        return
    raise VirtualPipelineBatchedP2PError(MESSAGE)


def _guarded(schedule):
    @functools.wraps(schedule)
    def forward_backward_pipelining_with_interleaving(*args, **kwargs):
        model = kwargs.get("model")
        first = model[0] if isinstance(model, (list, tuple)) else model
        config = importlib.import_module(MODULE).get_model_config(first)
        pg_collection = kwargs.get("pg_collection")
        refuse_if_batched_over_gloo(config, getattr(pg_collection, "pp", None))
        return schedule(*args, **kwargs)

    forward_backward_pipelining_with_interleaving.__megatron_auto_patched__ = True
    return forward_backward_pipelining_with_interleaving


def check():
    require_version(NAME, TARGET_VERSIONS)
    return require_text(MODULE, f"forward_backward_func = {FUNCTION}", NAME)


def apply() -> None:
    module = check()
    current = getattr(module, FUNCTION)
    if not getattr(current, "__megatron_auto_patched__", False):
        setattr(module, FUNCTION, _guarded(current))


def is_applied() -> bool:
    return getattr(getattr(importlib.import_module(MODULE), FUNCTION), "__megatron_auto_patched__", False)
