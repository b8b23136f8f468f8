#!/bin/bash
# The GPU measurements that docs/benchmarks.md is waiting for, in steps that each fit the
# 10 minutes a command may run on the lent GPU machine. From the repository root there:
#
#   bash validation/gpu_session.sh smoke        # 3 minutes: the distributed optimizer with its weight all-gather in the
#                                               # next forward (on by default with CUDA): trains, saves masters equal to
#                                               # its weights over several gradient buckets, resumes exactly; then a
#                                               # DeepSeek-style model (MLA, MoE with an overlapped shared expert,
#                                               # one MTP module) trains in bf16 on CUDA
#   bash validation/gpu_session.sh speed        # bench_gpu_vs_torch (auto, then --grad-accumulation-fusion off) and
#                                               # profile_gpu_step --time-grad-accumulation-fusion
#   bash validation/gpu_session.sh host         # 3 minutes: measure_host_floor, the host seconds per layer pass of the
#                                               # runtime's step per structure, core attention and recompute (all 18
#                                               # cases; `moe`: GPT-OSS's 16 local experts, issue 37's next measure)
#   bash validation/gpu_session.sh memory       # 1 minute: check_layer_memory, one layer's saved bytes against the
#                                               # activation formula for GPT, grouped-query/RoPE and q/k-norm layers
#   bash validation/gpu_session.sh validate-a   # validate_cost_model: micro-batch 1/2/4/8 without recompute, + the pick
#   bash validation/gpu_session.sh validate-b   # validate_cost_model: selective and full recompute, + the pick
#   bash validation/gpu_session.sh gemm         # 2 minutes: gemm_rates, dense bf16 and FP8, grouped bf16 (MoE experts)
#                                               # and a sustained 60 s GEMM against the GEMM law (keep gemm_rates.jsonl
#                                               # as data/reference/h100/gemm_rates_<date>.jsonl)
#
# megatron-core is installed from .whl/ when it does not import (the machine has no index).
# Logs and the docs/benchmarks.md that each step rewrites land in $OUT (default ./gpu_out);
# keep the validation's run lines as data/reference/h100/validation_runs_<date>.log, from which
# `python3 -m validation.validate_cost_model --measured-log FILE` rebuilds the section without a GPU; keep
# host_floor.json as data/reference/h100/host_floor_<date>.json for fitting the cost model's host term.
set -u
STEP=${1:-}
case "$STEP" in
    smoke|speed|host|memory|validate-a|validate-b|gemm) ;;
    *) echo "usage: bash validation/gpu_session.sh smoke|speed|host|memory|validate-a|validate-b|gemm (got '$STEP')" >&2
       exit 2 ;;
esac
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
if ! python3 -c "import megatron.core" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl || exit 1
    export PYTHONPATH=$PWD/.site:$PWD
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}:$PWD PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
cp docs/benchmarks.md "$OUT/benchmarks.md"
git rev-parse --short HEAD > "$OUT/commit.txt" 2>/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1

run() {  # run SECONDS LOG COMMAND...: one measurement, its exit status appended to its log
    local seconds=$1 log=$2
    shift 2
    timeout "$seconds" "$@" > "$OUT/$log" 2>&1
    echo "$* -> rc=$?" | tee -a "$OUT/$log"
}

# 52M parameters: more than one 40M-parameter gradient bucket (patches/fully_reshardable_bucket_offsets.py).
SMOKE_JOB="--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 256 --max-position-embeddings 256
    --micro-batch-size 2 --global-batch-size 8 --train-iters 6 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer
    --vocab-size 1024 --log-interval 1 --bf16 --use-distributed-optimizer --save-interval 3"
# DeepSeek-V3's kinds of layer at a small width: multi-latent attention with both latents and their norms,
# every MLP a MoE of 8 experts (top-2) with a shared expert on its own CUDA stream (--moe-shared-expert-overlap),
# the MoE layers recomputed (--moe-layer-recompute), one multi-token-prediction module.
DEEPSEEK_JOB="--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 256 --max-position-embeddings 256
    --micro-batch-size 2 --global-batch-size 8 --train-iters 6 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer
    --vocab-size 1024 --log-interval 1 --bf16 --position-embedding-type rope --normalization RMSNorm --swiglu
    --disable-bias-linear --untie-embeddings-and-output-weights --ffn-hidden-size 2816 --multi-latent-attention
    --q-lora-rank 384 --kv-lora-rank 256 --qk-head-dim 64 --qk-pos-emb-head-dim 32 --v-head-dim 64 --qk-layernorm
    --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 512 --moe-shared-expert-intermediate-size 512
    --moe-token-dispatcher-type alltoall --moe-shared-expert-overlap --moe-layer-recompute --mtp-num-layers 1
    --use-distributed-optimizer"

case "$STEP" in
    smoke)
        rm -rf "$OUT/smoke_ckpt"
        # shellcheck disable=SC2086
        run 150 smoke_full.log python3 tools/pretrain_gpt.py $SMOKE_JOB --save "$OUT/smoke_ckpt"
        # shellcheck disable=SC2086
        run 150 smoke_resumed.log python3 tools/pretrain_gpt.py $SMOKE_JOB --load "$OUT/smoke_ckpt" --ckpt-step 3
        for step in 3 6; do  # every saved fp32 master rounds to its saved bf16 weight
            run 120 "smoke_masters_$step.log" python3 -m validation.check_checkpoint_masters "$OUT/smoke_ckpt/iter_000000$step"
        done
        for log in smoke_full.log smoke_resumed.log; do  # iterations 4-6 of the two must match
            echo "$log: $(grep -c "all-gathered during the next forward" "$OUT/$log") overlap line(s)"
            grep -oE "iteration +[0-9]+/|lm loss: [^ |]+" "$OUT/$log" | paste - -
        done
        # auto turns the torch weight-gradient stand-in on once its start-up check passes on this GPU
        grep -ho "weight-gradient accumulation fusion [^,]*" "$OUT/smoke_full.log"
        # shellcheck disable=SC2086
        run 200 smoke_deepseek.log python3 tools/pretrain_gpt.py $DEEPSEEK_JOB
        grep -oE "iteration +[0-9]+/|lm loss: [^ |]+|mtp_1 loss: [^ |]+" "$OUT/smoke_deepseek.log" | paste - - -
        ;;
    speed)
        run 170 bench_auto.log python3 -m validation.bench_gpu_vs_torch --benchmarks "$OUT/benchmarks.md"
        run 170 bench_wgrad_off.log python3 -m validation.bench_gpu_vs_torch --grad-accumulation-fusion off
        run 220 profile.log python3 -m validation.profile_gpu_step --time-grad-accumulation-fusion --iters 4
        grep -h -A4 "^| model\|accumulation fusion |" "$OUT"/bench_*.log "$OUT/profile.log"
        ;;
    host)
        run 450 host_floor.log python3 -m validation.measure_host_floor --out "$OUT/host_floor.json"
        grep "^|" "$OUT/host_floor.log"
        ;;
    memory)
        run 200 layer_memory.log python3 -m validation.check_layer_memory --out "$OUT/layer_memory.json"
        grep "^|" "$OUT/layer_memory.log"
        ;;
    validate-a)
        run 560 validate_a.log python3 -m validation.validate_cost_model --plans "rc=none" \
            --results "$OUT/validate_a.json" --benchmarks "$OUT/benchmarks.md"
        grep -E "^mbs|pick" "$OUT/validate_a.log"
        ;;
    validate-b)
        run 560 validate_b.log python3 -m validation.validate_cost_model --plans "rc=selective" "rc=full" \
            --results "$OUT/validate_b.json" --benchmarks "$OUT/benchmarks.md"
        grep -E "^mbs|pick" "$OUT/validate_b.log"
        ;;
    gemm)
        run 300 gemm_rates.log python3 -m validation.gemm_rates --out "$OUT/gemm_rates.jsonl" --seconds 60
        grep "^|" "$OUT/gemm_rates.log"
        ;;
esac
