"""tools/pretrain_gpt.py's Megatron-LM flag handling, without a launch."""
from __future__ import annotations

import logging
import math
import re

import pytest

from validation.launcher import REPO
from megatron_auto import train
from megatron_auto.errors import UserError
from megatron_auto.runtime.manual_plan import plan_from_flags
from megatron_auto.specs.presets import MODEL_PRESETS

BASE = ["--num-layers", "32", "--hidden-size", "4096", "--num-attention-heads", "32", "--seq-length", "8192",
        "--train-iters", "10", "--mock-data"]
LLAMA3 = ["--group-query-attention", "--num-query-groups", "8", "--ffn-hidden-size", "14336", "--swiglu",
          "--normalization", "RMSNorm", "--disable-bias-linear", "--position-embedding-type", "rope",
          "--rotary-base", "500000", "--untie-embeddings-and-output-weights",
          "--attention-dropout", "0.0", "--hidden-dropout", "0.0"]  # as Megatron-LM's examples/llama scripts


def test_llama3_launch_flags_describe_the_llama3_preset():
    args = train.parse_args(BASE + LLAMA3)
    model = train.model_from_args(args, 128256)
    preset = MODEL_PRESETS["llama3-8b"]
    assert model.layers == preset.layers
    assert (model.position_embedding_type, model.rotary_base) == ("rope", 500000)
    assert model.num_parameters == preset.num_parameters


@pytest.mark.parametrize("flags, expected", [
    ([], "learned_absolute"),
    (["--position-embedding-type", "rope"], "rope"),
    (["--use-rotary-position-embeddings", "--no-position-embedding"], "rope"),
    (["--no-position-embedding"], "none"),
])
def test_position_embedding_type_follows_megatron_lm(flags, expected):
    assert train.position_embedding_type(train.parse_args(BASE + flags)) == expected


def test_kernel_and_logging_flags_are_accepted_and_named():
    args = train.parse_args(BASE + ["--use-flash-attn", "--transformer-impl", "local",
                                           "--tensorboard-dir", "/tmp/tb", "--overlap-grad-reduce"])
    assert train.no_effect_flags(args) == ["--use-flash-attn", "--overlap-grad-reduce",
                                                  "--transformer-impl", "--tensorboard-dir"]
    assert train.no_effect_flags(train.parse_args(BASE)) == []


@pytest.mark.parametrize("flags, on_gpu, priced", [
    ([], True, ("flash", "fused")),
    ([], False, ("unfused", "foreach")),
    (["--attention-backend", "fused", "--optimizer-impl", "foreach"], True, ("flash", "foreach")),
    (["--attention-backend", "local", "--optimizer-impl", "fused"], False, ("unfused", "fused")),
])
def test_kernel_flags_reach_the_settings_and_the_searched_training_spec(monkeypatch, flags, on_gpu, priced):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: on_gpu)
    args = train.parse_args(BASE + flags)
    settings = train.settings_from_args(args, 512)
    requested = (flags[1], flags[3]) if flags else ("auto", "auto")
    assert (settings.attention_backend, settings.optimizer_impl) == requested
    training = train.training_for_job(args, settings, world_size=4)
    assert (training.attention_backend, training.optimizer_impl) == priced


@pytest.mark.parametrize("flags, fusions", [
    ([], (True, True)),
    (["--no-bias-gelu-fusion"], (False, True)),
    (["--no-bias-swiglu-fusion"], (True, True)),  # GeLU model: the SwiGLU flag does not apply
    (["--swiglu", "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion"], (False, False)),
])
def test_megatron_fusion_switches_take_effect(flags, fusions):
    args = train.parse_args(BASE + flags)
    settings = train.settings_from_args(args, 512)
    assert (settings.bias_activation_fusion, settings.bias_dropout_fusion) == fusions
    assert train.no_effect_flags(args) == []


@pytest.mark.parametrize("flags, runs", [([], (False, False)), (["--bias-fusions", "on"], (True, True)),
                                         (["--bias-fusions", "on", "--no-bias-dropout-fusion"], (True, False)),
                                         (["--bias-fusions", "off"], (False, False))])
def test_bias_fusions_run_on_gpus_only_when_asked(flags, runs):
    from megatron_auto.runtime import kernels
    from megatron_auto.specs.model import uniform_model

    settings = train.settings_from_args(train.parse_args(BASE + flags), 512)
    chosen = kernels.choose_kernels(uniform_model("m", 2, 64, 4, 32, 512).layers[0], on_gpu=True,
                                    fusions=(settings.bias_activation_fusion, settings.bias_dropout_fusion),
                                    bias_fusions=settings.bias_fusions)
    assert (chosen.bias_activation_fusion, chosen.bias_dropout_fusion) == runs


def test_unknown_attention_backend_exits_2():
    with pytest.raises(SystemExit) as exit_info:
        train.parse_args(BASE + ["--attention-backend", "triton"])
    assert exit_info.value.code == 2


def _steps(flags, global_batch=8):
    from megatron_auto.runtime.schedule import resolve_samples, schedule_steps

    args = train.parse_args([f for f in BASE if f not in ("--train-iters", "10")] + flags)
    settings = resolve_samples(train.settings_from_args(args, 512), global_batch)
    return settings.train_iters, schedule_steps(settings, global_batch)


@pytest.mark.parametrize("flags, iters, warmup, decay, increment", [
    # Megatron-LM's get_optimizer_param_scheduler, by hand: iteration-based lengths are x global batch (8).
    (["--train-iters", "10", "--lr-warmup-fraction", "0.2", "--lr-decay-iters", "50"], 10, 0.2 * 400, 400, 80),
    (["--train-iters", "10", "--lr-warmup-iters", "2"], 10, 16, 80, 80),
    # Sample-based: train_iters = samples // global batch; lengths are samples.
    (["--train-samples", "100", "--lr-decay-samples", "60", "--lr-warmup-samples", "12"], 12, 12, 60, 100),
    (["--train-samples", "100"], 12, 0, 100, 100),
    (["--train-samples", "100", "--lr-warmup-fraction", "0.1"], 12, 10.0, 100, 100),
])
def test_schedule_lengths_follow_megatron_lm(flags, iters, warmup, decay, increment):
    train_iters, steps = _steps(flags)
    assert train_iters == iters
    assert (steps.warmup, steps.decay, steps.weight_decay_increment) == (warmup, decay, increment)


@pytest.mark.parametrize("style, shape", [("linear", lambda r: 1 - r), ("cosine", lambda r: (math.cos(math.pi * r) + 1) / 2),
                                          ("exponential", lambda r: 2 * 0.5 ** r - 1),
                                          ("minus_sqrt", lambda r: 1 - math.sqrt(r))])
def test_wsd_holds_the_rate_then_decays_over_its_window_while_the_weight_decay_moves(style, shape):
    """Warm-up-stable-decay as Megatron-LM defines it: `lr` until the last --lr-wsd-decay-iters of the
    decay, then min_lr + shape(ratio) x (lr - min_lr); and a linear weight decay from start to end."""
    from types import SimpleNamespace

    from megatron_auto.runtime.session import _scheduler

    args = train.parse_args(BASE + ["--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "WSD",
                                           "--lr-wsd-decay-iters", "4", "--lr-wsd-decay-style", style,
                                           "--weight-decay-incr-style", "linear", "--start-weight-decay", "0",
                                           "--end-weight-decay", "0.1"])
    optimizer = SimpleNamespace(param_groups=[{"params": [], "lr": 0.0, "weight_decay": 0.0}])
    scheduler, batch = _scheduler(optimizer, train.settings_from_args(args, 512), 8), 8
    for iteration in range(1, 11):  # 10 iterations: stable for 6, the WSD window over the last 4
        scheduler.step(batch)
        ratio = max(0, iteration - 6) / 4
        assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-4 + shape(ratio) * 9e-4, rel=1e-12)
        assert optimizer.param_groups[0]["weight_decay"] == pytest.approx(0.1 * iteration / 10, rel=1e-12)


@pytest.mark.parametrize("flags, message", [
    ([], "give exactly one of --train-iters and --train-samples"),
    (["--train-iters", "5", "--train-samples", "40"], "give exactly one of --train-iters and --train-samples"),
    (["--train-iters", "5", "--lr-decay-samples", "40"], "--lr-decay-samples cannot go with --train-iters"),
    (["--train-samples", "40", "--lr-warmup-iters", "2"], "--lr-warmup-iters cannot go with --train-samples"),
    (["--train-samples", "40", "--lr-warmup-samples", "8", "--lr-warmup-fraction", "0.1"],
     "give --lr-warmup-fraction or --lr-warmup-iters/--lr-warmup-samples, not both"),
    (["--train-iters", "5", "--fp8-format", "hybrid", "--fp8-amax-history-len", "1024"], "--fp8-format: fp8 training"),
    (["--train-iters", "5", "--moe-not-a-flag", "20"], "--moe-not-a-flag: not a Megatron-LM 0.16.1 flag"),
    (["--train-iters", "5", "--num-experts", "4", "--moe-router-enable-expert-bias"],
     "--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid"),
    (["--train-iters", "5", "--num-experts", "8", "--moe-router-group-topk", "2"],
     "--moe-router-num-groups None --moe-router-group-topk 2: give both"),
    (["--train-iters", "5", "--num-experts", "8", "--moe-router-num-groups", "3", "--moe-router-group-topk", "1"],
     "the groups must split the 8 experts evenly"),
    (["--train-iters", "5", "--num-experts", "8", "--moe-router-topk", "4", "--moe-router-num-groups", "4",
      "--moe-router-group-topk", "1"], "the chosen groups must hold --moe-router-topk 4 experts"),
    (["--train-iters", "5", "--moe-layer-freq", "[1,x]"], "--moe-layer-freq takes an int or a list"),
    (["--train-iters", "5", "--context-parallel-size", "2", "--attention-backend", "unfused"],
     "--context-parallel-size 2 needs the flash core attention"),
    (["--train-iters", "5", "--rampup-batch-size", "16", "16", "100"], "--rampup-batch-size needs --train-samples"),
    (["--train-samples", "80", "--rampup-batch-size", "4", "4", "8", "--step-batch-size-schedule", "0:4", "1K:8"],
     "give --rampup-batch-size or --step-batch-size-schedule, not both"),
    (["--train-iters", "5", "--step-batch-size-schedule", "1M:16 2M:32"], "the first threshold must be 0"),
    (["--train-iters", "5", "--step-batch-size-schedule", "0:16 1Q:32"], "'1Q' is not a number"),
    (["--train-iters", "5", "--global-batch-size", "8", "--step-batch-size-schedule", "0:4 1M:16"],
     "--global-batch-size 8 differs from the last batch of --step-batch-size-schedule (16)"),
    (["--train-iters", "5", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--train-iters", "5", "--wandb-project", "p"], "--wandb-project needs --wandb-exp-name"),
    (["--train-iters", "5", "--mtp-num-layers", "1"],
     "--mtp-num-layers: multi-token prediction needs --position-embedding-type rope or none, not learned_absolute"),
    (["--train-iters", "5", "--position-embedding-type", "rope", "--mtp-num-layers", "1", "--context-parallel-size",
      "2"], "multi-token prediction with context parallelism is not run by this runtime yet"),
    (["--train-iters", "5", "--position-embedding-type", "rope", "--mtp-num-layers", "1", "--recompute-granularity",
      "full", "--recompute-method", "uniform", "--recompute-num-layers", "2"],
     "--mtp-num-layers with --recompute-method uniform needs --recompute-num-layers 1, not 2"),
    (["--train-iters", "5", "--position-embedding-type", "rope", "--mtp-num-layers", "1",
      "--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Et*16|t*16L"],
     "--pipeline-model-parallel-layout places 0 multi-token-prediction layers (m), --mtp-num-layers 1"),
    (["--train-iters", "5", "--mtp-use-repeated-layer"],
     "--mtp-use-repeated-layer: not a Megatron-LM 0.16.1 flag: its multi-token prediction flags"),
    (["--train-iters", "5", "--rope-type", "yarn"], "--rope-type yarn needs --multi-latent-attention"),
    (["--train-iters", "5", "--multi-latent-attention", "--group-query-attention", "--num-query-groups", "8"],
     "--group-query-attention cannot go with --multi-latent-attention"),
    (["--train-iters", "5", "--multi-latent-attention", "--cache-mla-latents"],
     "--cache-mla-latents: caching MLA's latents serves Megatron-Core's dynamic inference backend"),
    (["--train-iters", "5", "--multi-latent-attention", "--context-parallel-size", "2"],
     "context parallelism with multi-latent attention is not run by this runtime yet"),
    (["--train-iters", "5", "--recompute-modules", "mla_up_proj", "layernorm"],
     "--recompute-modules mla_up_proj needs --multi-latent-attention"),
    (["--train-iters", "5", "--rope-type", "ntk"], "argument --rope-type: invalid choice: 'ntk'"),
    (["--train-iters", "5", "--recompute-modules", "core_attn", "moe_act"],
     "--recompute-modules core_attn moe_act: moe_act not run by this runtime yet "
     "(it runs core_attn, mlp, layernorm, moe, shared_experts, mla_up_proj)"),
    (["--train-iters", "5", "--recompute-modules", "mlp", "mlp"], "--recompute-modules mlp mlp: a module named twice"),
    (["--train-iters", "5", "--optimizer", "sgd"], "--optimizer sgd: only Adam with decoupled weight decay"),
    # No abbreviations, as Megatron-LM's parser: a prefix of --optimizer-impl is not taken for it.
    (["--train-iters", "5", "--optimizer-i", "fused"], "unrecognized arguments: --optimizer-i fused"),
    (["--train-iters", "5", "--account-for-loss-in-pipeline-split", "--decoder-first-pipeline-num-layers", "3"],
     "--account-for-embedding/loss-in-pipeline-split cannot go with --decoder-first/last-pipeline-num-layers"),
    (["--train-iters", "5", "--save-interval", "4", "--save-retain-interval", "6"],
     "--save-retain-interval 6 must be a positive multiple of --save-interval (4)"),
    (["--train-iters", "5", "--save-retain-interval", "6"],
     "--save-retain-interval 6 must be a positive multiple of --save-interval (not given)"),
    (["--train-iters", "5", "--non-persistent-ckpt-type", "local"],
     "--non-persistent-ckpt-type local: node-local checkpoints need NVIDIA's resiliency extension"),
    (["--train-iters", "5", "--non-persistent-save-interval", "10"],
     "--non-persistent-save-interval 10 needs a positive interval and --non-persistent-ckpt-type global"),
    (["--train-iters", "5", "--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"],
     "--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler cannot both be given"),
    (["--train-iters", "5", "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"],
     "--exp-avg-dtype bf16: main gradients, master weights or Adam moments below fp32 need Transformer Engine's"),
    (["--train-iters", "5", "--main-grads-dtype", "bf16"], "--main-grads-dtype bf16: main gradients"),
    (["--train-iters", "5", "--optimizer-cpu-offload", "--optimizer-offload-fraction", "0.5"],
     "--optimizer-cpu-offload: optimizer CPU offload"),
    (["--train-iters", "5", "--ckpt-convert-format", "torch_dist", "--ckpt-convert-save", "/tmp/c"],
     "--ckpt-convert-format: converting a checkpoint's format is not run here"),
    (["--train-iters", "5", "--no-load-optim", "--load-main-params-from-ckpt"],
     "--load-main-params-from-ckpt: copying the fp32 main parameters alone"),
    (["--train-iters", "5", "--moe-layer-recompute", "--recompute-granularity", "full", "--recompute-method",
      "uniform"], "do not set --moe-layer-recompute with full recompute granularity"),
    (["--train-iters", "5", "--num-experts", "4", "--moe-shared-expert-intermediate-size", "64",
      "--moe-shared-expert-overlap"], "--moe-shared-expert-overlap only works with --moe-token-dispatcher-type "
                                      "alltoall (as in Megatron-Core), not allgather"),
    (["--train-iters", "5", "--num-experts", "4", "--moe-shared-expert-intermediate-size", "64",
      "--moe-shared-expert-overlap", "--moe-token-dispatcher-type", "alltoall", "--recompute-granularity",
      "selective", "--recompute-modules", "shared_experts"],
     "--recompute-modules shared_experts cannot go with --moe-shared-expert-overlap"),
])
def test_bad_schedule_and_refused_flags_exit_2_with_one_line(capsys, flags, message):
    base = [f for f in BASE if f not in ("--train-iters", "10")]
    with pytest.raises(SystemExit) as exit_info:
        train.parse_args(base + flags)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_parallel_sizes_of_one_and_megatron_defaults_are_accepted():
    args = train.parse_args(BASE + ["--context-parallel-size", "1", "--expert-model-parallel-size", "1",
                                           "--rope-type", "rope", "--recompute-modules", "core_attn",
                                           "--optimizer", "adam", "--main-grads-dtype", "fp32", "--main-params-dtype",
                                           "fp32", "--exp-avg-dtype", "fp32", "--exp-avg-sq-dtype", "fp32"])
    assert args.optimizer_impl == "auto"  # `--optimizer adam` is Megatron's optimizer, not an implementation
    assert train.no_effect_flags(args) == []


def test_num_query_groups_without_group_query_attention_is_multi_head():
    mha = train.model_from_args(train.parse_args(BASE + ["--num-query-groups", "8"]), 512)
    gqa = train.model_from_args(train.parse_args(
        BASE + ["--num-query-groups", "8", "--group-query-attention"]), 512)
    assert mha.layers[0].num_query_groups == 32 and gqa.layers[0].num_query_groups == 8


def test_model_flags_reach_the_model_spec_and_its_parameter_count():
    flags = ["--kv-channels", "64", "--add-qkv-bias", "--qk-layernorm", "--apply-layernorm-1p",
             "--disable-bias-linear", "--normalization", "RMSNorm"]
    layer = train.model_from_args(train.parse_args(BASE + flags), 512).layers[0]
    assert (layer.kv_channels, layer.add_qkv_bias, layer.qk_layernorm, layer.apply_layernorm_1p) == (64, True, True, True)
    h, d, a, f = 4096, 64, 32, 4 * 4096
    # QKV (with its bias), projection a*d -> h, MLP, two RMSNorms, q and k RMSNorms over d.
    expected = h * 3 * a * d + 3 * a * d + a * d * h + 2 * h * f + 2 * h + 2 * d
    assert layer.num_parameters == expected


def test_sequence_parallel_without_tensor_parallel_is_turned_off_with_a_warning():
    args = train.parse_args(BASE + ["--sequence-parallel"])
    assert train.megatron_lm_adjustments(args) == [
        "Disabling sequence parallelism because tensor model parallelism is disabled"]
    assert train.manual_flags(args).sequence_parallel is False
    auto = train.parse_args(BASE + ["--sequence-parallel", "--auto-parallel"])
    assert "planner's choice" in train.megatron_lm_adjustments(auto)[0]
    assert train.search_constraints(auto, train.model_from_args(auto, 512)).sequence_parallel is None


def test_embedding_and_loss_in_the_pipeline_split_reach_the_plan_and_are_the_planners_under_auto_parallel():
    split = ["--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "2",
             "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    args = train.parse_args(BASE + ["--num-layers", "30", "--global-batch-size", "8"] + split)
    plan = plan_from_flags(train.model_from_args(args, 512), 8, train.manual_flags(args))
    assert [len(c.layers) for c in plan.chunks] == [1] + [2] * 14 + [1]
    assert train.megatron_lm_adjustments(args) == []
    auto = train.parse_args(BASE + split + ["--auto-parallel"])
    assert train.megatron_lm_adjustments(auto) == [
        "--account-for-embedding-in-pipeline-split, --account-for-loss-in-pipeline-split: under --auto-parallel the "
        "planner splits the layers over the pipeline stages (it prices the embedding and the loss on their stages)"]


def test_a_pipeline_layout_reaches_the_plan_and_is_the_planners_under_auto_parallel():
    layout = ["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Et*3|t*3|t*2|(t)*4,L"]
    args = train.parse_args(BASE + ["--num-layers", "12", "--global-batch-size", "8"] + layout)
    plan = plan_from_flags(train.model_from_args(args, 512), 8, train.manual_flags(args))
    assert [len(c.layers) for c in plan.chunks] == [3, 3, 2, 4] and plan.virtual_stages == 2
    auto = train.parse_args(BASE + layout + ["--auto-parallel"])
    assert train.megatron_lm_adjustments(auto)[0].startswith(
        "--pipeline-model-parallel-layout: under --auto-parallel the planner splits the layers")


def test_run_flags_reach_the_settings_and_megatrons_configs():
    from megatron_auto.runtime import config as configs
    from megatron_auto.parallel_dims import ParallelDims
    from megatron_auto.runtime.layout import MegatronLayout

    args = train.parse_args(BASE + ["--decoupled-lr", "5e-4", "--decoupled-min-lr", "4.5e-5",
                                           "--calculate-per-token-loss", "--no-check-for-nan-in-loss-and-grad",
                                           "--exit-duration-in-mins", "1.5", "--no-load-optim",
                                           "--kv-channels", "64", "--qk-layernorm", "--add-qkv-bias",
                                           "--apply-layernorm-1p", "--lr-warmup-init", "1e-5"])
    settings = train.settings_from_args(args, 512)
    assert (settings.check_for_nan, settings.exit_duration_s, settings.load_optimizer) == (False, 90.0, False)
    assert settings.lr_warmup_init == 1e-5
    layout = MegatronLayout(ParallelDims(), micro_batch_size=1, num_micro_batches=1,
                            global_batch_size=1)
    optimizer = configs.optimizer_config(layout, settings)
    assert (optimizer.decoupled_lr, optimizer.decoupled_min_lr) == (5e-4, 4.5e-5)
    model = train.model_from_args(args, 512)
    tconfig = configs.transformer_config(model, layout, settings, "gloo")
    assert (tconfig.kv_channels, tconfig.qk_layernorm, tconfig.add_qkv_bias) == (64, True, True)
    assert tconfig.layernorm_zero_centered_gamma and tconfig.calculate_per_token_loss
    assert not (tconfig.rotary_interleaved or tconfig.apply_query_key_layer_scaling)  # Megatron-LM's defaults
    rope = train.parse_args(BASE + ["--position-embedding-type", "rope", "--rotary-interleaved",
                                    "--apply-query-key-layer-scaling"])
    tconfig = configs.transformer_config(train.model_from_args(rope, 512), layout, train.settings_from_args(rope, 512),
                                         "gloo")
    assert tconfig.rotary_interleaved and tconfig.apply_query_key_layer_scaling and tconfig.attention_softmax_in_fp32
    from megatron.core.activations import squared_relu

    nemotron = train.parse_args(BASE + ["--squared-relu", "--disable-bias-linear"])
    model = train.model_from_args(nemotron, 512)
    assert model.layers[0].squared_relu and model.num_parameters == train.model_from_args(
        train.parse_args(BASE + ["--disable-bias-linear"]), 512).num_parameters  # two matrices, as GeLU's
    tconfig = configs.transformer_config(model, layout, train.settings_from_args(nemotron, 512), "gloo")
    assert tconfig.activation_func is squared_relu and not tconfig.gated_linear_unit
    with pytest.raises(UserError, match="give one"):
        train.model_from_args(train.parse_args(BASE + ["--squared-relu", "--swiglu"]), 512)


def test_mtp_flags_reach_the_model_spec_and_megatrons_config():
    """Megatron-LM's defaults (no MTP; weight 0.1 when on) and its None for "no MTP" in TransformerConfig."""
    from megatron_auto.runtime import config as configs
    from megatron_auto.parallel_dims import ParallelDims
    from megatron_auto.runtime.layout import MegatronLayout

    layout = MegatronLayout(ParallelDims(), micro_batch_size=1, num_micro_batches=1,
                            global_batch_size=1)
    rope = BASE + ["--position-embedding-type", "rope"]
    for flags, depths, weight in ((rope, 0, 0.1), (rope + ["--mtp-num-layers", "2"], 2, 0.1),
                                  (rope + ["--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.3"], 1, 0.3)):
        args = train.parse_args(flags)
        model = train.model_from_args(args, 512)
        assert (model.mtp_num_layers, model.mtp_loss_scaling_factor) == (depths, weight)
        tconfig = configs.transformer_config(model, layout, train.settings_from_args(args, 512), "gloo")
        assert (tconfig.mtp_num_layers, tconfig.mtp_loss_scaling_factor) == (depths or None, weight)


def test_xavier_uniform_initialisation_reaches_every_init_method_of_the_config():
    import torch

    from megatron_auto.runtime import config as configs
    from megatron_auto.parallel_dims import ParallelDims
    from megatron_auto.runtime.layout import MegatronLayout

    layout = MegatronLayout(ParallelDims(), micro_batch_size=1, num_micro_batches=1,
                            global_batch_size=1)
    tiny = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--train-iters", "1", "--mock-data"]
    for flags, xavier in ((tiny, False), (tiny + ["--init-method-xavier-uniform"], True)):
        args = train.parse_args(flags)
        tconfig = configs.transformer_config(train.model_from_args(args, 128),
                                             layout, train.settings_from_args(args, 128), "gloo")
        weight = torch.empty(256, 64)
        for init in (tconfig.init_method, tconfig.output_layer_init_method, tconfig.embedding_init_method):
            init(weight)
            bound = math.sqrt(6 / (256 + 64))  # xavier_uniform_'s U(-a, a), a = sqrt(6 / (fan_in + fan_out))
            # 16384 uniform draws reach within 1% of the bound; normal(0, 0.02) stays under 0.1.
            assert bool(weight.abs().max() > 0.99 * bound) is xavier and weight.abs().max() <= bound


def test_precision_aware_optimizer_with_fp32_states_is_accepted_and_named():
    # Alone, the switch keeps its four dtype flags at fp32: the same Adam step, so it runs and is named.
    args = train.parse_args(BASE + ["--use-precision-aware-optimizer", "--use-tp-pp-dp-mapping"])
    assert set(train.no_effect_flags(args)) == {"--use-precision-aware-optimizer", "--use-tp-pp-dp-mapping"}


def test_no_effect_flags_are_named_with_their_reason(monkeypatch):
    from megatron_auto.runtime import tensorboard_log

    monkeypatch.setattr(tensorboard_log, "tensorboard_available", lambda: False)
    monkeypatch.setattr(tensorboard_log, "wandb_available", lambda: False)
    args = train.parse_args(BASE + ["--profile", "--profile-ranks", "0", "1", "--cross-entropy-loss-fusion",
                                           "--empty-unused-memory-level", "1", "--tensorboard-dir", "/tmp/tb",
                                           "--wandb-project", "p", "--wandb-exp-name", "e"])
    reasons = dict(train.no_effect_reasons(args))
    assert set(reasons) == {"--profile", "--profile-ranks", "--cross-entropy-loss-fusion",
                            "--empty-unused-memory-level", "--tensorboard-dir", "--wandb-project"}
    assert reasons["--tensorboard-dir"] == "the tensorboard package is not installed"
    assert reasons["--wandb-project"] == "the wandb package is not installed"
    monkeypatch.setattr(tensorboard_log, "tensorboard_available", lambda: True)
    monkeypatch.setattr(tensorboard_log, "wandb_available", lambda: True)
    assert {"--tensorboard-dir", "--wandb-project"}.isdisjoint(dict(train.no_effect_reasons(args)))


def test_unknown_normalization_exits_2(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.parse_args(BASE + ["--normalization", "ScaleNorm"])
    assert exit_info.value.code == 2


VALIDATION_JOB = ["--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "128",
                  "--max-position-embeddings", "128", "--global-batch-size", "16", "--train-iters", "6",
                  "--mock-data", "--vocab-size", "512", "--auto-parallel", "--auto-parallel-cluster", "cpu-gloo"]
PROFILES = [str(REPO / "docs" / "profiles" / name) for name in ("cpu4_cluster.json", "cpu4_model.json")]


def _choose(flags):
    args = train.parse_args(flags)
    model = train.model_from_args(args, 513)
    return model, train.choose_plan(args, model, 4, train.settings_from_args(args, 513))


def test_auto_parallel_profile_prices_the_search_from_the_measured_files():
    from dataclasses import replace

    from megatron_auto.search import search_plan
    from megatron_auto.specs.presets import CLUSTER_PRESETS
    from megatron_auto.specs.profiles import measured_costs
    from megatron_auto.specs.training import TrainingSpec

    model, profiled = _choose(VALIDATION_JOB + ["--auto-parallel-profile", *PROFILES])
    _, analytic = _choose(VALIDATION_JOB)
    cluster = replace(CLUSTER_PRESETS["cpu-gloo"], gpus_per_node=4, measured=measured_costs(PROFILES))
    expected = search_plan(model, cluster, TrainingSpec.fp32(16), "megatron").plan
    assert (profiled.chunks, profiled.num_micro_batches) == (expected.chunks, expected.num_micro_batches)
    assert profiled.prediction == expected.prediction
    assert profiled.prediction != analytic.prediction


def test_unreadable_auto_parallel_profile_is_a_user_error(tmp_path):
    from megatron_auto.errors import UserError

    broken = tmp_path / "cluster.json"
    broken.write_text("{not json")
    with pytest.raises(UserError):
        _choose(VALIDATION_JOB + ["--auto-parallel-profile", str(broken)])


@pytest.mark.parametrize("rank, level", [("0", logging.NOTSET), ("3", logging.WARNING)])
def test_only_rank_0_reports_the_search(monkeypatch, rank, level):
    search_logger = logging.getLogger("megatron_auto.search")
    monkeypatch.setattr(search_logger, "level", logging.NOTSET)
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setattr(logging.getLogger("megatron"), "level", logging.getLogger("megatron").level)
    train.configure_logging()
    assert search_logger.level == level


def test_fp16_loss_scaling_flags_reach_the_settings_and_megatrons_optimizer_config():
    from megatron_auto.runtime.config import optimizer_config
    from megatron_auto.parallel_dims import ParallelDims
    from megatron_auto.runtime.layout import MegatronLayout

    layout = MegatronLayout(ParallelDims(), micro_batch_size=1, num_micro_batches=1,
                            global_batch_size=1)
    args = train.parse_args(BASE + ["--fp16", "--initial-loss-scale", "65536", "--min-loss-scale", "2",
                                           "--loss-scale-window", "50", "--hysteresis", "3"])
    settings = train.settings_from_args(args, 256)
    assert settings.precision == "fp16"
    config = optimizer_config(layout, settings)
    assert (config.fp16, config.bf16, config.loss_scale) == (True, False, None)  # None: dynamic scaling
    assert (config.initial_loss_scale, config.min_loss_scale, config.loss_scale_window, config.hysteresis) == \
        (65536.0, 2.0, 50, 3)
    constant = train.settings_from_args(train.parse_args(BASE + ["--fp16", "--loss-scale", "128"]), 256)
    assert optimizer_config(layout, constant).loss_scale == 128.0
    defaults = train.settings_from_args(train.parse_args(BASE + ["--fp16"]), 256)
    assert defaults.initial_loss_scale == 2.0**32  # Megatron-LM's default


@pytest.mark.parametrize("flags, message", [
    (["--bf16", "--fp16"], "mutually exclusive"),
    (["--fp16", "--hysteresis", "0"], "--hysteresis must be at least 1"),
    (["--fp16", "--loss-scale", "-1"], "--loss-scale must be positive"),
])
def test_bad_precision_flags_are_user_errors(flags, message):
    from megatron_auto.errors import UserError

    with pytest.raises(UserError, match=message):
        train.settings_from_args(train.parse_args(BASE + flags), 256)


def test_readme_flag_table_lists_every_refused_and_no_effect_flag():
    from megatron_auto.runtime import compat_flags
    from megatron_auto.train import flag_table

    readme = (REPO / "README.md").read_text()
    table = flag_table.readme_section(readme)
    assert table == flag_table.readme_table(), \
        "README.md's flag table differs from the verdicts: run `python -m megatron_auto.train.flag_table`"
    for flag in compat_flags.REFUSED_PREFIXES:
        assert f"`{flag}*`" in table
    for flag, (accepted, _) in compat_flags.REFUSED_UNLESS.items():
        assert f"`{flag}` other than `{accepted}`" in table
    for flag in (*compat_flags.REFUSED_ANY_VALUE, *compat_flags.REFUSED_ABOVE_ONE, *compat_flags.REFUSED_SWITCHES,
                 *compat_flags.NO_EFFECT_SWITCHES, *compat_flags.NO_EFFECT_VALUES, *compat_flags.NO_EFFECT_LISTS,
                 *compat_flags.MOE_NO_EFFECT_SWITCHES):
        assert f"`{flag}" in table


def test_rope_scaling_reaches_the_rotary_embedding():
    from megatron_auto.runtime.model import position_embedding_args

    rope = BASE + LLAMA3
    args = train.parse_args(rope + ["--use-rope-scaling", "--rope-scaling-factor", "32"])
    model = train.model_from_args(args, 512)
    assert position_embedding_args(model, train.settings_from_args(args, 512))["rope_scaling_factor"] == 32.0
    plain = train.parse_args(rope)
    assert "rope_scaling" not in position_embedding_args(model, train.settings_from_args(plain, 512))
    assert "seq_len_interpolation_factor" not in position_embedding_args(
        model, train.settings_from_args(plain, 512))
    stretched = train.parse_args(rope + ["--rotary-seq-len-interpolation-factor", "4"])
    arguments = position_embedding_args(model, train.settings_from_args(stretched, 512))
    assert arguments["seq_len_interpolation_factor"] == 4


DEEPSEEK_V2_LITE_MLA = ["--multi-latent-attention", "--kv-lora-rank", "512", "--qk-head-dim", "128",
                        "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128", "--rotary-scaling-factor", "40",
                        "--mscale", "0.707", "--mscale-all-dim", "0.707", "--qk-layernorm"]
"""DeepSeek-V2-Lite's attention flags as Megatron-LM's DeepSeek-V2-Lite.sh gives them (no --q-lora-rank)."""


def _mla_config(flags: list[str]):
    from megatron_auto.runtime import config as configs
    from megatron_auto.parallel_dims import ParallelDims
    from megatron_auto.runtime.layout import MegatronLayout

    args = train.parse_args(["--num-layers", "2", "--hidden-size", "2048", "--num-attention-heads", "16",
                                    "--seq-length", "128", "--train-iters", "1", "--mock-data", *flags])
    layout = MegatronLayout(ParallelDims(), micro_batch_size=1, num_micro_batches=1,
                            global_batch_size=1)
    model = train.model_from_args(args, 512)
    return model, configs.transformer_config(model, layout, train.settings_from_args(args, 512), "gloo")


def test_mla_flags_reach_the_model_spec_and_megatrons_mla_config():
    from megatron.core.transformer import MLATransformerConfig

    model, tconfig = _mla_config(DEEPSEEK_V2_LITE_MLA)
    assert model.layers[0].mla == MODEL_PRESETS["deepseek-v2-lite"].layers[0].mla
    assert type(tconfig) is MLATransformerConfig and tconfig.multi_latent_attention
    assert (tconfig.q_lora_rank, tconfig.kv_lora_rank, tconfig.qk_head_dim, tconfig.qk_pos_emb_head_dim,
            tconfig.v_head_dim) == (None, 512, 128, 64, 128)
    # --rope-type not given: MLATransformerConfig's yarn (Megatron-LM pops rope_type); YaRN's flags as given.
    assert (tconfig.rope_type, tconfig.rotary_scaling_factor, tconfig.mscale, tconfig.mscale_all_dim) == \
        ("yarn", 40.0, 0.707, 0.707)
    assert tconfig.num_query_groups == tconfig.num_attention_heads == 16
    assert (tconfig.original_max_position_embeddings, tconfig.beta_fast, tconfig.beta_slow) == (4096, 32, 1)


def test_mla_flags_take_megatron_lms_defaults_and_rope_type():
    model, tconfig = _mla_config(["--multi-latent-attention", "--q-lora-rank", "64", "--rope-type", "rope"])
    assert (tconfig.q_lora_rank, tconfig.kv_lora_rank, tconfig.qk_head_dim, tconfig.qk_pos_emb_head_dim,
            tconfig.v_head_dim) == (64, 32, 128, 64, 128)
    assert (tconfig.rope_type, tconfig.rotary_scaling_factor, tconfig.mscale, tconfig.mscale_all_dim) == \
        ("rope", 1.0, 1.0, 0.0)
    # Without --multi-latent-attention the shape flags change nothing, as in Megatron-LM.
    plain, plain_config = _mla_config(["--kv-lora-rank", "64", "--rope-type", "rope"])
    assert plain.layers[0].mla is None and not plain_config.multi_latent_attention
    assert type(plain_config).__name__ == "TransformerConfig"


def test_mla_up_proj_recompute_is_accepted_with_mla():
    args = train.parse_args(BASE + ["--multi-latent-attention", "--recompute-granularity", "selective",
                                           "--recompute-modules", "mla_up_proj", "layernorm"])
    settings = train.settings_from_args(args, 512)
    assert settings.recompute_modules == ("mla_up_proj", "layernorm")


def test_newer_hugging_face_special_token_flag_is_the_default_here():
    without = train.parse_args(BASE + ["--tokenizer-hf-no-include-special-tokens"])
    assert not without.tokenizer_hf_include_special_tokens
    assert train.parse_args(BASE + ["--tokenizer-hf-include-special-tokens"]).tokenizer_hf_include_special_tokens


def test_padded_vocab_size_is_taken_as_given_when_it_holds_the_vocabulary_and_splits_over_tp():
    from megatron_auto.errors import UserError
    from megatron_auto.runtime.config import padded_vocab_size

    args = train.parse_args(BASE + ["--padded-vocab-size", "600"])
    settings = train.settings_from_args(args, 513)
    assert padded_vocab_size(513, settings, 2) == 600
    assert padded_vocab_size(513, train.settings_from_args(train.parse_args(BASE), 513), 2) == 768
    for tp, vocab in ((7, 513), (2, 601)):
        with pytest.raises(UserError, match="--padded-vocab-size 600: must be at least"):
            padded_vocab_size(vocab, settings, tp)


def test_step_schedule_reads_as_one_word_or_one_word_per_step():
    # Megatron-LM's gpt3 example expands its quoted schedule unquoted: one word per step.
    quoted = train.parse_args(BASE + ["--step-batch-size-schedule", "0:8 10M:16"])
    split = train.parse_args(BASE + ["--step-batch-size-schedule", "0:8", "10M:16"])
    assert quoted.batch_ramp == split.batch_ramp and quoted.batch_ramp.steps == ((0, 8), (1220, 16))
    assert split.global_batch_size == 16


def test_auto_parallel_with_a_growing_batch_keeps_the_micro_batch_and_a_dp_that_splits_every_batch():
    from megatron_auto.runtime.layout import layout_from_plan

    job = [f for f in VALIDATION_JOB if f not in ("--global-batch-size", "16")]
    # Batches 2 then 16 (from 1M tokens): micro-batch 1 (pinned) x DP must divide 2.
    _, plan = _choose(job + ["--step-batch-size-schedule", "0:2", "1M:16", "--micro-batch-size", "1"])
    layout = layout_from_plan(plan)
    assert layout.global_batch_size == 16 and layout.micro_batch_size == 1 and layout.dims.dp in (1, 2)


MIXTRAL = ["--num-experts", "8", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "14336",
           "--moe-aux-loss-coeff", "1e-2", "--moe-z-loss-coeff", "1e-3", "--moe-token-dispatcher-type", "alltoall",
           "--moe-grouped-gemm", "--moe-router-dtype", "fp32", "--moe-permute-fusion", "--moe-layer-freq",
           "([0]*2+[1]*30)", "--moe-shared-expert-intermediate-size", "1024", "--disable-bias-linear"]


def test_moe_flags_reach_the_model_spec_and_the_run_settings():
    args = train.parse_args(BASE + MIXTRAL)
    model = train.model_from_args(args, 512)
    assert [layer.moe is not None for layer in model.layers] == [False] * 2 + [True] * 30
    moe = model.layers[2].moe
    assert (moe.num_experts, moe.router_topk, moe.expert_ffn_hidden_size, moe.shared_expert_ffn_hidden_size,
            moe.aux_loss_coeff, moe.z_loss_coeff) == (8, 2, 14336, 1024, 1e-2, 1e-3)
    run = train.moe_settings(args)
    assert (run.token_dispatcher, run.grouped_gemm, run.router_dtype) == ("alltoall", True, "fp32")
    assert train.no_effect_flags(args) == ["--moe-permute-fusion"]


@pytest.mark.parametrize("world, flags, message", [
    (4, ["--expert-model-parallel-size", "3"], "EP x expert TP = 3 x 1 must divide TP x DP = 1 x 4"),
    (4, ["--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2",
         "--expert-tensor-parallel-size", "4", "--sequence-parallel"],
     "EP x expert TP = 2 x 4 must divide TP x DP = 2 x 2"),
    (4, ["--expert-model-parallel-size", "4", "--num-experts", "6"], "ep=4 does not divide the 6 experts"),
])
def test_expert_parallel_sizes_that_do_not_fit_are_user_errors(world, flags, message):
    from megatron_auto.errors import UserError

    base = [f for f in BASE + MIXTRAL if f not in ("--moe-layer-freq", "([0]*2+[1]*30)")]
    args = train.parse_args(base + flags)
    with pytest.raises(UserError, match=re.escape(message)):
        plan_from_flags(train.model_from_args(args, 512), world, train.manual_flags(args))


def test_expert_parallel_flags_need_a_moe_model():
    from megatron_auto.errors import UserError

    args = train.parse_args(BASE + ["--expert-model-parallel-size", "2"])
    with pytest.raises(UserError, match="need a MoE model"):
        plan_from_flags(train.model_from_args(args, 512), 4, train.manual_flags(args))


def test_recompute_modules_reach_the_settings_the_priced_spec_and_the_plan_file_check():
    from dataclasses import replace

    from megatron_auto.cost.estimate import estimate_plan
    from megatron_auto.errors import UserError
    from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags
    from megatron_auto.specs.presets import CLUSTER_PRESETS

    args = train.parse_args(BASE + LLAMA3 + ["--recompute-granularity", "selective",
                                                    "--recompute-modules", "mlp", "layernorm"])
    settings = train.settings_from_args(args, 512)
    training = train.training_for_job(args, settings, world_size=8)
    assert settings.recompute_modules == training.recompute_modules == ("mlp", "layernorm")
    model = train.model_from_args(args, 512)
    plan = plan_from_flags(model, 8, ManualParallelism(tp=8, micro_batch_size=1, global_batch_size=8,
                                                       recompute_granularity="selective"))
    priced = replace(plan, prediction=estimate_plan(plan, model, CLUSTER_PRESETS["dgx-h100-80gb"], training))
    train.check_plan_runs(priced, settings, model)  # priced as it runs
    default = replace(settings, recompute_modules=("core_attn",))
    with pytest.raises(UserError, match="priced re-running mlp layernorm; this run's --recompute-modules is "
                                        "core_attn: give --recompute-modules mlp layernorm"):
        train.check_plan_runs(priced, default, model)
    train.check_plan_runs(plan, default, model)  # a plan without a prediction runs the run's modules


def test_without_recompute_modules_the_run_takes_the_plans():
    from dataclasses import replace

    from megatron_auto.cost.estimate import estimate_plan
    from megatron_auto.runtime.manual_plan import ManualParallelism, plan_from_flags
    from megatron_auto.specs.presets import CLUSTER_PRESETS

    args = train.parse_args(BASE + LLAMA3 + ["--auto-parallel"])
    assert args.recompute_modules is None
    settings = train.settings_from_args(args, 512)
    assert settings.recompute_modules == ("core_attn",)  # Megatron-LM's default until a plan says otherwise
    model = train.model_from_args(args, 512)
    plan = plan_from_flags(model, 8, ManualParallelism(tp=8, micro_batch_size=1, global_batch_size=8,
                                                       recompute_granularity="selective"))
    training = replace(train.training_for_job(args, settings, 8), recompute_modules=("mlp",))
    priced = replace(plan, prediction=estimate_plan(plan, model, CLUSTER_PRESETS["dgx-h100-80gb"], training))
    adopted = train.with_plan_recompute_modules(args, settings, priced)
    assert adopted.recompute_modules == ("mlp",)
    train.check_plan_runs(priced, adopted, model)
    pinned = train.parse_args(BASE + LLAMA3 + ["--auto-parallel", "--recompute-modules", "core_attn"])
    assert train.with_plan_recompute_modules(pinned, settings, priced) is settings  # the flag wins


def test_deepseek_v3_router_flags_reach_transformer_config():
    args = train.parse_args(BASE + ["--num-experts", "8", "--moe-router-topk", "4", "--moe-router-score-function",
                                           "sigmoid", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
                                           "0.002", "--moe-router-num-groups", "4", "--moe-router-group-topk", "2"])
    fields = train.moe_settings(args).config_fields()
    assert (fields["moe_router_enable_expert_bias"], fields["moe_router_bias_update_rate"],
            fields["moe_router_num_groups"], fields["moe_router_group_topk"]) == (True, 0.002, 4, 2)
    plain = train.moe_settings(train.parse_args(BASE + ["--num-experts", "8"])).config_fields()
    assert (plain["moe_router_enable_expert_bias"], plain["moe_router_bias_update_rate"]) == (False, 1e-3)


@pytest.mark.parametrize("flags, granularity, modules", [
    (["--moe-layer-recompute"], "selective", ("core_attn", "moe")),
    (["--recompute-activations", "--moe-layer-recompute"], "selective", ("core_attn", "moe")),
    (["--moe-layer-recompute", "--recompute-modules", "mlp"], "selective", ("mlp", "moe")),
    (["--moe-layer-recompute", "--recompute-modules", "moe", "core_attn"], "selective", ("moe", "core_attn")),
])
def test_moe_layer_recompute_is_selective_recompute_of_moe(flags, granularity, modules):
    """Megatron-Core's TransformerConfig turns --moe-layer-recompute into selective recomputation with `moe`
    appended to the modules (core_attn, its default, kept)."""
    args = train.parse_args(BASE + ["--num-experts", "8"] + flags)
    assert (args.recompute_granularity, tuple(args.recompute_modules)) == (granularity, modules)


def test_shared_expert_overlap_reaches_transformer_config_and_the_priced_spec():
    flags = ["--num-experts", "8", "--moe-shared-expert-intermediate-size", "64", "--moe-token-dispatcher-type",
             "alltoall"]
    for extra, expected in (([], False), (["--moe-shared-expert-overlap"], True)):
        args = train.parse_args(BASE + flags + extra)
        settings = train.settings_from_args(args, 1024)
        assert settings.moe.config_fields()["moe_shared_expert_overlap"] is expected
        assert train.training_for_job(args, settings, 8).moe_shared_expert_overlap is expected


def test_the_log_names_the_micro_batch_the_searched_plan_overrides():
    """Under --auto-parallel the micro-batch is the search's to choose (not a constraint, but for a batch ramp):
    the header and the dry run name the launch line's value it overrode; a plan keeping it, or flags alone,
    name nothing."""
    from megatron_auto.train.plan_choice import manual_flags, override_lines

    tiny = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
            "--max-position-embeddings", "64", "--global-batch-size", "16", "--train-iters", "2", "--mock-data"]
    args = train.parse_args([*tiny, "--micro-batch-size", "1", "--auto-parallel"])
    model = train.model_from_args(args, 512)
    planned = plan_from_flags(model, 4, manual_flags(train.parse_args([*tiny, "--micro-batch-size", "4"])))
    assert override_lines(args, planned) == ["--auto-parallel overrides --micro-batch-size 1 -> 4 (the search's "
                                             "choice; the other parallelism flags given are constraints)"]
    assert override_lines(train.parse_args([*tiny, "--micro-batch-size", "4", "--auto-parallel"]), planned) == []
    assert override_lines(train.parse_args([*tiny, "--micro-batch-size", "1"]), planned) == []
