"""Megatron-Core configuration records for one run: transformer, DDP and optimizer.

Pure constructors: they build Megatron's config dataclasses from the model spec,
the layout and the settings, and touch no process group.
"""
from __future__ import annotations

import torch

from ..errors import UserError
from ..pipeline_layout import mtp_layers_of_layout
from ..specs.model import LayerSpec, ModelSpec
from . import kernels
from .layout import MegatronLayout
from .settings import TrainSettings

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


MLA_CONTEXT_PARALLEL = ("context parallelism with multi-latent attention is not run by this runtime yet (its "
                        "split RoPE and latents are neither priced nor tested here): use --context-parallel-size 1")


MTP_CONTEXT_PARALLEL = ("multi-token prediction with context parallelism is not run by this runtime yet (megatron-core "
                        "0.16.1 rolls the MTP tokens across CP ranks with CUDA buffers; not tested here): use "
                        "--context-parallel-size 1")


def padded_vocab_size(vocab_size: int, settings: TrainSettings, tensor_parallel: int) -> int:
    """Megatron's padding: up to a multiple of make_vocab_size_divisible_by x TP, or --padded-vocab-size
    as given (Megatron-LM's _set_padded_vocab_size), which must hold the vocabulary and split over TP."""
    if settings.padded_vocab_size is not None:
        if settings.padded_vocab_size < vocab_size or settings.padded_vocab_size % tensor_parallel:
            raise UserError(f"--padded-vocab-size {settings.padded_vocab_size}: must be at least the tokenizer's "
                            f"{vocab_size} ids and divisible by the tensor-parallel size {tensor_parallel}")
        return settings.padded_vocab_size
    multiple = settings.make_vocab_size_divisible_by * tensor_parallel
    return -(-vocab_size // multiple) * multiple


def check_layout(layout: MegatronLayout) -> None:
    """Cross-field checks Megatron would otherwise fail on deep inside model construction."""
    if layout.sequence_parallel and layout.dims.tp == 1:
        raise UserError("--sequence-parallel needs --tensor-model-parallel-size > 1")


def moe_spec_of(model: ModelSpec):
    """The MoESpec all of the model's MoE layers share (None for a dense model); Megatron-Core's
    TransformerConfig holds one, so layers that differ in it are a UserError."""
    specs = {layer.moe for layer in model.layers if layer.moe is not None}
    if len(specs) > 1:
        raise UserError("the Megatron-Core runtime builds one kind of MoE layer per model; the model's MoE "
                        "layers differ in experts, top-k, widths or losses")
    return next(iter(specs), None)


def moe_fields(model: ModelSpec, layout: MegatronLayout, settings: TrainSettings) -> dict:
    """TransformerConfig's MoE fields (Megatron-LM's --num-experts, --moe-*, --expert-*-parallel-size);
    none for a dense model."""
    moe = moe_spec_of(model)
    if moe is None:
        return {}
    if moe.shared_expert_ffn_hidden_size and model.layers[0].add_bias_linear:
        raise UserError("--moe-shared-expert-intermediate-size: Megatron-Core's shared experts have no biases; "
                        "add --disable-bias-linear")
    return dict(
        num_moe_experts=moe.num_experts,
        moe_router_topk=moe.router_topk,
        moe_ffn_hidden_size=moe.expert_ffn_hidden_size,
        moe_shared_expert_intermediate_size=moe.shared_expert_ffn_hidden_size or None,
        moe_router_load_balancing_type=moe.router_load_balancing_type,
        moe_aux_loss_coeff=moe.aux_loss_coeff,
        # Megatron's "no z-loss" is None: a coefficient of 0 would be tracked as z_loss / 0.
        moe_z_loss_coeff=moe.z_loss_coeff or None,
        moe_layer_freq=[int(layer.moe is not None) for layer in model.layers],
        expert_model_parallel_size=layout.dims.ep,
        expert_tensor_parallel_size=layout.dims.etp,
        moe_grouped_gemm=kernels.kernels_for_run(model, settings).grouped_gemm,
        **settings.moe.config_fields(),
    )


def mla_spec_of(model: ModelSpec):
    """The MLASpec all of the model's layers share (None when no layer is multi-latent). Megatron-Core's
    MLATransformerConfig holds one, and GPTModel drops its RoPE table for every layer under it, so layers that
    differ in their attention are a UserError."""
    specs = {layer.mla for layer in model.layers}
    if len(specs) > 1:
        raise UserError("the Megatron-Core runtime builds one kind of attention per model; the model's layers "
                        "differ in multi-latent attention or its widths")
    return next(iter(specs))


def config_class(layer: LayerSpec):
    """MLATransformerConfig for a multi-latent attention layer (Megatron-LM's core_transformer_config_from_args
    picks it under --multi-latent-attention), else TransformerConfig."""
    from megatron.core.transformer import MLATransformerConfig, TransformerConfig

    return TransformerConfig if layer.mla is None else MLATransformerConfig


def mla_fields(layer: LayerSpec) -> dict:
    """MLATransformerConfig's shape fields of an MLA layer (its MLASpec; Megatron-LM's --q-lora-rank,
    --kv-lora-rank, --qk-head-dim, --qk-pos-emb-head-dim, --v-head-dim); none for other layers."""
    mla = layer.mla
    if mla is None:
        return {}
    return dict(multi_latent_attention=True, q_lora_rank=mla.q_lora_rank, kv_lora_rank=mla.kv_lora_rank,
                qk_head_dim=mla.qk_head_dim, qk_pos_emb_head_dim=mla.qk_pos_emb_head_dim, v_head_dim=mla.v_head_dim)


def mla_rope_fields(model: ModelSpec, settings: TrainSettings) -> dict:
    """The RoPE that multi-latent attention computes inside each layer (GPTModel builds none under MLA):
    --rope-type (left out when not given, so MLATransformerConfig's default yarn applies, as Megatron-LM pops
    it), --rotary-base, --rotary-percent and YaRN's --rotary-scaling-factor, --mscale, --mscale-all-dim.
    original_max_position_embeddings, beta_fast and beta_slow keep MLATransformerConfig's defaults (Megatron-LM
    has no flag for them). Without MLA only plain rope runs (Megatron-LM asserts it)."""
    if settings.rope_type not in (None, "rope", "yarn"):
        raise UserError(f"--rope-type {settings.rope_type}: rope or yarn")
    if mla_spec_of(model) is None:
        if settings.rope_type not in (None, "rope"):
            raise UserError(f"--rope-type {settings.rope_type} needs --multi-latent-attention (Megatron-LM: common "
                            "attention only supports rope_type=\"rope\")")
        return {}
    fields = dict(rotary_base=model.rotary_base, rotary_percent=settings.rotary_percent,
                  rotary_scaling_factor=settings.rotary_scaling_factor, mscale=settings.mscale,
                  mscale_all_dim=settings.mscale_all_dim)
    if settings.rope_type is not None:
        fields["rope_type"] = settings.rope_type
    return fields


def mtp_error(position_embedding_type: str, context_parallel: int = 1, recompute_method: str | None = None,
              recompute_num_layers: int | None = None, pipeline_layout: str | None = None,
              mtp_num_layers: int = 0) -> str | None:
    """What Megatron asserts of multi-token prediction with these settings, or this runtime does not run with it,
    as one line (None: it runs). The flag parser and the config builder both ask."""
    if position_embedding_type not in ("rope", "none"):
        return (f"--mtp-num-layers: multi-token prediction needs --position-embedding-type rope or none, not "
                f"{position_embedding_type} (Megatron-LM's validate_args)")
    if context_parallel > 1:
        return MTP_CONTEXT_PARALLEL
    if recompute_method == "uniform" and (recompute_num_layers or 1) > 1:
        return (f"--mtp-num-layers with --recompute-method uniform needs --recompute-num-layers 1, not "
                f"{recompute_num_layers} (megatron-core's MTP layer asserts it)")
    if pipeline_layout is not None and mtp_layers_of_layout(pipeline_layout) != mtp_num_layers:
        return (f"--pipeline-model-parallel-layout places {mtp_layers_of_layout(pipeline_layout)} multi-token-"
                f"prediction layers (m), --mtp-num-layers {mtp_num_layers}: put that many in the last chunk, before "
                "L (Megatron-Core checks the count)")
    return None


def mtp_fields(model: ModelSpec, layout: MegatronLayout) -> dict:
    """TransformerConfig's multi-token prediction fields (Megatron-LM's --mtp-num-layers and
    --mtp-loss-scaling-factor); none without MTP (Megatron's mtp_num_layers None)."""
    if not model.mtp_num_layers:
        return {}
    problem = mtp_error(model.position_embedding_type, layout.dims.cp, layout.recompute_method,
                        layout.recompute_num_layers, layout.pipeline_layout, model.mtp_num_layers)
    if problem:
        raise UserError(problem)
    return dict(mtp_num_layers=model.mtp_num_layers, mtp_loss_scaling_factor=model.mtp_loss_scaling_factor)


def layer_fields(layer: LayerSpec) -> dict:
    """TransformerConfig's fields that shape one decoder layer, unsharded: the runtime's config and the
    layer profiler's (profiling/layer_bench.py) take them from here, so both build the same layer
    (an MLA layer's go to config_class(layer), MLATransformerConfig)."""
    return dict(
        **mla_fields(layer),
        hidden_size=layer.hidden_size,
        num_attention_heads=layer.num_attention_heads,
        num_query_groups=layer.num_query_groups,
        kv_channels=layer.kv_channels,
        add_qkv_bias=layer.add_qkv_bias,
        qk_layernorm=layer.qk_layernorm,
        layernorm_zero_centered_gamma=layer.apply_layernorm_1p,
        ffn_hidden_size=layer.ffn_hidden_size,
        gated_linear_unit=layer.swiglu,
        activation_func=activation_function(layer),
        normalization=layer.normalization,
        add_bias_linear=layer.add_bias_linear,
    )


def activation_function(layer: LayerSpec):
    """The MLP's activation as Megatron-LM's core_transformer_config_from_args picks it: silu under the gated
    unit of --swiglu, megatron-core's squared_relu for --squared-relu, else gelu."""
    if layer.swiglu:
        return torch.nn.functional.silu
    if layer.squared_relu:
        from megatron.core.activations import squared_relu

        return squared_relu
    return torch.nn.functional.gelu


def xavier_init(settings: TrainSettings) -> dict:
    """TransformerConfig's init methods under --init-method-xavier-uniform; {} keeps Megatron's normal ones.

    Megatron-LM's core_transformer_config_from_args sets init_method and `scaled_init_method`, a field
    TransformerConfig no longer has (0.16 calls it output_layer_init_method, and the unknown keyword stops
    Megatron-LM's run); this sets both current fields, and the embedding follows init_method
    (TransformerConfig.__post_init__). Weights are initialised on the CPU before they are split, so each
    draw sees the whole matrix's fans for any layout."""
    if not settings.init_method_xavier_uniform:
        return {}
    return {"init_method": torch.nn.init.xavier_uniform_, "output_layer_init_method": torch.nn.init.xavier_uniform_}


def transformer_config(model: ModelSpec, layout: MegatronLayout, settings: TrainSettings, backend: str):
    """The TransformerConfig of a GPT model under `layout`."""
    check_layout(layout)
    if any(layer.attention_window is not None for layer in model.distinct_layers):
        raise UserError("sliding-window attention is priced by plan and estimate, not built by this runtime yet")
    if any(layer.softmax_type != "vanilla" for layer in model.distinct_layers):
        raise UserError("a softmax other than the vanilla one (softmax_type) is priced by plan and estimate, not "
                        "built by this runtime yet")
    if layout.dims.cp > 1 and kernels.kernels_for_run(model, settings).attention != "flash":
        raise UserError(f"context parallelism {layout.dims.cp} runs on the flash core attention "
                        f"(--attention-backend flash or auto), not {settings.attention_backend}")
    if layout.dims.cp > 1 and mla_spec_of(model) is not None:
        raise UserError(MLA_CONTEXT_PARALLEL)
    if settings.rotary_interleaved and mla_spec_of(model) is not None:
        raise UserError("--rotary-interleaved does not work with --multi-latent-attention (megatron-core's "
                        "TransformerConfig)")
    dtype = DTYPES[settings.precision]
    on_gloo = backend == "gloo"
    return config_class(model.layers[0])(
        num_layers=model.num_layers,
        **layer_fields(model.layers[0]),
        **mla_rope_fields(model, settings),
        calculate_per_token_loss=settings.calculate_per_token_loss,
        layernorm_epsilon=settings.norm_epsilon,
        hidden_dropout=settings.hidden_dropout,
        attention_dropout=settings.attention_dropout,
        rotary_interleaved=settings.rotary_interleaved,
        apply_query_key_layer_scaling=settings.apply_query_key_layer_scaling,
        init_method_std=settings.init_method_std,
        **xavier_init(settings),
        tensor_model_parallel_size=layout.dims.tp,
        pipeline_model_parallel_size=layout.dims.pp,
        context_parallel_size=layout.dims.cp,
        virtual_pipeline_model_parallel_size=layout.dims.vp if layout.dims.vp > 1 else None,
        num_layers_in_first_pipeline_stage=layout.first_stage_layers,
        num_layers_in_last_pipeline_stage=layout.last_stage_layers,
        account_for_embedding_in_pipeline_split=layout.account_for_embedding,
        account_for_loss_in_pipeline_split=layout.account_for_loss,
        pipeline_model_parallel_layout=layout.pipeline_layout,
        sequence_parallel=layout.sequence_parallel,
        recompute_granularity=layout.recompute_granularity,
        recompute_method=layout.recompute_method,
        recompute_num_layers=layout.recompute_num_layers,
        recompute_modules=list(settings.recompute_modules),
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=settings.precision == "bf16",
        fp16=settings.precision == "fp16",
        # Identical initial weights for every TP degree: the master weight is drawn on the CPU, then split.
        # It is drawn in fp32 and cast to params_dtype before the split (tensor_parallel.layers.
        # _initialize_affine_weight_cpu), so bf16/fp16 weights are the rounded fp32 ones at any TP.
        use_cpu_initialization=True,
        # Over gloo, batched p2p gives wrong interleaved-schedule results (patches/vpp_batched_p2p_guard.py).
        batch_p2p_comm=not on_gloo,
        deallocate_pipeline_outputs=True,
        # The run's fusions (and TE's attention backend): runtime/kernels.py.
        **kernels.config_flags(kernels.kernels_for_run(model, settings)),
        **moe_fields(model, layout, settings),
        **mtp_fields(model, layout),
    )


def ddp_config(layout: MegatronLayout, settings: TrainSettings):
    """Megatron DDP: fp32 gradient buffers, optionally sharded by the distributed optimizer, whose weight
    all-gather then runs in the next forward where the run asks for it (overlaps_param_gather)."""
    from megatron.core.distributed import DistributedDataParallelConfig

    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        # On GPUs, reduce each bucket while the backward runs (Megatron-LM's
        # --overlap-grad-reduce), as the cluster presets' grad_overlap = 1 assumes;
        # gloo on CPU gains nothing from it (cpu-gloo: grad_overlap = 0).
        overlap_grad_reduce=torch.cuda.is_available(),
        overlap_param_gather=overlaps_param_gather(layout, settings),
        use_distributed_optimizer=layout.distributed_optimizer,
        check_for_nan_in_grad=False,
    )


def param_gather_overlap_requested(settings: TrainSettings) -> bool:
    """--overlap-param-gather, or by default with CUDA: the distributed optimizer's updated weights are
    all-gathered during the next forward."""
    return torch.cuda.is_available() if settings.overlap_param_gather is None else settings.overlap_param_gather


def overlaps_param_gather(layout: MegatronLayout, settings: TrainSettings) -> bool:
    """Whether the parts of `layout` gather their weights during the next forward (distributed optimizer only)."""
    return layout.distributed_optimizer and param_gather_overlap_requested(settings)


def optimizer_config(layout: MegatronLayout, settings: TrainSettings):
    """Adam with Megatron's mixed-precision handling and gradient clipping."""
    from megatron.core.optimizer import OptimizerConfig

    return OptimizerConfig(
        optimizer="adam",
        lr=settings.lr,
        min_lr=settings.min_lr,
        weight_decay=settings.weight_decay,
        adam_beta1=settings.adam_beta1,
        adam_beta2=settings.adam_beta2,
        adam_eps=settings.adam_eps,
        clip_grad=settings.clip_grad,
        # --decoupled-lr: megatron-core gives the embedding and output layer their own param group.
        decoupled_lr=settings.decoupled_lr,
        decoupled_min_lr=settings.decoupled_min_lr,
        bf16=settings.precision == "bf16",
        fp16=settings.precision == "fp16",
        params_dtype=DTYPES[settings.precision],
        use_distributed_optimizer=layout.distributed_optimizer,
        **loss_scaling(settings),
        log_num_zeros_in_grad=False,
    )


def check_loss_scaling(settings: TrainSettings) -> None:
    """UserError for fp16 loss-scaling settings Megatron's grad scaler would assert on."""
    if settings.precision != "fp16":
        return
    if settings.loss_scale is not None and settings.loss_scale <= 0:
        raise UserError(f"--loss-scale must be positive, got {settings.loss_scale:g}")
    if settings.initial_loss_scale <= 0 or settings.min_loss_scale <= 0:
        raise UserError("--initial-loss-scale and --min-loss-scale must be positive")
    if settings.loss_scale_window < 1 or settings.hysteresis < 1:
        raise UserError("--loss-scale-window and --hysteresis must be at least 1")


def loss_scaling(settings: TrainSettings) -> dict:
    """OptimizerConfig's fp16 loss-scaling fields (Megatron-LM's --loss-scale, --initial-loss-scale,
    --min-loss-scale, --loss-scale-window, --hysteresis); bf16 and fp32 need no scaling."""
    if settings.precision != "fp16":
        return {}
    check_loss_scaling(settings)
    return dict(loss_scale=settings.loss_scale, initial_loss_scale=settings.initial_loss_scale,
                min_loss_scale=settings.min_loss_scale, loss_scale_window=settings.loss_scale_window,
                hysteresis=settings.hysteresis)
