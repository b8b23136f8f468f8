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
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pretrain_gpt  # noqa: E402

from megatron_auto.errors import UserError  # noqa: E402


def convert(args) -> str:
    """Load `--load` under the flags' plan and save it to `--save`; the written iteration's directory."""
    import patches
    from megatron_auto.runtime import checkpoint, distributed, session

    if not (args.load and args.save):
        raise UserError("convert_checkpoint.py needs --load SRC and --save DST")
    tokenizer = pretrain_gpt.tokenizer_from_flags(args)
    settings = pretrain_gpt.settings_from_args(args, tokenizer.vocab_size, tokenizer.eod)
    model = pretrain_gpt.model_from_args(args, args.padded_vocab_size or tokenizer.vocab_size)
    patches.apply_all()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    plan = pretrain_gpt.choose_plan(args, model, world_size, settings)
    settings = pretrain_gpt.with_plan_recompute_modules(args, settings, plan)
    pretrain_gpt.check_plan_runs(plan, settings, model)
    info = distributed.init_distributed(settings.timeout_s)
    try:
        checkpoint.check_paths(settings.save, settings.load)
        job = session.build_session(plan, model, settings, info.backend, info.device)
        resumed = checkpoint.load_checkpoint(settings.load, job.model, job.optimizer, job.scheduler,
                                             step=settings.ckpt_step, with_optimizer=settings.load_optimizer,
                                             with_rng=settings.load_rng)
        if resumed is None:
            raise UserError(f"--load {settings.load}: no checkpoint there to convert")
        return checkpoint.save_checkpoint(settings.save, job.model, job.optimizer, job.scheduler,
                                          resumed.iteration, resumed.consumed_samples,
                                          with_optimizer=settings.save_optimizer, with_rng=settings.save_rng)
    finally:
        distributed.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = pretrain_gpt.parse_args(argv)
    pretrain_gpt.configure_logging()
    try:
        convert(args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
