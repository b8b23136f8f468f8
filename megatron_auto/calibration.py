"""The published runs we calibrate against, and the error of our estimate on each.

Rows: shared/reference/megatron_sc21_table1_subset.json (Narayanan et al. SC21,
Table 1). Each row is estimated with its (t, p, d, batch) and full recomputation;
the micro-batch size and virtual stages, which the table omits, are chosen by
the same rule `megatron-auto estimate` uses: the fastest that fits.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from .search.uniform import UniformConfig, best_uniform_plan
from .specs.cluster import ClusterSpec, ComputeEfficiency
from .specs.model import uniform_model
from .specs.presets import CLUSTER_PRESETS
from .specs.training import TrainingSpec

SEQ, VOCAB = 2048, 51200


@dataclass(frozen=True)
class PublishedRow:
    params_b: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    dp: int
    gpus: int
    batch: int
    tflops_per_gpu: float

    @property
    def published_time_s(self) -> float:
        """F / (n * X) with F = 96Bslh^2(1 + s/6h + V/16lh), SC21 eq. (3)."""
        s, l, h = SEQ, self.layers, self.hidden
        flops = 96 * self.batch * s * l * h * h * (1 + s / (6 * h) + VOCAB / (16 * l * h))
        return flops / (self.gpus * self.tflops_per_gpu * 1e12)


def load_rows(path: str | Path) -> list[PublishedRow]:
    rows = json.loads(Path(path).read_text())["rows"]
    fields = PublishedRow.__dataclass_fields__
    return [PublishedRow(**{k: v for k, v in row.items() if k in fields}) for row in rows]


def predict_row(row: PublishedRow, cluster: ClusterSpec):
    """Our best `megatron`-space plan for the row's (t, p, d, batch) with full recompute."""
    model = uniform_model(f"gpt3-{row.params_b}b", row.layers, row.hidden, row.heads, SEQ, VOCAB)
    cluster = cluster.with_nodes(row.gpus // cluster.gpus_per_node)
    training = TrainingSpec(global_batch_size=row.batch, precision="fp16")
    config = UniformConfig(tp=row.tp, pp=row.pp, micro_batch_size=1, recompute="full")
    return best_uniform_plan(model, cluster, training, config, choose_micro_batch=True, choose_virtual_stages=True)


def row_errors(rows: list[PublishedRow], compute: ComputeEfficiency, base: str = "dgx-a100-80gb") -> list[float]:
    """Relative error (predicted / published - 1) of each row under one efficiency model."""
    cluster = replace(CLUSTER_PRESETS[base], compute=compute)
    return [predict_row(row, cluster).prediction.iteration_time_s / row.published_time_s - 1 for row in rows]
