"""The --help text of pretrain_gpt.py (tools/pretrain_gpt.py, megatron_auto.train): what it runs and how."""

DESCRIPTION = """Drop-in for Megatron-LM's pretrain_gpt.py: the same flags, plus `--auto-parallel`.

Four CPU ranks over gloo, tiny GPT, the shipped corpus, parallelism chosen by the planner:

    .venv/bin/python tools/preprocess_data.py --input data/tiny_corpus.jsonl \
        --output-prefix data/generated/tiny --tokenizer-type ByteTokenizer
    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --nproc_per_node 4 tools/pretrain_gpt.py \
        --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64 \
        --max-position-embeddings 64 --micro-batch-size 2 --global-batch-size 16 --train-iters 60 \
        --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 5 \
        --data-path data/generated/tiny_text_document --tokenizer-type ByteTokenizer \
        --log-interval 5 --eval-interval 30 --eval-iters 2 --auto-parallel

The same job with the parallelism spelled out (what Megatron-LM users type today):

    ... tools/pretrain_gpt.py <same flags, without --auto-parallel> --tensor-model-parallel-size 2 \
        --pipeline-model-parallel-size 2

Other forms: `--mock-data --tokenizer-type NullTokenizer --vocab-size 256` instead of a
dataset; `--auto-parallel-plan plan.json` runs a saved plan (`megatron-auto plan --out`);
`--bf16`, or `--fp16` with Megatron-LM's loss-scaling flags, trains in 16-bit with fp32 master
weights; `--auto-parallel-profile cluster.json model.json` prices the search from the files that
`megatron-auto profile-cluster` and `profile-model` wrote (the analytic model otherwise);
`--save DIR --save-interval N` / `--load DIR` checkpoint through Megatron-Core's
dist_checkpointing, and a run may resume under another plan or world size. On GPUs, the
same command under torchrun uses NCCL, detects the cluster preset from the GPU name and prices
WORLD_SIZE / LOCAL_WORLD_SIZE nodes of LOCAL_WORLD_SIZE GPUs (torchrun's node shape).

Kernels: `--attention-backend` (Megatron-LM's flash/fused/unfused/local/auto) and
`--optimizer-impl fused|foreach|auto` choose the core attention and torch Adam's step
(auto: SDPA, fused Adam and Megatron's bias fusions on GPUs; Megatron's unfused attention
and foreach Adam on CPU); one log line names what runs, and `--auto-parallel` prices it.

Megatron-LM's own launch scripts run as they are (tests/launch_lines/ holds shrunk copies): sample-based
schedules (`--train-samples`, `--lr-decay-samples`, `--lr-warmup-samples`), growing batches
(`--rampup-batch-size`, `--step-batch-size-schedule`: runtime/batch_schedule.py), `--kv-channels`,
`--add-qkv-bias`, `--qk-layernorm`, `--apply-layernorm-1p`, `--decoupled-lr`, `--calculate-per-token-loss`,
`--exit-duration-in-mins`, `--exit-signal-handler`, `--no-load-optim`, NaN checks, evaluations that walk through
the validation split and a validation pass after the last iteration keep Megatron-LM's meaning; `--tensorboard-dir` and
`--wandb-*` write scalars when their packages import; MoE models (`--num-experts`, `--moe-*`) train with
Megatron-Core's MoE layer under `--expert-model-parallel-size` / `--expert-tensor-parallel-size` (chosen
by the planner under --auto-parallel); multi-latent attention (`--multi-latent-attention` and its shape and
YaRN flags) runs Megatron-Core's MLASelfAttention; multi-token prediction (`--mtp-num-layers`,
`--mtp-loss-scaling-factor`) builds Megatron-Core's MTP modules on the last stage; `--context-parallel-size`
splits sequences on the flash core (dense layers without MLA); fp8 is refused before any work with one line
saying why; kernel, logging and I/O flags are accepted and named in the log as without effect, with the reason.
Every flag of Megatron-LM 0.16.1's parser is honoured, without effect or refused (megatron_auto/runtime/
compat_flags.py, megatron_auto/train/flag_verdicts_tables.py; README.md's table lists them).

Parallelism flags given beside `--auto-parallel` become constraints on the search;
`--micro-batch-size` is then the planner's to choose. A user error (a plan for another
world size or model, a bad flag combination) prints one line on stderr and exits 2.

Each rank logs its device memory at start and, after iteration 2, its measured peak against
the cost model's peak for its pipeline stage (runtime/memory_check.py). An out-of-memory
error in the first two iterations is agreed on by all ranks (runtime/oom.py): under
`--auto-parallel` the job re-plans under a budget lowered by the overshoot and starts again;
otherwise it writes the re-planned plan to `auto_parallel_replan.json` (in `--save` or the
working directory) and exits 2 with one line naming it (runtime/fit.py).
"""
