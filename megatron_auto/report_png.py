"""A picture of a Plan: stages and their layers, stage memory against the budget, and the time breakdown; on a
mixed cluster, the node group each stage runs on.

matplotlib is imported inside `draw_plan_png` (Agg backend), so the planner
itself stays numpy-only; only `megatron-auto show --png` needs matplotlib.
"""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Optional

from .errors import UserError
from .plan import LayerStrategy, Plan, Prediction
from .specs.cluster import ClusterSpec

__all__ = ["draw_plan_png", "plan_figure"]

HATCHES = {"none": "", "selective": "..", "full": "xx"}
BREAKDOWN_COLORS = {
    "compute": "#4c78a8", "recompute": "#9ecae9", "tp comm": "#f58518", "dp comm": "#e45756",
    "pp comm": "#72b7b2", "bubble": "#bab0ac", "transition": "#b279a2", "optimizer": "#54a24b",
}
OTHER_COLORS = ("#eeca3b", "#ff9da6", "#9d755d", "#79706e")
"""For breakdown terms added after this palette was chosen."""
STRADDLE_HATCH = "////"
"""The group strip of a stage whose ranks straddle node groups."""


def _layout_label(strategy: LayerStrategy) -> str:
    """The strategy without its recomputation (which the hatching shows)."""
    parts = [f"tp{strategy.tp}", f"dp{strategy.dp}"]
    if strategy.zero:
        parts.append(f"zero-{strategy.zero}")
    if strategy.sp:
        parts.append("sp")
    return " ".join(parts)


def _stage_layers(plan: Plan, stage: int) -> list[tuple[int, LayerStrategy, int]]:
    """(global layer index, strategy, chunk index) of every layer on a stage, in run order."""
    out, start = [], 0
    for index, chunk in enumerate(plan.chunks):
        if index % plan.pipeline_parallel == stage:
            out.extend((start + i, s, index) for i, s in enumerate(chunk.layers))
        start += len(chunk.layers)
    return out


def _layout_colors(plan: Plan, colormap) -> dict[tuple, object]:
    layouts = sorted({s.layout() for s in plan.layer_strategies}, key=lambda k: (k[0], k[2], k[3]))
    return {layout: colormap(i % colormap.N) for i, layout in enumerate(layouts)}


def _draw_layers(ax, plan: Plan, colors: dict) -> None:
    """One column per stage; one box per layer, top to bottom, coloured by layout, hatched by recompute."""
    longest = max(plan.stage_layer_counts())
    for stage in range(plan.pipeline_parallel):
        previous = None
        for row, (layer, strategy, chunk) in enumerate(_stage_layers(plan, stage)):
            ax.bar(stage, 0.9, bottom=row, width=0.8, align="center",
                   color=colors[strategy.layout()], hatch=HATCHES[strategy.recompute],
                   edgecolor="white", linewidth=0.4)
            if previous is not None and chunk != previous[1]:
                ax.plot([stage - 0.45, stage + 0.45], [row - 0.05] * 2, color="black", linewidth=1.2)
            if previous is None or chunk != previous[1] or strategy != previous[0]:
                _label_run(ax, plan, stage, row, layer)
            previous = (strategy, chunk)
    ax.set_xlim(-0.6, plan.pipeline_parallel - 0.4)
    ax.set_ylim(longest + 0.2, -0.3)
    ax.set_xticks(range(plan.pipeline_parallel))
    ax.set_xticklabels([str(s) for s in range(plan.pipeline_parallel)], fontsize=7)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("layers on the stage, in run order\n(tags: first model layer of a chunk or run)")
    title = "layers by stage" + ("; black lines separate virtual-stage chunks" if plan.virtual_stages > 1 else "")
    ax.set_title(title, fontsize=10)


def _label_run(ax, plan: Plan, stage: int, row: int, layer: int) -> None:
    """The model-layer number where a chunk or a run of one strategy starts, on a white tag."""
    if plan.pipeline_parallel > 32:
        return
    size = 7 if plan.pipeline_parallel <= 12 else 5
    ax.text(stage - 0.38, row + 0.45, f"L{layer}", ha="left", va="center", fontsize=size, color="black",
            bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.9))


def _legend_handles(colors: dict, plan: Plan):
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=c, label=_layout_label(LayerStrategy(tp=k[0], dp=k[1], zero=k[2], sp=k[3])))
               for k, c in colors.items()]
    for kind in sorted({s.recompute for s in plan.layer_strategies}, key=list(HATCHES).index):
        handles.append(Patch(facecolor="white", edgecolor="gray", hatch=HATCHES[kind] * 2,
                             label=f"recompute: {kind}"))
    return handles


def _draw_groups(ax, plan: Plan, cluster: ClusterSpec, colors: list) -> None:
    """A strip atop each stage's column in its node group's colour, tagged g<index>; a stage whose ranks straddle
    groups gets a hatched strip split by its share of ranks in each, tagged g<i>+g<j>."""
    pp = plan.pipeline_parallel
    height = max(0.8, 0.05 * max(plan.stage_layer_counts()))  # a visible strip on a tall column too
    for stage, shares in enumerate(cluster.stage_rank_shares(pp)):
        left = stage - 0.4
        for index, share in shares:
            ax.bar(left, height, bottom=-0.2 - height, width=0.8 * share, align="edge", color=colors[index],
                   hatch=STRADDLE_HATCH if len(shares) > 1 else "", edgecolor="white", linewidth=0.4)
            left += 0.8 * share
        if pp <= 32:
            ax.text(stage, -0.2 - height / 2, "+".join(f"g{index}" for index, _ in shares), ha="center",
                    va="center", fontsize=7 if pp <= 12 else 5, color="black",
                    bbox=dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.9))
    ax.set_ylim(ax.get_ylim()[0], -0.3 - height)
    ax.set_yticks([tick for tick in ax.get_yticks() if 0 <= tick <= ax.get_ylim()[0]])
    ax.set_title(ax.get_title() + "; strip atop: the stage's node group", fontsize=10)


def _stage_list(stages: list[int]) -> str:
    """'stages 0-2, 5' for [0, 1, 2, 5]."""
    if not stages:
        return "no stage"
    runs = [[stages[0], stages[0]]]
    for stage in stages[1:]:
        if stage == runs[-1][1] + 1:
            runs[-1][1] = stage
        else:
            runs.append([stage, stage])
    text = ", ".join(str(first) if first == last else f"{first}-{last}" for first, last in runs)
    return f"stage{'s' if len(stages) > 1 else ''} {text}"


def _group_handles(plan: Plan, cluster: ClusterSpec, colors: list):
    """One legend entry per node group (its GPU, node ranks and stages), and one for straddling stages."""
    from matplotlib.patches import Patch

    spans = cluster.stage_spans(plan.pipeline_parallel)
    handles = []
    for index, (group, (first, last)) in enumerate(zip(cluster.node_groups, cluster.group_node_ranks())):
        nodes = f"node rank {first}" if first == last else f"node ranks {first}-{last}"
        speed = f" at {group.speed_factor:.2f} of its speed" if group.speed_factor < 1 else ""
        stages = _stage_list([stage for stage, span in enumerate(spans) if index in span])
        handles.append(Patch(facecolor=colors[index], label=f"g{index} {group.name}: {group.gpu.name}{speed}\n"
                                                           f"{nodes}; {stages}"))
    straddling = [stage for stage, span in enumerate(spans) if len(span) > 1]
    if straddling:
        handles.append(Patch(facecolor="white", edgecolor="gray", hatch=STRADDLE_HATCH,
                             label=f"{_stage_list(straddling)}: ranks straddle groups,\nrun at the slowest one's pace"))
    return handles


def _draw_memory(ax, plan: Plan, prediction: Optional[Prediction]) -> None:
    """Each stage's peak memory per GPU against the budget."""
    ax.set_title("peak memory per GPU by stage", fontsize=10)
    if prediction is None:
        ax.text(0.5, 0.5, "no prediction in the plan file\n(score it: megatron-auto estimate --plan)",
                ha="center", va="center", transform=ax.transAxes, fontsize=9)
        ax.set_axis_off()
        return
    memory = prediction.stage_memory_gib
    # Bars are allocated memory; fits compares the peak stage's device memory (cost.peak_memory).
    over = [m > prediction.memory_budget_gib or (not prediction.fits and m == prediction.peak_memory_gib)
            for m in memory]
    bars = ax.bar(range(len(memory)), memory, color=["#d62728" if o else "#4c78a8" for o in over], width=0.8)
    if len(memory) <= 32:
        ax.bar_label(bars, labels=[f"{m:.1f}" for m in memory], fontsize=7, label_type="center", color="white")
    ax.axhline(prediction.memory_budget_gib, color="black", linestyle="--", linewidth=1)
    ax.text(len(memory) - 0.5, prediction.memory_budget_gib, f" budget {prediction.memory_budget_gib:.1f} GiB",
            ha="right", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.15 * max(max(memory), prediction.memory_budget_gib))
    ax.set_xlim(-0.6, len(memory) - 0.4)
    ax.set_xticks(range(len(memory)))
    ax.set_xticklabels([str(s) for s in range(len(memory))], fontsize=7)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB")


def _draw_breakdown(ax, prediction: Optional[Prediction]) -> None:
    """The critical stage's iteration time as one stacked bar, each part labelled with seconds and share."""
    if prediction is None:
        ax.set_axis_off()
        return
    parts = [(f.name[:-2].replace("_", " "), getattr(prediction.breakdown, f.name)) for f in fields(prediction.breakdown)]
    total = prediction.breakdown.total_s or 1.0
    left = 0.0
    for index, (name, seconds) in enumerate(parts):
        share = seconds / total
        ax.barh(0, seconds, left=left, color=BREAKDOWN_COLORS.get(name, OTHER_COLORS[index % len(OTHER_COLORS)]), edgecolor="white",
                label=f"{name}: {seconds:.3g} s ({100 * share:.1f}%)")
        if share > 0.06:
            ax.text(left + seconds / 2, 0, f"{name}\n{100 * share:.0f}%", ha="center", va="center",
                    fontsize=8, color="white")
        left += seconds
    ax.set_xlim(0, total)
    ax.set_yticks([])
    shared = total - prediction.iteration_time_s
    ax.set_xlabel("seconds per iteration (critical stage)" if shared <= 1e-9 * total else
                  f"seconds per iteration (critical stage) at the profiled share of a CPU core; ranks that"
                  f" time-slice the cores save {shared:.3g} s of it (cost/timeslice.py)")
    ax.set_title(f"predicted iteration {prediction.iteration_time_s:.3f} s, "
                 f"{prediction.tflops_per_gpu:.3g} TFLOP/s per GPU: where the time goes", fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.75), ncol=4, fontsize=8, frameon=False)


def _title(plan: Plan) -> str:
    model = plan.model.name if plan.model is not None else "model"
    micro = plan.local_micro_batch(plan.embedding)
    return (f"{model} on {plan.world_size} GPUs{' (' + plan.cluster + ')' if plan.cluster else ''}: "
            f"{plan.space} space, p={plan.pipeline_parallel}, v={plan.virtual_stages}, "
            f"m={plan.num_micro_batches} micro-batches of {micro}/rank; embedding {plan.embedding.short()}")


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("--png needs matplotlib (pip install matplotlib)") from None
    return plt


def draw_plan_png(plan: Plan, path: str | Path, cluster: Optional[ClusterSpec] = None) -> None:
    """Write a PNG picture of `plan` to `path`, with the node groups of `cluster` when it is a mixed one; UserError
    when matplotlib is missing or the file cannot be written."""
    plt = _pyplot()
    figure = plan_figure(plan, cluster)
    try:
        figure.savefig(path, format="png", bbox_inches="tight")
    except OSError as error:
        raise UserError(f"cannot write picture '{path}': {error.strerror or error}") from None
    finally:
        plt.close(figure)


def plan_figure(plan: Plan, cluster: Optional[ClusterSpec] = None):
    """The matplotlib figure that draw_plan_png saves (the caller closes it); a uniform cluster or None draws no
    node groups."""
    plt = _pyplot()
    width = min(28.0, max(12.0, 6.0 + 0.32 * plan.pipeline_parallel))
    figure = plt.figure(figsize=(width, 10), dpi=110)
    grid = figure.add_gridspec(3, 2, height_ratios=[3.2, 1.6, 0.7], width_ratios=[4, 1], hspace=0.55, wspace=0.05)
    colors = _layout_colors(plan, plt.get_cmap("tab10"))
    layers_ax = figure.add_subplot(grid[0, 0])
    _draw_layers(layers_ax, plan, colors)
    legend_ax = figure.add_subplot(grid[0, 1])
    legend_ax.set_axis_off()
    layouts = legend_ax.legend(handles=_legend_handles(colors, plan), loc="upper left", fontsize=9,
                               title="layer layout", frameon=False)
    if cluster is not None and cluster.is_mixed:
        group_colors = [plt.get_cmap("Dark2")(i % 8) for i in range(len(cluster.node_groups))]
        _draw_groups(layers_ax, plan, cluster, group_colors)
        legend_ax.add_artist(layouts)
        legend_ax.legend(handles=_group_handles(plan, cluster, group_colors), loc="lower left", fontsize=9,
                         title="node groups (strip atop each stage)", frameon=False)
    _draw_memory(figure.add_subplot(grid[1, 0]), plan, plan.prediction)
    _draw_breakdown(figure.add_subplot(grid[2, :]), plan.prediction)
    figure.suptitle(_title(plan), fontsize=11)
    return figure
