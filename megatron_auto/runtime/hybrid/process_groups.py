"""Process groups of a hybrid plan, created once per job and looked up by rank set.

`groups.unique_groups` lists every rank set of size > 1; each becomes one
torch.distributed group (one NCCL communicator on GPUs), created by all ranks in
the same order. A size-1 group is Megatron's own tensor-parallel group of the
base layout (tp = 1), which `parallel_state` already holds for every rank.
"""
from __future__ import annotations

import logging
from datetime import timedelta

import torch

from ...plan import LayerStrategy, Plan
from .. import distributed
from . import groups

logger = logging.getLogger(__name__)


class HybridProcessGroups:
    """Rank set -> process group, for every group of one plan."""

    def __init__(self, plan: Plan, seq_length: int, timeout_s: float) -> None:
        from megatron.core import parallel_state

        self.plan = plan
        self.rank = torch.distributed.get_rank()
        self.gpus = plan.gpus_per_stage
        self.stage = self.rank // self.gpus
        self.local_rank = self.rank % self.gpus
        self._single = parallel_state.get_tensor_model_parallel_group()
        self._groups: dict[groups.Ranks, object] = {}
        timeout = timedelta(seconds=timeout_s)
        for ranks in groups.unique_groups(plan, seq_length):
            group = distributed.new_group(list(ranks), timeout)
            if self.rank in ranks:
                self._groups[ranks] = group
        logger.debug("rank %d: %d hybrid groups (%d hold this rank)", self.rank,
                     len(groups.unique_groups(plan, seq_length)), len(self._groups))

    def group(self, ranks: groups.Ranks):
        """The group of `ranks` (which must contain this rank)."""
        if len(ranks) == 1:
            return self._single
        return self._groups[tuple(ranks)]

    def _layout(self, strategy: LayerStrategy) -> groups.StageLayout:
        return groups.StageLayout(self.stage, self.gpus, strategy.tp)

    def tp(self, strategy: LayerStrategy):
        """This rank's tensor-parallel group under `strategy`."""
        return self.group(groups.tp_groups(self._layout(strategy))[self.local_rank // strategy.tp])

    def dp(self, strategy: LayerStrategy):
        """This rank's data-parallel group under `strategy`."""
        return self.group(groups.dp_groups(self._layout(strategy))[self.local_rank % strategy.tp])

    def experts(self, strategy: LayerStrategy) -> dict[str, object]:
        """This rank's expert groups under a MoE layer's `strategy`, by role (groups.expert_groups);
        without expert parallelism they are its TP and DP groups and a one-rank EP group."""
        if not groups.has_experts(strategy):
            return {"expt_tp": self.tp(strategy), "tp_ep": self.tp(strategy), "ep": self._single,
                    "expt_dp": self.dp(strategy)}
        by_role = groups.expert_groups(self.stage, self.gpus, strategy.ep, strategy.expert_tp)
        return {role: self.group(next(ranks for ranks in rank_sets if self.rank in ranks))
                for role, rank_sets in by_role.items()}

    def dp_rank(self, strategy: LayerStrategy) -> int:
        return self.local_rank // strategy.tp

    def regroup(self, tp_a: int, tp_b: int):
        """The group that re-splits the batch between TP degrees tp_a and tp_b."""
        for ranks in groups.regroup_groups(self.stage, self.gpus, tp_a, tp_b):
            if self.rank in ranks:
                return self.group(ranks)
        raise KeyError(f"rank {self.rank} has no regroup group for tp {tp_a} -> {tp_b}")
