"""`megatron-auto show`: print a plan file as a table (or as its canonical JSON); --png draws it."""
from __future__ import annotations

import argparse
import sys

from .. import serde
from ..plan import load_plan
from ..report import plan_table


def run_show(args: argparse.Namespace) -> int:
    plan = load_plan(args.plan)
    sys.stdout.write(serde.dumps(plan) if args.json else plan_table(plan))
    if args.png:
        from ..report_png import draw_plan_png  # matplotlib is needed only here

        draw_plan_png(plan, args.png)
        sys.stderr.write(f"wrote {args.png}\n")
    return 0
