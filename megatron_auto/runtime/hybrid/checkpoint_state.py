"""Checkpoints of hybrid-space plans: any hybrid plan, at any world size, resumes them.

The model's tensors are Megatron-Core's own global ShardedTensors: the embedding/LM
head shell's from its GPTModel, and each segment's from its TransformerBlock. Layers
differ in TP degree, so every layer has keys of its own
(`decoder.layers.<global index>...`, Megatron's form for heterogeneous layers; the
stock runtime stacks the layers of a dense model under one key). Each module passes
its own data-parallel group, so exactly one replica of every shard is written.

The optimizer state is kept per parameter, in model space
(runtime/model_space_optimizer.py), so a resume may change the plan too. ZeRO-2/3
parameters are gathered over their data-parallel group for the write, and each rank
copies its dim-0 shard back on load (sharded.copy_into_shard).

A hybrid run reads the stock runtime's checkpoints too, and the stock runtime reads
hybrid ones: the reader builds its template under the stored keys
(runtime/saved_layout.py).
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch

from ..model_space_optimizer import ModelSpaceOptimizerState, copy_tensor, is_dtensor
from ..saved_layout import OptimizerKeys

FORMAT = "hybrid"
"""The `checkpoint_format` a hybrid checkpoint records (the stock runtime's is saved_layout.STOCK_FORMAT)."""


def _modules(chunks):
    """(name, module, data-parallel group) of every shell and segment block on this rank."""
    for c, chunk in enumerate(chunks):
        if chunk.shell is not None:
            yield f"chunk{c}.shell", chunk.shell, chunk.shell_dp_group
        for s, (block, dp_group) in enumerate(zip(chunk.segments, chunk.block_dp_groups)):
            yield f"chunk{c}.segment{s}", block, dp_group


@contextlib.contextmanager
def gathered_parameters(module: torch.nn.Module, dtype: torch.dtype):
    """Within: every FSDP2 (DTensor) parameter of `module` replaced by its gathered TP-local tensor in
    `dtype`, so that Megatron's sharded_state_dict sees plain tensors. Yields {id(gathered): DTensor}."""
    swapped = []
    for owner in module.modules():
        for name, param in list(owner._parameters.items()):
            if param is not None and is_dtensor(param):
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


def _module_state(module, dp_group, stacked: bool) -> dict:
    metadata = {"dp_cp_group": dp_group}
    if hasattr(module, "layers"):  # a segment block
        # Layers differ in TP degree, so each has keys of its own (Megatron's heterogeneous-layer form);
        # `stacked` builds the stock runtime's keys to read its checkpoints (runtime/saved_layout.py).
        return module.sharded_state_dict(prefix="decoder.", metadata={**metadata,
                                                                      "non_homogeneous_layers": not stacked})
    return module.sharded_state_dict(prefix="", metadata=metadata)


def _signature(module) -> tuple:
    """How a module's tensors are cut across ranks: its TP, EP and expert-TP degrees."""
    config = module.config
    return (config.tensor_model_parallel_size, config.expert_model_parallel_size,
            config.expert_tensor_parallel_size or config.tensor_model_parallel_size)


def _parameter_key(module, name: str) -> str:
    return _block_key(module, name) if hasattr(module, "layers") else name


class HybridFormat:
    """What checkpoint.py saves and loads for a list of HybridChunks.

    `saved`: the layout of the checkpoint to read (runtime/saved_layout.py), when it is not this
    runtime's own: the stock runtime's stacked layer keys and its optimizer's key names."""

    format = FORMAT

    def __init__(self, chunks: list, saved=None) -> None:
        self.chunks = chunks
        foreign = saved is not None and saved.format != FORMAT
        self.stacked = foreign and saved.layers_stacked
        self.optimizer_keys = OptimizerKeys(saved.stored_keys) if foreign else None
        self.sharded_by_param: dict[int, object] = {}
        """id(model parameter) -> its ShardedTensor (or factory) in the last model_state."""
        self.selected = None
        """The sharding signature whose modules model_state builds (`load_passes`); None: every module."""
        self.model_space: Optional[ModelSpaceOptimizerState] = None
        """The per-parameter optimizer state of the last optimizer_state."""

    def load_passes(self) -> list:
        """What one dist_checkpointing.load reads at a time: everything (`[None]`), or, under stacked layer
        keys, the modules of one (TP, EP, expert-TP) signature per pass, every rank taking part in each.

        megatron-core 0.16.1 turns each key's shards on a rank into one torch ShardedTensor laid on a
        regular grid (torch.py `_mcore_to_torch_sharded_tensor`); layers of different TP degrees under one
        stacked key are not such a grid, and DCP refuses the overlap."""
        if not self.stacked:
            return [None]
        local = sorted({_signature(module) for _, module, _ in _modules(self.chunks)})
        everyone = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(everyone, local)
        return sorted({tuple(signature) for signatures in everyone for signature in signatures})

    def select(self, signature) -> None:
        self.selected = signature

    def model_state(self) -> dict:
        """{"model": {module name: its sharded state dict}}; remembers each parameter's ShardedTensor."""
        from megatron.core.dist_checkpointing.utils import extract_sharded_tensors_and_factories
        from megatron.core.dist_checkpointing.dict_utils import nested_values

        state, self.sharded_by_param = {}, {}
        for name, module, dp_group in _modules(self.chunks):
            if self.selected is not None and _signature(module) != self.selected:
                continue
            with gathered_parameters(module, module.config.params_dtype) as originals:
                state[name] = _module_state(module, dp_group, self.stacked)
            tensors, _ = extract_sharded_tensors_and_factories(state[name])
            for sharded in nested_values(tensors):
                self.sharded_by_param[id(originals.get(id(sharded.data), sharded.data))] = sharded
        return {"model": state}

    @property
    def validates_access(self) -> bool:
        """Whether dist_checkpointing may check the template's sharding: stacked keys over layers of
        different TP degrees have shards of different shapes, which its check refuses."""
        return not self.stacked

    @torch.no_grad()
    def load_model(self, loaded: dict) -> None:
        """Copy the loaded tensors into every parameter (a ZeRO-3 one takes its dim-0 shard)."""
        for name, module, _ in _modules(self.chunks):
            tensors = loaded["model"][name]
            for param_name, param in module.named_parameters():
                copy_tensor(param, tensors[_parameter_key(module, param_name)])
            for buffer_name, buffer in module.named_buffers():
                key = _parameter_key(module, buffer_name)
                if key in tensors and torch.is_tensor(tensors[key]):
                    copy_tensor(buffer, tensors[key])

    def _optimizer(self) -> ModelSpaceOptimizerState:
        return ModelSpaceOptimizerState(self.sharded_by_param, self.optimizer_keys)

    def optimizer_state(self, optimizer, model_state: dict, is_loading: bool) -> dict:
        self.model_space = self._optimizer()
        return self.model_space.state(optimizer, model_state, is_loading)

    def load_optimizer(self, optimizer, loaded: dict) -> None:
        self._optimizer().load(optimizer, loaded)

    def random_streams(self) -> list:
        """The parts' own dropout streams (rng.PartRng), in build order."""
        streams = []
        for chunk in self.chunks:
            streams += [chunk.shell_rng] if chunk.shell_rng is not None else []
            streams += [rng for rng in chunk.decoder.rngs if rng is not None]
        return streams
