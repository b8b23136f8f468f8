"""Human-readable tables of a Plan: layout, per-stage predictions, Megatron flags.

Pure string building: the command line prints these, the library never does.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Optional

from .errors import UserError
from .megatron_flags import expert_degrees, flag_groups, megatron_flags
from .plan import Chunk, LayerStrategy, Plan, Prediction

__all__ = ["plan_table", "strategy_runs", "stage_lines", "prediction_lines", "comparison_lines",
           "node_group_lines"]


def strategy_runs(strategies: tuple[LayerStrategy, ...], first_layer: int) -> list[tuple[int, int, LayerStrategy]]:
    """(first, last, strategy) for each run of equal consecutive strategies; layer numbers are global."""
    runs: list[tuple[int, int, LayerStrategy]] = []
    for offset, strategy in enumerate(strategies):
        index = first_layer + offset
        if runs and runs[-1][2] == strategy and runs[-1][1] == index - 1:
            runs[-1] = (runs[-1][0], index, strategy)
        else:
            runs.append((index, index, strategy))
    return runs


def _layer_range(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def _chunk_starts(plan: Plan) -> list[int]:
    """Global index of the first layer of each chunk."""
    starts, total = [], 0
    for chunk in plan.chunks:
        starts.append(total)
        total += len(chunk.layers)
    return starts


def _stage_runs(plan: Plan, stage: int, starts: list[int]) -> list[tuple[LayerStrategy, list[str]]]:
    """The stage's layer ranges grouped by strategy, in order of first appearance."""
    groups: dict[LayerStrategy, list[str]] = {}
    for chunk_index in range(stage, len(plan.chunks), plan.pipeline_parallel):
        chunk: Chunk = plan.chunks[chunk_index]
        for first, last, strategy in strategy_runs(chunk.layers, starts[chunk_index]):
            groups.setdefault(strategy, []).append(_layer_range(first, last))
    return list(groups.items())


def _stage_header(plan: Plan, stage: int) -> str:
    count = plan.stage_layer_counts()[stage]
    header = f"  stage {stage}: {count} layer{'s' if count != 1 else ''}"
    if plan.virtual_stages > 1:
        chunks = range(stage, len(plan.chunks), plan.pipeline_parallel)
        header += f" in chunks {', '.join(map(str, chunks))}"
    depths = plan.model.mtp_num_layers if plan.model is not None else 0
    if depths and stage == plan.mtp_stage:
        header += f" + {depths} MTP module{'s' if depths != 1 else ''}"
    prediction = plan.prediction
    if prediction is not None:
        memory = prediction.stage_memory_gib[stage]
        # fits compares the peak stage's device memory (cost.peak_memory) with the budget.
        over = not prediction.fits and memory == prediction.peak_memory_gib
        header += (f"; busy {prediction.stage_time_s[stage]:.3f} s/iter; "
                   f"memory {memory:.2f} GiB allocated{'  OVER BUDGET' if over else ''}")
    return header


def stage_lines(plan: Plan) -> list[str]:
    """Per stage: its predicted time and memory, then its layer runs with their strategies."""
    starts = _chunk_starts(plan)
    lines = []
    for stage in range(plan.pipeline_parallel):
        lines.append(_stage_header(plan, stage))
        for strategy, ranges in _stage_runs(plan, stage, starts):
            plural = "s" if len(ranges) > 1 or "-" in ranges[0] else ""
            lines.append(f"    layer{plural} {', '.join(ranges)}: {strategy.short()}")
    return lines


def micro_batch_line(plan: Plan) -> str:
    """What each rank of the layers runs per micro-batch: the layers' data-parallel degree
    decides it (a hybrid plan's embedding may have another; it is named when it differs)."""
    per_layer = sorted({plan.local_micro_batch(s) for s in plan.distinct_strategies})
    layers = str(per_layer[0]) if len(per_layer) == 1 else f"{per_layer[0]}-{per_layer[-1]} (by layer)"
    line = (f"  micro-batch size    {layers} per data-parallel rank "
            f"({plan.global_batch_size // plan.num_micro_batches} samples per micro-batch)")
    embedding = plan.local_micro_batch(plan.embedding)
    if per_layer != [embedding]:
        line += f"; embedding / head {embedding} per rank"
    return line


def _header_lines(plan: Plan) -> list[str]:
    model = plan.model.name if plan.model is not None else "(not recorded)"
    lines = [
        f"plan ({plan.space} space) for model {model} on {plan.world_size} GPUs"
        + (f" of cluster {plan.cluster}" if plan.cluster else ""),
        f"  pipeline parallel   {plan.pipeline_parallel}  ({plan.gpus_per_stage} GPUs per stage)",
        f"  global batch size   {plan.global_batch_size}",
        micro_batch_line(plan),
        f"  micro-batches       {plan.num_micro_batches}",
        f"  virtual stages      {plan.virtual_stages}",
        f"  schedule            {plan.schedule}" + (" (interleaved)" if plan.virtual_stages > 1 else ""),
        f"  embedding / head    {plan.embedding.short()}",
    ]
    degrees = expert_degrees(plan)
    if degrees is not None:
        lines.append(f"  expert parallel     ep {degrees[0]}, expert tp {degrees[1]} (MoE layers)")
    return lines


def _number(value: float) -> str:
    """One decimal for ordinary values, three significant digits for tiny ones (CPU runs)."""
    return f"{value:.1f}" if abs(value) >= 1 or value == 0 else f"{value:.3g}"


def prediction_lines(prediction: Prediction, recomputes_selectively: bool = False) -> list[str]:
    """The cost model's summary: time, throughput, memory, what selective recompute re-runs (when some layer
    does), and the critical stage's breakdown."""
    selective = [f"  selective re-runs   {' '.join(prediction.recompute_modules)} (--recompute-modules)"]
    lines = [
        "prediction",
        f"  iteration time      {prediction.iteration_time_s:.3f} s",
        f"  TFLOP/s per GPU     {_number(prediction.tflops_per_gpu)}",
        *memory_lines(prediction),
        *(selective if recomputes_selectively else []),
        f"  fits                {'yes' if prediction.fits else 'NO'}",
        "  time breakdown (critical stage)",
    ]
    total = prediction.iteration_time_s or 1.0
    parts = [(field.name[:-2].replace("_", " "), getattr(prediction.breakdown, field.name))
             for field in fields(prediction.breakdown)]
    # Ranks that time-slice CPU cores (cost.timeslice) finish sooner than the sum of the
    # parts, which are priced at the profiled core share: the difference gets its own line.
    shared = prediction.iteration_time_s - prediction.breakdown.total_s
    sliced = shared < -1e-9 * total
    for label, seconds in parts + ([("core sharing", shared)] if sliced else []):
        lines.append(f"    {label:<14} {seconds:9.3f} s  {100.0 * seconds / total:5.1f}%")
    if sliced:
        lines.append("    (ranks outnumber the CPU cores: the parts are at the profiled share of a core, and a"
                     " waiting rank lends its core to the others; cost/timeslice.py)")
    return lines


def memory_lines(prediction: Prediction) -> list[str]:
    """The allocated peak, the allocator's reserve, the device total against the budget, and the
    kernels priced (cost.peak_memory)."""
    memory = prediction.memory_breakdown
    moment = f" (at the {memory.peak_moment})" if memory is not None else ""
    lines = [f"  peak memory         {prediction.peak_memory_gib:.2f} GiB allocated{moment}, "
             f"{prediction.peak_reserved_gib:.2f} GiB reserved",
             f"  device memory       {prediction.device_memory_gib:.2f} GiB of {prediction.memory_budget_gib:.2f} GiB "
             f"budget (after the safety margin)"]
    if prediction.attention_backend:
        lines.append(f"  kernels priced      {prediction.attention_backend} attention, "
                     f"{prediction.optimizer_impl} optimizer")
    return lines


def _flag_lines(plan: Plan) -> list[str]:
    if plan.space != "megatron":
        return ["megatron-lm flags", "  (none: per-layer layouts need the megatron-auto runtime)"]
    try:
        flags = megatron_flags(plan)
    except UserError as error:
        return ["megatron-lm flags", f"  (not expressible: {error})"]
    lines = [" ".join(group) for group in flag_groups(flags)]  # --recompute-modules takes several values
    return ["megatron-lm flags", "  " + " \\\n  ".join(lines)]


def plan_table(plan: Plan) -> str:
    """The whole plan as text: header, stages, prediction (if any), Megatron flags."""
    sections = [_header_lines(plan), ["stages"] + stage_lines(plan)]
    if plan.prediction is not None:
        sections.append(prediction_lines(plan.prediction, plan.recomputes_selectively))
    sections.append(_flag_lines(plan))
    return "\n\n".join("\n".join(section) for section in sections) + "\n"


def comparison_lines(plan: Plan, own: Optional[Plan], own_problem: Optional[str]) -> list[str]:
    """The launch line's own flags against the plan, both predicted on the same cluster and job: what
    --auto-parallel-dry-run prints under the plan."""
    lines = ["the launch line's own parallelism flags"]
    if own is None or own.prediction is None:
        return lines + [f"  not a layout here: {own_problem}"]
    ours, theirs = plan.prediction, own.prediction
    fits = "fits" if theirs.fits else "does not fit"
    lines.append(f"  iteration time      {theirs.iteration_time_s:.3f} s ({fits}, "
                 f"{theirs.peak_memory_gib:.2f} GiB allocated at the peak)")
    lines.append(f"  TFLOP/s per GPU     {_number(theirs.tflops_per_gpu)}")
    if ours is not None and theirs.fits and ours.fits:
        lines.append(f"  the plan is predicted {theirs.iteration_time_s / ours.iteration_time_s:.3f}x as fast")
    elif ours is not None and ours.fits:
        lines.append("  the plan fits where these flags do not")
    return lines


def node_group_lines(plan: Plan, cluster) -> list[str]:
    """On a mixed cluster (specs.cluster.ClusterSpec.node_groups): which node group runs which stages, with the
    node ranks to launch each on (Megatron-Core puts stage s on ranks s x world/pp onward; a stage whose ranks
    straddle two groups is named under both); [] otherwise."""
    if not cluster.is_mixed:
        return []
    spans = cluster.stage_spans(plan.pipeline_parallel)
    lines = ["node groups (launch each group's nodes at these node ranks)"]
    counts = plan.stage_layer_counts()
    for index, (group, (first, last)) in enumerate(zip(cluster.node_groups, cluster.group_node_ranks())):
        stages = [stage for stage, span in enumerate(spans) if index in span]
        nodes = _layer_range(first, last)
        layers = sum(counts[s] for s in stages)
        held = (f"stage{'s' if len(stages) > 1 else ''} {_layer_range(stages[0], stages[-1])}, {layers} "
                f"layer{'s' if layers != 1 else ''}") if stages else "no stage"
        size = f"{cluster.group_gpus_per_node(index)} x " if cluster.nodes_differ else ""
        lines.append(f"  {group.name}: node rank{'s' if group.num_nodes > 1 else ''} {nodes}, {size}{group.gpu.name}"
                     f"{f' at {group.speed_factor:.2f} of its speed' if group.speed_factor < 1 else ''}: {held}")
    return lines
