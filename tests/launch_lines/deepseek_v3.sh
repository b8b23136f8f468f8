#!/bin/bash
# DeepSeek-V3's architecture through Megatron-LM's DeepSeek-R1 model flags
# (examples/post_training/modelopt/conf/deepseek-ai/DeepSeek-R1.sh; R1 is V3's architecture), shrunk (sizes,
# data) for 4 CPU ranks, with a pretraining block and V3's one multi-token prediction module (arXiv 2412.19437,
# Sec. 2.2): multi-latent attention with a query LoRA, a dense first layer, then MoE layers with sigmoid
# scores, auxiliary-loss-free balancing (expert bias), group-limited routing, a shared expert overlapped with
# the dispatch, and selective recomputation of core attention and the MoE layers.
# Usage: deepseek_v3.sh CHECKPOINT_DIR TOKENIZER_DIR DATA_PREFIX (or HF_MODEL_CKPT=TOKENIZER_DIR).

CHECKPOINT_PATH=$1
DATA_PATH=$3

if [ -z ${HF_MODEL_CKPT} ]; then
    HF_MODEL_CKPT=$2  # a local HuggingFace tokenizer directory (the original: deepseek-ai/DeepSeek-R1)
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
    --untie-embeddings-and-output-weights \
    --position-embedding-type rope \
    --no-rope-fusion \
    --normalization RMSNorm \
    --swiglu \
    --num-layers 4 \
    --hidden-size 64 \
    --ffn-hidden-size 192 \
    --num-attention-heads 4 \
    --kv-channels 16 \
    --multi-latent-attention \
    --kv-lora-rank 32 \
    --v-head-dim 16 \
    --q-lora-rank 48 \
    --qk-head-dim 16 \
    --qk-layernorm \
    --qk-pos-emb-head-dim 8 \
    --num-experts 8 \
    --moe-layer-freq [0]*1+[1]*3 \
    --moe-ffn-hidden-size 32 \
    --moe-router-dtype fp32 \
    --moe-router-score-function sigmoid \
    --moe-router-bias-update-rate 1e-3 \
    --moe-router-enable-expert-bias \
    --moe-router-topk 4 \
    --moe-router-num-groups 4 \
    --moe-router-group-topk 2 \
    --moe-router-pre-softmax \
    --moe-router-topk-scaling-factor 2.5 \
    --moe-shared-expert-overlap \
    --moe-shared-expert-intermediate-size 32 \
    --moe-aux-loss-coeff 1e-4 \
    --moe-router-load-balancing-type seq_aux_loss \
    --moe-token-dispatcher-type alltoall \
    --moe-token-drop-policy probs \
    --mtp-num-layers 1 \
    --mtp-loss-scaling-factor 0.1 \
    --seq-length 64 \
    --max-position-embeddings 64 \
    --tokenizer-type HuggingFaceTokenizer \
    --make-vocab-size-divisible-by 1280 \
    --use-mcore-models \
    --rotary-base 10000 \
    --rotary-percent 1.0 \
    --rotary-scaling-factor 40 \
    --mscale 1.0 \
    --mscale-all-dim 1.0 \
    --recompute-activations \
    --moe-layer-recompute \
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
