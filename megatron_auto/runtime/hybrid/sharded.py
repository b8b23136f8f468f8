"""ZeRO-3 segments: torch FSDP2 (`fully_shard`) over the segment's own data-parallel group.

Why FSDP2 and not Megatron-FSDP (megatron-core 0.16.1): Megatron-FSDP's adapter
builds its device mesh as `arange(world_size)` folded into (dp, tp), so it
asserts that one segment's DP x TP tiles the *whole* world, which a pipeline
stage's segment (or any hybrid layout beside PP) never does; it also creates
CUDA streams and MemPools in its constructor and buffers. FSDP2 takes any
group (`DeviceMesh.from_group`, "cpu" without CUDA), runs on gloo, and keeps the
TP shards of Megatron's layers as ordinary local tensors that it shards again
along dim 0 over DP. Megatron's own `TorchFullyShardedDataParallel` hardcodes a
"cuda" mesh and the global DP group, so this wrapper is ours.

`ShardedPart` offers what the hybrid runtime calls on a Megatron DDP part
(no_sync, finish_grad_sync, scale_gradients, zero_grad_buffer, ddp_config,
tp_group, module); parameters are DTensors tagged `__fsdp_param__`, which
Megatron's optimizer and clip-grad already read through `_local_tensor`.
Gradients are reduce-scattered as sums (divide factor 1, SUM collectives), as
Megatron's DDP with per-token loss does; `finalize` divides by the token count.
zero=2 maps to `reshard_after_forward=False` (parameters stay gathered from
forward to backward; gradients and optimizer states sharded).
In bf16/fp16 the shards stay fp32 (they are the master weights, stepped by an
fp32 optimizer) and FSDP2's MixedPrecisionPolicy gathers them in 16-bit for
compute and reduce-scatters the gradients in fp32, as Megatron-LM's
Float16Module + fp32 gradient buffers do for the other parts.
"""
from __future__ import annotations

import contextlib

import torch


def _param_attrs(module: torch.nn.Module) -> dict[str, dict]:
    """Megatron's attributes on each parameter (FSDP2 replaces the Parameter objects)."""
    return {name: dict(vars(param)) for name, param in module.named_parameters()}


def _restore_attrs(module: torch.nn.Module, attrs: dict[str, dict]) -> None:
    for name, param in module.named_parameters():
        for key, value in attrs.get(name, {}).items():
            setattr(param, key, value)
        param.__fsdp_param__ = True


class ShardedPart(torch.nn.Module):
    """A TransformerBlock fully sharded over `dp_group`, with Megatron DDP's part interface."""

    def __init__(self, config, module: torch.nn.Module, dp_group, tp_group, reshard_after_forward: bool = True,
                 compute_dtype: torch.dtype = torch.float32):
        from megatron.core.distributed import DistributedDataParallelConfig
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        super().__init__()
        self.config, self.tp_group, self.dp_group = config, tp_group, dp_group
        self.ddp_config = DistributedDataParallelConfig(use_distributed_optimizer=False)
        attrs = _param_attrs(module)
        mesh = DeviceMesh.from_group(dp_group, "cuda" if torch.cuda.is_available() else "cpu")
        policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
        for layer in module.layers:
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
        fully_shard(module, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
        _restore_attrs(module, attrs)
        for fsdp_module in (m for m in module.modules() if isinstance(m, FSDPModule)):
            # Sum, not average, over DP (gloo has no PREMUL_SUM/AVG): per-token loss scales once later.
            fsdp_module.set_gradient_divide_factor(1.0)
            fsdp_module.set_force_sum_reduction_for_comms(True)
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Nothing to defer: ZeRO-3 reduce-scatters every micro-batch's gradients into the shards
        (DeepSpeed's and FSDP's default), so no rank holds a whole layer's gradients between
        micro-batches; the cost model charges one reduce-scatter per micro-batch and 1/d of the
        gradients (cost.communication.zero3_comm_time, cost.memory.model_state_bytes)."""
        yield

    def finish_grad_sync(self) -> None:
        """FSDP2 waits for its reduce-scatters at the end of backward: nothing left to do."""

    def _grads(self):
        return [p.grad for p in self.module.parameters() if p.grad is not None]

    @torch.no_grad()
    def scale_gradients(self, factor: float) -> None:
        for grad in self._grads():
            grad._local_tensor.mul_(factor)

    def zero_grad_buffer(self) -> None:
        for param in self.module.parameters():
            param.grad = None

    @torch.no_grad()
    def allreduce_sequence_parallel_grads(self) -> None:
        """Sum the TP-replicated parameters' gradient shards over the TP group, as Megatron's finalize
        (_allreduce_non_tensor_model_parallel_grads) does: the SP layernorms, and with --qk-layernorm the
        q/k norms (each TP rank's heads give a part of their gradient), but not multi-latent attention's latent
        norms, whose gradient every TP rank holds whole (patches/mla_latent_norm_grads.py)."""
        if torch.distributed.get_world_size(self.tp_group) <= 1:
            return
        for name, param in self.module.named_parameters():
            by_sp = self.config.sequence_parallel and getattr(param, "sequence_parallel", False)
            by_qk = (self.config.qk_layernorm and not self.config.multi_latent_attention
                     and ("q_layernorm" in name or "k_layernorm" in name))
            if param.grad is not None and (by_sp or by_qk):
                torch.distributed.all_reduce(param.grad._local_tensor, group=self.tp_group)


@torch.no_grad()
def copy_into_shard(param, full: torch.Tensor) -> None:
    """Copy the unsharded (TP-local) tensor `full` into this rank's dim-0 shard of DTensor `param`."""
    local = param._local_tensor
    mesh = param.device_mesh
    pieces = full.chunk(mesh.size(), dim=0)
    index = mesh.get_local_rank()
    if local.numel():
        local.copy_(pieces[index].to(local.device, local.dtype))
