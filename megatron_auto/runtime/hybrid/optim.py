"""One Megatron optimizer per DDP-wrapped part, chained, with a gradient norm over the whole job.

Each part (segment or embedding/head shell) has its own DP group, so its
optimizer is built with that part's group collection (ZeRO-1 parts get
Megatron's distributed optimizer over their own DP group). The norm cannot use
Megatron's per-optimizer groups, which differ per part: every rank sums the
squares of the gradients it owns (TP duplicates and the tied head weight left
out; a part replicated over d DP ranks without sharding counts 1/d on each) and
one all-reduce over the world gives the global norm.

Mixed precision: DDP parts hold 16-bit weights and get Megatron's 16-bit
optimizer (fp32 master copies); ZeRO-3 parts already hold fp32 shards (FSDP2's
mixed-precision policy computes in 16-bit), so their optimizer is the fp32 one.
With fp16 all parts share one loss scaler: the chained optimizer unscales every
part's gradients, agrees on overflow over the whole world (parts have different
groups, and a rank that skipped alone would desynchronise the job) and updates
the one scale, as Megatron's optimizer does over its model-parallel group.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math

import torch

from .. import config as configs
from .. import kernels
from ..optimizer_parts import inner_optimizers, steps_experts
from ..settings import TrainSettings
from . import configs as hconfigs


def _chained_class():
    from megatron.core.optimizer.optimizer import ChainedOptimizer

    class HybridChainedOptimizer(ChainedOptimizer):
        """ChainedOptimizer whose gradient norm spans parts with different groups."""

        replication: list[int] = []

        grad_scaler = None
        """fp16: the loss scaler every part shares (None without loss scaling)."""

        def get_loss_scale(self):
            if self.grad_scaler is None:
                return super().get_loss_scale()
            return self.grad_scaler.scale

        @torch.no_grad()
        def prepare_grads(self) -> bool:
            """Main gradients of every part; with fp16, unscaled and checked for inf/nan job-wide."""
            if self.grad_scaler is None:
                return super().prepare_grads()
            for optimizer in self.chained_optimizers:
                optimizer.prepare_grads()  # their own scalers are detached: copies grads only
            grads = [grad for optimizer in self.chained_optimizers for grad in _main_grads(optimizer)]
            found_inf = torch.zeros(1, dtype=torch.float32, device=self.grad_scaler.scale.device)
            if grads:
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, self.grad_scaler.inv_scale)
            torch.distributed.all_reduce(found_inf, op=torch.distributed.ReduceOp.MAX)
            overflow = bool(found_inf.item() > 0)
            self.grad_scaler.update(overflow)
            return overflow

        @torch.no_grad()
        def get_grad_norm(self):
            squares = torch.zeros(1, dtype=torch.float64)
            for optimizer, copies in zip(self.chained_optimizers, self.replication):
                grads = [grad.detach() for grad in optimizer.get_main_grads_for_grad_norm()]
                if grads:  # per-tensor fp32 norms in one call, as Megatron's multi_tensor_l2norm
                    norms = torch.stack(torch._foreach_norm(grads, 2)).double().cpu()
                    squares += norms.pow(2).sum() / copies
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
            squares = squares.to(device)
            torch.distributed.all_reduce(squares)
            return math.sqrt(float(squares))

    return HybridChainedOptimizer


def _main_grads(optimizer) -> list:
    """The fp32 gradients `optimizer` steps with (local shards of FSDP2's DTensors)."""
    if hasattr(optimizer, "_collect_main_grad_data_for_unscaling"):
        return optimizer._collect_main_grad_data_for_unscaling() or []
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    return [getattr(grad, "_local_tensor", grad) for grad in grads]


@contextlib.contextmanager
def _param_groups_of_this_part():
    """megatron-core 0.16.1's _get_param_groups (optimizer/__init__.py) aligns its (override, expert)
    param-group keys over the whole world with all_gather_object, for distributed checkpoints. Hybrid
    parts differ between stages and layers (a dense part beside a part with experts, or another number
    of parts on another stage), so each part's optimizer takes its own keys: the gather returns this
    rank's keys for every rank. It is the only all_gather_object get_megatron_optimizer makes."""
    real = torch.distributed.all_gather_object

    def own_keys(outputs, obj, group=None):
        outputs[:] = [obj] * len(outputs)

    torch.distributed.all_gather_object = own_keys
    try:
        yield
    finally:
        torch.distributed.all_gather_object = real


def part_optimizer_config(plan, strategy, settings: TrainSettings):
    """Megatron's OptimizerConfig for one part: fp32 for ZeRO-3 parts, whose FSDP2 shards are the masters."""
    config = configs.optimizer_config(hconfigs.strategy_layout(plan, strategy), settings)
    if strategy.zero >= 2 and settings.precision != "fp32":
        config = dataclasses.replace(config, bf16=False, fp16=False, params_dtype=torch.float32)
    return config


def build_optimizer(chunks, plan, settings: TrainSettings, parts_with_strategy, pg_collection_for):
    """The chained optimizer over every (DDP part, strategy) of this rank."""
    from megatron.core.optimizer import get_megatron_optimizer

    optimizers, replication = [], []
    for part, strategy in parts_with_strategy:
        pgc = pg_collection_for(strategy)
        config = part_optimizer_config(plan, strategy, settings)
        with _param_groups_of_this_part():
            optimizer = get_megatron_optimizer(config, [part], use_gloo_process_groups=False, pg_collection=pgc)
        kernels.use_run_optimizer_impl(optimizer, settings)
        for inner in inner_optimizers(optimizer):
            experts = steps_experts(inner)
            # Experts: TP duplicates within the expert-TP group, replicas over the expert-DP group.
            inner.tp_group = pgc.expt_tp if experts else pgc.tp
            optimizers.append(inner)
            replication.append(1 if strategy.zero >= 1 else strategy.expert_dp if experts else strategy.dp)
    # Parts differ in `use_distributed_optimizer`, which ChainedOptimizer's constructor
    # forbids (it asserts equal configs); the fields it reads at step time agree.
    chained = _chained_class()([])
    chained.chained_optimizers, chained.config = optimizers, optimizers[0].config
    chained.model_chunks = [part for part, _ in parts_with_strategy]
    chained.is_stub_optimizer = False
    chained.replication = replication
    # The job's precision (a rank may hold only ZeRO-3 parts, whose optimizers are fp32).
    chained.config = dataclasses.replace(optimizers[0].config, bf16=settings.precision == "bf16",
                                         fp16=settings.precision == "fp16")
    for optimizer in optimizers:
        if getattr(optimizer, "grad_scaler", None) is not None:
            optimizer.grad_scaler = None  # the chained optimizer's shared scaler replaces it
    chained.grad_scaler = loss_scaler(settings)
    return chained


def loss_scaler(settings: TrainSettings):
    """fp16: the loss scaler get_megatron_optimizer would build (constant with --loss-scale, else
    dynamic with Megatron-LM's growth 2 and backoff 0.5); None for fp32 and bf16."""
    from megatron.core.optimizer.grad_scaler import ConstantGradScaler, DynamicGradScaler

    if settings.precision != "fp16":
        return None
    if settings.loss_scale:
        return ConstantGradScaler(settings.loss_scale)
    return DynamicGradScaler(initial_scale=settings.initial_loss_scale, min_scale=settings.min_loss_scale,
                             growth_factor=2.0, backoff_factor=0.5, growth_interval=settings.loss_scale_window,
                             hysteresis=settings.hysteresis)
