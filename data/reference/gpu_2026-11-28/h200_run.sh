#!/bin/bash
# Device call 1: install, bench vs torch, smoke (bf16 pretrain_gpt, deepseek), layer memory.
set -u
T0=$(date +%s)
G=/tmp/g; mkdir -p $G
pack() { tar czf $OUT/g.tgz --exclude=./ck -C $G . 2>/dev/null; }
left() { echo $(( ${BUDGET:-330} - ($(date +%s) - T0) )); }
step() { # step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  local l=$(left); if [ $l -lt 20 ]; then echo "SKIP $name (left $l)"; return; fi
  [ $secs -gt $l ] && secs=$l
  local s=$(date +%s)
  timeout $secs "$@" > $G/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - s ))s"; tail -n ${TAILN:-15} $G/$name.log; pack
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl && export PYTHONPATH=$PWD/.site:$PWD || exit 1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
git rev-parse --short HEAD 2>/dev/null
TAILN=12 step bench 170 python3 tools/bench_gpu_vs_torch.py --benchmarks $G/benchmarks.md
J="--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 256 --max-position-embeddings 256
 --micro-batch-size 2 --global-batch-size 8 --train-iters 6 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer
 --vocab-size 1024 --log-interval 1 --bf16 --use-distributed-optimizer --save-interval 3"
TAILN=10 step smoke_full 90 python3 tools/pretrain_gpt.py $J --save $G/ck
D="--num-layers 4 --hidden-size 1024 --num-attention-heads 8 --seq-length 256 --max-position-embeddings 256
 --micro-batch-size 2 --global-batch-size 8 --train-iters 6 --lr 1e-3 --mock-data --tokenizer-type NullTokenizer
 --vocab-size 1024 --log-interval 1 --bf16 --position-embedding-type rope --normalization RMSNorm --swiglu
 --disable-bias-linear --untie-embeddings-and-output-weights --ffn-hidden-size 2816 --multi-latent-attention
 --q-lora-rank 384 --kv-lora-rank 256 --qk-head-dim 64 --qk-pos-emb-head-dim 32 --v-head-dim 64 --qk-layernorm
 --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 512 --moe-shared-expert-intermediate-size 512
 --moe-token-dispatcher-type alltoall --moe-shared-expert-overlap --moe-layer-recompute --mtp-num-layers 1
 --use-distributed-optimizer"
TAILN=8 step smoke_deepseek 100 python3 tools/pretrain_gpt.py $D
TAILN=14 step memory 100 python3 tools/check_layer_memory.py --out $G/layer_memory.json
TAILN=8 step smoke_resumed 60 python3 tools/pretrain_gpt.py $J --load $G/ck --ckpt-step 3
rm -rf $G/ck; pack
echo "total $(( $(date +%s) - T0 ))s"
