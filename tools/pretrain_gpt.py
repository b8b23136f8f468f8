"""Drop-in for Megatron-LM's pretrain_gpt.py: the same flags, plus `--auto-parallel`.

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

`tools/pretrain_gpt.py --help` lists every flag and form; the work is megatron_auto/train/ (its flags,
their checks, the plan choice and the run).
"""
import sys

from megatron_auto.train import main

if __name__ == "__main__":
    sys.exit(main())
