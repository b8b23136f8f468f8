"""What a checkpoint iteration holds, so that a run reads it whichever runtime and layout wrote it.

The two runtimes write the same tensors under two naming schemes (runtime/checkpoint.py,
hybrid/checkpoint_state.py):
- the stock runtime keys a dense model's layers as Megatron-LM does, stacked under one key per
  parameter (`decoder.layers.mlp.linear_fc1.weight`, global shape `(num_layers, ...)`); MoE models
  with dense layers among them, and every hybrid checkpoint, key each layer on its own
  (`decoder.layers.<i>.mlp.linear_fc1.weight`), Megatron's form for heterogeneous layers;
- optimizer tensors are in model space under `optimizer.state.<kind>.<model key>`, with kind
  `param` (fp32 master) where the distributed optimizer or the hybrid runtime wrote them,
  `fp32_param` where Megatron's non-distributed mixed-precision optimizer did, and no master at
  all from its fp32 optimizer (the weights are the masters). Megatron's chained optimizer (the
  experts' own at expert parallel > 1) puts `chained_<n>.` before each part's keys.
A reading run builds its template in the stored scheme: the layer keys it finds in the
checkpoint's metadata, and optimizer keys resolved against the stored ones (`OptimizerKeys`).
`SavedLayout.optimizer_kind` tells which of Megatron's optimizers wrote a stock checkpoint, so that a
run under another one (a changed --use-distributed-optimizer or precision) reads it per parameter.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

STOCK_FORMAT = "megatron"
"""The `checkpoint_format` entry of a stock checkpoint (a hybrid one's is hybrid.checkpoint_state.FORMAT)."""
CHECKPOINT_FORMAT = "checkpoint_format"
"""Checkpoint entry: which runtime wrote it."""
EXPERT_OPTIMIZER = "expert_optimizer"
"""Checkpoint entry: whether the experts had an optimizer of their own (stock runtime, expert parallel > 1)."""
STATE_PREFIX = "optimizer.state."
_PER_LAYER_KEY = re.compile(r"(?:^|\.)decoder\.layers\.\d+\.")
_CHAINED = re.compile(r"^chained_\d+\.")
MASTER_ALIASES = ("param", "fp32_param")
"""Names of the fp32 master weights among optimizer tensors (distributed / non-distributed optimizer)."""
DISTRIBUTED, MIXED_PRECISION, FP32 = "distributed", "16-bit", "fp32"
"""Megatron's optimizers, by the state they write: the distributed one (masters as `param`), the non-distributed
16-bit one (masters as `fp32_param`) and the fp32 one (no masters)."""


@dataclass(frozen=True)
class SavedLayout:
    """How one checkpoint iteration was written."""

    format: str
    """STOCK_FORMAT or the hybrid one."""
    expert_optimizer: Optional[bool]
    """Whether the experts had an optimizer of their own (None: not recorded)."""
    stored_keys: frozenset
    """Every tensor key in the iteration's metadata."""

    @property
    def layers_stacked(self) -> bool:
        """Whether the layers share keys (Megatron-LM's dense form) rather than each having its own."""
        return not any(_PER_LAYER_KEY.search(key) for key in self.stored_keys)

    @property
    def optimizer_kind(self) -> Optional[str]:
        """Which of Megatron's optimizers wrote the state, told by its master weights' name (a stock
        checkpoint: the hybrid runtime writes `param` for every part); None: no optimizer state saved."""
        kinds = OptimizerKeys(self.stored_keys).stored_kinds
        if not kinds:
            return None
        return DISTRIBUTED if "param" in kinds else MIXED_PRECISION if "fp32_param" in kinds else FP32


def read_saved_layout(path: str) -> SavedLayout:
    """The layout of the iteration directory `path` (common.pt and the tensor metadata)."""
    from megatron.core.dist_checkpointing import load_common_state_dict
    from torch.distributed.checkpoint import FileSystemReader

    common = load_common_state_dict(path)
    stored = FileSystemReader(path).read_metadata().state_dict_metadata.keys()
    return SavedLayout(format=common.get(CHECKPOINT_FORMAT, STOCK_FORMAT),
                       expert_optimizer=common.get(EXPERT_OPTIMIZER), stored_keys=frozenset(stored))


class OptimizerKeys:
    """Maps this run's optimizer keys (`optimizer.state.<kind>.<model key>`) to the stored ones."""

    def __init__(self, stored_keys) -> None:
        self.by_plain = {}
        self.stored_kinds = set()
        """The optimizer tensor kinds as stored (`param`, `fp32_param`, `exp_avg`, ...)."""
        for key in stored_keys:
            plain = _CHAINED.sub("", key)
            if plain.startswith(STATE_PREFIX):
                kind, model_key = plain[len(STATE_PREFIX):].split(".", 1)
                self.stored_kinds.add(kind)
                kind = "param" if kind in MASTER_ALIASES else kind
                self.by_plain[f"{STATE_PREFIX}{kind}.{model_key}"] = key

    def stored(self, key: str) -> Optional[str]:
        """The stored key holding what this run calls `key`; None when the checkpoint has none."""
        return self.by_plain.get(key)

    def has_masters(self) -> bool:
        return any(key.startswith(f"{STATE_PREFIX}param.") for key in self.by_plain)


def rekey_optimizer_template(parts: dict, keys: OptimizerKeys) -> list:
    """Point every ShardedTensor (or factory) of `parts` ({part: {index: {kind: sharded}}}) at the stored
    key of its tensor. A master weight the checkpoint lacks (Megatron's fp32 optimizer keeps none) is
    taken out of `parts` and returned as (part, index, sharded): the weights are the masters then. Any other
    missing tensor raises KeyError."""
    dropped = []
    for part_name, part in parts.items():
        for index, entry in part.items():
            for kind in list(entry):
                stored = keys.stored(entry[kind].key)
                if stored is None and kind == "param" and not keys.has_masters():
                    dropped.append((part_name, index, entry.pop(kind)))
                elif stored is None:
                    raise KeyError(f"the checkpoint has no optimizer tensor for {entry[kind].key}")
                else:
                    entry[kind].key = stored
    return dropped


def saved_adam_step(state) -> int:
    """The Adam step in a loaded optimizer state written by either runtime: the hybrid runtime's `step`,
    Megatron's `common_step` (non-distributed optimizer) or its param groups' `step` (distributed)."""
    found = []

    def visit(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("step", "common_step") and not isinstance(value, (dict, list)):
                    found.append(int(float(value)))
                else:
                    visit(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                visit(value)
    visit(state)
    return max(found, default=0)


def saved_grad_scaler(state) -> Optional[dict]:
    """The fp16 loss scaler's state in a loaded optimizer state of either runtime (None: none saved)."""
    if isinstance(state, dict):
        scaler = state.get("grad_scaler")
        if isinstance(scaler, dict):
            return scaler
        values = state.values()
    elif isinstance(state, (list, tuple)):
        values = state
    else:
        return None
    return next((found for found in map(saved_grad_scaler, values) if found is not None), None)
