"""validation/megatron_lm_corpus.py's own logic, without launching ranks: the ranks' logs read into rows, the
resumption after a line that crashed or hung, and the docs table."""
from __future__ import annotations

import math

from validation.megatron_lm_corpus import Row, compact_plan, corpus_lines, framed_runs, render, row_from_frames, settle

PLAN_LOG = """parallel plan (auto-parallel):
plan (megatron space) for model pretrain_gpt on 4 GPUs of cluster cpu-gloo
megatron-lm flags
  --tensor-model-parallel-size 2 \\
  --pipeline-model-parallel-size 2 \\
  --micro-batch-size 4 \\
  --global-batch-size 8 \\
  --sequence-parallel \\
  --use-distributed-optimizer

tokenizer: NullTokenizer, vocabulary 513, end of document 512
"""


def iteration(i: int, loss: str) -> str:
    return (f" iteration {i:8d}/{4:8d} | consumed samples: {8 * i:12d} | elapsed time per iteration (ms): 170.1 | "
            f"learning rate: 1.0E-05 | global batch size:     8 | lm loss: {loss} | grad norm: 0.97 |\n")


def finished(name: str, body: str = "", code: int = 0, seconds: float = 2.5) -> str:
    return f"#### launch line {name} start\n{body}#### launch line {name} exit {code} ({seconds:.2f} s)\n"


def started(name: str, body: str = "") -> str:
    return f"#### launch line {name} start\n{body}"


def test_a_finished_line_gives_its_losses_plan_and_seconds():
    last_rank = finished("case_a:auto", PLAN_LOG + "".join(iteration(i, f"{7 - i / 10:.6E}") for i in range(1, 5)))
    logs = [finished("case_a:auto", seconds=2.0)] * 3 + [last_rank]
    row = row_from_frames("case_a:auto", [framed_runs(log)["case_a:auto"] for log in logs])
    assert (row.case, row.variant, row.code, row.seconds) == ("case_a", "auto", 0, 2.5)
    assert row.losses == (6.9, 6.8, 6.7, 6.6) and row.trains and row.outcome == "trains, loss falls"
    assert row.plan == "tp2 pp2 mbs4 --sequence-parallel --use-distributed-optimizer"
    assert compact_plan("no plan here\n") == ""


def test_outcomes_say_what_went_wrong():
    row = Row("c", "flags", 0, (6.9, 6.95), "", 1.0, "")
    assert not row.trains and row.outcome == "runs, loss does not fall"
    assert Row("c", "flags", 0, (6.9, math.nan), "", 1.0, "").outcome == "non-finite loss"
    assert Row("c", "flags", 0, (), "", 1.0, "").outcome == "no loss logged"
    assert Row("c", "flags", 2, (), "", 1.0, "x").outcome == "exit 2"
    assert Row("c", "flags", None, (), "", None, "x").outcome == "crashed or hung"


def test_a_crash_fails_its_line_with_the_ranks_own_error_and_the_next_launch_resumes_after_it():
    names = ["a:flags", "a:auto", "b:flags", "b:auto"]
    crashed = started("a:auto", "Traceback (most recent call last):\nValueError: bad shape (8, 3)\n")
    peer = started("a:auto", "RuntimeError: [gloo] Connection closed by peer\n")
    logs = [finished("a:flags") + peer, finished("a:flags") + crashed, finished("a:flags") + peer,
            finished("a:flags") + peer]
    rows, left = settle(names, [framed_runs(log) for log in logs])
    assert list(rows) == ["a:flags", "a:auto"] and left == ["b:flags", "b:auto"]
    assert rows["a:flags"].code == 0
    assert rows["a:auto"].code is None and rows["a:auto"].error == "ValueError: bad shape (8, 3)"


def test_a_line_one_rank_never_finished_fails_and_a_launch_that_ran_nothing_still_moves_on():
    names = ["a:flags", "b:flags", "c:flags"]
    logs = [finished("a:flags") + finished("b:flags")] * 3 + [finished("a:flags") + started("b:flags")]
    rows, left = settle(names, [framed_runs(log) for log in logs])
    assert rows["b:flags"].code is None and rows["b:flags"].error and left == ["c:flags"]
    rows, left = settle(names, [{}] * 4)  # no rank got as far as the first line
    assert list(rows) == ["a:flags"] and rows["a:flags"].code is None and left == ["b:flags", "c:flags"]
    rows, left = settle(names, [framed_runs(finished("a:flags"))] * 4)  # the launch ended between two lines
    assert list(rows) == ["a:flags"] and left == ["b:flags", "c:flags"]
    rows, left = settle(names, [framed_runs(finished("a:flags", code=2, body="x: error: no MoE\n"))] * 4)
    assert rows["a:flags"].code == 2 and rows["a:flags"].error == "x: error: no MoE" and left == ["b:flags", "c:flags"]


def test_only_the_lines_that_plan_run_and_the_table_counts_them():
    cases = [{"name": "ok", "argv": ["--x"], "verdicts": {"flags": "plans", "auto": "plans"}},
             {"name": "fp8", "argv": ["--fp8"], "verdicts": {"flags": "FP8 needs TE", "auto": "FP8 needs TE"}}]
    lines = corpus_lines(cases, 6, 100.0)
    assert [line["name"] for line in lines] == ["ok:flags", "ok:auto"]
    assert lines[1]["argv"][-1] == "--auto-parallel" and lines[0]["argv"][1:3] == ["--train-iters", "6"]
    rows = {"ok:flags": Row("ok", "flags", 0, (6.9, 6.8), "tp1 pp4 mbs1", 3.21, ""),
            "ok:auto": Row("ok", "auto", None, (), "", None, "ValueError: bad")}
    text = render(cases, rows, "the command", "2026-11-29", 6)
    assert "`the command`" in text and "2026-11-29" in text
    assert "- as it is: 1 run, 1 exit 0, 1 with the loss falling" in text
    assert "- --auto-parallel: 1 run, 0 exit 0, 0 with the loss falling" in text and "1 failed" in text
    assert ("| `ok` | trains, loss falls | 6.9000 → 6.8000 | `tp1 pp4 mbs1` | 3.2 | "
            "crashed or hung: `ValueError: bad` |  |  |  |") in text
    assert "| `fp8` | FP8 needs TE | FP8 needs TE |" in text
    assert "other flags than the case's own in 0 of the 1 cases" in text
    rows["ok:auto"] = Row("ok", "auto", 0, (6.9, 6.7), "tp1 pp4 mbs8", 2.0, "")
    assert "other flags than the case's own in 1 of the 1 cases" in render(cases, rows, "c", "d", 6)
