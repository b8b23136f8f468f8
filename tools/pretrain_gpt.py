"""Drop-in for Megatron-LM's pretrain_gpt.py: the same flags, plus `--auto-parallel`.

Megatron-LM's launch line, pointed at this file:

    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --nproc_per_node 4 tools/pretrain_gpt.py \
        <Megatron-LM's pretraining flags> --auto-parallel

`make demo-train` runs one whole on the shipped corpus; `tools/pretrain_gpt.py --help` prints it and
every other form (megatron_auto/train/usage.py). The work is megatron_auto/train/ (its flags, their checks,
the plan choice and the run).
"""
import sys

from megatron_auto.train import main

if __name__ == "__main__":
    sys.exit(main())
