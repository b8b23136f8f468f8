"""TrainSettings: everything about a run that is not the model or its parallel layout.

Field names follow Megatron-LM's flags (`--lr` -> `lr`, `--train-iters` -> `train_iters`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from ..specs.training import DEFAULT_RECOMPUTE_MODULES
from .batch_schedule import BatchRamp
from .file_tokenizers import TokenizerFiles

NON_PERSISTENT_SUBDIR = "non_persistent"
"""Megatron-LM's default folder of global non-persistent checkpoints inside --save and --load."""

EXIT_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")
"""What --exit-signal may name."""


@dataclass(frozen=True)
class FimSettings:
    """Megatron-LM's fill-in-the-middle flags (--fim-data and the --fim-* flags; runtime/fim.py), with what
    rebuilds the tokenizer on each rank (FIM cuts a sample's text, so the dataset needs the tokenizer)."""

    rate: float = 0.5
    """--fim-rate: probability that a segment (or, with split_sample, a sample) is put in FIM form."""
    spm_rate: float = 0.5
    """--fim-spm-rate: probability that a FIM example is laid out SPM rather than PSM."""
    split_sample: Optional[str] = None
    """--fim-split-sample: the token at which a sample is cut into fragments, each put in FIM form apart."""
    fragment_rate: Optional[float] = None
    """--fim-fragment-rate: probability for each fragment (with split_sample)."""
    no_prefix: Optional[str] = None
    """--fim-no-prefix: a segment or fragment whose text starts with it is left as it is."""
    prefix_token: str = "<fim_prefix>"
    middle_token: str = "<fim_middle>"
    suffix_token: str = "<fim_suffix>"
    pad_token: str = "<fim_pad>"
    eod_token: str = "<|endoftext|>"
    """--fim-{prefix,middle,suffix,pad,eod}-token: the sentinel tokens (Megatron-LM's defaults)."""
    tokenizer_type: Optional[str] = None
    vocab_size: Optional[int] = None
    tokenizer_files: TokenizerFiles = TokenizerFiles()
    """The tokenizer flags (runtime/tokenizers.make_tokenizer's arguments)."""


@dataclass(frozen=True)
class DataSettings:
    """Where the training tokens come from (Megatron-LM's data flags)."""

    blend: tuple[str, ...] = ()
    """--data-path words: PREFIX..., or WEIGHT PREFIX pairs (runtime/gpt_data.py); empty (and no
    `blend_per_split`) means mock data."""
    blend_per_split: tuple[tuple[str, ...], ...] = ()
    """--train-data-path, --valid-data-path, --test-data-path words (each in --data-path's forms, empty for
    a split without data), in place of `blend` and `split`: every dataset goes whole to its split."""
    vocab_size: int = 256
    """Token ids the tokenizer produces (including its end-of-document id)."""
    eod: int = 0
    """The tokenizer's end-of-document id."""
    split: str = "969,30,1"
    """--split: train, validation and test weights of every dataset's documents (Megatron-LM's default)."""
    mmap_bin_files: bool = True
    """False (--no-mmap-bin-files): read the .bin files with file reads instead of memory maps."""
    cache_path: Optional[str] = None
    """--data-cache-path: where the dataset indices are cached (None: beside each dataset)."""
    eod_mask_loss: bool = False
    """--eod-mask-loss: end-of-document tokens carry no loss (megatron-core's GPTDataset masks them)."""
    reset_position_ids: bool = False
    """--reset-position-ids: positions restart after each end-of-document token (GPTDataset)."""
    mock_dataset: bool = False
    """--mock-data: megatron-core's MockGPTDataset, as Megatron-LM's pretrain_gpt.py builds it (documents of
    1, 2, 3, ... then end-of-document, split by --split); without it and without files the runtime draws
    uniform random tokens (data.MockTokens, what the equivalence tests feed)."""
    fim: Optional[FimSettings] = None
    """--fim-data: samples in fill-in-the-middle form (runtime/fim.py); None without it."""

    @property
    def from_files(self) -> bool:
        """Whether the tokens come from indexed datasets (else mock data)."""
        return bool(self.blend) or any(self.blend_per_split)


@dataclass(frozen=True)
class MoESettings:
    """How a MoE model's routers and experts run (Megatron-LM's --moe-* flags that are not the model's shape;
    the shape is the ModelSpec's MoESpec)."""

    token_dispatcher: str = "alltoall"
    """--moe-token-dispatcher-type: alltoall or allgather."""
    grouped_gemm: bool = False
    """--moe-grouped-gemm: one grouped GEMM for the local experts where its kernel imports (runtime/kernels.py)."""
    router_dtype: Optional[str] = None
    """--moe-router-dtype: fp32 or fp64 routing (None: the activations' dtype)."""
    router_pre_softmax: bool = False
    """--moe-router-pre-softmax: softmax over all experts before the top-k (Mixtral's router takes it after)."""
    router_score_function: str = "softmax"
    """--moe-router-score-function: softmax or sigmoid."""
    router_topk_scaling_factor: Optional[float] = None
    """--moe-router-topk-scaling-factor: scales the routing weights of the chosen experts."""
    expert_capacity_factor: Optional[float] = None
    """--moe-expert-capacity-factor: tokens over capacity x mean are dropped (None: no dropping)."""
    pad_expert_input_to_capacity: bool = False
    """--moe-pad-expert-input-to-capacity: pad every expert's input to its capacity."""
    token_drop_policy: str = "probs"
    """--moe-token-drop-policy: probs or position (which tokens an over-capacity expert drops)."""
    input_jitter_eps: Optional[float] = None
    """--moe-input-jitter-eps: multiplicative noise on the router's input while training."""
    per_layer_logging: bool = False
    """--moe-per-layer-logging: log each layer's auxiliary losses, not only their mean."""
    router_expert_bias: bool = False
    """--moe-router-enable-expert-bias: DeepSeek-V3's auxiliary-loss-free balancing, a per-expert bias added to
    the scores that pick the experts (not to the weights that mix them), moved after each global batch
    toward the experts that got fewer tokens (Wang et al. 2024, arXiv:2408.15664)."""
    router_bias_update_rate: float = 1e-3
    """--moe-router-bias-update-rate: how far each update moves an expert's bias."""
    router_num_groups: Optional[int] = None
    """--moe-router-num-groups: experts split into this many groups for group-limited routing (DeepSeek-V2/V3's
    device- and node-limited routing)."""
    router_group_topk: Optional[int] = None
    """--moe-router-group-topk: groups a token's experts may come from."""
    shared_expert_overlap: bool = False
    """--moe-shared-expert-overlap: the shared expert runs on its own CUDA stream beside the alltoall
    dispatcher's communication (megatron/core/transformer/moe/shared_experts.py), with its TP collectives
    issued by itself; on CPU the streams are no-ops (patches/moe_cuda_device.py) and the math is the same."""

    def config_fields(self) -> dict:
        """TransformerConfig's fields for these settings (megatron/core/transformer/transformer_config.py)."""
        return dict(moe_token_dispatcher_type=self.token_dispatcher, moe_router_dtype=self.router_dtype,
                    moe_router_pre_softmax=self.router_pre_softmax,
                    moe_router_score_function=self.router_score_function,
                    moe_router_topk_scaling_factor=self.router_topk_scaling_factor,
                    moe_expert_capacity_factor=self.expert_capacity_factor,
                    moe_pad_expert_input_to_capacity=self.pad_expert_input_to_capacity,
                    moe_token_drop_policy=self.token_drop_policy, moe_input_jitter_eps=self.input_jitter_eps,
                    moe_per_layer_logging=self.per_layer_logging,
                    moe_router_enable_expert_bias=self.router_expert_bias,
                    moe_router_bias_update_rate=self.router_bias_update_rate,
                    moe_router_num_groups=self.router_num_groups, moe_router_group_topk=self.router_group_topk,
                    moe_shared_expert_overlap=self.shared_expert_overlap)


@dataclass(frozen=True)
class TrainSettings:
    """Optimiser, schedule, precision, logging and checkpoint settings of one run."""

    train_iters: int = 10
    """Iterations to run (including those a resumed checkpoint already did); with `train_samples`,
    train_samples // global batch (schedule.resolve_samples)."""
    train_samples: Optional[int] = None
    """Megatron-LM's sample-based schedule (--train-samples): samples to train on; None: iteration-based."""
    batch_ramp: Optional[BatchRamp] = None
    """--rampup-batch-size / --step-batch-size-schedule: a global batch that grows with the samples
    consumed (runtime/batch_schedule.py); None: the plan's global batch throughout."""
    lr_decay_samples: Optional[int] = None
    """Sample-based schedule: samples over which the rate decays; None means train_samples."""
    lr_warmup_samples: int = 0
    """Sample-based schedule: samples of linear warm-up."""
    lr_warmup_init: float = 0.0
    """Learning rate at the start of the linear warm-up (Megatron-LM's --lr-warmup-init)."""
    override_schedule: bool = False
    """--override-opt_param-scheduler: a resume takes the schedule (learning rates, warm-up and decay lengths,
    weight decay) from these settings; False keeps the checkpoint's (--use-checkpoint-opt_param-scheduler)."""
    lr_warmup_fraction: Optional[float] = None
    """Warm-up as a share of the decay steps (Megatron-LM's --lr-warmup-fraction); overrides the counts."""
    lr: float = 1e-3
    """Peak learning rate."""
    min_lr: float = 0.0
    """Learning rate at the end of the decay."""
    lr_decay_style: str = "constant"
    """constant, linear, cosine, inverse-square-root or WSD (Megatron's names)."""
    lr_wsd_decay_style: str = "exponential"
    """WSD's shape over its last lr_wsd_decay_iters/samples: exponential, linear, cosine or minus_sqrt."""
    lr_wsd_decay_iters: Optional[int] = None
    """With WSD (iteration-based): iterations of the final decay; before them the rate stays at `lr`."""
    lr_wsd_decay_samples: Optional[int] = None
    """With WSD and train_samples: samples of the final decay."""
    lr_warmup_iters: int = 0
    """Iterations of linear warm-up."""
    lr_decay_iters: Optional[int] = None
    """Iterations over which the rate decays; None means train_iters."""
    weight_decay: float = 0.01
    """Adam weight decay."""
    weight_decay_incr_style: str = "constant"
    """constant (`weight_decay` throughout), linear or cosine from start_ to end_weight_decay over the run."""
    start_weight_decay: Optional[float] = None
    end_weight_decay: Optional[float] = None
    clip_grad: float = 1.0
    """Gradient-norm clipping threshold (0 disables clipping)."""
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    decoupled_lr: Optional[float] = None
    """Peak rate of the embedding and output layer (Megatron-LM's --decoupled-lr); None: `lr`."""
    decoupled_min_lr: Optional[float] = None
    """Final rate of the embedding and output layer (--decoupled-min-lr); None: `min_lr`."""
    calculate_per_token_loss: bool = False
    """Megatron-LM's --calculate-per-token-loss: the loss and gradients are divided once by the global
    batch's token count rather than averaged per micro-batch."""
    check_for_nan: bool = True
    """Stop on a NaN/Inf loss or NaN gradient norm (Megatron-LM's --check-for-nan-in-loss-and-grad)."""
    precision: str = "fp32"
    """fp32, bf16 or fp16 (16-bit weights and activations; fp32 main gradients and master weights)."""
    loss_scale: Optional[float] = None
    """fp16 only: a constant loss scale (--loss-scale); None means dynamic loss scaling."""
    initial_loss_scale: float = 2.0**32
    """fp16 dynamic scaling: the starting scale (Megatron-LM's --initial-loss-scale default)."""
    min_loss_scale: float = 1.0
    """fp16 dynamic scaling: the scale never backs off below this."""
    loss_scale_window: int = 1000
    """fp16 dynamic scaling: overflow-free iterations before the scale doubles."""
    hysteresis: int = 2
    """fp16 dynamic scaling: overflowing iterations tolerated before the scale halves."""
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    init_method_std: float = 0.02
    """Standard deviation of the normal weight initialisation."""
    init_method_xavier_uniform: bool = False
    """--init-method-xavier-uniform: every weight that init_method_std would draw is drawn by
    torch.nn.init.xavier_uniform_ instead, as Megatron-LM sets init_method and scaled_init_method."""
    norm_epsilon: float = 1e-5
    """Epsilon of the LayerNorm / RMSNorm layers (--norm-epsilon)."""
    rotary_percent: float = 1.0
    """Share of each head's channels that RoPE rotates (--rotary-percent)."""
    rotary_interleaved: bool = False
    """--rotary-interleaved: RoPE rotates channel pairs (2i, 2i+1) rather than the two halves of a head."""
    apply_query_key_layer_scaling: bool = False
    """--apply-query-key-layer-scaling: the unfused core scales Q.K down by the layer number and back up in its
    fp32 softmax (the same scores; the flash core computes them in one kernel either way)."""
    rope_scaling: bool = False
    """--use-rope-scaling: Llama 3.1's RoPE frequency scaling (megatron-core's RotaryEmbedding rope_scaling)."""
    rope_scaling_factor: float = 8.0
    """--rope-scaling-factor: its factor (Megatron-LM's default 8)."""
    rotary_interpolation_factor: Optional[int] = None
    """--rotary-seq-len-interpolation-factor: RoPE's positions divided by this factor (linear position
    interpolation, for a context longer than the one trained), None: none."""
    rope_type: Optional[str] = None
    """--rope-type: rope or yarn, the RoPE that multi-latent attention computes itself (None: Megatron-Core's
    MLATransformerConfig default, yarn); other attention runs plain rope only (Megatron-LM asserts so)."""
    rotary_scaling_factor: float = 1.0
    """--rotary-scaling-factor: YaRN's context-extension factor s (Peng et al. 2023, arXiv 2309.00071); at 1 YaRN's
    frequencies are RoPE's and its attention temperature is 1 (Megatron-LM's default)."""
    mscale: float = 1.0
    """--mscale: YaRN's mscale, in the temperature that multiplies the rotated channels (megatron-core's
    _yarn_get_concentration_factor; DeepSeek-V2's config.json names it mscale)."""
    mscale_all_dim: float = 0.0
    """--mscale-all-dim: YaRN's mscale_all_dim, in the same temperature and, squared, in MLA's softmax scale
    (megatron-core's MultiLatentAttention: softmax_scale = mscale^2 / sqrt(q head width))."""
    seed: int = 1234
    attention_backend: str = "auto"
    """--attention-backend (Megatron-LM's names; runtime/kernels.py resolves `auto` for the host)."""
    optimizer_impl: str = "auto"
    """--optimizer-impl: fused, foreach, or auto (fused on GPUs, foreach on CPU)."""
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    """--recompute-modules: what selective recomputation re-runs (specs.training.RECOMPUTE_MODULES)."""
    bias_fusions: str = "auto"
    """--bias-fusions: on runs Megatron's bias fusions on GPUs; auto and off keep them off (megatron_auto.kernel_choice)."""
    grad_accumulation_fusion: str = "auto"
    """--grad-accumulation-fusion: Megatron's weight-gradient accumulation in the GEMM (megatron_auto.kernel_choice)."""
    overlap_param_gather: Optional[bool] = None
    """--overlap-param-gather: with the distributed optimizer, the updated weights are all-gathered during the
    next forward instead of inside the optimizer step; None: on with CUDA (as the GPU presets' overlap assumes),
    off on CPU (gloo gains nothing from it)."""
    bias_activation_fusion: bool = True
    """Megatron's fused bias + GeLU/SwiGLU allowed (with --bias-fusions on); --no-bias-gelu/swiglu-fusion: off."""
    bias_dropout_fusion: bool = True
    """Megatron's fused bias + dropout + add allowed (with --bias-fusions on); --no-bias-dropout-fusion: off."""
    make_vocab_size_divisible_by: int = 128
    """Megatron pads the vocabulary to a multiple of this times the TP degree."""
    padded_vocab_size: Optional[int] = None
    """--padded-vocab-size: the embedding's rows as given (None: the tokenizer's ids padded as above)."""
    max_position_embeddings: Optional[int] = None
    """Learned position embeddings; None means the sequence length."""
    log_interval: int = 1
    eval_interval: int = 0
    """Evaluate every this many iterations (0: never)."""
    eval_iters: int = 0
    """Global batches per validation pass, at every eval_interval and after the last iteration
    (0: never validate; tools/pretrain_gpt.py's --eval-iters defaults to 10)."""
    save: Optional[str] = None
    """Checkpoint directory to write."""
    load: Optional[str] = None
    """Checkpoint directory to resume from."""
    save_interval: int = 0
    """Save every this many iterations (0: only at the end when `save` is set)."""
    save_retain_interval: Optional[int] = None
    """--save-retain-interval: each save to `save` removes the previous one unless its iteration is a multiple
    of this (None: keep every checkpoint); runtime.checkpoint_rotation."""
    non_persistent_save_interval: int = 0
    """--non-persistent-save-interval: a non-persistent checkpoint every this many iterations (0: none)."""
    non_persistent_ckpt_type: Optional[str] = None
    """--non-persistent-ckpt-type: "global" (the one kind run here) or None."""
    non_persistent_global_ckpt_dir: Optional[str] = None
    """--non-persistent-global-ckpt-dir (None: the non_persistent folder of `save` and of `load`)."""
    exit_interval: int = 0
    """Stop after this iteration (0: run to train_iters); for tests of resumption."""
    exit_duration_s: float = 0.0
    """Save (with `save`) and stop once training has run this long (--exit-duration-in-mins; 0: never)."""
    exit_signal: Optional[str] = None
    """With --exit-signal-handler, the signal (one of EXIT_SIGNALS) on which the run saves (with
    `save`) and stops after the current iteration; None: the signal keeps its default action."""
    save_optimizer: bool = True
    """Write the optimizer state and schedule with each checkpoint (False: --no-save-optim)."""
    save_rng: bool = True
    """Write every rank's random streams with each checkpoint (False: --no-save-rng)."""
    load_optimizer: bool = True
    """With `load`: restore the optimizer and learning-rate schedule (False: --no-load-optim)."""
    load_rng: bool = True
    """Restore the random streams saved with the checkpoint (--no-load-rng: keep the fresh seeds)."""
    ckpt_step: Optional[int] = None
    """With `load`: the iteration to load (default: the latest)."""
    finetune: bool = False
    """With `load`: take only the weights (no optimizer state, iteration restarts at 0)."""
    exit_on_missing_checkpoint: bool = False
    """--exit-on-missing-checkpoint: a `load` without a checkpoint stops the run (one line) instead of
    starting it from scratch."""
    pretrained_checkpoint: Optional[str] = None
    """--pretrained-checkpoint: where `load` holds no checkpoint (or is unset), fine-tune from this one's
    weights (Megatron-LM's checkpointing.load_checkpoint: the first run of a fine-tuning job starts from the
    base model, its restarts resume from their own checkpoints in `load`)."""
    tensorboard_dir: Optional[str] = None
    """Write TensorBoard scalars here (--tensorboard-dir) when the tensorboard package imports."""
    wandb_project: str = ""
    """--wandb-project: write the scalars to this Weights & Biases project when wandb imports ('' : none)."""
    wandb_exp_name: str = ""
    """--wandb-exp-name: the wandb run's name (needed with a project, as Megatron-LM)."""
    wandb_save_dir: str = ""
    """--wandb-save-dir: wandb's local directory ('': SAVE/wandb)."""
    wandb_entity: str = ""
    """--wandb-entity: the wandb team or user ('': wandb's default)."""
    timeout_s: float = 300.0
    """Timeout of every process-group collective, so a dead rank cannot hang the job."""
    data: DataSettings = DataSettings()
    """Training data."""
    moe: MoESettings = MoESettings()
    """How MoE layers route and dispatch (unused by dense models)."""

    def non_persistent_dir(self, base: Optional[str]) -> Optional[str]:
        """Where global non-persistent checkpoints live for the checkpoint folder `base` (--save or --load):
        --non-persistent-global-ckpt-dir when given, else base/non_persistent (Megatron-LM's); None without
        --non-persistent-ckpt-type global."""
        if self.non_persistent_ckpt_type != "global":
            return None
        return self.non_persistent_global_ckpt_dir or (os.path.join(base, NON_PERSISTENT_SUBDIR) if base else None)

    @property
    def non_persistent_save_dir(self) -> Optional[str]:
        """Where this run writes non-persistent checkpoints (None: it writes none)."""
        return self.non_persistent_dir(self.save) if self.save and self.non_persistent_save_interval else None

    @property
    def starts_from_checkpoint(self) -> bool:
        """Whether the run reads a checkpoint before training (`load`, or `pretrained_checkpoint`)."""
        return bool(self.load or self.pretrained_checkpoint)
