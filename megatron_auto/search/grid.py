"""Exhaustive grid search over Megatron's flags: the baseline the planner must never lose to.

This is what an auto-configurator that only sweeps flags does (NeMo's, say): it
scores every combination of

- `--tensor-model-parallel-size` t: every divisor of the GPUs dividing the heads
  and query groups (also across nodes: no "TP within a node" rule);
- `--pipeline-model-parallel-size` p: every divisor of the GPUs up to the layers;
- `--micro-batch-size`: every divisor of B / dp;
- `--num-layers-per-virtual-pipeline-stage`: every v dividing the stage's layers;
- `--sequence-parallel` on and off, `--use-distributed-optimizer` on and off;
- for MoE models, `--expert-model-parallel-size` e and `--expert-tensor-parallel-size` t_e: every pair
  with e dividing the experts and e x t_e dividing t x dp (t_e = t written as Megatron's default);
- `--recompute-granularity` none, selective, full (uniform: every layer), and
  full with `--recompute-method block --recompute-num-layers N` for every N;
- `--decoder-first/last-pipeline-num-layers`: every first/last stage size whose
  middle stages split evenly (optionally within `split_window` of the average);
- `--account-for-embedding/loss-in-pipeline-split`: the embedding, the loss or both counted as
  layers of an even split, with every v > 1 whose chunks keep a layer.

It shares no pruning with `megatron_space.search_megatron`; every candidate is
built with `build_uniform_plan` and scored with `estimate_plan`. Two sound bounds
keep it tractable, both from one fact: recomputation only adds work. A
configuration's time without recomputation bounds every recomputing variant of
it from below, and recomputing more layers (block method, larger N) is never
faster, so the scan over N stops at the first N that fits or is no faster than
the best so far. A quick first pass (no recompute, full recompute) supplies the
best-so-far. `use_bound=False` turns the bounds off; the tests check both agree.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace
from typing import Iterator, Optional

from ..cost.estimate import estimate_plan
from ..errors import UserError
from ..plan import Plan
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import TrainingSpec
from .experts import expert_degree_choices
from .integers import divisors
from .uniform import (ACCOUNTED, UniformConfig, build_uniform_plan, chunk_sizes, even_split,
                      megatron_uneven_splits, virtual_stage_choices)


@dataclass
class GridResult:
    """The fastest fitting configuration of the grid and what the sweep cost."""

    plan: Optional[Plan] = None
    """Best fitting plan (with its prediction), None when nothing fits."""
    config: Optional[UniformConfig] = None
    """The flags of `plan`."""
    evaluated: int = 0
    """Configurations scored with estimate_plan."""
    bounded: int = 0
    """Recomputing variants skipped because their no-recompute lower bound was no better."""
    invalid: int = 0
    """Combinations Megatron rejects (batch or layers do not divide)."""
    search_time_s: float = 0.0
    """Wall-clock seconds."""

    @property
    def time_s(self) -> float:
        return self.plan.prediction.iteration_time_s if self.plan is not None else math.inf

    def merge(self, other: "GridResult") -> None:
        """Fold another sweep (e.g. of other (t, p) pairs) into this one."""
        if other.plan is not None and other.time_s < self.time_s:
            self.plan, self.config = other.plan, other.config
        self.evaluated += other.evaluated
        self.bounded += other.bounded
        self.invalid += other.invalid


def grid_degrees(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> list[tuple[int, int]]:
    """Every (t, p) Megatron accepts for this job."""
    layer, world = model.layers[0], cluster.world_size
    return [(tp, pp) for tp in divisors(world) if layer.tensor_parallel_error(tp) is None
            for pp in divisors(world // tp)
            if pp <= model.num_layers and training.global_batch_size % (world // (tp * pp)) == 0]


def grid_splits(model: ModelSpec, pp: int, split_window: Optional[int]) -> list[Optional[tuple[int, ...]]]:
    """The even split (as None) and every first/last-stage split Megatron's flags express."""
    even = even_split(model.num_layers, pp)
    splits: list[Optional[tuple[int, ...]]] = [None] if even else []
    average = model.num_layers / pp
    for split in megatron_uneven_splits(model.num_layers, pp):
        if split == even:
            continue
        if split_window is None or (abs(split[0] - average) <= split_window and abs(split[-1] - average) <= split_window):
            splits.append(split)
    return splits


def _base_configs(model, cluster, training, tp, pp, split_window) -> Iterator[UniformConfig]:
    """Every flag combination of one (t, p) with recomputation off."""
    dp = cluster.world_size // (tp * pp)
    experts = expert_degree_choices(model, tp, tp * dp)
    splits = [(split, (False, False)) for split in grid_splits(model, pp, split_window)]
    splits += [(None, account_for) for account_for in ACCOUNTED if pp > 1]
    for split, account_for in splits:
        probe = UniformConfig(tp=tp, pp=pp, micro_batch_size=1, stage_layers=split, account_for=account_for)
        virtual = virtual_stage_choices(model, probe)
        for mbs, v, (ep, etp) in itertools.product(divisors(training.global_batch_size // dp), virtual, experts):
            for sp in ((False, True) if tp > 1 else (False,)):
                for distributed in (False, True):
                    yield replace(probe, micro_batch_size=mbs, vp=v, sequence_parallel=sp,
                                  distributed_optimizer=distributed, ep=ep, etp=etp)


def recompute_variants(config: UniformConfig, model: ModelSpec) -> list[UniformConfig]:
    """Selective, then full on the first N layers of each chunk for N = 1, 2, ..., then full on every layer."""
    longest_chunk = max(chunk_sizes(model.num_layers, config))
    return ([replace(config, recompute="selective")]
            + [replace(config, recompute="full", recompute_num_layers=n) for n in range(1, longest_chunk)]
            + [replace(config, recompute="full")])


def _score(model, cluster, training, config: UniformConfig, result: GridResult) -> Optional[Plan]:
    try:
        plan = build_uniform_plan(model, cluster, training, config)
    except UserError:
        result.invalid += 1
        return None
    result.evaluated += 1
    return plan.with_prediction(estimate_plan(plan, model, cluster, training))


def _consider(plan: Optional[Plan], config: UniformConfig, result: GridResult) -> None:
    if plan is not None and plan.prediction.fits and plan.prediction.iteration_time_s < result.time_s:
        result.plan, result.config = plan, config


def _sweep_recompute(model, cluster, training, plain: Plan, base: UniformConfig, result: GridResult,
                     use_bound: bool) -> None:
    """Every recomputing variant of `base`, skipping those the no-recompute time or a fitting
    variant with fewer recomputed layers proves no faster than the best so far."""
    variants = recompute_variants(base, model)
    if use_bound and (plain.prediction.fits or plain.prediction.iteration_time_s >= result.time_s):
        result.bounded += len(variants)
        return
    for index, config in enumerate(variants):
        plan = _score(model, cluster, training, config, result)
        _consider(plan, config, result)
        stop = plan is not None and (plan.prediction.fits or plan.prediction.iteration_time_s >= result.time_s)
        if use_bound and config.recompute == "full" and stop:
            result.bounded += len(variants) - index - 1   # more recomputed layers: no faster
            return


def grid_search_degrees(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, tp: int, pp: int,
                        split_window: Optional[int] = None, use_bound: bool = True,
                        incumbent: Optional[Plan] = None, quick: bool = False) -> GridResult:
    """The fastest fitting configuration with these (t, p), trying every other flag.

    `incumbent`: a plan (of any (t, p)) to beat, so that the bounds bite from the start.
    `quick`: only no recomputation and full recomputation of every layer (to find an incumbent fast).
    """
    result = GridResult(plan=incumbent)
    for base in _base_configs(model, cluster, training, tp, pp, split_window):
        plain = _score(model, cluster, training, base, result)
        if plain is None:
            continue
        _consider(plain, base, result)
        if quick:
            full = replace(base, recompute="full")
            _consider(_score(model, cluster, training, full, result), full, result)
        else:
            _sweep_recompute(model, cluster, training, plain, base, result, use_bound)
    if result.plan is incumbent:
        result.plan = None
    return result


def grid_search(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                split_window: Optional[int] = None, use_bound: bool = True) -> GridResult:
    """The fastest fitting configuration over every (t, p) and every other flag.

    A quick pass (no recompute, full recompute) finds an incumbent; the full pass then bounds against it.
    """
    started = time.perf_counter()
    quick = GridResult()
    if use_bound:
        for tp, pp in grid_degrees(model, cluster, training):
            quick.merge(grid_search_degrees(model, cluster, training, tp, pp, split_window, quick=True))
    result = GridResult(plan=quick.plan, config=quick.config)
    for tp, pp in grid_degrees(model, cluster, training):
        result.merge(grid_search_degrees(model, cluster, training, tp, pp, split_window, use_bound,
                                         incumbent=result.plan))
    result.evaluated += quick.evaluated
    result.search_time_s = time.perf_counter() - started
    return result
