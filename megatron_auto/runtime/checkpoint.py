"""Save and resume through Megatron-Core distributed checkpointing.

Tensors are saved as global ShardedTensors (keys name global layers), and the
distributed optimizer uses the `fully_reshardable` format, so a checkpoint
written under one TP/PP/DP layout and world size loads under any other.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional

import torch

from ..errors import UserError

logger = logging.getLogger(__name__)

TRACKER = "latest_checkpointed_iteration.txt"
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


@dataclass(frozen=True)
class Resumed:
    """Where a loaded checkpoint leaves the run."""

    iteration: int
    consumed_samples: int


def iteration_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}")


def _model_state(model: list) -> dict:
    """Chunk state dicts under Megatron-LM's keys (`model`, or `model0`, `model1`, ... with virtual stages)."""
    if len(model) == 1:
        return {"model": model[0].module.sharded_state_dict()}
    return {f"model{i}": chunk.module.sharded_state_dict() for i, chunk in enumerate(model)}


def _ensure_adam_state(optimizer) -> None:
    """Give every parameter Adam state (zeros, step 0) so a loading template has all the keys.

    Megatron-LM creates this state with apex/TE's fused Adam; torch's Adam creates
    it lazily at the first step, and the distributed optimizer's state_dict needs it.
    """
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        torch_optimizer = getattr(inner, "optimizer", None)
        if torch_optimizer is None:
            continue
        for group in torch_optimizer.param_groups:
            for param in group["params"]:
                state = torch_optimizer.state[param]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(param.data)
                    state["exp_avg_sq"] = torch.zeros_like(param.data)


def _full_state(model: list, optimizer, scheduler, iteration: int, consumed: int, with_optimizer: bool,
                is_loading: bool) -> dict:
    state = _model_state(model)
    if with_optimizer:
        if is_loading:
            _ensure_adam_state(optimizer)
        merged = {k: v for part in state.values() for k, v in part.items()}
        state["optimizer"] = optimizer.sharded_state_dict(merged, is_loading=is_loading,
                                                          metadata=OPTIMIZER_METADATA)
        state["opt_param_scheduler"] = scheduler.state_dict()
    state["iteration"] = iteration
    state["consumed_samples"] = consumed
    return state


def save_checkpoint(root: str, model: list, optimizer, scheduler, iteration: int, consumed: int) -> str:
    """Write `root/iter_XXXXXXX` on all ranks and point the tracker file at it."""
    from megatron.core import dist_checkpointing

    path = iteration_dir(root, iteration)
    if torch.distributed.get_rank() == 0:
        os.makedirs(path, exist_ok=True)
    torch.distributed.barrier()
    state = _full_state(model, optimizer, scheduler, iteration, consumed, with_optimizer=True, is_loading=False)
    dist_checkpointing.save(state, path)
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        with open(os.path.join(root, TRACKER), "w") as tracker:
            tracker.write(str(iteration))
    torch.distributed.barrier()
    logger.info("saved checkpoint at iteration %d to %s", iteration, path)
    return path


def latest_iteration(root: str) -> int:
    """The iteration the tracker file names; UserError when the directory holds no checkpoint."""
    try:
        with open(os.path.join(root, TRACKER)) as tracker:
            return int(tracker.read().strip())
    except (OSError, ValueError):
        raise UserError(f"--load {root}: no {TRACKER} there (not a megatron-auto checkpoint directory)") from None


def load_checkpoint(root: str, model: list, optimizer, scheduler, weights_only: bool = False,
                    step: Optional[int] = None, with_optimizer: bool = True) -> Optional[Resumed]:
    """Load iteration `step` (default: the latest) of `root` into this layout's model, optimizer and scheduler.

    None, with a warning, when `root` holds no tracker file and no `step` is asked for: Megatron-LM then
    starts from random weights (a launch line with `--save DIR --load DIR` on a new DIR). Without
    `with_optimizer` (--no-load-optim) the weights and the iteration load, the optimizer state and
    the learning-rate schedule do not (Megatron-LM's checkpointing.load_checkpoint)."""
    from megatron.core import dist_checkpointing

    if step is None and not os.path.isfile(os.path.join(root, TRACKER)):
        if torch.distributed.get_rank() == 0:
            logger.warning("WARNING: could not find the metadata file %s; will not load any checkpoints and "
                           "will start from random", os.path.join(root, TRACKER))
        return None
    iteration = latest_iteration(root) if step is None else step
    path = iteration_dir(root, iteration)
    if not os.path.isdir(path):
        raise UserError(f"--load {root}: no checkpoint of iteration {iteration} ({path} is missing)")
    load_optimizer = with_optimizer and not weights_only
    template = _full_state(model, optimizer, scheduler, 0, 0, with_optimizer=load_optimizer, is_loading=True)
    loaded = dist_checkpointing.load(template, path)
    if len(model) == 1:
        model[0].module.load_state_dict(loaded["model"])
    else:
        for i, chunk in enumerate(model):
            chunk.module.load_state_dict(loaded[f"model{i}"])
    if weights_only:
        optimizer.reload_model_params()
        logger.info("loaded weights of iteration %d from %s", iteration, path)
        return Resumed(iteration=0, consumed_samples=0)
    if not load_optimizer:
        optimizer.reload_model_params()
        logger.info("resumed weights of iteration %d of %s (--no-load-optim: fresh optimizer state and "
                    "learning-rate schedule)", loaded["iteration"], path)
        return Resumed(iteration=int(loaded["iteration"]), consumed_samples=int(loaded["consumed_samples"]))
    optimizer.load_state_dict(loaded["optimizer"])
    scheduler.load_state_dict(loaded["opt_param_scheduler"])
    logger.info("resumed from iteration %d of %s", loaded["iteration"], path)
    return Resumed(iteration=int(loaded["iteration"]), consumed_samples=int(loaded["consumed_samples"]))
