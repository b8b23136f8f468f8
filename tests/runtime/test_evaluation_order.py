"""Evaluations walk through the validation split as Megatron-LM's validation iterator does
(training.evaluate draws the next eval_iters batches; consumed_valid_samples carries over a resume)."""
from __future__ import annotations

from types import SimpleNamespace

from megatron_auto.runtime import session as sessions
from megatron_auto.runtime.settings import TrainSettings


def _session(eval_iters: int, eval_batches: int = 0):
    settings = TrainSettings(train_iters=12, eval_interval=4, eval_iters=eval_iters)
    return SimpleNamespace(settings=settings, source="source", slicer="slicer", device="cpu", model=[],
                           layout=None, model_spec=SimpleNamespace(seq_length=8), hybrid=None,
                           eval_batches=eval_batches)


def _record_batches(monkeypatch) -> list:
    """The validation batch index each eval_step is handed; the loss of batch i is i."""
    asked = []

    def iterators_for_chunks(source, slicer, index, device, split="train"):
        assert split == "eval"
        asked.append(index)
        return index

    monkeypatch.setattr(sessions.data, "iterators_for_chunks", iterators_for_chunks)
    monkeypatch.setattr(sessions, "eval_step", lambda model, index, *args, **kwargs: float(index))
    return asked


def test_each_evaluation_continues_where_the_last_one_stopped(monkeypatch):
    asked = _record_batches(monkeypatch)
    session = _session(eval_iters=2)
    losses = [sessions.evaluate(session) for _ in range(3)]
    assert asked == [0, 1, 2, 3, 4, 5]
    assert losses == [0.5, 2.5, 4.5]
    assert session.eval_batches == 6


def test_a_resumed_run_skips_the_batches_its_evaluations_used():
    settings = TrainSettings(train_iters=12, eval_interval=4, eval_iters=3)
    # Megatron-LM: consumed_valid_samples = iteration // eval_interval x eval_iters x global batch.
    assert [sessions.eval_batches_before(i, settings) for i in (0, 3, 4, 9, 12)] == [0, 0, 3, 6, 9]
    assert sessions.eval_batches_before(9, TrainSettings(train_iters=12, eval_interval=0, eval_iters=3)) == 0
    assert sessions.eval_batches_before(9, TrainSettings(train_iters=12, eval_interval=4, eval_iters=0)) == 0


def test_resume_restores_the_validation_position(monkeypatch):
    session = _session(eval_iters=2)
    session.settings = TrainSettings(train_iters=12, eval_interval=4, eval_iters=2, load="ckpt")
    session.optimizer = session.scheduler = None
    monkeypatch.setattr(sessions.checkpoint, "load_checkpoint",
                        lambda *args, **kwargs: SimpleNamespace(iteration=9, consumed_samples=72))
    sessions.resume(session)
    assert (session.iteration, session.eval_batches) == (9, 4)
