"""Process groups: torch.distributed from the torchrun environment, then Megatron's groups.

Gloo on CPU, NCCL on CUDA. Every group gets an explicit timeout so a rank that
dies makes the others fail instead of hang.
"""
from __future__ import annotations

import gc
import logging
import os
from dataclasses import dataclass
from datetime import timedelta

import torch

from ..errors import UserError
from . import teardown
from .layout import MegatronLayout

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeviceInfo:
    """Where this process computes and how it talks to the others."""

    device: torch.device
    backend: str
    """gloo or nccl."""

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"


def detect_device() -> DeviceInfo:
    """The local CUDA device (LOCAL_RANK) with NCCL, or the CPU with gloo."""
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        return DeviceInfo(torch.device("cuda", local_rank), "nccl")
    return DeviceInfo(torch.device("cpu"), "gloo")


def init_distributed(timeout_s: float) -> DeviceInfo:
    """Join the job that torchrun (or a test launcher) describes in RANK/WORLD_SIZE/MASTER_*."""
    info = detect_device()
    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        try:
            torch.distributed.init_process_group(backend=info.backend, rank=rank, world_size=world_size,
                                                 timeout=timedelta(seconds=timeout_s),
                                                 store=_restart_store(world_size, timeout_s))
        except torch.distributed.DistError as error:  # the store timed out: a rank never came
            raise UserError(f"rank {rank} of {world_size}: the job's ranks did not all meet at "
                            f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} within {timeout_s:g} s "
                            f"(--distributed-timeout-minutes {timeout_s / 60:g}): start every rank with the same "
                            f"MASTER_ADDR, MASTER_PORT and WORLD_SIZE ({type(error).__name__}: "
                            f"{str(error).strip().splitlines()[0] if str(error).strip() else 'no detail'})") from None
    return info


def _restart_store(world_size: int, timeout_s: float):
    """Under `torchrun --max-restarts`, a store of this attempt's own keys; None (env://) otherwise.

    torchrun's agent keeps one TCPStore for all attempts (TORCHELASTIC_USE_AGENT_STORE), and a
    restarted gloo job read the addresses the killed attempt had published there ("Connection
    refused" at init_process_group, measured with torch 2.13). Prefixing the keys with the restart
    count keeps each attempt's rendezvous apart."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if attempt == "0" or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = torch.distributed.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                                       is_master=False, timeout=timedelta(seconds=timeout_s))
    return torch.distributed.PrefixStore(f"megatron_auto/attempt_{attempt}", store)


_OWN_GROUPS: list = []
"""Groups new_group made for the current layout (a hybrid plan's), destroyed with Megatron's."""


def initialize_parallel(layout: MegatronLayout, timeout_s: float) -> None:
    """Megatron's TP/PP/DP groups for `layout` (destroying any previous ones)."""
    from megatron.core import parallel_state

    world = torch.distributed.get_world_size()
    if layout.dims.world_size != world:
        raise ValueError(f"layout needs {layout.dims.world_size} ranks, the job has {world}")
    destroy_parallel_groups()
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=layout.dims.tp,
        pipeline_model_parallel_size=layout.dims.pp,
        virtual_pipeline_model_parallel_size=layout.dims.vp if layout.dims.vp > 1 else None,
        expert_model_parallel_size=layout.dims.ep,
        expert_tensor_parallel_size=layout.dims.etp,
        context_parallel_size=layout.dims.cp,
        distributed_timeout_minutes=timeout_s / 60,  # a float: sub-minute timeouts in tests
        create_gloo_process_groups=False,
    )
    logger.debug("rank %d: tp=%d cp=%d pp=%d dp=%d vp=%d ep=%d etp=%s", torch.distributed.get_rank(),
                 layout.dims.tp, layout.dims.cp, layout.dims.pp, layout.dims.dp,
                 layout.dims.vp, layout.dims.ep, layout.dims.etp)


def shutdown() -> None:
    """Tear down Megatron's groups and the default group."""
    destroy_parallel_groups()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def destroy_parallel_groups() -> None:
    """Forget Megatron's groups and ours, destroy them, and collect what still held them.

    `parallel_state.destroy_model_parallel` only drops its references, and a gloo group keeps its
    worker and transport threads until the group object itself is freed, which a model left in a
    reference cycle (DDP holds its groups) delays until the next garbage collection, and caches of
    megatron-core and torch delay for ever (teardown.py). A process that builds layout after layout
    (a re-plan, a test running many layouts) piled up 48 threads per layout per rank without the
    destroy and collect (measured with megatron-core 0.16.1 and torch 2.13 on gloo), hundreds in all."""
    from megatron.core import parallel_state

    groups = megatron_groups() + _OWN_GROUPS
    _OWN_GROUPS.clear()
    if not groups and not parallel_state.model_parallel_is_initialized():
        return  # nothing built since the last teardown (a closed session): no collection to pay for
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    for group in groups:
        try:
            torch.distributed.destroy_process_group(group)
        except (ValueError, RuntimeError):  # destroyed already (Megatron destroys its gloo groups itself)
            continue
    del groups
    teardown.forget_group_references()
    gc.collect()


def new_group(ranks: list[int], timeout: timedelta):
    """torch.distributed.new_group, kept for destroy_parallel_groups when this rank is in it."""
    group = torch.distributed.new_group(ranks=ranks, timeout=timeout)
    if isinstance(group, torch.distributed.ProcessGroup):
        _OWN_GROUPS.append(group)
    return group


def megatron_groups() -> list:
    """The process groups parallel_state holds now (its module globals, the list of every group
    its create_group made with this rank, the hybrid-CP groups' dict), the default group left out."""
    from megatron.core import parallel_state

    world = torch.distributed.group.WORLD if torch.distributed.is_initialized() else None
    found = []
    for value in vars(parallel_state).values():
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else (value,)
        for item in items:
            if isinstance(item, torch.distributed.ProcessGroup) and item is not world and item not in found:
                found.append(item)
    return found
