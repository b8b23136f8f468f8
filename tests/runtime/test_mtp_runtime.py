"""Multi-token prediction in the stock runtime, without a launch: where it is refused (one clear UserError,
before any process group) and the FLOPs its throughput line counts."""
from __future__ import annotations

import dataclasses

import pytest

from megatron_auto.errors import UserError
from megatron_auto.parallel_dims import ParallelDims
from megatron_auto.plan import Chunk, LayerStrategy, Plan
from worker_models import llama_model, mtp_model


def test_the_hybrid_runtime_refuses_an_mtp_model():
    from megatron_auto.runtime.hybrid.hybrid_runtime import check_supported

    model = mtp_model("mtp")
    plan = Plan(space="hybrid", world_size=2, pipeline_parallel=1, global_batch_size=4, num_micro_batches=1,
                chunks=(Chunk(tuple(LayerStrategy(dp=2) for _ in model.layers)),), embedding=LayerStrategy(dp=2))
    check_supported(plan, llama_model("no-mtp"))  # the same plan without MTP runs
    with pytest.raises(UserError, match="the hybrid runtime does not build multi-token prediction modules yet"):
        check_supported(plan, model)


@pytest.mark.parametrize("layout, words", [
    (dict(dims=ParallelDims(cp=2, dp=1)), "multi-token prediction with context parallelism is not run"),
    (dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2),
     "needs --recompute-num-layers 1, not 2"),
])
def test_the_config_refuses_what_megatron_asserts_or_this_runtime_does_not_run(layout, words):
    """The same checks as the flag parser's, for plans that come from a file or the planner."""
    from megatron_auto.runtime import config as configs
    from megatron_auto.runtime.layout import MegatronLayout
    from megatron_auto.runtime.settings import TrainSettings

    base = MegatronLayout(ParallelDims(), micro_batch_size=1, num_micro_batches=1,
                          global_batch_size=1)
    settings = TrainSettings(train_iters=1, attention_backend="flash")
    with pytest.raises(UserError, match=words):
        configs.transformer_config(mtp_model("mtp"), dataclasses.replace(base, **layout), settings, "gloo")
    assert configs.transformer_config(mtp_model("mtp"), base, settings, "gloo").mtp_num_layers == 1


def test_throughput_counts_mtp_flops_as_megatron_lm_does():
    """Megatron-LM's num_floating_point_operations: each MTP depth adds one layer like the last, its norms (3h) and
    eh_proj (2h x h), and one more pass through the output layer; x 3 (forward and backward) x 2 (FMA)."""
    from megatron_auto.runtime.metrics import model_flops_per_iteration

    with_mtp = mtp_model("mtp")
    without = dataclasses.replace(with_mtp, mtp_num_layers=0)
    layer_flops = (model_flops_per_iteration(dataclasses.replace(without, layers=without.layers[:2]), 8, 256)
                   - model_flops_per_iteration(dataclasses.replace(without, layers=without.layers[:1]), 8, 256))
    h, tokens = with_mtp.hidden_size, 8 * with_mtp.seq_length
    expected = layer_flops + 3 * 2 * tokens * (3 * h + 2 * h * h + h * 256)
    extra = model_flops_per_iteration(with_mtp, 8, 256) - model_flops_per_iteration(without, 8, 256)
    assert extra == pytest.approx(expected, rel=1e-12)
