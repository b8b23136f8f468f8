"""`megatron-auto show`: print a plan file as a table (or as its canonical JSON)."""
from __future__ import annotations

import argparse
import sys

from .. import serde
from ..plan import load_plan
from ..report import plan_table


def run_show(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    sys.stdout.write(serde.dumps(plan) if args.json else plan_table(plan))
    return 0
