"""tools/convert_checkpoint.py's work: load a checkpoint under the flags' plan and save it in that layout."""
from __future__ import annotations

import argparse
import os
import sys

from megatron_auto.errors import UserError
from megatron_auto.runtime.tokenizers import tokenizer_from_flags

from .arguments import parse_args
from .plan_choice import check_plan_runs, choose_plan, with_plan_recompute_modules
from .pretrain import configure_logging
from .settings import model_from_args, settings_from_args


def convert(args: argparse.Namespace) -> str:
    """Load `--load` under the flags' plan and save it to `--save`; the written iteration's directory."""
    import patches
    from megatron_auto.runtime import checkpoint, distributed, session

    if not (args.load and args.save):
        raise UserError("convert_checkpoint.py needs --load SRC and --save DST")
    tokenizer = tokenizer_from_flags(args)
    settings = settings_from_args(args, tokenizer.vocab_size, tokenizer.eod)
    model = model_from_args(args, args.padded_vocab_size or tokenizer.vocab_size)
    patches.apply_all()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    plan = choose_plan(args, model, world_size, settings)
    settings = with_plan_recompute_modules(args, settings, plan)
    check_plan_runs(plan, settings, model)
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
    """convert_checkpoint.py: 0 when the checkpoint is written, 2 with one line on a user error."""
    args = parse_args(argv)
    configure_logging()
    try:
        convert(args)
    except UserError as error:
        sys.stderr.write(f"error: {error}\n")
        return 2
    return 0
