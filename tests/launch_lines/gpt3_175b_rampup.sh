#!/bin/bash
# Megatron-LM examples/pretrain_gpt3_175B.sh (releases before examples/gpt3/), shrunk (sizes, data) for
# 4 CPU ranks: a batch-size ramp-up, a sample-based schedule and a weighted blend of three datasets.
# The original runs `python -u pretrain_gpt.py $@ ${options}` under srun (one task per GPU); here the
# same command line runs under torchrun on 4 processes.
# Beyond sizes: --initial-loss-scale 65536 (as in gpt3_175b_distributed.sh).
# Usage: gpt3_175b_rampup.sh CHECKPOINT_DIR TENSORBOARD_DIR VOCAB MERGES DATASET_1 DATASET_2 DATASET_3

CHECKPOINT_DIR=$1
TENSORBOARD_DIR=$2
VOCAB_FILE=$3
MERGE_FILE=$4

DATASET_1=$5
DATASET_2=$6
DATASET_3=$7
DATASET="0.2 ${DATASET_1} 0.3 ${DATASET_2} 0.5 ${DATASET_3}"


options=" \
	--tensor-model-parallel-size 2 \
	--pipeline-model-parallel-size 2 \
        --num-layers 4 \
        --hidden-size 64 \
        --num-attention-heads 4 \
        --seq-length 64 \
        --max-position-embeddings 64 \
	--micro-batch-size 1 \
	--global-batch-size 8 \
	--rampup-batch-size 4 4 32 \
	--train-samples 160 \
       	--lr-decay-samples 140 \
        --lr-warmup-samples 8 \
        --lr 1.0e-3 \
	--min-lr 1.0e-4 \
        --lr-decay-style cosine \
        --log-interval 1 \
        --eval-iters 2 \
        --eval-interval 20 \
	--data-path ${DATASET} \
	--vocab-file ${VOCAB_FILE} \
	--merge-file ${MERGE_FILE} \
	--save-interval 1000 \
	--save ${CHECKPOINT_DIR} \
	--load ${CHECKPOINT_DIR} \
	--split 98,2,0 \
	--clip-grad 1.0 \
	--weight-decay 0.1 \
	--adam-beta1 0.9 \
	--adam-beta2 0.95 \
	--init-method-std 0.006 \
	--tensorboard-dir ${TENSORBOARD_DIR} \
	--fp16 \
	--initial-loss-scale 65536 "


torchrun --nproc_per_node 4 tools/pretrain_gpt.py ${options}
