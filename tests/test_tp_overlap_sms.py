"""The SMs that TE's userbuffer overlap reserves from the GEMMs beside it (cost/tp_overlap.py, sm_margin_seconds),
against the GEMMs named by hand."""
from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_auto.cost.kernel_rates import gemm_compute_time
from megatron_auto.cost.flops import Gemm
from megatron_auto.cost.layer_cost import layer_cost
from megatron_auto.cost.tp_overlap import USERBUFFER_SMS, sm_margin_seconds
from megatron_auto.plan import LayerStrategy
from megatron_auto.specs.model import LayerSpec
from test_moe_cost import BF16, TOY

# A GPT layer: h=1024, 16 heads, f=4096 GeLU, TP 4 with SP; 2 samples of 512 tokens.
LAYER = LayerSpec(1024, 16, 16, 4096)
TP4 = LayerStrategy(tp=4, dp=4, sp=True)
SMS = replace(TOY, gpu=replace(TOY.gpu, sm_count=132))
OVERLAP = replace(BF16, tp_comm_overlap=True)


def approx(value):
    return pytest.approx(value, rel=1e-12, abs=0.0)


def test_the_reduce_scatter_and_bulk_overlaps_stretch_six_gemms():
    tokens, h, stretch = 1024, 1024, 132 / (132 - USERBUFFER_SMS) - 1
    qkv, proj = Gemm(tokens, h, 3 * h // 4), Gemm(tokens, h // 4, h)
    fc1, fc2 = Gemm(tokens, h, 4096 // 4), Gemm(tokens, 4096 // 4, h)
    time = lambda g: gemm_compute_time(g, SMS)  # noqa: E731
    forward, backward = sm_margin_seconds(LAYER, 512, 2, 4, SMS, OVERLAP)
    assert forward == approx(stretch * (time(proj) + time(fc2)))   # pipeline reduce-scatters, forward
    assert backward == approx(2 * stretch * (time(qkv) + time(fc1)))  # bulk overlaps: dgrad and wgrad


def test_the_margin_enters_the_layer_only_under_the_overlap_and_a_known_sm_count():
    forward, backward = sm_margin_seconds(LAYER, 512, 2, 4, SMS, OVERLAP)
    with_sms, without = (layer_cost(LAYER, TP4, 2, 512, cluster, OVERLAP) for cluster in (SMS, TOY))
    assert with_sms.forward_s - without.forward_s == approx(forward)
    assert with_sms.backward_s - without.backward_s == approx(backward)
    assert sm_margin_seconds(LAYER, 512, 2, 4, TOY, OVERLAP) == (0.0, 0.0)
    assert layer_cost(LAYER, TP4, 2, 512, SMS, BF16) == layer_cost(LAYER, TP4, 2, 512, TOY, BF16)
    assert layer_cost(LAYER, replace(TP4, sp=False), 2, 512, SMS, OVERLAP) == \
        layer_cost(LAYER, replace(TP4, sp=False), 2, 512, TOY, OVERLAP)
