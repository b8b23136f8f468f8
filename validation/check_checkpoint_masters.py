"""Check that a checkpoint's fp32 master weights are the weights it saved.

    .venv/bin/python -m validation.check_checkpoint_masters CKPT/iter_0000006

Megatron's mixed-precision optimizers write each 16-bit weight as its fp32 master rounded
(the step copies master into weight), and in fp32 the two are the same tensor: so for every
`optimizer.state.param.<key>` (or `fp32_param`), the master cast to the weight's dtype must equal
the saved `<key>` exactly. A master saved from the wrong place (megatron-core 0.16.1's
bucket-offset bug, patches/fully_reshardable_bucket_offsets.py) breaks that. Prints one line;
exit status 1 when any master differs, 2 when the directory holds no masters to check.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from megatron_auto.runtime.saved_layout import MASTER_ALIASES, STATE_PREFIX

MASTER_PREFIXES = tuple(f"{STATE_PREFIX}{alias}." for alias in MASTER_ALIASES)


def checkpoint_tensors(iteration_dir: Path) -> dict:
    """Every tensor of a checkpoint iteration by its flattened name, read without a process group."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as folder:
        target = Path(folder) / "state.pt"
        dcp_to_torch_save(str(iteration_dir), str(target))
        tree = torch.load(target, weights_only=False)

    def flat(node, prefix=""):
        for key, value in node.items():
            if isinstance(value, dict):
                yield from flat(value, f"{prefix}{key}.")
            elif torch.is_tensor(value):
                yield f"{prefix}{key}", value
    return dict(flat(tree))


def mismatched_masters(tensors: dict) -> tuple[int, list[str]]:
    """(masters checked, the names of those that are not their weight once cast to its dtype)."""
    import torch

    checked, wrong = 0, []
    for name, master in tensors.items():
        prefix = next((p for p in MASTER_PREFIXES if name.startswith(p)), None)
        weight = tensors.get(name[len(prefix):]) if prefix else None
        if weight is None:
            continue
        checked += 1
        if not torch.equal(master.to(weight.dtype), weight):
            wrong.append(name)
    return checked, wrong


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("iteration_dir", type=Path, help="a checkpoint's iter_XXXXXXX directory")
    args = parser.parse_args(argv)
    if not (args.iteration_dir / "metadata.json").is_file():
        print(f"error: {args.iteration_dir}: not a checkpoint iteration (no metadata.json)", file=sys.stderr)
        return 2
    checked, wrong = mismatched_masters(checkpoint_tensors(args.iteration_dir))
    if not checked:
        print(f"error: {args.iteration_dir}: no fp32 masters saved beside their weights", file=sys.stderr)
        return 2
    print(f"{args.iteration_dir}: {checked - len(wrong)} of {checked} masters equal their weights"
          + (f"; differ: {', '.join(wrong[:5])}" if wrong else ""))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
