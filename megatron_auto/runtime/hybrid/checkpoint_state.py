"""Checkpoints of hybrid-space plans: any hybrid plan, at any world size, resumes them.

The model's tensors are Megatron-Core's own global ShardedTensors: the embedding/LM
head shell's from its GPTModel, and each segment's from its TransformerBlock. Layers
differ in TP degree, so every layer has keys of its own
(`decoder.layers.<global index>...`, Megatron's form for heterogeneous layers; the
stock runtime stacks the layers of a dense model under one key). Each module passes
its own data-parallel group, so exactly one replica of every shard is written.

The optimizer state is kept per parameter, in model space, under
`optimizer.state.{param,exp_avg,exp_avg_sq}.<model key>`: Megatron's distributed
optimizer (ZeRO-1 parts) writes its `fully_reshardable` form, and the other
parts (ZeRO-0, and FSDP2's ZeRO-2/3 shards, gathered) write the same keys. The
chaining of part optimizers, which differs between plans and ranks, is not in
the file: only the tensors, the shared Adam step and the fp16 loss scaler are,
so a resume may change the plan too. ZeRO-2/3 parameters are gathered over
their data-parallel group for the write, and each rank copies its dim-0 shard
back on load (sharded.copy_into_shard).
"""
from __future__ import annotations

import contextlib

import torch

from ..optimizer_parts import inner_optimizers
from .sharded import copy_into_shard

FORMAT = "hybrid"
"""The `optimizer_format` a hybrid checkpoint records (the stock runtime's is checkpoint.STOCK_FORMAT)."""
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}
STATE_PREFIX = "optimizer.state"


def _modules(chunks):
    """(name, module, data-parallel group) of every shell and segment block on this rank."""
    for c, chunk in enumerate(chunks):
        if chunk.shell is not None:
            yield f"chunk{c}.shell", chunk.shell, chunk.shell_dp_group
        for s, (block, dp_group) in enumerate(zip(chunk.segments, chunk.block_dp_groups)):
            yield f"chunk{c}.segment{s}", block, dp_group


def _is_dtensor(tensor) -> bool:
    return hasattr(tensor, "full_tensor") and hasattr(tensor, "_local_tensor")


@contextlib.contextmanager
def gathered_parameters(module: torch.nn.Module, dtype: torch.dtype):
    """Within: every FSDP2 (DTensor) parameter of `module` replaced by its gathered TP-local tensor in
    `dtype`, so that Megatron's sharded_state_dict sees plain tensors. Yields {id(gathered): DTensor}."""
    swapped = []
    for owner in module.modules():
        for name, param in list(owner._parameters.items()):
            if param is not None and _is_dtensor(param):
                full = torch.nn.Parameter(param.detach().full_tensor().to(dtype), requires_grad=False)
                owner._parameters[name] = full
                swapped.append((owner, name, param, full))
    try:
        yield {id(full): param for _, _, param, full in swapped}
    finally:
        for owner, name, param, _ in swapped:
            owner._parameters[name] = param


def _block_key(block, name: str) -> str:
    """The state-dict key a segment block's sharded_state_dict(prefix="decoder.") gives parameter `name`:
    its layers are keyed by their model-wide index."""
    if name.startswith("layers."):
        _, index, rest = name.split(".", 2)
        return f"decoder.layers.{block.layers[int(index)].layer_number - 1}.{rest}"
    return f"decoder.{name}"


def _module_state(module, dp_group) -> dict:
    metadata = {"dp_cp_group": dp_group}
    if hasattr(module, "layers"):  # a segment block
        # Layers differ in TP degree, so each has keys of its own (Megatron's heterogeneous-layer form).
        return module.sharded_state_dict(prefix="decoder.", metadata={**metadata, "non_homogeneous_layers": True})
    return module.sharded_state_dict(prefix="", metadata=metadata)


def _parameter_key(module, name: str) -> str:
    return _block_key(module, name) if hasattr(module, "layers") else name


class HybridFormat:
    """What checkpoint.py saves and loads for a list of HybridChunks."""

    format = FORMAT

    def __init__(self, chunks: list) -> None:
        self.chunks = chunks
        self.sharded_by_param: dict[int, object] = {}
        """id(model parameter) -> its ShardedTensor (or factory) in the last model_state."""

    def model_state(self) -> dict:
        """{"model": {module name: its sharded state dict}}; remembers each parameter's ShardedTensor."""
        from megatron.core.dist_checkpointing.utils import extract_sharded_tensors_and_factories
        from megatron.core.dist_checkpointing.dict_utils import nested_values

        state, self.sharded_by_param = {}, {}
        for name, module, dp_group in _modules(self.chunks):
            with gathered_parameters(module, module.config.params_dtype) as originals:
                state[name] = _module_state(module, dp_group)
            tensors, _ = extract_sharded_tensors_and_factories(state[name])
            for sharded in nested_values(tensors):
                self.sharded_by_param[id(originals.get(id(sharded.data), sharded.data))] = sharded
        return {"model": state}

    @torch.no_grad()
    def load_model(self, loaded: dict) -> None:
        """Copy the loaded tensors into every parameter (a ZeRO-3 one takes its dim-0 shard)."""
        for name, module, _ in _modules(self.chunks):
            tensors = loaded["model"][name]
            for param_name, param in module.named_parameters():
                _copy(param, tensors[_parameter_key(module, param_name)])
            for buffer_name, buffer in module.named_buffers():
                key = _parameter_key(module, buffer_name)
                if key in tensors and torch.is_tensor(tensors[key]):
                    _copy(buffer, tensors[key])

    def optimizer_state(self, optimizer, model_state: dict, is_loading: bool) -> dict:
        """Every part optimizer's tensors in model space, with the shared Adam step and loss scaler."""
        parts = {}
        for index, inner in enumerate(inner_optimizers(optimizer)):
            if _is_distributed(inner):
                parts[f"part{index}"] = inner.sharded_param_state_fully_reshardable(
                    model_state, is_loading, OPTIMIZER_METADATA)
            else:
                parts[f"part{index}"] = self._per_parameter_state(inner, is_loading)
        scaler = getattr(optimizer, "grad_scaler", None)
        return {"param_state": parts, "step": _adam_step(optimizer),
                "grad_scaler": scaler.state_dict() if scaler is not None else None}

    def _per_parameter_state(self, inner, is_loading: bool) -> dict:
        from megatron.core.dist_checkpointing.optimizer import make_sharded_optimizer_tensor

        entries = {}
        for index, (model_param, main_param) in enumerate(_parameter_pairs(inner)):
            sharded = self.sharded_by_param[id(model_param)]
            tensors = {"param": main_param, **_adam_tensors(inner, main_param)}
            entries[index] = {kind: make_sharded_optimizer_tensor(sharded, _whole(tensor, is_loading),
                                                                  f"{STATE_PREFIX}.{kind}")
                              for kind, tensor in tensors.items()}
        return entries

    @torch.no_grad()
    def load_optimizer(self, optimizer, loaded: dict) -> None:
        for index, inner in enumerate(inner_optimizers(optimizer)):
            part = loaded["param_state"][f"part{index}"]
            if _is_distributed(inner):
                inner.load_parameter_state_from_fully_reshardable(part)
                continue
            for position, (_, main_param) in enumerate(_parameter_pairs(inner)):
                targets = {"param": main_param, **_adam_tensors(inner, main_param)}
                for kind, tensor in part[position].items():
                    _copy(targets[kind], tensor)
        _set_adam_step(optimizer, loaded["step"])
        if loaded.get("grad_scaler") is not None and getattr(optimizer, "grad_scaler", None) is not None:
            optimizer.grad_scaler.load_state_dict(loaded["grad_scaler"])

    def random_streams(self) -> list:
        """The parts' own dropout streams (rng.PartRng), in build order."""
        streams = []
        for chunk in self.chunks:
            streams += [chunk.shell_rng] if chunk.shell_rng is not None else []
            streams += [rng for rng in chunk.decoder.rngs if rng is not None]
        return streams


def _is_distributed(inner) -> bool:
    return hasattr(inner, "load_parameter_state_from_fully_reshardable")


def _parameter_pairs(inner):
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


def _whole(tensor, is_loading: bool):
    """A FSDP2 shard's whole tensor (gathered, or an empty template to load into); others as they are."""
    if not _is_dtensor(tensor):
        return tensor.detach()
    if is_loading:
        return torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor._local_tensor.device)
    return tensor.detach().full_tensor()


def _copy(target, value: torch.Tensor) -> None:
    if _is_dtensor(target):
        copy_into_shard(target, value)
    else:
        target.data.copy_(value.to(target.device, target.dtype))


def _adam_step(optimizer) -> int:
    """The Adam step every parameter shares (updates so far)."""
    for inner in inner_optimizers(optimizer):
        for state in inner.optimizer.state.values():
            if "step" in state:
                return int(state["step"])
    return 0


def _set_adam_step(optimizer, step: int) -> None:
    for inner in inner_optimizers(optimizer):
        for state in inner.optimizer.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"].fill_(step)
            elif "step" in state:
                state["step"] = step
