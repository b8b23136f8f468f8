"""The flags mapped into what the runtime and the planner take: the ModelSpec, TrainSettings and its parts."""
from __future__ import annotations

import argparse
import dataclasses
from typing import Optional

from megatron_auto.errors import UserError
from megatron_auto.runtime import compat_flags
from megatron_auto.runtime.settings import DataSettings, FimSettings, MoESettings, TrainSettings
from megatron_auto.specs.model import ModelSpec, uniform_model
from megatron_auto.specs.training import DEFAULT_RECOMPUTE_MODULES

from . import flag_verdicts
from .arguments_data import per_split_paths
from .arguments_model import position_embedding_type
from .log import logger


def mtp_model_flags(args: argparse.Namespace) -> dict:
    """uniform_model's MTP fields from the flags (Megatron-LM's None depth is no MTP: 0 here)."""
    return dict(mtp_num_layers=args.mtp_num_layers or 0, mtp_loss_scaling_factor=args.mtp_loss_scaling_factor)


def mla_model_flags(args: argparse.Namespace) -> dict:
    """uniform_model's `mla` from the flags: an MLASpec under --multi-latent-attention, else None (Megatron-LM
    reads the shape flags only under the switch)."""
    from megatron_auto.specs.model import MLA_KEYS, mla_from_flags

    if not args.multi_latent_attention:
        return {}
    return {"mla": mla_from_flags(True, **{key: getattr(args, key) for key in MLA_KEYS})}


def moe_model_flags(args: argparse.Namespace) -> dict:
    """uniform_model's MoE keywords from the flags (none without --num-experts)."""
    if args.num_experts is None:
        return {}
    return dict(num_experts=args.num_experts, moe_router_topk=args.moe_router_topk,
                moe_ffn_hidden_size=args.moe_ffn_hidden_size,
                moe_shared_expert_intermediate_size=args.moe_shared_expert_intermediate_size,
                moe_layer_freq=args.moe_layer_freq, moe_router_load_balancing_type=args.moe_router_load_balancing_type,
                moe_aux_loss_coeff=args.moe_aux_loss_coeff, moe_z_loss_coeff=args.moe_z_loss_coeff or 0.0)


def moe_settings(args: argparse.Namespace) -> MoESettings:
    """How the MoE layers route and dispatch (the shape of the experts is the model's)."""
    return MoESettings(
        token_dispatcher="alltoall" if args.moe_token_dispatcher_type == "flex" else args.moe_token_dispatcher_type,
        grouped_gemm=args.moe_grouped_gemm, router_dtype=args.moe_router_dtype,
        router_pre_softmax=args.moe_router_pre_softmax, router_score_function=args.moe_router_score_function,
        router_topk_scaling_factor=args.moe_router_topk_scaling_factor,
        expert_capacity_factor=args.moe_expert_capacity_factor,
        pad_expert_input_to_capacity=args.moe_pad_expert_input_to_capacity,
        token_drop_policy=args.moe_token_drop_policy, input_jitter_eps=args.moe_input_jitter_eps,
        per_layer_logging=args.moe_per_layer_logging, router_expert_bias=args.moe_router_enable_expert_bias,
        router_bias_update_rate=args.moe_router_bias_update_rate, router_num_groups=args.moe_router_num_groups,
        router_group_topk=args.moe_router_group_topk, shared_expert_overlap=args.moe_shared_expert_overlap)


def model_from_args(args: argparse.Namespace, vocab_size: int) -> ModelSpec:
    """The ModelSpec of the model flags, with `vocab_size` embedding rows; bad shapes are a UserError."""
    try:
        # Megatron-LM: --num-query-groups counts only with --group-query-attention (else multi-head).
        groups = args.num_query_groups if args.group_query_attention else None
        return uniform_model("pretrain_gpt", args.num_layers, args.hidden_size, args.num_attention_heads,
                             args.seq_length, vocab_size, ffn_hidden_size=args.ffn_hidden_size,
                             num_query_groups=groups, swiglu=args.swiglu, squared_relu=args.squared_relu,
                             kv_channels=args.kv_channels,
                             add_qkv_bias=args.add_qkv_bias, qk_layernorm=args.qk_layernorm,
                             apply_layernorm_1p=args.apply_layernorm_1p,
                             untie_embeddings_and_output_weights=args.untie_embeddings_and_output_weights,
                             normalization=args.normalization, add_bias_linear=not args.disable_bias_linear,
                             position_embedding_type=position_embedding_type(args), rotary_base=args.rotary_base,
                             hidden_dropout=args.hidden_dropout, attention_dropout=args.attention_dropout,
                             **moe_model_flags(args), **mla_model_flags(args), **mtp_model_flags(args))
    except ValueError as error:
        raise UserError(f"model flags: {error}") from None


def precision_from_args(args: argparse.Namespace) -> str:
    """fp32, bf16 or fp16; both 16-bit flags together is a user error."""
    if args.bf16 and args.fp16:
        raise UserError("--bf16 and --fp16 are mutually exclusive: give one")
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


def settings_from_args(args: argparse.Namespace, vocab_size: int, eod: int = 0) -> TrainSettings:
    """The run's TrainSettings, checked before any work (UserError), with the tokenizer's end-of-document id."""
    from megatron_auto.runtime.config import check_loss_scaling
    from megatron_auto.runtime.validation import check_settings

    settings = train_settings(args, vocab_size, precision_from_args(args))
    check_settings(settings, args.seq_length)
    check_loss_scaling(settings)
    return dataclasses.replace(settings, data=dataclasses.replace(settings.data, eod=eod))


def data_from_args(args: argparse.Namespace, vocab_size: int) -> DataSettings:
    """The data flags: the `--data-path` blend (empty for --mock-data) and its split (Megatron-LM's default
    969,30,1 when not given), or the per-split datasets; .bin reading, cache, masks."""
    from megatron_auto.runtime.gpt_data import MAX_SCAN_BYTES, check_data, check_data_tokens, check_run_data

    if args.reset_attention_mask:
        raise UserError("--reset-attention-mask: per-document attention masks are not supported "
                        "(the attention here is causal over the whole sequence)")
    per_split = per_split_paths(args)
    data = DataSettings(blend=tuple(args.data_path or ()), blend_per_split=per_split if any(per_split) else (),
                        vocab_size=vocab_size, split=args.split or "969,30,1", mmap_bin_files=args.mmap_bin_files,
                        cache_path=args.data_cache_path, eod_mask_loss=args.eod_mask_loss,
                        reset_position_ids=args.reset_position_ids, mock_dataset=bool(args.mock_data),
                        fim=fim_from_args(args, vocab_size))
    if data.from_files:
        check_data(data)  # before any work: a truncated .bin, a bad blend or split is one line
        check_run_data(data, args.eval_iters)
        if not check_data_tokens(data):
            logger.info("--data-path: a .bin over %d GiB: token ids are checked against the vocabulary as "
                        "samples are read", MAX_SCAN_BYTES >> 30)
    return data


def fim_from_args(args: argparse.Namespace, vocab_size: int) -> Optional[FimSettings]:
    """--fim-data and its flags (None without it), checked before any work as Megatron-LM's validate_args
    checks them (megatron/training/arguments.py): files, not mock data; rates in [0, 1]; sentinel tokens the
    tokenizer holds. A --fim-* flag without --fim-data changes nothing, as in Megatron-LM."""
    from megatron_auto.runtime.fim import token_ids
    from megatron_auto.runtime.tokenizers import tokenizer_files_from_flags, tokenizer_from_flags

    if not args.fim_data:
        return None
    if args.mock_data or not (args.data_path or any(per_split_paths(args))):
        raise UserError("--fim-data: fill-in-the-middle samples are built from --data-path datasets, "
                        "not --mock-data (as in Megatron-LM)")
    rates = [("--fim-rate", args.fim_rate), ("--fim-spm-rate", args.fim_spm_rate)]
    if args.fim_split_sample is not None:
        if args.fim_fragment_rate is None:
            raise UserError("--fim-split-sample needs --fim-fragment-rate (the FIM probability of each fragment)")
        rates.append(("--fim-fragment-rate", args.fim_fragment_rate))
    for flag, rate in rates:
        if not 0.0 <= rate <= 1.0:
            raise UserError(f"{flag} {rate:g}: a probability, between 0 and 1")
    tokenizer = tokenizer_from_flags(args)
    fim = FimSettings(rate=args.fim_rate, spm_rate=args.fim_spm_rate, split_sample=args.fim_split_sample,
                      fragment_rate=args.fim_fragment_rate, no_prefix=args.fim_no_prefix,
                      prefix_token=args.fim_prefix_token, middle_token=args.fim_middle_token,
                      suffix_token=args.fim_suffix_token, pad_token=args.fim_pad_token,
                      eod_token=args.fim_eod_token, tokenizer_type=args.tokenizer_type, vocab_size=args.vocab_size,
                      tokenizer_files=tokenizer_files_from_flags(args))
    ids = token_ids(fim, tokenizer)  # UserError for a token the vocabulary lacks
    if max(ids.prefix, ids.middle, ids.suffix, ids.pad, ids.eod) >= vocab_size:
        raise UserError(f"--fim-data: a FIM sentinel token's id is outside the vocabulary of {vocab_size}")
    return fim


def train_settings(args: argparse.Namespace, vocab_size: int, precision: str) -> TrainSettings:
    """Every TrainSettings field from its flag (unchecked; settings_from_args checks)."""
    return TrainSettings(
        train_iters=args.train_iters or 0, train_samples=args.train_samples, batch_ramp=args.batch_ramp,
        lr_decay_samples=args.lr_decay_samples,
        lr_warmup_samples=args.lr_warmup_samples, lr_warmup_fraction=args.lr_warmup_fraction,
        lr_warmup_init=args.lr_warmup_init, override_schedule=args.override_opt_param_scheduler,
        decoupled_lr=args.decoupled_lr, decoupled_min_lr=args.decoupled_min_lr,
        calculate_per_token_loss=args.calculate_per_token_loss, check_for_nan=args.check_for_nan_in_loss_and_grad,
        exit_duration_s=args.exit_duration_in_mins * 60, load_optimizer=not args.no_load_optim,
        save_optimizer=not args.no_save_optim, save_rng=not args.no_save_rng,
        exit_signal=args.exit_signal if args.exit_signal_handler else None,
        load_rng=not args.no_load_rng, tensorboard_dir=args.tensorboard_dir, wandb_project=args.wandb_project,
        wandb_exp_name=args.wandb_exp_name, wandb_save_dir=args.wandb_save_dir, wandb_entity=args.wandb_entity,
        lr=args.lr, min_lr=args.min_lr, lr_decay_style=args.lr_decay_style,
        lr_wsd_decay_style=args.lr_wsd_decay_style, lr_wsd_decay_iters=args.lr_wsd_decay_iters,
        lr_wsd_decay_samples=args.lr_wsd_decay_samples, weight_decay_incr_style=args.weight_decay_incr_style,
        start_weight_decay=args.start_weight_decay, end_weight_decay=args.end_weight_decay,
        lr_warmup_iters=args.lr_warmup_iters, lr_decay_iters=args.lr_decay_iters, weight_decay=args.weight_decay,
        clip_grad=args.clip_grad, adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
        precision=precision, loss_scale=args.loss_scale, initial_loss_scale=args.initial_loss_scale,
        min_loss_scale=args.min_loss_scale, loss_scale_window=args.loss_scale_window, hysteresis=args.hysteresis,
        hidden_dropout=args.hidden_dropout, attention_dropout=args.attention_dropout,
        init_method_std=args.init_method_std, init_method_xavier_uniform=args.init_method_xavier_uniform,
        seed=args.seed, norm_epsilon=args.norm_epsilon,
        attention_backend=args.attention_backend, optimizer_impl=args.optimizer_impl,
        recompute_modules=tuple(args.recompute_modules or DEFAULT_RECOMPUTE_MODULES),
        bias_activation_fusion=not (args.no_bias_swiglu_fusion if args.swiglu else args.no_bias_gelu_fusion),
        bias_dropout_fusion=not args.no_bias_dropout_fusion, bias_fusions=args.bias_fusions,
        grad_accumulation_fusion=args.grad_accumulation_fusion, overlap_param_gather=args.overlap_param_gather,
        rotary_percent=args.rotary_percent, rope_scaling=args.use_rope_scaling,
        rotary_interleaved=args.rotary_interleaved, apply_query_key_layer_scaling=args.apply_query_key_layer_scaling,
        rope_scaling_factor=args.rope_scaling_factor,
        rotary_interpolation_factor=args.rotary_seq_len_interpolation_factor, rope_type=args.rope_type,
        rotary_scaling_factor=args.rotary_scaling_factor, mscale=args.mscale, mscale_all_dim=args.mscale_all_dim,
        make_vocab_size_divisible_by=args.make_vocab_size_divisible_by, padded_vocab_size=args.padded_vocab_size,
        max_position_embeddings=args.max_position_embeddings, log_interval=args.log_interval,
        eval_interval=args.eval_interval, eval_iters=args.eval_iters, save=args.save, load=args.load,
        save_interval=args.save_interval, exit_interval=args.exit_interval, ckpt_step=args.ckpt_step,
        save_retain_interval=args.save_retain_interval,
        non_persistent_save_interval=args.non_persistent_save_interval or 0,
        non_persistent_ckpt_type=args.non_persistent_ckpt_type,
        non_persistent_global_ckpt_dir=args.non_persistent_global_ckpt_dir,
        finetune=args.finetune, pretrained_checkpoint=args.pretrained_checkpoint,
        exit_on_missing_checkpoint=args.exit_on_missing_checkpoint, timeout_s=args.distributed_timeout_minutes * 60,
        data=data_from_args(args, vocab_size), moe=moe_settings(args))


def no_effect_reasons(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(flag, reason) of the accepted-without-effect flags this run was given."""
    from megatron_auto.runtime.tensorboard_log import tensorboard_available, wandb_available

    reasons = compat_flags.no_effect(args) + flag_verdicts.no_effect(args)
    if args.tensorboard_dir is not None and not tensorboard_available():
        reasons.append(("--tensorboard-dir", "the tensorboard package is not installed"))
    if args.wandb_project and not wandb_available():
        reasons.append(("--wandb-project", "the wandb package is not installed"))
    return reasons


def no_effect_flags(args: argparse.Namespace) -> list[str]:
    """The accepted-without-effect flags this run was given."""
    return [flag for flag, _ in no_effect_reasons(args)]


def precision_summary(settings: TrainSettings) -> str:
    """One log line naming the precision (and the loss scaling of fp16)."""
    if settings.precision == "fp32":
        return "fp32"
    text = f"{settings.precision} (fp32 main gradients and master weights in the optimizer"
    if settings.precision == "fp16":
        scaling = (f"constant loss scale {settings.loss_scale:g}" if settings.loss_scale else
                   f"dynamic loss scale from {settings.initial_loss_scale:g}, window {settings.loss_scale_window},"
                   f" hysteresis {settings.hysteresis}, min {settings.min_loss_scale:g}")
        text += f"; {scaling}"
    return text + ")"
