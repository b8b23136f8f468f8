"""The verdicts of flag_verdicts.py: Megatron-LM 0.16.1 flags accepted without effect, and flags refused, each
with the reason a user reads (in the log, or as the one line of a refusal; README.md's flag table lists both).

Keys are the first option string of a Megatron-LM argument (its aliases share the verdict). A flag that changes
the model, the data or the optimisation and is not built here is refused; a flag that picks a kernel, an overlap,
a sink, an I/O back-end, or is read only by a feature that is itself refused or by another Megatron-LM program
(inference, RL, BERT/T5/vision), is accepted without effect.
"""
from __future__ import annotations

from megatron_auto.runtime.compat_flags import IO, KERNEL, LAYOUT, SINK, STRAGGLER

INFERENCE = "read only at inference (text generation, Megatron-Core's inference engines), not by pretraining"
OTHER_MODELS = "read only by Megatron-LM's BERT/T5/ICT/retriever/vision programs, not by pretrain_gpt.py"
RL = "read only by --perform-rl-step (reinforcement learning), which is refused"
RESTART = ("NVIDIA's resiliency tools (in-process restart, fault tolerance, ADLR autoresume) are not run here; "
           "a failed rank ends the job and a restart resumes from --load")
RERUN = ("Megatron-LM's rerun state machine (its default --rerun-mode validate_results: re-running an iteration "
         "whose loss is NaN, Inf or spiky to tell a transient fault from a deterministic one) is not run here; "
         "a NaN/Inf loss or gradient stops the run with one line naming the iteration "
         "(--check-for-nan-in-loss-and-grad)")
PRICED_ELSEWHERE = ("; --auto-parallel leaves it out of the plan it prices, while `megatron-auto plan`/`estimate` "
                    "price it for Megatron-LM runs")
CUDA_GRAPHS = KERNEL + " (CUDA graphs replay the same kernels; they are not captured here" + PRICED_ELSEWHERE + ")"
OFFLOAD = "activations stay on the device (and are priced there); offloading moves memory, not math"
FINE_OFFLOAD = OFFLOAD + PRICED_ELSEWHERE
ONE_LOGGER = SINK + " (NVIDIA's one-logger telemetry)"
FP_LOW = "read only with fp8/fp4 training, which is refused"
MUON = "read only by --optimizer muon/dist_muon, which is refused"
CPU_OFFLOAD = "read only by --optimizer-cpu-offload, which is refused"
MAMBA = "Mamba / hybrid (attention + Mamba + MLP) models are not built by this runtime yet"
LINEAR_ATTENTION = "linear (gated delta net) attention layers are not built by this runtime yet"
DSA = "DeepSeek sparse attention (its indexer) is not built by this runtime yet"
TOKENIZER = "not passed to the tokenizer here yet (runtime/tokenizers.py builds Megatron-LM's tokenizer types)"
KITCHEN = "NVIDIA Kitchen quantization is not run by this runtime"
SFT = "supervised fine-tuning data (Megatron-LM's SFT dataset and prompt formats) is not built here"
DIST_CKPT_RESHARDABLE = ("checkpoints already save the distributed optimizer fully reshardable (Megatron-Core "
                         "dist_checkpointing, loadable at any layout)")
VIRTUAL_GROUP = LAYOUT + " (the order in which micro-batches visit virtual stages; each computes the same)"

NO_EFFECT = {
    # model and kernels
    "--cross-entropy-fusion-impl": KERNEL + " (the loss is Megatron's vocab-parallel cross entropy)",
    "--fp16-lm-cross-entropy": "the loss is computed in fp32 (as precise or more)",
    "--use-te-activation-func": KERNEL, "--disable-jit-fuser": KERNEL,
    "--batch-invariant-mode": KERNEL + " (batch-invariant kernels give the same result at any batch size; the "
                                       "math is unchanged)",
    "--enable-cuda-graph": CUDA_GRAPHS, "--external-cuda-graph": CUDA_GRAPHS, "--cuda-graph-warmup-steps": CUDA_GRAPHS,
    "--cuda-graph-impl": CUDA_GRAPHS, "--cuda-graph-scope": CUDA_GRAPHS,
    "--no-clone-scatter-output-in-embedding": "a memory detail of the embedding's output; the values are the same",
    "--distribute-saved-activations": LAYOUT + " (recompute checkpoints split over TP ranks: memory, not math)",
    "--fine-grained-activation-offloading": FINE_OFFLOAD, "--offload-modules": FINE_OFFLOAD,
    "--min-offloaded-tensor-size": FINE_OFFLOAD, "--cpu-offloading-num-layers": OFFLOAD,
    "--mtp-standalone": LAYOUT + " (the MTP modules sit on the last pipeline stage)",
    "--enable-experimental": "Megatron-Core's gate for experimental features; this runtime builds none of them",
    "--te-precision-config-file": FP_LOW, "--first-last-layers-bf16": FP_LOW,
    "--num-layers-at-start-in-bf16": FP_LOW, "--num-layers-at-end-in-bf16": FP_LOW,
    "--fp4-recipe": FP_LOW, "--fp4-param-gather": FP_LOW, "--fp4-quantizer-factory": FP_LOW,
    "--reuse-grad-buf-for-mxfp8-param-ag": FP_LOW, "--keep-fp8-transpose-cache": FP_LOW,
    "--moe-router-padding-for-quantization": FP_LOW, "--moe-router-padding-for-fp8": FP_LOW,
    "--moe-deepep-num-sms": "read only by DeepEP's dispatcher (--moe-enable-deepep is without effect)",
    "--moe-hybridep-num-sms": "read only by HybridEP's dispatcher (the flex dispatcher runs as alltoall here)",
    "--moe-flex-dispatcher-backend": KERNEL + " (the flex dispatcher runs as alltoall here, which moves the same "
                                              "tokens as DeepEP or HybridEP)",
    "--no-fp8-wgrad": FP_LOW,
    "--moe-pad-experts-for-cuda-graph-inference": INFERENCE,
    "--disable-mamba-mem-eff-path": "read only by Mamba layers, which are refused",
    # parallelism and overlap
    "--overlap-param-gather-with-optimizer-step": LAYOUT + " (the weights are gathered as --overlap-param-gather "
                                                           "says; the values are the same)",
    "--no-overlap-p2p-communication": LAYOUT, "--no-align-grad-reduce": LAYOUT, "--no-align-param-gather": LAYOUT,
    "--ddp-num-buckets": LAYOUT, "--ddp-pad-buckets-for-high-nccl-busbw": LAYOUT,
    "--ddp-reduce-scatter-with-fp32-accumulation": "gradients are reduced in fp32 already",
    "--no-gradient-reduce-div-fusion": LAYOUT + " (the gradients are averaged over the data-parallel ranks either way)",
    "--no-scatter-gather-tensors-in-pipeline": LAYOUT,
    "--tp-comm-overlap": LAYOUT + " (Transformer Engine's userbuffer overlap of TP communication)",
    "--no-tp-comm-bulk-wgrad": LAYOUT, "--no-tp-comm-bulk-dgrad": LAYOUT, "--no-tp-comm-overlap-ag": LAYOUT,
    "--no-tp-comm-overlap-rs": LAYOUT, "--tp-comm-overlap-rs-dgrad": LAYOUT, "--no-tp-comm-split-ag": LAYOUT,
    "--no-tp-comm-split-rs": LAYOUT, "--tp-comm-bootstrap-backend": LAYOUT, "--tp-comm-overlap-cfg": LAYOUT,
    "--no-async-tensor-model-parallel-allreduce": LAYOUT,
    "--delay-wgrad-compute": LAYOUT, "--ep-overlap-early-attn-memory-release": LAYOUT,
    "--use-ring-exchange-p2p": LAYOUT, "--defer-embedding-wgrad-compute": LAYOUT, "--wgrad-deferral-limit": LAYOUT,
    "--overlap-p2p-communication-warmup-flush": LAYOUT,
    "--microbatch-group-size-per-virtual-pipeline-stage": VIRTUAL_GROUP,
    "--pipeline-model-parallel-comm-backend": LAYOUT, "--disable-symmetric-registration": LAYOUT,
    "--use-sharp": LAYOUT, "--sharp-enabled-group": LAYOUT, "--create-all-gather-group": LAYOUT,
    "--outer-dp-sharding-strategy": LAYOUT, "--suggested-communication-unit-size": LAYOUT,
    "--enable-full-sharding-in-hsdp": LAYOUT, "--num-distributed-optimizer-instances": LAYOUT,
    "--use-torch-fsdp2": LAYOUT + " (ZeRO-3 layers come from --auto-parallel-space hybrid)",
    "--torch-fsdp2-no-reshard-after-forward": LAYOUT,
    "--hierarchical-context-parallel-sizes": KERNEL + " (context-parallel attention all-gathers K and V here; "
                                                      "read by --cp-comm-type a2a+p2p, which is without effect)",
    "--nccl-communicator-config-path": LAYOUT, "--disable-gloo-process-groups": LAYOUT,
    "--high-priority-stream-groups": LAYOUT, "--symmetric-ar-type": LAYOUT,
    "--distributed-timeout-seconds-after-init": "--distributed-timeout-minutes sets the collective timeout",
    "--local-rank": "the rank comes from torchrun's environment (RANK, LOCAL_RANK)",
    "--lazy-mpu-init": "read only when another program initialises Megatron",
    "--replication": "read only by --non-persistent-ckpt-type local, which is refused",
    "--replication-jump": "read only by --non-persistent-ckpt-type local, which is refused",
    "--replication-factor": "read only by --non-persistent-ckpt-type local, which is refused",
    # checkpoints and data I/O
    "--dist-ckpt-optim-fully-reshardable": DIST_CKPT_RESHARDABLE,
    "--distrib-optim-fully-reshardable-mem-efficient": DIST_CKPT_RESHARDABLE,
    "--no-ckpt-fully-parallel-save": IO, "--no-strict-fsdp-dtensor-load": IO, "--dist-ckpt-save-pre-mcore-014": IO,
    "--use-mp-args-from-checkpoint-args": "read only by --use-checkpoint-args, which is without effect",
    "--no-use-tokenizer-model-from-checkpoint-args": "read only by --use-checkpoint-args, which is without effect",
    "--dataloader-fast-cache-load": IO, "--dataloader-defer-npy-index-mmap": IO, "--disable-msc": IO,
    "--exit-signal-handler-for-dataloader": IO,
    "--mid-level-dataset-surplus": IO + " (the surplus of samples a blend builds; Megatron-Core's default is used)",
    "--trust-remote-code": "no remote code is run: HuggingFace tokenizers load from local files",
    # logging, profiling, resilience
    "--tensorboard-queue-size": SINK, "--no-log-loss-scale-to-tensorboard": SINK, "--log-memory-interval": SINK,
    "--log-device-memory-used": SINK, "--log-max-attention-logit": SINK, "--no-barrier-with-level-1-timing": SINK,
    "--config-logger-dir": SINK, "--use-pytorch-profiler": SINK, "--memory-snapshot-path": SINK,
    "--dump-param-to-param-group-map": SINK, "--save-wgrads-interval": SINK, "--save-dgrads-interval": SINK,
    "--straggler-ctrlr-port": STRAGGLER, "--straggler-minmax-count": STRAGGLER, "--run-workload-inspector-server": SINK,
    "--train-sync-interval": SINK + " (a host-device sync point; the steps are the same)",
    "--no-manual-gc-eval": "Python's garbage collector runs as usual",
    "--no-one-logger": ONE_LOGGER, "--one-logger-project": ONE_LOGGER, "--one-logger-run-name": ONE_LOGGER,
    "--one-logger-async": ONE_LOGGER, "--app-tag-run-name": ONE_LOGGER, "--app-tag-run-version": ONE_LOGGER,
    "--test-mode": "Megatron-Core's real-time self-checks in attention (test_mode) are not run here; the "
                   "training is the same",
    "--rerun-mode": RERUN, "--error-injection-rate": RERUN, "--error-injection-type": RERUN,
    "--check-for-large-grads": RERUN, "--check-for-spiky-loss": RERUN, "--result-rejected-tracker-filename": RERUN,
    "--enable-ft-package": RESTART, "--calc-ft-timeouts": RESTART, "--ft-num-warmup-iters": RESTART,
    "--adlr-autoresume": RESTART, "--adlr-autoresume-interval": RESTART,
    "--inprocess-restart": RESTART, "--inprocess-max-iterations": RESTART,
    "--inprocess-monitor-thread-interval": RESTART, "--inprocess-monitor-process-interval": RESTART,
    "--inprocess-progress-watchdog-interval": RESTART, "--inprocess-heartbeat-interval": RESTART,
    "--inprocess-soft-timeout": RESTART, "--inprocess-hard-timeout": RESTART,
    "--inprocess-heartbeat-timeout": RESTART, "--inprocess-barrier-timeout": RESTART,
    "--inprocess-completion-timeout": RESTART, "--inprocess-last-call-wait": RESTART,
    "--inprocess-termination-grace-time": RESTART, "--inprocess-granularity": RESTART,
    "--inprocess-active-world-size": RESTART, "--inprocess-empty-cuda-cache": RESTART,
    # read only by features that are refused, or by other programs
    "--muon-momentum": MUON, "--muon-no-split-qkv": MUON, "--muon-use-nesterov": MUON, "--muon-scale-mode": MUON,
    "--muon-fp32-matmul-prec": MUON, "--muon-num-ns-steps": MUON, "--muon-tp-mode": MUON,
    "--muon-extra-scale-factor": MUON,
    "--use-torch-optimizer-for-cpu-offload": CPU_OFFLOAD, "--no-pin-cpu-grads": CPU_OFFLOAD,
    "--no-pin-cpu-params": CPU_OFFLOAD,
    "--sft-tokenizer-prompt-format": "read only by --sft, which is refused",
}
"""Flags accepted without effect: flag -> why (named in the log when given)."""

_INFERENCE_FLAGS = (
    "--inference-batch-times-seqlen-threshold", "--max-tokens-to-oom", "--output-bert-embeddings",
    "--bert-embedder-type", "--use-legacy-static-engine", "--inference-max-requests", "--inference-max-seq-length",
    "--inference-max-batch-size", "--inference-dynamic-batching", "--inference-dynamic-batching-buffer-size-gb",
    "--inference-dynamic-batching-paused-buffer-size-gb", "--inference-dynamic-batching-block-size",
    "--inference-dynamic-batching-max-requests", "--inference-dynamic-batching-max-tokens",
    "--inference-dynamic-batching-num-cuda-graphs", "--inference-dynamic-batching-track-paused-request-events",
    "--decode-only-cuda-graphs", "--inference-dynamic-batching-unified-memory-level", "--nccl-all-reduce-for-prefill",
    "--enable-chunked-prefill", "--disable-chunked-prefill", "--inference-dynamic-batching-cuda-graph-max-tokens",
    "--inference-dynamic-batching-cuda-graph-mixed-prefill-count", "--inference-logging-step-interval",
    "--inference-wandb-logging", "--inference-coordinator-port", "--flash-decode", "--inference-fuse-tp-communication",
    "--mlp-chunks-for-prefill")
_RL_FLAGS = (
    "--rl-prompts-per-eval", "--grpo-prompts-per-step", "--grpo-group-size", "--grpo-iterations",
    "--grpo-clamp-eps-lower", "--grpo-clamp-eps-upper", "--grpo-kl-beta", "--grpo-entropy-term-weight",
    "--grpo-filter-groups-with-same-reward", "--langrl-inference-server-type",
    "--langrl-inference-server-conversation-template", "--langrl-external-server", "--langrl-env-config",
    "--rl-default-temperature", "--rl-default-top-p", "--rl-default-top-k", "--rl-offload-optimizer-during-inference",
    "--rl-offload-kv-cache-during-training", "--rl-remove-kv-cache-during-training", "--rl-reset-cuda-graphs",
    "--rl-partial-rollouts", "--rl-inference-logprobs-is-correction", "--rl-importance-sampling-truncation-coef",
    "--rl-use-sequence-packing", "--rl-sequence-packing-max-sequences-per-bin", "--rl-sequence-packing-algo",
    "--rl-training-cuda-graphs", "--rl-inference-tensor-model-parallel-size",
    "--rl-inference-pipeline-model-parallel-size", "--rl-inference-expert-model-parallel-size",
    "--rl-inference-expert-tensor-model-parallel-size", "--rl-inference-model-unified-memory-level",
    "--rl-offload-inference-model-weights-when-idle", "--refit-method", "--rl-verify-model-weights-swap",
    "--rl-parallel-generation-tasks", "--rl-skip-bos-token")
_OTHER_MODEL_FLAGS = (
    "--relative-attention-num-buckets", "--relative-attention-max-distance", "--bert-no-binary-head",
    "--decoder-num-layers", "--decoder-seq-length", "--mask-prob", "--short-seq-prob", "--sample-rate",
    "--ict-head-size", "--biencoder-projection-dim", "--biencoder-shared-query-context-model", "--ict-load",
    "--bert-load", "--titles-data-path", "--query-in-block-prob", "--use-one-sent-docs", "--evidence-data-path",
    "--retriever-report-topk-accuracies", "--retriever-score-scaling", "--block-data-path", "--embedding-path",
    "--indexer-batch-size", "--indexer-log-interval", "--num-classes", "--img-h", "--img-w", "--num-channels",
    "--patch-dim", "--classes-fraction", "--data-per-class-fraction", "--no-data-sharding", "--head-lr-mult",
    "--vision-pretraining", "--vision-pretraining-type", "--vision-backbone-type", "--swin-backbone-type",
    "--mask-type", "--mask-factor", "--iter-per-epoch", "--dino-local-img-size", "--dino-local-crops-number",
    "--dino-head-hidden-size", "--dino-bottleneck-size", "--dino-freeze-last-layer", "--dino-norm-last-layer",
    "--dino-warmup-teacher-temp", "--dino-teacher-temp", "--dino-warmup-teacher-temp-epochs")
NO_EFFECT.update({flag: INFERENCE for flag in _INFERENCE_FLAGS})
NO_EFFECT.update({flag: RL for flag in _RL_FLAGS})
NO_EFFECT.update({flag: OTHER_MODELS for flag in _OTHER_MODEL_FLAGS})

NOT_BUILT = "not built by this runtime yet"
REFUSED = {
    # Megatron-LM's ModelOpt arguments (megatron/post_training/arguments.py, added beside arguments.py's parser by
    # its post-training entry points; Megatron-LM's functional test gpt3_mcore_te_tp2_pp1_modelopt_distill_resume)
    "--export-te-mcore-model": ("ModelOpt's export of a TE model (Megatron-LM's post-training arguments) is not run "
                                "here"),
    # model math not built here
    "--openai-gelu": "the tanh-approximated (OpenAI) GELU: " + NOT_BUILT + " (the MLP runs the exact GELU)",
    "--onnx-safe": "the ONNX-exportable GELU/embedding variants: " + NOT_BUILT,
    "--use-fused-weighted-squared-relu": "the weighted squared-ReLU activation: " + NOT_BUILT,
    "--no-rope-freq": "skipping RoPE on some layers: " + NOT_BUILT,
    "--mrope-section": "multimodal RoPE sections: " + NOT_BUILT,
    "--qk-l2-norm": "L2-normalised queries and keys: " + NOT_BUILT,
    "--qk-clip": "QK-clip (capping attention logits by rescaling Q/K weights): " + NOT_BUILT,
    "--qk-clip-alpha": "QK-clip: " + NOT_BUILT, "--qk-clip-threshold": "QK-clip: " + NOT_BUILT,
    "--attention-output-gate": "the gated attention output: " + NOT_BUILT,
    "--experimental-attention-variant": ("experimental attention variants: " + NOT_BUILT + " (Megatron-Core's "
                                         "gated_delta_net also needs the flash-linear-attention Triton kernels)"),
    "--dsa-indexer-n-heads": DSA, "--dsa-indexer-head-dim": DSA, "--dsa-indexer-topk": DSA,
    "--dsa-indexer-loss-coeff": DSA, "--dsa-indexer-use-sparse-loss": DSA,
    "--linear-conv-kernel-dim": LINEAR_ATTENTION, "--linear-key-head-dim": LINEAR_ATTENTION,
    "--linear-value-head-dim": LINEAR_ATTENTION, "--linear-num-key-heads": LINEAR_ATTENTION,
    "--linear-num-value-heads": LINEAR_ATTENTION, "--linear-attention-freq": LINEAR_ATTENTION,
    "--fp32-residual-connection": "an fp32 residual stream under bf16/fp16: " + NOT_BUILT,
    "--apply-residual-connection-post-layernorm": "the residual taken after the LayerNorm: " + NOT_BUILT,
    "--embedding-init-method-std": "a separate initialisation std for the embedding: " + NOT_BUILT,
    "--no-initialization": "skipping weight initialisation is not run here (weights are always initialised)",
    "--data-parallel-random-init": "different initial weights per data-parallel rank are not run here",
    "--apply-wd-to-qk-layernorm": "weight decay on the q/k LayerNorms is not run here (norms are not decayed)",
    "--no-weight-decay-cond-type": "another rule for which parameters are decayed is not run here",
    "--is-hybrid-model": MAMBA, "--mamba-state-dim": MAMBA, "--mamba-head-dim": MAMBA, "--mamba-num-groups": MAMBA,
    "--mamba-num-heads": MAMBA, "--hybrid-attention-ratio": MAMBA, "--hybrid-mlp-ratio": MAMBA,
    "--hybrid-override-pattern": MAMBA,
    "--spec": "a custom layer spec module is not loaded here (the runtime builds its own GPT layer specs)",
    "--yaml-cfg": "a YAML config in place of the flags is not read here: give the flags",
    "--heterogeneous-layers-config-path": "heterogeneous (per-layer different) transformer blocks: " + NOT_BUILT,
    "--heterogeneous-layers-config-encoded-json": "heterogeneous (per-layer different) transformer blocks: "
                                                  + NOT_BUILT,
    "--use-legacy-models": "Megatron-LM's legacy (non-Megatron-Core) models are not built here",
    "--fp4-format": "fp4 training needs Transformer Engine's fp4 recipes, which this runtime does not run",
    "--use-kitchen-attention": KITCHEN, "--kitchen-attention-backend": KITCHEN,
    "--kitchen-config-file": KITCHEN, "--kitchen-recipe-number": KITCHEN,
    "--hybrid-context-parallel": "hybrid context parallel (a CP size per sequence length) is not run here",
    "--max-seqlen-per-dp-cp-rank": "hybrid context parallel (a CP size per sequence length) is not run here",
    "--moe-extended-tp": "MoE extended tensor parallel is not run here: give --expert-tensor-parallel-size",
    "--moe-shared-expert-gate": "the shared expert's gate: " + NOT_BUILT,
    "--moe-enable-routing-replay": "replaying recorded expert routes (for RL) is not run here",
    "--moe-router-force-load-balancing": "forced balanced routing (random routes, for benchmarks) is not run here",
    "--moe-apply-probs-on-input": "router probabilities applied to the experts' input: " + NOT_BUILT,
    "--moe-latent-size": "MoE layers working in a projected latent space: " + NOT_BUILT,
    "--moe-use-upcycling": "upcycling a dense checkpoint into a MoE model is not run here",
    "--moe-upcycling-granularity": "upcycling a dense checkpoint into a MoE model is not run here",
    "--fake-process-group": "a fake process group (no communication) is not run here",
    # data, tokenizer, training loop
    "--sft": SFT,
    "--data-args-path": "reading --data-path from a file is not run here: give --data-path",
    "--per-split-data-args-path": "reading the split paths from a file is not run here: give --train-data-path ...",
    "--per-dataset-sequences-path": "per-dataset sequence counts from a file are not read here",
    "--object-storage-cache-path": "datasets in object storage are not read here (local files only)",
    "--allow-ambiguous-pad-tokens": "not passed to Megatron-Core's GPTDataset here yet",
    "--phase-transition-iterations": "data phases switched at given iterations are not run here",
    "--multiple-validation-sets": "validation over several sets is not run here (one validation split)",
    "--full-validation": "validation over the whole split is not run here (--eval-iters batches)",
    "--skip-train": "evaluation without training is not run here",
    "--iterations-to-skip": "skipping given iterations' batches is not run here",
    "--decrease-batch-size-if-needed": "a global batch lowered to fit the data-parallel size is not run here: "
                                       "give a --global-batch-size divisible by micro-batch x data-parallel size",
    "--perform-rl-step": "reinforcement learning (GRPO) is not run here",
    "--vocab-extra-ids": TOKENIZER, "--tokenizer-metadata": TOKENIZER, "--tokenizer-special-tokens": TOKENIZER,
    "--legacy-tokenizer": TOKENIZER, "--tiktoken-special-tokens": TOKENIZER,
    "--tokenizer-sentencepiece-legacy": TOKENIZER, "--tokenizer-hf-use-fast": TOKENIZER,
    # Megatron-LM's own deprecated flags, refused with its own messages
    "--batch-size": "--batch-size argument is no longer valid, use --micro-batch-size instead (Megatron-LM's words)",
    "--warmup": "--warmup argument is no longer valid, use --lr-warmup-fraction instead (Megatron-LM's words)",
    "--model-parallel-size": ("--model-parallel-size is no longer valid, use --tensor-model-parallel-size instead "
                              "(Megatron-LM's words)"),
    "--checkpoint-activations": ("--checkpoint-activations is no longer valid, use --recompute-activations, or, "
                                 "for more control, --recompute-granularity and --recompute-method "
                                 "(Megatron-LM's words)"),
}
"""Flags refused before any work: flag -> why (the one line on stderr, exit status 2)."""
