#!/bin/bash
# DeepSeek-V2-Lite's Megatron-LM model flags (examples/post_training/modelopt/conf/deepseek-ai/DeepSeek-V2-Lite.sh),
# shrunk (sizes, data) for 4 CPU ranks, with a pretraining block: multi-latent attention with YaRN and latent
# norms, a dense first layer, then MoE layers with a shared expert, pre-softmax top-k and the sequence aux loss.
# Usage: deepseek_v2_lite.sh CHECKPOINT_DIR TOKENIZER_DIR DATA_PREFIX (or HF_MODEL_CKPT=TOKENIZER_DIR).

CHECKPOINT_PATH=$1
DATA_PATH=$3

if [ -z ${HF_MODEL_CKPT} ]; then
    HF_MODEL_CKPT=$2  # a local HuggingFace tokenizer directory (the original: deepseek-ai/DeepSeek-V2-Lite)
    TOKENIZER_MODEL=$2
else
    TOKENIZER_MODEL=${HF_MODEL_CKPT}
fi

MODEL_ARGS=" \
    --save-interval 100000 \
    --attention-dropout 0.0 \
    --hidden-dropout 0.0 \
    --micro-batch-size 1 \
    --bf16 \
    --no-masked-softmax-fusion \
    --disable-bias-linear \
    --untie-embeddings-and-output-weights \
    --position-embedding-type rope \
    --no-rope-fusion \
    --normalization RMSNorm \
    --norm-epsilon 1e-6 \
    --swiglu \
    --num-layers 4 \
    --hidden-size 64 \
    --ffn-hidden-size 192 \
    --num-attention-heads 4 \
    --kv-channels 16 \
    --multi-latent-attention \
    --kv-lora-rank 32 \
    --v-head-dim 16 \
    --qk-head-dim 16 \
    --qk-layernorm \
    --qk-pos-emb-head-dim 8 \
    --num-experts 4 \
    --moe-layer-freq ([0]+[1]*3) \
    --moe-ffn-hidden-size 48 \
    --moe-grouped-gemm \
    --moe-router-score-function softmax \
    --moe-router-topk 2 \
    --moe-router-topk-scaling-factor 1.0 \
    --moe-router-pre-softmax \
    --moe-shared-expert-intermediate-size 96 \
    --moe-aux-loss-coeff 1e-3 \
    --moe-token-dispatcher-type alltoall \
    --moe-token-drop-policy probs \
    --moe-router-load-balancing-type seq_aux_loss \
    --seq-length 64 \
    --max-position-embeddings 64 \
    --tokenizer-type HuggingFaceTokenizer \
    --make-vocab-size-divisible-by 1187 \
    --attention-softmax-in-fp32 \
    --use-mcore-models \
    --rotary-percent 1.0 \
    --rotary-base 10000 \
    --rotary-scaling-factor 40 \
    --mscale 0.707 \
    --mscale-all-dim 0.707 \
    --sequence-parallel \
"

TRAINING_ARGS=" \
    --global-batch-size 4 \
    --train-iters 14 \
    --lr 1e-3 \
    --min-lr 1e-4 \
    --lr-warmup-iters 2 \
    --lr-decay-style cosine \
    --weight-decay 0.1 \
    --clip-grad 1.0 \
    --eval-iters 2 \
    --eval-interval 7 \
    --log-interval 1 \
"

MODEL_PARALLEL_ARGS=" \
    --tensor-model-parallel-size 2 \
    --expert-model-parallel-size 2 \
"

torchrun --nproc_per_node 4 tools/pretrain_gpt.py \
    ${MODEL_ARGS} ${TRAINING_ARGS} ${MODEL_PARALLEL_ARGS} \
    --data-path ${DATA_PATH} --tokenizer-model ${TOKENIZER_MODEL} --split 99,1,0 \
    --save ${CHECKPOINT_PATH} --load ${CHECKPOINT_PATH}
