"""One Megatron optimizer per DDP-wrapped part, chained, with a gradient norm over the whole job.

Each part (segment or embedding/head shell) has its own DP group, so its
optimizer is built with that part's group collection (ZeRO-1 parts get
Megatron's distributed optimizer over their own DP group). The norm cannot use
Megatron's per-optimizer groups, which differ per part: every rank sums the
squares of the gradients it owns (TP duplicates and the tied head weight left
out; a part replicated over d DP ranks without sharding counts 1/d on each) and
one all-reduce over the world gives the global norm.
"""
from __future__ import annotations

import math

import torch

from .. import config as configs
from .. import kernels
from ..settings import TrainSettings
from . import configs as hconfigs


def _chained_class():
    from megatron.core.optimizer.optimizer import ChainedOptimizer

    class HybridChainedOptimizer(ChainedOptimizer):
        """ChainedOptimizer whose gradient norm spans parts with different groups."""

        replication: list[int] = []

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


def build_optimizer(chunks, plan, settings: TrainSettings, parts_with_strategy, pg_collection_for):
    """The chained optimizer over every (DDP part, strategy) of this rank."""
    from megatron.core.optimizer import get_megatron_optimizer

    optimizers, replication = [], []
    for part, strategy in parts_with_strategy:
        pgc = pg_collection_for(strategy)
        config = configs.optimizer_config(hconfigs.strategy_layout(plan, strategy), settings)
        optimizer = get_megatron_optimizer(config, [part], use_gloo_process_groups=False, pg_collection=pgc)
        kernels.use_run_optimizer_impl(optimizer, settings)
        for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
            inner.tp_group = pgc.tp
            optimizers.append(inner)
            replication.append(1 if strategy.zero >= 1 else strategy.dp)
    # Parts differ in `use_distributed_optimizer`, which ChainedOptimizer's constructor
    # forbids (it asserts equal configs); the fields it reads at step time agree.
    chained = _chained_class()([])
    chained.chained_optimizers, chained.config = optimizers, optimizers[0].config
    chained.model_chunks = [part for part, _ in parts_with_strategy]
    chained.is_stub_optimizer = False
    chained.replication = replication
    return chained
