"""What TE's userbuffer overlap does to the GEMMs beside it (cost/tp_overlap.py, overlap_gemm_seconds): the SMs it
reserves and the pieces it runs the GEMMs in, against the GEMMs named by hand."""
from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_auto.cost.flops import Gemm
from megatron_auto.cost.kernel_rates import gemm_compute_time
from megatron_auto.cost.layer_cost import layer_cost
from megatron_auto.cost.tp_overlap import PIPELINE_SPLITS, USERBUFFER_SMS, linear_gemm_seconds, overlap_gemm_seconds
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.model import LayerSpec
from test_moe_cost import BF16, TOY

# A GPT layer: h=1024, 16 heads, f=4096 GeLU, TP 4 with SP; 2 samples of 512 tokens.
LAYER = LayerSpec(1024, 16, 16, 4096)
TP4 = LayerStrategy(tp=4, dp=4, sp=True)
SMS = replace(TOY, gpu=replace(TOY.gpu, sm_count=132))
OVERLAP = replace(BF16, tp_comm_overlap=True)
TOKENS, H = 1024, 1024
QKV, PROJ = Gemm(TOKENS, H, 3 * H // 4), Gemm(TOKENS, H // 4, H)
FC1, FC2 = Gemm(TOKENS, H, 4096 // 4), Gemm(TOKENS, 4096 // 4, H)


def approx(value):
    return pytest.approx(value, rel=1e-12, abs=0.0)


def seconds(gemm, cluster, pieces=1):
    """`gemm` run as `pieces` GEMMs of 1/pieces of its rows."""
    return pieces * gemm_compute_time(replace(gemm, m=gemm.m // pieces), cluster)


def test_ring_exchanges_run_in_tp_pieces_and_pipelines_in_four_on_fewer_sms():
    stretch = 132 / (132 - USERBUFFER_SMS)
    time = lambda g, pieces=1: seconds(g, SMS, pieces)  # noqa: E731
    forward, backward = overlap_gemm_seconds(LAYER, 512, 2, 4, SMS, OVERLAP)
    expected_forward = (stretch * (time(PROJ, PIPELINE_SPLITS) + time(FC2, PIPELINE_SPLITS)) - time(PROJ) - time(FC2)
                        + time(QKV, 4) - time(QKV) + time(FC1, 4) - time(FC1))
    expected_backward = (2 * (stretch - 1) * (time(QKV) + time(FC1))  # bulk overlaps: dgrad and wgrad, whole
                         + time(PROJ, 4) - time(PROJ) + time(FC2, 4) - time(FC2))  # ring exchanges: dgrad
    assert forward == approx(expected_forward)
    assert backward == approx(expected_backward)
    assert forward > 0 and backward > 0


def test_without_a_known_sm_count_only_the_pieces_cost():
    time = lambda g, pieces=1: seconds(g, TOY, pieces)  # noqa: E731
    forward, backward = overlap_gemm_seconds(LAYER, 512, 2, 4, TOY, OVERLAP)
    assert forward == approx(sum(time(g, PIPELINE_SPLITS) - time(g) for g in (PROJ, FC2))
                             + sum(time(g, 4) - time(g) for g in (QKV, FC1)))
    assert backward == approx(sum(time(g, 4) - time(g) for g in (PROJ, FC2)))


def test_more_tp_pieces_cost_more():
    """TP 8 multiplies each gathered shard in eighths of the rows: each piece runs further below the GEMM law's
    plateau than TP 2's halves do, so the overlap costs more of the GEMMs' time."""
    def share(tp: int) -> float:
        forward, backward = overlap_gemm_seconds(LAYER, 512, 2, tp, TOY, OVERLAP)
        return (forward + backward) / linear_gemm_seconds(LAYER, 512, 2, tp, TOY, OVERLAP)
    assert share(8) > share(2) > 0


def test_the_overlap_enters_the_layer_only_with_tp_and_sequence_parallelism():
    forward, backward = overlap_gemm_seconds(LAYER, 512, 2, 4, SMS, OVERLAP)
    with_overlap, without = (layer_cost(LAYER, TP4, 2, 512, SMS, training) for training in (OVERLAP, BF16))
    assert with_overlap.forward_s - without.forward_s == approx(forward)
    assert with_overlap.backward_s - without.backward_s == approx(backward)
    assert layer_cost(LAYER, replace(TP4, sp=False), 2, 512, SMS, OVERLAP).forward_s == \
        layer_cost(LAYER, replace(TP4, sp=False), 2, 512, SMS, BF16).forward_s
