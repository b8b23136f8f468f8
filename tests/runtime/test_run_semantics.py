"""Megatron-LM's run semantics in tools/pretrain_gpt.py: NaN checks, --eval-iters 0 and the final
validation, --save/--load on a new directory, --no-load-optim, --pretrained-checkpoint, the schedule on
resume, --exit-on-missing-checkpoint, weights-only checkpoints (--no-save-optim, --no-save-rng), checkpoint
rotation (--save-retain-interval, non-persistent checkpoints), sample-based schedules and
--exit-duration-in-mins. One process each, a 2-layer 64-wide model."""
from __future__ import annotations

import re
import subprocess

import pytest

from validation.launcher import free_port, rank_env, run_script

TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
        "--max-position-embeddings", "32", "--mock-data", "--vocab-size", "256", "--micro-batch-size", "2",
        "--log-interval", "1"]


def _pretrain(args: list[str], fresh: bool = False) -> subprocess.CompletedProcess:
    """One rank of pretrain_gpt.py; `fresh`: in an interpreter of its own, to see all it prints, at exit too."""
    return run_script(["tools/pretrain_gpt.py", *TINY, *args], rank_env(0, 1, free_port()), 180, fresh)


def _learning_rates(stdout: str) -> list[float]:
    return [float(x) for x in re.findall(r"learning rate: (\S+) \|", stdout)]


def test_a_nan_loss_stops_the_run_with_one_line_naming_the_iteration():
    # A learning rate of 1e30 without clipping turns the weights to inf after the first update.
    done = _pretrain(["--train-iters", "6", "--lr", "1e30", "--clip-grad", "0", "--eval-iters", "0"], fresh=True)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(r"error: NaN or Inf in the loss or gradients at iteration [23] ", lines[0])
    unchecked = _pretrain(["--train-iters", "4", "--lr", "1e30", "--clip-grad", "0", "--eval-iters", "0",
                           "--no-check-for-nan-in-loss-and-grad"])
    assert unchecked.returncode == 0 and "lm loss: nan" in unchecked.stdout.lower()


def test_eval_iters_0_never_evaluates_and_the_end_of_training_validation_runs_otherwise():
    done = _pretrain(["--train-iters", "2", "--eval-interval", "1", "--eval-iters", "0"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "validation loss" not in done.stdout
    evaluated = _pretrain(["--train-iters", "2", "--eval-iters", "1"])
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert re.search(r"validation loss at iteration 2 on validation set \(end of training\) \| lm loss value: \S+",
                     evaluated.stdout)


def test_new_checkpoint_directory_starts_from_scratch_and_no_load_optim_restarts_the_schedule(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    # --train-samples 8 at a global batch of 2: 4 iterations; linear decay over the 8 samples.
    first = _pretrain(["--train-samples", "8", "--lr", "1e-3", "--eval-iters", "0", "--save", ckpt, "--load", ckpt])
    assert first.returncode == 0, first.stderr[-3000:]
    assert "will start from random" in first.stdout
    assert _learning_rates(first.stdout) == pytest.approx([1e-3 * (1 - 2 * i / 8) for i in range(1, 5)], rel=1e-6)
    # Resume to 12 samples with a fresh optimizer: the schedule restarts (decay over 12 samples from step 0),
    # as Megatron-LM's --no-load-optim does, while the iteration count carries on from 4.
    resumed = _pretrain(["--train-samples", "12", "--lr", "1e-3", "--eval-iters", "0", "--load", ckpt,
                         "--no-load-optim", "--no-load-rng"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "(--no-load-optim: fresh optimizer state and learning-rate schedule)" in resumed.stdout
    assert re.findall(r" iteration +(\d+)/", resumed.stdout) == ["5", "6"]
    assert _learning_rates(resumed.stdout) == pytest.approx([1e-3 * (1 - 2 / 12), 1e-3 * (1 - 4 / 12)], rel=1e-6)
    restored = _pretrain(["--train-samples", "12", "--lr", "1e-3", "--eval-iters", "0", "--load", ckpt])
    # A full resume restores the saved schedule (8 samples done of a decay over 8): past its end, min-lr.
    assert _learning_rates(restored.stdout)[0] == 0.0


def _losses(stdout: str) -> dict[int, str]:
    return {int(i): loss for i, loss in re.findall(r" iteration +(\d+)/ .*?\| lm loss: (\S+) \|", stdout)}


def test_a_fine_tuning_job_starts_from_the_pretrained_weights_and_its_restarts_resume_its_own(tmp_path):
    """--pretrained-checkpoint as Megatron-LM's load_checkpoint reads it: while --load holds no checkpoint the
    run fine-tunes from the pretrained weights (--finetune: iteration 1, fresh optimizer and schedule), so its
    losses are those of `--load BASE --finetune`; once it has saved, a restart resumes from --load instead."""
    base, job, common = str(tmp_path / "base"), str(tmp_path / "job"), ["--lr", "1e-3", "--eval-iters", "0"]
    assert _pretrain(["--train-iters", "3", *common, "--save", base]).returncode == 0
    finetuned = _pretrain(["--train-iters", "2", *common, "--load", base, "--finetune"])
    first = _pretrain(["--train-iters", "2", *common, "--pretrained-checkpoint", base, "--load", job, "--save", job])
    assert first.returncode == 0, first.stderr[-3000:]
    assert f"no checkpoint in --load {job}: fine-tuning from the weights of --pretrained-checkpoint {base}" \
        in first.stdout
    assert _losses(first.stdout) == _losses(finetuned.stdout) and sorted(_losses(first.stdout)) == [1, 2]
    restart = _pretrain(["--train-iters", "4", *common, "--pretrained-checkpoint", base, "--load", job, "--save", job])
    assert restart.returncode == 0, restart.stderr[-3000:]
    assert "fine-tuning from" not in restart.stdout and "resumed from iteration 2 of" in restart.stdout
    assert sorted(_losses(restart.stdout)) == [3, 4]


def test_a_pretrained_checkpoint_that_holds_none_is_one_line(tmp_path):
    done = _pretrain(["--train-iters", "2", "--eval-iters", "0", "--pretrained-checkpoint", str(tmp_path / "none")],
                     fresh=True)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"error: no checkpoint to start from: --pretrained-checkpoint {tmp_path / 'none'} holds none"]


def test_a_resume_keeps_the_checkpoint_s_schedule_or_the_command_line_s_with_override(tmp_path):
    """A resume with another --lr: the checkpoint's rate stays (a line names the difference; Megatron-LM would
    stop), and --override-opt_param-scheduler takes the command line's, as Megatron-LM's scheduler does."""
    ckpt, common = str(tmp_path / "ckpt"), ["--eval-iters", "0", "--lr-decay-style", "constant"]
    assert _pretrain(["--train-iters", "2", "--lr", "1e-3", *common, "--save", ckpt]).returncode == 0
    kept = _pretrain(["--train-iters", "4", "--lr", "2e-3", *common, "--load", ckpt])
    assert kept.returncode == 0, kept.stderr[-3000:]
    assert "learning-rate schedule differs from the checkpoint's (max_lr 0.001 -> 0.002, lr_decay_steps 4 -> 8, " \
           "wd_incr_steps 4 -> 8; steps in samples): the run keeps the checkpoint's" in kept.stdout
    assert _learning_rates(kept.stdout) == pytest.approx([1e-3, 1e-3], rel=1e-6)
    override = _pretrain(["--train-iters", "4", "--lr", "2e-3", *common, "--load", ckpt,
                          "--override-opt_param-scheduler"])
    assert "the run keeps the command line's (--override-opt_param-scheduler)" in override.stdout
    assert _learning_rates(override.stdout) == pytest.approx([2e-3, 2e-3], rel=1e-6)


def test_exit_on_missing_checkpoint_stops_with_one_line(tmp_path):
    done = _pretrain(["--train-iters", "2", "--eval-iters", "0", "--load", str(tmp_path / "none"),
                      "--exit-on-missing-checkpoint"], fresh=True)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"error: --load {tmp_path / 'none'}: no checkpoint there (--exit-on-missing-checkpoint)"]


def test_weights_only_checkpoints_resume_with_no_load_optim_and_stop_without_it_in_one_line(tmp_path):
    """--no-save-optim --no-save-rng write the weights alone; a resume that asks for the optimizer state stops
    with one line (an older iteration is no substitute), and --no-load-optim resumes them."""
    from checkpoint_files import checkpoint_tensors
    from megatron_auto.runtime import rng_state

    ckpt, common = tmp_path / "ckpt", ["--lr", "1e-3", "--eval-iters", "0"]
    saved = _pretrain(["--train-iters", "2", *common, "--save", str(ckpt), "--no-save-optim", "--no-save-rng"])
    assert saved.returncode == 0, saved.stderr[-3000:]
    names = checkpoint_tensors(ckpt / "iter_0000002")
    assert names and not any(name.startswith("optimizer.") for name in names)
    assert not (ckpt / "iter_0000002" / rng_state.FOLDER).exists()
    refused = _pretrain(["--train-iters", "4", *common, "--load", str(ckpt)], fresh=True)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        f"error: --load {ckpt}: iteration 2 was saved without optimizer state (--no-save-optim): resume it with "
        "--no-load-optim or --finetune"]
    resumed = _pretrain(["--train-iters", "4", *common, "--load", str(ckpt), "--no-load-optim"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert re.findall(r" iteration +(\d+)/", resumed.stdout) == ["3", "4"]


def test_retained_and_non_persistent_checkpoints_rotate_as_megatron_lm_s_and_resume(tmp_path):
    """6 iterations, --save-interval 2 --save-retain-interval 4, a non-persistent checkpoint at every other
    iteration: the save at 4 removes iteration 2 (not a multiple of 4), the one at 6 keeps 4; each
    non-persistent save leaves the newest before it and itself. --ckpt-step 5 reads iteration 5 from the
    non-persistent folder, and iteration 6 then repeats the uninterrupted run's loss."""
    ckpt, common = tmp_path / "ckpt", ["--lr", "1e-3", "--eval-iters", "0"]
    rotation = ["--save-interval", "2", "--save-retain-interval", "4", "--non-persistent-save-interval", "1",
                "--non-persistent-ckpt-type", "global"]
    full = _pretrain(["--train-iters", "6", *common, *rotation, "--save", str(ckpt)])
    assert full.returncode == 0, full.stderr[-3000:]
    iterations = lambda folder: sorted(int(p.name[5:]) for p in folder.glob("iter_*"))  # noqa: E731
    assert iterations(ckpt) == [4, 6] and iterations(ckpt / "non_persistent") == [3, 5]
    assert (ckpt / "non_persistent" / "latest_checkpointed_iteration.txt").read_text() == "5"
    resumed = _pretrain(["--train-iters", "6", *common, "--load", str(ckpt), "--ckpt-step", "5",
                         "--non-persistent-ckpt-type", "global"])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from iteration 5 of {ckpt / 'non_persistent' / 'iter_0000005'}" in resumed.stdout
    assert _losses(resumed.stdout) == {6: _losses(full.stdout)[6]}


def test_rope_position_interpolation_reaches_the_model():
    """--rotary-seq-len-interpolation-factor divides RoPE's positions: factor 1 trains exactly as without the
    flag, factor 4 changes the first loss (the same weights and tokens, other rotations)."""
    rope = ["--train-iters", "1", "--eval-iters", "0", "--position-embedding-type", "rope"]
    plain, one, four = (_losses(_pretrain([*rope, *extra]).stdout)
                        for extra in ([], ["--rotary-seq-len-interpolation-factor", "1"],
                                      ["--rotary-seq-len-interpolation-factor", "4"]))
    assert plain == one and set(plain) == {1}
    assert four[1] != plain[1]


def test_exit_duration_stops_after_the_first_iteration_past_it(tmp_path):
    done = _pretrain(["--train-iters", "50", "--eval-iters", "0", "--exit-duration-in-mins", "1e-6",
                      "--save", str(tmp_path / "ckpt")])
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.findall(r" iteration +(\d+)/", done.stdout) == ["1"]
    assert "exiting after" in done.stdout and "saved checkpoint at iteration 1" in done.stdout


def test_per_token_loss_trains_as_the_mean_when_every_token_counts():
    # With every token in the loss (no masked tokens here), Megatron's per-token loss (sum over the
    # global batch / its token count) equals the mean of the micro-batch means: same losses to fp32
    # rounding (4 micro-batches of 32 tokens: relative differences of order 1e-7 per step; 1e-5 allows
    # for three Adam steps amplifying them).
    common = ["--train-iters", "3", "--eval-iters", "0", "--micro-batch-size", "1", "--global-batch-size", "4",
              "--hidden-dropout", "0", "--attention-dropout", "0"]
    mean = _pretrain(common)
    per_token = _pretrain(common + ["--calculate-per-token-loss"])
    assert mean.returncode == 0 and per_token.returncode == 0, per_token.stderr[-3000:]
    losses = [[float(x) for x in re.findall(r"lm loss: (\S+) \|", run.stdout)] for run in (mean, per_token)]
    assert len(losses[0]) == 3 and losses[1] == pytest.approx(losses[0], rel=1e-5)
