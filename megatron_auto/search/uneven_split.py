"""The fastest pipeline split Megatron-LM accepts, for flags whose layers do not divide evenly over the stages.

Megatron-LM splits the decoder layers evenly over the pipeline stages (and the chunks of each) unless told
otherwise; where they do not divide (Llama 3.1 405B's 126 layers over 8 stages x 8 chunks, DeepSeek-V3's 61
over 16 stages) it refuses to start, and its users pick a split by hand. Megatron-Core 0.16.1
(transformer_config.py `__post_init__`, transformer_block.py `get_num_layers_to_build`) accepts two kinds:

- `--decoder-first/last-pipeline-num-layers`: the first and/or last stage hold what they are given and the
  rest splits evenly over the middle stages (megatron_uneven_splits); this package builds them with one chunk
  per stage (chunk_sizes);
- `--account-for-embedding/loss-in-pipeline-split`: the embedding and/or the loss count as one layer each of
  an even split, so the first and/or last chunk hold one decoder layer fewer (ACCOUNTED).

Megatron-Core refuses the two kinds together, so each candidate is one of them; every candidate is priced
with the cost model (best_uniform_plan, which also picks the micro-batch and virtual stages when asked) and
the fastest that fits wins, as for every other flag `estimate` picks. Pure Python; no torch.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional

from ..errors import UserError
from ..plan import Plan
from ..specs.cluster import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.training import TrainingSpec
from .uniform import (ACCOUNTED, UniformConfig, best_uniform_plan, build_uniform_plan, chunk_sizes,
                      megatron_uneven_splits, virtual_stage_choices)


def splits_as_given(model: ModelSpec, config: UniformConfig) -> bool:
    """Whether `config`'s own split (stage_layers, account_for, chunk_layers) builds at its virtual stages."""
    return chunk_sizes(model.num_layers, config) is not None


def split_candidates(model: ModelSpec, config: UniformConfig, fixed_virtual_stages: bool) -> list[UniformConfig]:
    """`config` under every split Megatron-LM accepts for its pp: each --account-for-embedding/loss pair, then
    each first/last-stage split; only those that build at config.vp (when fixed) or at some
    virtual-stage count (virtual_stage_choices) otherwise."""
    if config.pp < 2:
        return []
    base = replace(config, stage_layers=None, account_for=(False, False), chunk_layers=None)
    splits = [replace(base, account_for=account_for) for account_for in ACCOUNTED]
    splits += [replace(base, stage_layers=stages) for stages in megatron_uneven_splits(model.num_layers, config.pp)]
    if fixed_virtual_stages:
        return [split for split in splits if splits_as_given(model, split)]
    return [split for split in splits if virtual_stage_choices(model, split)]


def best_split_plan(model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec, config: UniformConfig,
                    choose_micro_batch: bool, choose_virtual_stages: bool) -> Plan:
    """The fastest plan of `config`'s flags under the split Megatron-LM accepts that prices best (fitting
    plans first, then the lower predicted time; the first of equal ones); the micro-batch size and/or the
    virtual stages are picked as best_uniform_plan picks them. UserError, one line, when no split builds."""
    candidates = split_candidates(model, config, fixed_virtual_stages=not choose_virtual_stages)
    if not candidates:
        raise UserError(f"{model.num_layers} layers do not split over {config.pp} pipeline stages"
                        + (f" x {config.vp} chunks" if not choose_virtual_stages else "")
                        + ", evenly or by any split Megatron-LM accepts (--decoder-first/last-pipeline-num-"
                        "layers, --account-for-embedding/loss-in-pipeline-split)")
    first = candidates[0]
    if choose_virtual_stages:
        first = replace(first, vp=(virtual_stage_choices(model, first) or [1])[0])
    build_uniform_plan(model, cluster, training, first)  # surfaces the reason the other flags cannot work
    best: Optional[Plan] = None
    for candidate in candidates:
        fitting = best.prediction.iteration_time_s if best is not None and best.prediction.fits else math.inf
        try:
            plan = best_uniform_plan(model, cluster, training, candidate, choose_micro_batch, choose_virtual_stages,
                                     incumbent=fitting)
        except UserError:  # no micro-batch / chunk count of this split beats the best fitting plan so far
            continue
        if best is None or _rank(plan) < _rank(best):
            best = plan
    if best is None:
        raise UserError(f"no pipeline split Megatron-LM accepts makes these flags valid for {model.num_layers} "
                        f"layers over {config.pp} pipeline stages")
    return best


def _rank(plan: Plan) -> tuple[bool, float]:
    """Fitting plans first, then the faster."""
    return (not plan.prediction.fits, plan.prediction.iteration_time_s)
