#!/bin/bash
# Qwen3-0.6B's Megatron-LM model flags (examples/post_training/modelopt/conf/Qwen/Qwen3-0.6B.sh),
# shrunk (sizes, data) for 4 CPU ranks, with a pretraining block: a head width (--kv-channels)
# twice hidden / heads, as Qwen3-0.6B has, and per-head q/k norms.
# Usage: qwen3_0p6b.sh CHECKPOINT_DIR TOKENIZER_DIR DATA_PREFIX (or HF_MODEL_CKPT=TOKENIZER_DIR).

CHECKPOINT_PATH=$1
DATA_PATH=$3

if [ -z ${HF_MODEL_CKPT} ]; then
    HF_MODEL_CKPT=$2  # a local HuggingFace tokenizer directory (the original: Qwen/Qwen3-0.6B from the Hub)
    TOKENIZER_MODEL=$2
else
    TOKENIZER_MODEL=${HF_MODEL_CKPT}
fi

MODEL_ARGS=" \
    --save-interval 100000 \
    --micro-batch-size 1 \
    --bf16 \
    --no-masked-softmax-fusion \
    --disable-bias-linear \
    --position-embedding-type rope \
    --no-rope-fusion \
    --normalization RMSNorm \
    --swiglu \
    --num-layers 4 \
    --hidden-size 64 \
    --ffn-hidden-size 192 \
    --num-attention-heads 4 \
    --group-query-attention \
    --num-query-groups 2 \
    --kv-channels 32 \
    --qk-layernorm \
    --seq-length 64 \
    --max-position-embeddings 640 \
    --tokenizer-type HuggingFaceTokenizer \
    --make-vocab-size-divisible-by 1187 \
    --use-mcore-models \
    --rotary-percent 1.0 \
    --rotary-base 1000000 \
    --no-bias-swiglu-fusion \
"

TRAINING_ARGS=" \
    --global-batch-size 4 \
    --train-iters 20 \
    --lr 1e-3 \
    --min-lr 1e-4 \
    --lr-warmup-iters 2 \
    --lr-decay-style cosine \
    --weight-decay 0.1 \
    --clip-grad 1.0 \
    --eval-iters 2 \
    --eval-interval 10 \
    --log-interval 1 \
"

MODEL_PARALLEL_ARGS=" \
    --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 2 \
    --sequence-parallel \
"

torchrun --nproc_per_node 4 tools/pretrain_gpt.py \
    ${MODEL_ARGS} ${TRAINING_ARGS} ${MODEL_PARALLEL_ARGS} \
    --data-path ${DATA_PATH} --tokenizer-model ${TOKENIZER_MODEL} --split 99,1,0 \
    --save ${CHECKPOINT_PATH} --load ${CHECKPOINT_PATH}
