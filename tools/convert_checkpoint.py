"""Rewrite a checkpoint in another plan's layout, without training a step.

Give it the job's own tools/pretrain_gpt.py flags (model, precision, tokenizer or data, and the
parallelism of the layout to write: Megatron flags, `--auto-parallel` or `--auto-parallel-plan`),
with `--load SRC` and `--save DST`:

    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --nproc_per_node 2 tools/convert_checkpoint.py \
        --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 32 \
        --max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 4 --train-iters 6 --lr 1e-3 \
        --mock-data --tokenizer-type NullTokenizer --vocab-size 256 --use-distributed-optimizer \
        --load SRC [--ckpt-step K] --save DST

It reads SRC's newest complete iteration (or `--ckpt-step`), whichever runtime and layout wrote it
(megatron_auto/runtime/saved_layout.py), and writes that iteration into DST in the layout of the plan
the flags give: under a megatron-space plan Megatron-LM's own (stacked layer keys), so a model trained
under a hybrid plan goes on to tools that read Megatron-LM checkpoints. Weights, optimizer state
(unless `--no-load-optim`), learning-rate schedule, iteration and consumed samples carry over.
The work is megatron_auto/train/convert.py.
"""
import sys

from megatron_auto.train.convert import main

if __name__ == "__main__":
    sys.exit(main())
