"""Checkpoints that cannot be lost or half-read, and a job that survives a killed rank.

Runs go through torch.distributed.run (torchrun) with tools/pretrain_gpt.py, 2 gloo ranks at
tensor parallel 2 (so Megatron's model-parallel dropout stream is in play; dropout is 0.1,
Megatron's default). "Bit-identical" is checked on the saved tensors themselves: every weight
and optimizer state of the final checkpoint, compared with torch.equal.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch

from checkpoint_files import checkpoint_tensors as _tensors, logged_losses as _losses
from validation.launcher import REPO, free_port, launch, rank_env
from megatron_auto.errors import UserError
from megatron_auto.runtime import checkpoint

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32", "--mock-data", "--vocab-size", "256", "--micro-batch-size", "2",
        "--global-batch-size", "4", "--log-interval", "1", "--lr", "1e-3", "--eval-iters", "0"]
TWO_RANKS = ["--tensor-model-parallel-size", "2"]


def _torchrun(args: list[str], log_dir: Path, env: dict | None = None, restarts: int = 0) -> str:
    """torchrun's 2 ranks of pretrain_gpt; returns their output. Everything the job started is
    killed afterwards: a SIGKILLed rank leaves megatron-core's multiprocessing Manager behind
    (dist_checkpointing's write-results queue), which would keep the output open."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "--max-restarts", str(restarts), "tools/pretrain_gpt.py", *TINY, *TWO_RANKS, *args]
    tag = f"{JOB_TAG}={uuid.uuid4().hex}"
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                **(env or {}), JOB_TAG: tag.split("=", 1)[1]}
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "torchrun.log", "w+") as log:
        job = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=full_env)
        try:
            code = job.wait(timeout=600)
        finally:
            _kill_tagged(tag)
        log.seek(0)
        output = log.read()
    assert code == 0, output[-4000:]
    return output


JOB_TAG = "MEGATRON_AUTO_TEST_JOB"


def _kill_tagged(tag: str) -> None:
    """SIGKILL every process whose environment holds `tag` (what one _torchrun call started, at any depth)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if tag.encode() in (proc / "environ").read_bytes().split(b"\0"):
                os.kill(int(proc.name), signal.SIGKILL)


def _direct(args: list[str], nproc: int, log_dir: Path):
    """The ranks started as torchrun starts them, without its agent (whose own report of a failed
    worker would hide whether ours stopped with one line): validation/launcher.py."""
    return launch(nproc, ["tools/pretrain_gpt.py", *TINY, *(TWO_RANKS if nproc == 2 else []), *args], 300, log_dir)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """6 iterations on 2 ranks, a checkpoint every 2: the run the others are compared with."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    output = _torchrun(["--train-iters", "6", "--save-interval", "2", "--save", str(folder / "ckpt")], folder)
    return folder / "ckpt", _losses(output)


def test_tracker_is_replaced_whole(tmp_path):
    tracker = tmp_path / checkpoint.TRACKER
    checkpoint.write_atomically(str(tracker), "4")
    checkpoint.write_atomically(str(tracker), "12")
    assert tracker.read_text() == "12" and [p.name for p in tmp_path.iterdir()] == [checkpoint.TRACKER]


def test_load_candidates_are_complete_iterations_newest_first(tmp_path):
    for iteration, complete in ((2, True), (4, True), (6, False)):
        folder = Path(checkpoint.iteration_dir(str(tmp_path), iteration))
        folder.mkdir()
        if complete:
            (folder / checkpoint.COMPLETE).write_text(str(iteration))
    assert checkpoint.load_candidates(str(tmp_path)) == [4, 2]  # no tracker: the complete ones
    (tmp_path / checkpoint.TRACKER).write_text("")  # emptied by a kill during an in-place write
    assert checkpoint.load_candidates(str(tmp_path)) == [4, 2]
    (tmp_path / checkpoint.TRACKER).write_text("6")  # the tracker is trusted too (older checkpoints)
    assert checkpoint.load_candidates(str(tmp_path)) == [6, 4, 2]


def test_checkpoints_to_try_take_the_non_persistent_folder_where_it_is_at_least_as_new(tmp_path):
    persistent, non_persistent = tmp_path / "ckpt", tmp_path / "ckpt" / "non_persistent"
    for root, iterations in ((persistent, (4, 8)), (non_persistent, (7, 8, 9))):
        for iteration in iterations:
            folder = Path(checkpoint.iteration_dir(str(root), iteration))
            folder.mkdir(parents=True)
            (folder / checkpoint.COMPLETE).write_text(str(iteration))
    p, n = str(persistent), str(non_persistent)
    assert checkpoint.checkpoints_to_try(p) == [(p, 8), (p, 4)]
    assert checkpoint.checkpoints_to_try(p, non_persistent=n) == [(n, 9), (n, 8), (p, 8), (n, 7), (p, 4)]
    assert checkpoint.checkpoints_to_try(p, 8, n) == [(p, 8)]  # --ckpt-step: the persistent one first
    assert checkpoint.checkpoints_to_try(p, 9, n) == [(n, 9)]
    with pytest.raises(UserError, match="no checkpoint of iteration 5"):
        checkpoint.checkpoints_to_try(p, 5, n)


def test_a_killed_rank_restarts_the_job_which_resumes_bit_identically(uninterrupted, tmp_path):
    reference, reference_losses = uninterrupted
    root = tmp_path / "ckpt"
    # Rank 1 is SIGKILLed after iteration 5 (past the save at 4, and the non-persistent one at 5); torchrun
    # restarts both ranks once, and they resume from the newer, non-persistent checkpoint.
    output = _torchrun(["--train-iters", "6", "--save-interval", "2", "--save", str(root), "--load", str(root),
                        "--non-persistent-save-interval", "1", "--non-persistent-ckpt-type", "global"],
                       tmp_path, env={"MEGATRON_AUTO_INJECT_KILL": "5:1"}, restarts=1)
    assert f"resumed from iteration 5 of {root / 'non_persistent' / 'iter_0000005'}" in output
    # Every iteration logged one loss, the uninterrupted run's: iteration 5 did not run again, and
    # iteration 6 drew the samples and dropout masks it would have drawn.
    assert _losses(output) == reference_losses and len(reference_losses) == 6
    assert len(re.findall(r" iteration +5/", output)) == 1
    assert re.search(r" iteration +6/ +6 \| consumed samples: +24 \|", output)
    ours, theirs = _tensors(root / "iter_0000006"), _tensors(reference / "iter_0000006")
    assert ours.keys() == theirs.keys() and len(ours) > 20
    assert [name for name in ours if not torch.equal(ours[name], theirs[name])] == []


def test_no_load_rng_resumes_with_other_dropout_masks(uninterrupted, tmp_path):
    """The control of the test above: without the saved streams the same resume is not identical."""
    reference, _ = uninterrupted
    _torchrun(["--train-iters", "6", "--load", str(reference), "--ckpt-step", "4", "--no-load-rng",
               "--save", str(tmp_path / "ckpt")], tmp_path)
    ours = _tensors(tmp_path / "ckpt" / "iter_0000006")
    theirs = _tensors(reference / "iter_0000006")
    assert any(not torch.equal(ours[name], theirs[name]) for name in ours)


def _damaged_copy(reference: Path, target: Path) -> Path:
    shutil.copytree(reference, target)
    shard = sorted((target / "iter_0000006").glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[:100])  # truncated
    (target / "iter_0000004" / "common.pt").unlink()
    (target / checkpoint.TRACKER).write_text("")  # emptied tracker
    return target


def test_damaged_iterations_fall_back_to_the_newest_that_reads_in_one_line(uninterrupted, tmp_path):
    root = _damaged_copy(uninterrupted[0], tmp_path / "ckpt")
    done = _direct(["--train-iters", "7", "--load", str(root)], 1, tmp_path / "logs")
    assert done.ok, done.output[-3000:]
    said = [line for line in done.output.splitlines() if "damaged or incomplete" in line]
    assert len(said) == 1 and "fell back to iteration 2" in said[0]
    assert "iteration 6: EOFError" in said[0] and "iteration 4: FileNotFoundError: common.pt missing" in said[0]
    assert sorted(_losses(done.output)) == [3, 4, 5, 6, 7]


def test_no_readable_checkpoint_stops_with_one_line(uninterrupted, tmp_path):
    root = _damaged_copy(uninterrupted[0], tmp_path / "ckpt")
    (root / "iter_0000002" / "metadata.json").write_text("{not json")
    done = _direct(["--train-iters", "7", "--load", str(root)], 1, tmp_path / "logs")
    assert done.returncodes == (2,), done.output[-3000:]
    errors = [line for line in done.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no checkpoint there can be read" in errors[0] and "JSONDecodeError" in errors[0]
    assert "Traceback" not in done.output and not _losses(done.output)


@pytest.mark.parametrize("save, reason", [("a_file", "exists and is not a directory"),
                                          ("a_file/sub", "cannot write there")])
def test_an_unusable_save_path_stops_before_any_work(tmp_path, save, reason):
    (tmp_path / "a_file").write_text("not a directory")
    done = _direct(["--train-iters", "4", "--save", str(tmp_path / save)], 2, tmp_path / "logs")
    assert done.returncodes == (2, 2), done.output[-3000:]
    errors = [line for line in done.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 2 and all(reason in line for line in errors) and "Traceback" not in done.output
    assert not _losses(done.output)


def test_auto_parallel_relaunch_at_another_world_size_replans_and_resumes(tmp_path):
    """What a restart onto fewer or more GPUs does: the new world size gets its own plan, the
    checkpoint reshards into it, and the samples continue where they stopped."""
    root, auto = tmp_path / "ckpt", ["--auto-parallel", "--save", str(tmp_path / "ckpt")]
    first = launch(2, ["tools/pretrain_gpt.py", *TINY, "--train-iters", "4", "--save-interval", "2", *auto], 300,
                   tmp_path / "two")
    assert first.ok, first.output[-3000:]
    again = launch(4, ["tools/pretrain_gpt.py", *TINY, "--train-iters", "6", "--load", str(root), *auto], 300,
                   tmp_path / "four")
    assert again.ok, again.output[-3000:]
    assert "parallel plan (auto-parallel)" in again.output and "resumed from iteration 4 of" in again.output
    assert sorted(_losses(again.output)) == [5, 6]
    assert re.search(r" iteration +6/ +6 \| consumed samples: +24 \|", again.output)
    assert "no random-stream state for this rank, world size and plan" in again.output


def test_adam_state_made_for_a_save_before_the_first_update_leaves_training_unchanged():
    # A save before any update (fp16's skipped first steps, a batch ramp-up) gives torch's Adam its
    # state early (checkpoint._ensure_adam_state); the first step must then match a fresh Adam's exactly.
    from types import SimpleNamespace

    torch.manual_seed(0)
    start, grad = torch.randn(5, 3), torch.randn(5, 3)
    params = [torch.nn.Parameter(start.clone()) for _ in range(2)]
    fresh, early = (torch.optim.Adam([p], lr=1e-2, foreach=True) for p in params)
    checkpoint._ensure_adam_state(SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=early)]))
    assert float(early.state[params[1]]["step"]) == 0.0
    for optimizer, param in ((fresh, params[0]), (early, params[1])):
        param.grad = grad.clone()
        optimizer.step()
    assert torch.equal(params[0], params[1]) and not torch.equal(params[0], start)


def _losses_and_scales(output: str) -> dict[int, tuple[str, str]]:
    return {int(i): (loss, scale) for i, loss, scale in
            re.findall(r" iteration +(\d+)/ .*?\| lm loss: (\S+) \| loss scale: (\S+) \|", output)}


def test_fp16_checkpoint_saved_before_any_update_resumes_as_if_uninterrupted(tmp_path):
    """At fp16's first loss scale (2^32) every early iteration overflows and is skipped, so the
    checkpoint of iteration 2 holds Adam step 0, which megatron-core leaves out of the file
    (checkpoint.restore_zero_adam_step). The resume must load it and go on as one run would."""
    fp16, root = ["--fp16", "--save-interval", "2"], tmp_path / "ckpt"
    whole = _direct([*fp16, "--train-iters", "4"], 2, tmp_path / "whole")
    first = _direct([*fp16, "--train-iters", "2", "--save", str(root)], 2, tmp_path / "first")
    again = _direct([*fp16, "--train-iters", "4", "--load", str(root)], 2, tmp_path / "again")
    assert whole.ok and first.ok and again.ok, (first.output + again.output)[-3000:]
    assert "number of skipped iterations:   1" in first.output and "resumed from iteration 2 of" in again.output
    expected = _losses_and_scales(whole.output)
    assert len(expected) == 4 and _losses_and_scales(again.output) == {i: expected[i] for i in (3, 4)}


def test_a_dropped_zero_adam_step_is_restored_and_nothing_else_changes():
    dropped = {"optimizer": {"state": {0: {"exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)}},
                             "param_groups": [{"params": [0]}]}}
    kept = {"state": {0: {"exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)}, "common_step": torch.tensor(3.0)},
            "param_groups": [{"params": [0]}]}
    sgd = {"state": {0: {"momentum_buffer": torch.zeros(2)}}, "param_groups": [{"params": [0]}]}
    checkpoint.restore_zero_adam_step({0: dropped, 1: kept, 2: sgd})
    assert float(dropped["optimizer"]["state"]["common_step"]) == 0.0
    assert float(kept["state"]["common_step"]) == 3.0 and "common_step" not in sgd["state"]


@pytest.mark.parametrize("fault, survivors, words", [
    # Rank 1 sleeps 20 s after iteration 2; its peer's 6 s timeout runs out first, and rank 1 then
    # wakes to a closed connection. The 14 s between them leave room for a loaded machine.
    (("MEGATRON_AUTO_INJECT_STALL", "2:1:20"), (0, 1),
     ("timed out waiting for a peer", "lost the connection to a peer")),
    (("MEGATRON_AUTO_INJECT_KILL", "2:1"), (0,), ("lost the connection to a peer",))])
def test_a_peer_that_stalls_or_dies_mid_run_ends_the_others_with_one_line(fault, survivors, words, tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv(*fault)
    done = _direct(["--train-iters", "6", "--distributed-timeout-minutes", "0.1"], 2, tmp_path / "logs")
    logs = [(tmp_path / "logs" / f"rank{rank}.log").read_text() for rank in survivors]
    assert [done.returncodes[rank] for rank in survivors] == [1] * len(survivors), done.output[-3000:]
    for rank, log, expected in zip(survivors, logs, words):
        errors = [line for line in log.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and f"rank {rank}: {expected}" in errors[0], log[-3000:]
        assert "Traceback" not in log and "Timed out" not in log.replace(errors[0], "")


def _elastic_agent(port: int, args: list[str], log: Path, tag: str, env: dict) -> subprocess.Popen:
    """One torchrun agent of an elastic job of 1 to 2 nodes, 2 ranks each, on this host.

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the store shared (torch's default), the agent that
    was rank 0 skips publishing the new round's MASTER_ADDR and a membership change hangs
    (pytorch/pytorch#135712); README says so for users. quiet_port_torchrun.py is torchrun with the
    workers' MASTER_PORT drawn below the ephemeral range, where no other test's sockets land."""
    command = [sys.executable, str(Path(__file__).with_name("quiet_port_torchrun.py")), "--nnodes", "1:2", "--nproc-per-node", "2",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "elastic-test",
               "--rdzv-conf", "join_timeout=120,last_call_timeout=1", "--max-restarts", "2",
               "--monitor-interval", "0.2", "tools/pretrain_gpt.py", *TINY, *args]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", JOB_TAG: tag,
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), **env}
    return subprocess.Popen(command, cwd=REPO, env=full_env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _wait_for(text: str, log: Path, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"no {text!r} in {seconds} s: {log.read_text()[-3000:]}"
        time.sleep(0.2)


def test_an_elastic_job_that_gains_a_node_replans_for_it_and_resumes(tmp_path):
    """torchrun --nnodes 1:2: the job starts on one agent (2 ranks); a second agent joins, torchrun
    restarts every worker at world size 4, and --auto-parallel re-plans and resumes from the last
    complete checkpoint. The losses after it are those of a 4-rank relaunch from that checkpoint."""
    root, tag, port = tmp_path / "ckpt", uuid.uuid4().hex, free_port()
    args = ["--train-iters", "8", "--save-interval", "4", "--save", str(root), "--load", str(root), "--auto-parallel"]
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    # The first agent's rank 0 hangs after the save at 4 until the membership change restarts it.
    first = _elastic_agent(port, args, first_log, tag, {"MEGATRON_AUTO_INJECT_STALL": "4:0:600"})
    try:
        _wait_for("saved checkpoint at iteration 4", first_log, 300)
        second = _elastic_agent(port, args, second_log, tag, {})
        codes = (first.wait(timeout=300), second.wait(timeout=300))
    finally:
        _kill_tagged(tag)
    output = first_log.read_text() + second_log.read_text()
    assert codes == (0, 0), output[-4000:]
    # Global rank 0 logs the plan: before the restart on the first agent, after it on either.
    assert sorted(re.findall(r"for model pretrain_gpt on (\d+) GPUs", output)) == ["2", "4"]
    assert "resumed from iteration 4 of" in output
    consumed = re.findall(r" iteration +(\d+)/ +8 \| consumed samples: +(\d+) \|", output)
    assert {int(i) for i, _ in consumed} == set(range(1, 9)) and all(int(n) == 4 * int(i) for i, n in consumed)
    relaunch = launch(4, ["tools/pretrain_gpt.py", *TINY, "--train-iters", "8", "--load", str(root), "--ckpt-step", "4",
                          "--auto-parallel"], 300, tmp_path / "relaunch")
    assert relaunch.ok, relaunch.output[-3000:]
    resumed = {i: losses for i, losses in _losses(output).items() if i > 4}
    assert resumed == _losses(relaunch.output) and sorted(resumed) == [5, 6, 7, 8]


def test_the_exit_signal_saves_and_stops_every_rank_at_one_iteration(tmp_path):
    """--exit-signal-handler: SIGTERM to rank 0 alone (as a scheduler's warning may reach one node
    first) stops both ranks after the same iteration, with a complete checkpoint of it. Rank 1, the
    last, logs the iterations and the exit."""
    root, port = tmp_path / "ckpt", free_port()
    argv = ["tools/pretrain_gpt.py", *TINY, *TWO_RANKS, "--train-iters", "100000", "--save", str(root),
            "--exit-signal-handler"]
    logs = [(tmp_path / f"rank{rank}.log").open("w+") for rank in range(2)]
    ranks = [subprocess.Popen([sys.executable, *argv], cwd=REPO, env=rank_env(rank, 2, port), stdout=logs[rank],
                              stderr=subprocess.STDOUT, start_new_session=True) for rank in range(2)]
    try:
        _wait_for("iteration        3/", tmp_path / "rank1.log", 120)
        ranks[0].send_signal(signal.SIGTERM)
        codes = [rank.wait(timeout=120) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    output = "".join((tmp_path / f"rank{rank}.log").read_text() for rank in range(2))
    assert codes == [0, 0], output[-3000:]
    stopped = re.findall(r"exiting on SIGTERM \(--exit-signal-handler\) at iteration (\d+)", output)
    assert len(stopped) == 1 and 3 <= int(stopped[0]) < 100000
    assert checkpoint.load_candidates(str(root)) == [int(stopped[0])]
    assert max(_losses(output)) == int(stopped[0])
