"""Issue 40: every case of the Megatron-LM functional-test corpus run end to end on 4 CPU gloo ranks, as it is and
with --auto-parallel (outside `make test`: tens of minutes on two cores).

Run from the repository root:

    OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m validation.megatron_lm_corpus --write-docs
    .venv/bin/python -m validation.megatron_lm_corpus --only moe --iterations 8     # prints the table only
    .venv/bin/python -m validation.megatron_lm_corpus --render DIR/rows.json --write-docs

--write-docs writes docs/megatron_lm_corpus.md; the ranks' logs and the rows (rows.json) stay in --log-dir (a
temporary directory by default), which --render turns into the table again without running anything.

The corpus is tests/megatron_lm_cases/cases.json (Megatron-LM 0.16.1's GPT and MoE functional-test cases shrunk to
4 ranks by its shrink.py). Each case whose recorded dry-run verdict is "plans" runs for --iterations iterations
(logging each), as it is and with --auto-parallel; the cases the dry run refuses are listed with their reason. The
runs go in batches of --per-launch command lines through validation/launch_lines.py under
validation/launcher.py's `launch` (ranks forked from its fork server, torch and megatron-core imported once). A
line that crashes a rank (its peers are killed --fail-fast-s seconds later) or runs past --line-timeout-s (the
ranks dump their stacks and exit) is recorded as failed with its error line, and the next launch resumes after it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from validation.launch_lines import FramedRun, framed_runs

REPO = Path(__file__).resolve().parents[1]
CASES_FILE = REPO / "tests" / "megatron_lm_cases" / "cases.json"
DOCS = REPO / "docs" / "megatron_lm_corpus.md"
WORKER = "validation/launch_lines.py"
COMMAND = ".venv/bin/python -m validation.megatron_lm_corpus"
WORLD_SIZE = 4
VARIANTS = {"flags": [], "auto": ["--auto-parallel"]}
VARIANT_TITLES = {"flags": "as it is", "auto": "--auto-parallel"}
LOSS = re.compile(r"^ iteration +\d+/ *\d+ \|.*?\| lm loss: (\S+) \|", re.M)
PLAN_FLAGS = re.compile(r"^megatron-lm flags\n((?:  --.*\n?)+)", re.M)
ERROR = re.compile(r"Error|Exception|error:|^Timeout \(|Fatal|Aborted")
PEER_ERROR = re.compile(r"gloo|[Cc]onnection|peer|Broken pipe")
SHORT_FLAGS = {"--tensor-model-parallel-size": "tp", "--pipeline-model-parallel-size": "pp",
               "--context-parallel-size": "cp", "--expert-model-parallel-size": "ep",
               "--expert-tensor-parallel-size": "etp", "--micro-batch-size": "mbs",
               "--num-layers-per-virtual-pipeline-stage": "layers/vstage",
               "--num-virtual-stages-per-pipeline-rank": "vstages", "--global-batch-size": None}
"""The plan's Megatron-LM flags as the table writes them (None: left out, the same in every case)."""


@dataclass(frozen=True)
class Row:
    """One command line's run: a case as it is ("flags") or with --auto-parallel ("auto")."""

    case: str
    variant: str
    code: Optional[int]
    """Exit code; None when a rank never reached the end of the line (crashed, hung, killed)."""
    losses: tuple[float, ...]
    """The training loss of each logged iteration."""
    plan: str
    """The plan's Megatron-LM flags as the run printed them, compacted (`compact_plan`)."""
    seconds: Optional[float]
    error: str
    """The line's error line where it failed, else empty."""

    @property
    def outcome(self) -> str:
        if self.code is None:
            return "crashed or hung"
        if self.code != 0:
            return f"exit {self.code}"
        if not self.losses:
            return "no loss logged"
        if not all(math.isfinite(loss) for loss in self.losses):
            return "non-finite loss"
        return "trains, loss falls" if self.losses[-1] < self.losses[0] else "runs, loss does not fall"

    @property
    def trains(self) -> bool:
        return self.outcome == "trains, loss falls"


def compact_plan(log: str) -> str:
    """The last `megatron-lm flags` block of a run's log in one short line ("tp1 pp4 mbs1 layers/vstage1
    --use-distributed-optimizer"); empty when the log has none."""
    blocks = PLAN_FLAGS.findall(log)
    if not blocks:
        return ""
    words = []
    for line in blocks[-1].splitlines():
        flag, *value = line.strip().rstrip("\\").split()
        short = SHORT_FLAGS.get(flag, flag)
        if short is not None:
            words.append(short + "".join(value) if flag in SHORT_FLAGS else " ".join([flag, *value]))
    return " ".join(words)


def error_line(logs: list[str]) -> str:
    """The failure's own error line from the ranks' logs of one run: the last error-looking line of the first rank
    that has one, preferring lines that are not a peer's lost connection."""
    found = [[line.strip() for line in log.splitlines() if ERROR.search(line)] for log in logs]
    own = [[line for line in lines if not PEER_ERROR.search(line)] for lines in found]
    return next((lines[-1] for lines in own + found if lines), "")


def row_from_frames(name: str, frames: list[FramedRun], world_size: int = WORLD_SIZE) -> Row:
    """The row of run `name` (CASE:VARIANT) from its frame in each rank's log that started it."""
    case, variant = name.rsplit(":", 1)
    codes = [frame.code for frame in frames]
    code = None if None in codes or len(frames) < world_size else next((c for c in codes if c != 0), 0)
    loss_logs = max((LOSS.findall(frame.log) for frame in frames), key=len, default=[])
    plan = next((p for p in (compact_plan(frame.log) for frame in frames) if p), "")
    seconds = [frame.seconds for frame in frames if frame.seconds is not None]
    error = "" if code == 0 else error_line([frame.log for frame in frames]) or (
        "a rank ended without finishing the line" if code is None else f"exit {code}, no error line")
    return Row(case, variant, code, tuple(float(x) for x in loss_logs), plan, max(seconds) if seconds else None,
               error)


def settle(names: list[str], rank_runs: list[dict[str, FramedRun]]) -> tuple[dict[str, Row], list[str]]:
    """After a launch of the lines `names`: ({name: Row} of the lines it finished or failed, the lines left to a
    next launch). A line that started but did not finish on every rank failed, and the lines after it are left; a
    launch that started no line at all fails its first, so that every launch makes progress."""
    rows = {}
    for index, name in enumerate(names):
        frames = [runs[name] for runs in rank_runs if name in runs]
        if not frames:
            if index == 0:
                case, variant = name.rsplit(":", 1)
                rows[name] = Row(case, variant, None, (), "", None, "the launch never started this line")
                return rows, names[1:]
            return rows, names[index:]
        rows[name] = row_from_frames(name, frames, len(rank_runs))
        if rows[name].code is None:
            return rows, names[index + 1:]
    return rows, []


def corpus_lines(cases: list[dict], iterations: int, line_timeout_s: float) -> list[dict]:
    """The worker's RUNS.json entries: each case whose dry run plans, per variant, run for `iterations`."""
    length = ["--train-iters", str(iterations), "--eval-interval", str(iterations), "--log-interval", "1"]
    return [{"name": f"{case['name']}:{variant}", "argv": [*case["argv"], *length, *extra], "timeout_s": line_timeout_s}
            for case in cases for variant, extra in VARIANTS.items() if case["verdicts"][variant] == "plans"]


def run_lines(lines: list[dict], per_launch: int, fail_fast_s: float, work: Path) -> dict[str, Row]:
    """Run `lines` in launches of up to `per_launch`, each resuming after the line the previous one failed on."""
    from validation.launcher import launch

    rows, pending, number = {}, list(lines), 0
    while pending:
        number += 1
        batch, launch_dir = pending[:per_launch], work / f"launch{number}"
        launch_dir.mkdir(parents=True, exist_ok=True)
        (launch_dir / "runs.json").write_text(json.dumps(batch))
        timeout_s = 120 + sum(line["timeout_s"] for line in batch)  # the worker's per-line watchdog acts first
        result = launch(WORLD_SIZE, [WORKER, str(launch_dir / "runs.json"), str(launch_dir / "codes.json")],
                        timeout_s=timeout_s, log_dir=launch_dir / "logs", fail_fast_s=fail_fast_s)
        rank_runs = [framed_runs((launch_dir / "logs" / f"rank{r}.log").read_text(errors="replace"))
                     for r in range(WORLD_SIZE)]
        done, left = settle([line["name"] for line in batch], rank_runs)
        rows.update(done)
        by_name = {line["name"]: line for line in batch}
        pending = [by_name[name] for name in left] + pending[per_launch:]
        print(f"launch {number}: {len(done)} lines in {result.seconds:.0f} s (exit codes {result.returncodes}); "
              f"{len(rows)}/{len(lines)} done", file=sys.stderr, flush=True)
        for row in done.values():
            print(f"  {row.case} {row.variant}: {row.outcome} {row.error}".rstrip(), file=sys.stderr, flush=True)
    return rows


def _loss_cell(row: Row) -> str:
    return f"{row.losses[0]:.4f} → {row.losses[-1]:.4f}" if row.losses else ""


def _result_cell(row: Optional[Row]) -> str:
    if row is None:
        return "not run"
    return row.outcome + (f": `{row.error[:160]}`" if row.error else "")


def summary_lines(cases: list[dict], rows: dict[str, Row]) -> list[str]:
    """The counts the table adds up to, and each failure."""
    planned = [case for case in cases if "plans" in case["verdicts"].values()]
    out = [f"- {len(cases)} cases; {len(planned)} plan in the dry run and ran here, "
           f"{len(cases) - len(planned)} are refused (not run, listed at the end)."]
    for variant, title in VARIANT_TITLES.items():
        mine = [row for row in rows.values() if row.variant == variant]
        finished = [row for row in mine if row.code == 0]
        out.append(f"- {title}: {len(mine)} run, {len(finished)} exit 0, "
                   f"{sum(row.trains for row in mine)} with the loss falling (last iteration below the first), "
                   f"{len(mine) - len(finished)} failed.")
    out += [f"  - `{row.case}` {VARIANT_TITLES[row.variant]}: {_result_cell(row)}"
            for row in rows.values() if row.code != 0]
    pairs = [(rows[f"{case['name']}:flags"], rows[f"{case['name']}:auto"]) for case in planned
             if f"{case['name']}:flags" in rows and f"{case['name']}:auto" in rows]
    changed = sum(flags.plan != auto.plan for flags, auto in pairs if flags.plan and auto.plan)
    out.append(f"- --auto-parallel chose other flags than the case's own in {changed} of the {len(pairs)} cases.")
    return out


def render(cases: list[dict], rows: dict[str, Row], command: str, date: str, iterations: int) -> str:
    """docs/megatron_lm_corpus.md: the command and date, the counts, a row per case, and the refused cases."""
    text = ["# Megatron-LM's functional-test cases, end to end on 4 CPU ranks", "",
            f"Command: `{command}` (run on {date}; {iterations} iterations per line, every iteration logged, "
            f"4 gloo ranks with OMP_NUM_THREADS=1 each on a 2-core machine; `--write-docs` writes this file, or "
            "`--render DIR/rows.json --write-docs` from a finished run's rows). The cases are "
            "`tests/megatron_lm_cases/cases.json`; `tests/test_megatron_lm_cases.py` dry-runs all of them in "
            "`make test`, and `tests/runtime/test_megatron_lm_cases_run.py` runs three of them end to end there.", "",
            *summary_lines(cases, rows), "",
            "Loss: the training loss of the first and the last iteration; plan: the Megatron-LM flags the run "
            "printed (tp, pp, cp, ep, etp: parallel sizes; mbs: micro-batch size; data parallel is the rest of the "
            "4 ranks; the global batch is 8 throughout); s: the line's wall seconds in its launch.", "",
            "| case | as it is | loss | plan | s | --auto-parallel | loss | plan chosen | s |",
            "|---|---|---|---|---|---|---|---|---|"]
    for case in cases:
        if "plans" not in case["verdicts"].values():
            continue
        cells = []
        for variant in VARIANTS:
            row = rows.get(f"{case['name']}:{variant}")
            cells += [_result_cell(row), _loss_cell(row) if row else "", f"`{row.plan}`" if row and row.plan else "",
                      f"{row.seconds:.1f}" if row and row.seconds is not None else ""]
        text.append(f"| `{case['name']}` | " + " | ".join(cells) + " |")
    refused = [case for case in cases if "plans" not in case["verdicts"].values()]
    text += ["", "## Refused by the dry run (not run)", "", "| case | as it is | --auto-parallel |", "|---|---|---|"]
    text += [f"| `{case['name']}` | {case['verdicts']['flags']} | {case['verdicts']['auto']} |" for case in refused]
    return "\n".join(text) + "\n"


def _environment() -> list[str]:
    """The OMP_NUM_THREADS and niceness this harness runs with, as the words before its command."""
    words = [f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"] if "OMP_NUM_THREADS" in os.environ else []
    return words + (["nice", "-n", str(os.nice(0))] if os.nice(0) else [])


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m validation.megatron_lm_corpus", description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    parser.add_argument("--iterations", type=int, default=4, help="training iterations per line (the cases' own 4)")
    parser.add_argument("--per-launch", type=int, default=4,
                        help="command lines per launch of the 4 ranks (each line leaves gloo threads running behind it)")
    parser.add_argument("--line-timeout-s", type=float, default=300, help="a line still running after this fails")
    parser.add_argument("--fail-fast-s", type=float, default=20,
                        help="after a rank fails, its peers are killed this many seconds later")
    parser.add_argument("--log-dir", type=Path, help="keep the ranks' logs here (default: a temporary directory)")
    parser.add_argument("--write-docs", action="store_true", help=f"write {DOCS.relative_to(REPO)}")
    parser.add_argument("--render", type=Path, metavar="ROWS_JSON",
                        help="run nothing: render the rows.json a run left in its --log-dir (with that run's command)")
    return parser.parse_args(argv)


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.render:
        saved = json.loads(args.render.read_text())
        command, date, iterations = saved["command"], saved["date"], parse_args(saved["argv"]).iterations
        rows = {name: Row(**{**row, "losses": tuple(row["losses"])}) for name, row in saved["rows"].items()}
        only = parse_args(saved["argv"]).only
    else:
        work = args.log_dir or Path(tempfile.mkdtemp(prefix="megatron-lm-corpus-"))
        work.mkdir(parents=True, exist_ok=True)
        only, iterations = args.only, args.iterations
        lines = corpus_lines(_cases(only), iterations, args.line_timeout_s)
        rows = run_lines(lines, args.per_launch, args.fail_fast_s, work)
        command, date = " ".join([*_environment(), COMMAND, *argv]), datetime.date.today().isoformat()
        (work / "rows.json").write_text(json.dumps({"argv": argv, "command": command, "date": date,
                                                    "rows": {name: asdict(row) for name, row in rows.items()}}))
        print(f"ranks' logs and rows.json: {work}", file=sys.stderr)
    text = render(_cases(only), rows, command, date, iterations)
    if args.write_docs:
        DOCS.write_text(text)
    sys.stdout.write(text)
    return 0


def _cases(only: str) -> list[dict]:
    return [case for case in json.loads(CASES_FILE.read_text())["cases"] if only in case["name"]]


if __name__ == "__main__":
    raise SystemExit(main())
