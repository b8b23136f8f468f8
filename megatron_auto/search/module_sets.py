"""Which --recompute-modules set `selective` recomputation re-runs: one search per set that can run.

Megatron-Core applies one set to every selectively recomputed layer (TransformerConfig.recompute_modules),
so the set is a plan-wide choice: each candidate set is searched and the fastest fitting plan wins.
With flash attention `core_attn` frees almost nothing, so on GPUs the choice decides whether
`selective` is a memory lever at all (docs/cost_model.md, "Which modules").
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Callable, Optional

from ..errors import UserError
from ..specs.model import ModelSpec
from ..specs.training import RECOMPUTE_MODULES, TrainingSpec, recompute_modules_problem
from .constraints import SearchConstraints, SearchResult

SearchOne = Callable[[TrainingSpec, Optional[Callable[[float], None]], float, bool], Optional[SearchResult]]
"""search_one(training, progress, incumbent, first): one search under `training`'s set (`first`: the first set,
searched in full; the others may leave out what does not read the set); with a finite incumbent (seconds), None
when it found nothing that fits and beats it."""


def candidate_module_sets(model: ModelSpec, training: TrainingSpec) -> list[tuple[str, ...]]:
    """`training`'s set first, then every other non-empty subset of RECOMPUTE_MODULES that this model can
    recompute, leaving out a set that re-runs the same modules in every layer as one listed before it, or
    nothing in any layer (on a model of MoE layers only, `mlp` changes nothing)."""
    subsets = [combo for size in range(1, len(RECOMPUTE_MODULES) + 1)
               for combo in itertools.combinations(RECOMPUTE_MODULES, size)]
    ordered = [tuple(training.recompute_modules)] + [s for s in subsets if set(s) != set(training.recompute_modules)]
    seen, out = set(), []
    for modules in ordered:
        if recompute_modules_problem(model.layers, modules):
            continue
        effect = _per_layer_effect(model, replace(training, recompute_modules=modules))
        if effect not in seen and (any(effect) or not out):
            seen.add(effect)
            out.append(modules)
    return out


def _per_layer_effect(model: ModelSpec, training: TrainingSpec) -> tuple[frozenset[str], ...]:
    return tuple(training.selective_modules(layer) for layer in model.layers)


def search_module_sets(search_one: SearchOne, model: ModelSpec, training: TrainingSpec,
                       constraints: SearchConstraints, progress: Optional[Callable[[float], None]] = None,
                       incumbent: float = math.inf) -> Optional[SearchResult]:
    """The fastest fitting plan over the candidate sets (with a finite `incumbent`, None when none beats it).

    The first set's plan is the incumbent the others must beat, so their searches prune with it. A pinned
    `--recompute-granularity` other than selective makes the set irrelevant: one search. When no plan fits
    under the first set, each other set is searched in full, and the first set's UserError (with the
    least memory a plan needs) is raised if none fits either."""
    sets = candidate_module_sets(model, training)
    if constraints.recompute in ("none", "full"):
        sets = sets[:1]
    best, spent, first_error = None, [], None
    for index, modules in enumerate(sets):
        limit = min(incumbent, best.plan.prediction.iteration_time_s if best is not None else math.inf)
        # The first set is `training`'s own: the same object, so the caches keyed on it match by identity.
        own = modules == tuple(training.recompute_modules)
        spec = training if own else replace(training, recompute_modules=modules)
        try:
            result = search_one(spec, _progress_share(progress, index, len(sets)), limit, index == 0)
        except UserError as error:
            first_error = first_error or error
            continue
        if result is not None:
            spent.append((modules, result.search_time_s, result.candidates_evaluated))
            if limit == math.inf or result.plan.prediction.iteration_time_s < limit:
                best = result
    if best is None:
        if incumbent < math.inf:
            return None
        raise first_error
    return replace(best, search_time_s=sum(seconds for _, seconds, _ in spent),
                   candidates_evaluated=sum(count for _, _, count in spent),
                   timings=tuple((f"recompute modules {' '.join(m)}", seconds) for m, seconds, _ in spent)
                   + best.timings)


def _progress_share(progress, index: int, count: int) -> Optional[Callable[[float], None]]:
    if progress is None:
        return None
    return lambda fraction: progress((index + fraction) / count)
