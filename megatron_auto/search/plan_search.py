"""The top of the search: the fastest plan that fits, in the `megatron` or the `hybrid` space.

It runs the megatron-space search, then (hybrid space) the per-layer search from that optimum, optionally
over the selective-recompute module sets, and explains with the least memory any plan needs when none fits.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import replace
from typing import Callable, Optional

from ..cost.estimate import estimate_plan
from ..cost.fp8 import fp8_problem
from ..cost.peak_memory import device_budget_bytes
from ..errors import UserError
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import GIB, TrainingSpec, interned
from .constraints import SearchConstraints, SearchResult
from .experts import check_expert_constraints
from .hybrid import search_hybrid
from .least_memory import least_memory_gib
from .megatron_space import SpaceStats, search_megatron
from .module_sets import search_module_sets
from .pruning import clear_search_caches

log = logging.getLogger(__name__)


def search_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, space: str = "megatron",
                constraints: SearchConstraints = SearchConstraints(),
                progress: Optional[Callable[[float], None]] = None,
                choose_recompute_modules: bool = False, choose_tp_comm_overlap: bool = False,
                switches: tuple[dict, ...] = ()) -> SearchResult:
    """The fastest plan that fits; UserError with the least memory any plan needs when none fits.

    `choose_recompute_modules`: also choose what selective recomputation re-runs (search.module_sets);
    otherwise it re-runs `training.recompute_modules`. `choose_tp_comm_overlap`: also weigh Transformer
    Engine's TP communication overlap (--tp-comm-overlap, cost/tp_overlap.py), a run-wide switch. `switches`:
    more run-wide switches to weigh, each TrainingSpec fields to set (cli.job.knob_switches: CUDA graphs,
    activation offloading). Each switch is searched on top of the best spec so far, pruned with its plan, and
    kept where its plan is faster (or where it alone fits).
    """
    problem = _space_problem(model, cluster, training, space) or _switches_problem(switches, space)
    if problem:
        raise UserError(problem)
    clear_search_caches()  # shared by this call's searches only (search/pruning.py)

    def search(spec: TrainingSpec, incumbent: float = math.inf) -> Optional[SearchResult]:
        pinned = _optimizer_constraints(constraints, spec)
        if choose_recompute_modules:
            return search_module_sets(_module_set_searcher(model, cluster, space, pinned), model, spec,
                                      pinned, progress, incumbent)
        return _search_space(model, cluster, spec, space, pinned, progress, incumbent)

    overlap = (dict(tp_comm_overlap=True),) if choose_tp_comm_overlap and not training.tp_comm_overlap else ()
    return _search_with_switches(search, training, (*overlap, *switches))


def _optimizer_constraints(constraints: SearchConstraints, training: TrainingSpec) -> SearchConstraints:
    """The distributed optimizer pinned on wherever the precision-aware optimizer runs (Megatron-Core refuses
    the switch without it)."""
    if training.optimizer_states.precision_aware and constraints.distributed_optimizer is None:
        return replace(constraints, distributed_optimizer=True)
    return constraints


def _search_with_switches(search, training: TrainingSpec, switches: tuple[dict, ...]) -> SearchResult:
    """search(training), then each switch on top of the fastest spec so far (search_plan); the search times and
    candidates of every search that returned a plan are summed. Raises the first UserError when none fits."""
    best, spec, refusal, spent, evaluated = None, training, None, 0.0, 0
    for fields in ({}, *switches):
        tried = interned(replace(spec, **fields)) if fields else interned(spec)
        try:
            found = search(tried, _fitting_time(best.plan) if best is not None else math.inf)
        except UserError as error:
            if not switches:
                raise
            refusal = refusal or error
            continue
        if found is None:
            continue
        spent, evaluated = spent + found.search_time_s, evaluated + found.candidates_evaluated
        if best is None or _fitting_time(found.plan) < _fitting_time(best.plan):
            best, spec = found, tried
    if best is None:
        raise refusal
    return replace(best, search_time_s=spent, candidates_evaluated=evaluated)


def _space_problem(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, space: str) -> Optional[str]:
    """Why the search cannot plan this job in `space`, as one line; None when it can."""
    if space == "hybrid" and model.mtp_num_layers:
        return (f"model '{model.name}' has multi-token prediction, which the hybrid space does not plan yet (its "
                "runtime builds no MTP modules): search the megatron space")
    if space == "hybrid" and (training.cuda_graph_impl != "none" or training.offload_modules):
        return _HOST_KNOBS_HYBRID
    if space == "hybrid" and training.optimizer_states.precision_aware:
        return _PRECISION_AWARE_HYBRID
    if space == "hybrid" and training.moe_ep_overlap:
        return _EP_OVERLAP_HYBRID
    return fp8_problem(cluster, training.fp8_recipe) if training.fp8 else None


_EP_OVERLAP_HYBRID = ("--overlap-moe-expert-parallel-comm runs Megatron-Core's combined 1F1B schedule, which the "
                      "hybrid space does not plan (its runtime runs its own schedule): search the megatron space")
_HOST_KNOBS_HYBRID = ("CUDA graphs and activation offloading are Megatron-LM's; the hybrid space's plans run on "
                      "megatron-auto's runtime, which runs neither: search the megatron space")


def _switches_problem(switches: tuple[dict, ...], space: str) -> Optional[str]:
    """Why the search cannot weigh these switches in `space`, or None."""
    knobs = {"cuda_graph_impl", "offload_modules"}
    if space == "hybrid" and any("optimizer_states" in switch for switch in switches):
        return _PRECISION_AWARE_HYBRID
    if space == "hybrid" and any("moe_ep_overlap" in switch for switch in switches):
        return _EP_OVERLAP_HYBRID
    if space == "hybrid" and any("cp_comm_type" in switch for switch in switches):
        return "--cp-comm-type search weighs context parallelism, which the hybrid space does not plan: search the " \
               "megatron space"
    return _HOST_KNOBS_HYBRID if space == "hybrid" and any(knobs & set(switch) for switch in switches) else None


_PRECISION_AWARE_HYBRID = ("--use-precision-aware-optimizer runs Transformer Engine's FusedAdam under Megatron-LM; "
                           "the hybrid space's plans run on megatron-auto's runtime, which keeps fp32 Adam states: "
                           "search the megatron space")


def _module_set_searcher(model: ModelSpec, cluster: ClusterSpec, space: str, constraints: SearchConstraints):
    """search_one for search_module_sets: each set's plan as a search under that set alone finds it, with
    the work that does not depend on the set done once."""
    selective_only = replace(constraints, recompute="selective") if constraints.recompute is None else None
    shared: dict = {}  # the fastest megatron-space plan without selective recompute: the same under every set

    def search_one(spec: TrainingSpec, share, incumbent: float, first: bool) -> Optional[SearchResult]:
        if space == "hybrid":
            # Every hybrid candidate carries its own embedding layout, so the incumbent's bounds are exact; the
            # megatron phase weighs the shared plan without selective recompute against the set's selective ones.
            return _search_space(model, cluster, spec, space, constraints, share, incumbent,
                                 megatron_constraints=selective_only, unselective=shared if selective_only else None)
        # The megatron space's bounds are exact. After the first set, only selective recomputation
        # differs from the sets searched before.
        flags_only = selective_only if not first and selective_only else constraints
        return _search_space(model, cluster, spec, space, constraints, share, incumbent, flags_only)
    return search_one


def _megatron_phase(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, constraints: SearchConstraints,
                    progress, stats: SpaceStats, incumbent: float, unselective: Optional[dict]):
    """search_megatron under `constraints`; with `unselective` (a cache shared by the module sets, and
    `constraints` pinned to selective) the faster of that and the best plan without selective recompute,
    which is searched once (recompute none, then full) and re-priced under `training`."""
    if unselective is None:
        return search_megatron(model, cluster, training, constraints, progress, stats, incumbent)
    if "plan" not in unselective:
        best = None
        for kind in ("none", "full"):
            found, stats = search_megatron(model, cluster, training, replace(constraints, recompute=kind), None,
                                           stats, _fitting_time(best))
            best = found if _fitting_time(found) < _fitting_time(best) else best
        unselective["plan"] = best
    floor = unselective["plan"]
    selective, stats = search_megatron(model, cluster, training, constraints, progress, stats,
                                       min(incumbent, _fitting_time(floor)))
    if _fitting_time(selective) < _fitting_time(floor):
        return selective, stats
    if floor is None:
        return None, stats
    return replace(floor, prediction=estimate_plan(floor, model, cluster, training)), stats


def _fitting_time(plan) -> float:
    """A plan's predicted iteration seconds when it fits; infinity for no plan or one that does not fit."""
    return plan.prediction.iteration_time_s if plan is not None and plan.prediction.fits else math.inf


def _search_space(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, space: str,
                  constraints: SearchConstraints, progress: Optional[Callable[[float], None]],
                  incumbent: float = math.inf,
                  megatron_constraints: Optional[SearchConstraints] = None,
                  unselective: Optional[dict] = None) -> Optional[SearchResult]:
    """The fastest plan of `space` that fits, selective recomputation re-running `training.recompute_modules`.

    The hybrid space contains the megatron space, so its search starts from the
    megatron-space optimum and keeps a per-layer plan only when it is faster. With a finite
    `incumbent` (seconds) the search may leave out what cannot beat it, and returns None when nothing
    that fits was found. `megatron_constraints` replace `constraints` in the megatron-space phase, which
    with `unselective` also weighs the plan without selective recompute (_megatron_phase).
    """
    if space not in ("megatron", "hybrid"):
        raise UserError(f"unknown search space '{space}'; choose megatron or hybrid")
    check_expert_constraints(model, cluster.world_size, constraints.ep,
                             constraints.etp)
    started = time.perf_counter()
    stats = SpaceStats()
    share = 0.3 if space == "hybrid" else 1.0
    with stats.timed("megatron space"):
        best, stats = _megatron_phase(model, cluster, training, megatron_constraints or constraints,
                                      (lambda f: progress(share * f)) if progress else None, stats, incumbent,
                                      unselective)
    megatron_evaluated = stats.evaluated
    log.info("megatron space: %.2f s over %d flag configurations", stats.timings["megatron space"],
             megatron_evaluated)
    megatron_time = best.prediction.iteration_time_s if best is not None and best.prediction.fits else math.inf
    if space == "hybrid":
        with stats.timed("hybrid space"):
            hybrid, stats = search_hybrid(model, cluster, training, constraints,
                                          (lambda f: progress(share + (1 - share) * f)) if progress else None,
                                          stats, incumbent=min(incumbent, megatron_time))
        log.info("hybrid space: %.2f s over %d (pipeline degree, micro-batch, strategy) candidates",
                 stats.timings["hybrid space"], stats.evaluated - megatron_evaluated)
        if hybrid is not None and hybrid.prediction.iteration_time_s < megatron_time:
            best = hybrid
    if best is None or not best.prediction.fits:
        if incumbent < math.inf:
            return None
        raise UserError(_infeasible_message(least_memory_gib(model, cluster, training, space, constraints),
                                            training, cluster))
    elapsed = time.perf_counter() - started
    log.info("search took %.2f s over %d candidates", elapsed, stats.evaluated)
    return SearchResult(plan=best, search_time_s=elapsed, candidates_evaluated=stats.evaluated,
                        pruning=tuple(sorted(stats.pruning.items())),
                        timings=tuple(stats.timings.items()))


def _infeasible_message(least_gib: float, training: TrainingSpec, cluster: ClusterSpec) -> str:
    """The one-line error when nothing fits: the budget and the least memory any plan needs."""
    budget = device_budget_bytes(cluster, training) / GIB
    if math.isinf(least_gib):
        return f"no valid plan exists for this model, batch and {cluster.world_size} GPUs"
    return (f"no plan fits in {budget:.1f} GiB per GPU; the least memory any plan needs is "
            f"{least_gib:.1f} GiB")
