"""Optimizer state in model space: each parameter's fp32 master and Adam moments under its model key.

The hybrid runtime always checkpoints its optimizer this way, and the stock runtime reads a
checkpoint this way when Megatron's own optimizer state would not match what was written (a
hybrid checkpoint, or one saved with the experts under an optimizer of their own when this run
has none, or the reverse). Whatever steps a parameter, its state has the same keys:
- Megatron's distributed optimizer (ZeRO-1) writes its `fully_reshardable` form;
- the other parts (Megatron's non-distributed optimizers, FSDP2's ZeRO-2/3 shards, gathered)
  write `optimizer.state.{param,exp_avg,exp_avg_sq}.<model key>` per parameter.
The chaining of part optimizers, which differs between plans, runtimes and ranks, is not in the
file: only the tensors, the shared Adam step and the fp16 loss scaler are.
"""
from __future__ import annotations

from typing import Optional

import torch

from .optimizer_parts import inner_optimizers, is_distributed
from .saved_layout import STATE_PREFIX, OptimizerKeys, rekey_optimizer_template, saved_adam_step, saved_grad_scaler

OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


class ModelSpaceOptimizerState:
    """Save and load a (possibly chained) Megatron optimizer's state per parameter.

    `sharded_by_param`: id(model parameter) -> its ShardedTensor (or factory) in the model state the
    template is built with. `keys`: the stored keys to read from, when another layout wrote them."""

    def __init__(self, sharded_by_param: dict, keys: Optional[OptimizerKeys] = None) -> None:
        self.sharded_by_param = sharded_by_param
        self.keys = keys
        self.masters_from_weights: dict = {}
        """After a loading `state`: the template that reads the stored fp32 weights into the masters of the
        parameters this run keeps in 16 bits, where the checkpoint holds no masters (Megatron's fp32 optimizer
        wrote it): `_masters_from_weights`."""

    def state(self, optimizer, model_state: dict, is_loading: bool) -> dict:
        """Every part optimizer's tensors in model space, with the shared Adam step and loss scaler."""
        parts = {}
        for index, inner in enumerate(inner_optimizers(optimizer)):
            if not all(id(param) in self.sharded_by_param for param in _model_params(inner)):
                continue  # its modules are not in this model state (a load pass of other modules)
            if is_distributed(inner):
                parts[f"part{index}"] = inner.sharded_param_state_fully_reshardable(
                    model_state, is_loading, OPTIMIZER_METADATA)
            else:
                parts[f"part{index}"] = self._per_parameter_state(inner, is_loading)
        if is_loading and self.keys is not None:
            missing = rekey_optimizer_template(parts, self.keys)
            self.masters_from_weights = _masters_from_weights(optimizer, self.sharded_by_param, missing)
        scaler = getattr(optimizer, "grad_scaler", None)
        return {"param_state": parts, "step": adam_step(optimizer),
                "grad_scaler": scaler.state_dict() if scaler is not None else None}

    def _per_parameter_state(self, inner, is_loading: bool) -> dict:
        from megatron.core.dist_checkpointing.optimizer import make_sharded_optimizer_tensor

        entries = {}
        for index, (model_param, main_param) in enumerate(parameter_pairs(inner)):
            sharded = self.sharded_by_param[id(model_param)]
            tensors = {"param": main_param, **_adam_tensors(inner, main_param)}
            entries[index] = {kind: make_sharded_optimizer_tensor(sharded, _whole(tensor, is_loading),
                                                                  f"{STATE_PREFIX}{kind}")
                              for kind, tensor in tensors.items()}
        return entries

    @torch.no_grad()
    def load(self, optimizer, loaded: dict) -> None:
        """Copy what `state`'s template read into every part; a master weight the checkpoint did not
        hold (Megatron's fp32 optimizer keeps none) comes from the loaded weight."""
        for index, inner in enumerate(inner_optimizers(optimizer)):
            part = loaded["param_state"][f"part{index}"]
            if is_distributed(inner):
                for position, model_param in enumerate(_distributed_params_in_order(inner)):
                    part[position].setdefault("param", _whole(model_param, is_loading=False))
                inner.load_parameter_state_from_fully_reshardable(part)
                continue
            for position, (model_param, main_param) in enumerate(parameter_pairs(inner)):
                targets = {"param": main_param, **_adam_tensors(inner, main_param)}
                saved = dict(part[position])
                if "param" not in saved and main_param is not model_param:
                    saved["param"] = _whole(model_param, is_loading=False)
                for kind, tensor in saved.items():
                    copy_tensor(targets[kind], tensor)
        set_adam_step(optimizer, saved_adam_step(loaded))
        scaler = saved_grad_scaler(loaded)
        if scaler is not None and getattr(optimizer, "grad_scaler", None) is not None:
            optimizer.grad_scaler.load_state_dict(scaler)


def _masters_from_weights(optimizer, sharded_by_param: dict, missing_masters: list) -> dict:
    """{"param_state": {part: {index: {"param": template}}}} reading each stored weight, written in fp32 by a run
    without masters, into the fp32 master of a parameter whose weights this run keeps in 16 bits (rounding it
    to the loaded 16-bit weight would lose the digits the fp32 run kept): a 16-bit parameter's own master, or
    a ZeRO-3 shard's fp32 parameter, which the 16-bit model state only loads rounded. Weights loaded in fp32
    are their masters already. `missing_masters`: rekey_optimizer_template's (part, index, master template)."""
    params = {f"part{index}": _model_params(inner) for index, inner in enumerate(inner_optimizers(optimizer))}
    parts: dict = {}
    for part, index, master in missing_masters:
        if sharded_by_param[id(params[part][index])].data.dtype != torch.float32:
            master.key = master.key[len(f"{STATE_PREFIX}param."):]
            parts.setdefault(part, {})[index] = {"param": master}
    return {"param_state": parts} if parts else {}


def _distributed_params_in_order(inner):
    """The model parameters of a distributed optimizer in its fully_reshardable state's order
    (megatron-core 0.16.1 numbers them over its buffers' param_index_map, buffer by buffer)."""
    for buffer in inner.buffers:
        yield from buffer.param_index_map


def _model_params(inner):
    if is_distributed(inner):
        return list(_distributed_params_in_order(inner))
    return [model_param for model_param, _ in parameter_pairs(inner)]


def parameter_pairs(inner):
    """(model parameter, the parameter the optimizer steps) of a non-distributed part optimizer:
    16-bit weights and their fp32 copies, or the same tensor twice (fp32 and FSDP2 parts)."""
    if hasattr(inner, "float16_groups"):
        for model_group, main_group in zip(inner.float16_groups, inner.fp32_from_float16_groups):
            yield from zip(model_group, main_group)
        for group in inner.fp32_from_fp32_groups:
            yield from ((param, param) for param in group)
        return
    for group in inner.optimizer.param_groups:
        yield from ((param, param) for param in group["params"])


def _adam_tensors(inner, main_param) -> dict:
    return {kind: value for kind, value in inner.optimizer.state[main_param].items() if kind != "step"}


def is_dtensor(tensor) -> bool:
    return hasattr(tensor, "full_tensor") and hasattr(tensor, "_local_tensor")


def _whole(tensor, is_loading: bool):
    """A FSDP2 shard's whole tensor (gathered, or an empty template to load into); others as they are."""
    if not is_dtensor(tensor):
        return tensor.detach()
    if is_loading:
        return torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor._local_tensor.device)
    return tensor.detach().full_tensor()


def copy_tensor(target, value: torch.Tensor) -> None:
    """Copy a whole (TP-local) tensor into `target`; a FSDP2 parameter takes its dim-0 shard."""
    from .hybrid.sharded import copy_into_shard

    if is_dtensor(target):
        copy_into_shard(target, value)
    else:
        target.data.copy_(value.to(target.device, target.dtype))


def adam_step(optimizer) -> int:
    """The Adam step every parameter shares (updates so far)."""
    for inner in inner_optimizers(optimizer):
        for state in inner.optimizer.state.values():
            if "step" in state:
                return int(state["step"])
    return 0


def set_adam_step(optimizer, step: int) -> None:
    for inner in inner_optimizers(optimizer):
        for state in inner.optimizer.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"].fill_(step)
            elif "step" in state:
                state["step"] = step
