"""tools/pretrain_gpt.py's catalogue of bad runs (issue 14): every case stops with exit status 2 and
exactly one line on stderr, no traceback, before any work, and an existing --save directory stays as
it was.

"Before any work" is checked by replacing the process-group start (runtime.distributed.init_distributed,
the first step of a run after the checks) with a tripwire: a case that reaches it failed to stop early.
The cases run in this process (main(argv), 1 rank, or 2 ranks' flags with WORLD_SIZE=2: no rank is
started); two run as real processes, for what only a process shows: an error at interpreter exit, and
a rendezvous that times out.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from validation.launcher import REPO, free_port, rank_env
from megatron_auto import train
from megatron_auto.train import pretrain

VOCAB = 257  # ByteTokenizer: bytes 0..255 and end-of-document 256
TINY = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "32",
        "--max-position-embeddings", "32", "--micro-batch-size", "2", "--global-batch-size", "2",
        "--lr", "1e-3", "--eval-iters", "0", "--tokenizer-type", "ByteTokenizer"]
"""A demo-sized run of 2 iterations (--train-iters 2 unless the case gives --train-samples)."""


class ReachedWork(Exception):
    """The run got past its checks to the process group."""


def _write_dataset(prefix: Path, documents: list[np.ndarray]) -> None:
    """A Megatron indexed dataset (.bin/.idx) of uint16 tokens, through megatron-core's builder."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for document in documents:
        builder.add_document(document, [len(document)])
    builder.finalize(f"{prefix}.idx")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, str]:
    """Prefixes: a good byte-level dataset and damaged copies of it."""
    root = tmp_path_factory.mktemp("bad_data")
    rng = np.random.default_rng(0)
    documents = [np.append(rng.integers(0, 256, size=int(n)), 256) for n in rng.integers(20, 80, size=60)]
    _write_dataset(root / "good", documents)
    good_bin, good_idx = (root / "good.bin").read_bytes(), (root / "good.idx").read_bytes()
    files = {"no_idx": (good_bin, None), "short_idx": (good_bin, good_idx[:100]),
             "garbage_idx": (good_bin, bytes(rng.integers(0, 256, size=len(good_idx), dtype=np.uint8))),
             "short_bin": (good_bin[:1000], good_idx)}
    for name, (bin_bytes, idx_bytes) in files.items():
        (root / f"{name}.bin").write_bytes(bin_bytes)
        if idx_bytes is not None:
            (root / f"{name}.idx").write_bytes(idx_bytes)
    prefixes = {name: str(root / name) for name in ("good", *files)}
    return {**prefixes, "under_a_file": str(root / "good.bin" / "cache")}


def _snapshot(folder: Path) -> dict[str, tuple]:
    """Every file's bytes and modification time, and every folder, under `folder`."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else "folder"
            for p in sorted(folder.rglob("*"))}


@pytest.fixture
def saved(tmp_path) -> Path:
    """A --save directory holding an earlier run's checkpoint (stand-in files)."""
    folder = tmp_path / "ckpt"
    (folder / "iter_0000004").mkdir(parents=True)
    (folder / "latest_checkpointed_iteration.txt").write_text("4")
    (folder / "iter_0000004" / "common.pt").write_bytes(b"weights of iteration 4")
    return folder


def _main(argv: list[str], monkeypatch, world_size: int = 1) -> int:
    """megatron_auto.train's main in this process, stopped at the process group; its exit status."""
    import patches
    from megatron_auto.runtime import distributed

    def tripwire(*_args, **_kwargs):
        raise ReachedWork

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    monkeypatch.setattr(distributed, "init_distributed", tripwire)  # run() looks it up at each call
    monkeypatch.setattr(patches, "apply_all", lambda: None)
    monkeypatch.setattr(pretrain, "configure_logging", lambda: None)  # main() looks it up at each call
    try:
        return pretrain.main(argv)
    except SystemExit as stop:  # argparse's errors
        return stop.code


# (case id, flags after TINY, world size, words the one line must hold)
CASES = [
    ("warmup_longer_than_run", ["--lr-warmup-iters", "5"], 1, "warm-up (5 iterations) must be shorter"),
    ("warmup_equal_to_decay", ["--lr-warmup-iters", "4", "--lr-decay-iters", "4"], 1, "must be shorter"),
    ("warmup_fraction_one", ["--lr-warmup-fraction", "1"], 1, "--lr-warmup-fraction must be"),
    ("decay_iters_zero", ["--lr-decay-iters", "0"], 1, "--lr-decay-iters must be positive"),
    ("train_iters_zero", ["--train-iters", "0"], 1, "--train-iters must be positive"),
    ("iters_and_samples", ["--train-iters", "2", "--train-samples", "8"], 1,
     "exactly one of --train-iters and --train-samples"),
    ("samples_below_one_batch", ["--train-samples", "1"], 1, "less than one global batch"),
    ("seq_above_positions", ["--seq-length", "64"], 1, "max_position_embeddings (32) must be greater"),
    ("vocab_below_token_ids", ["--tokenizer-type", "NullTokenizer", "--vocab-size", "100"], 1,
     "token id 256 is outside the tokenizer's vocabulary of 101"),
    ("missing_idx", ["--data-path", "@no_idx"], 1, "no file"),
    ("garbage_idx", ["--data-path", "@garbage_idx"], 1, "cannot read"),
    ("truncated_idx", ["--data-path", "@short_idx"], 1, "cannot read"),
    ("truncated_bin", ["--data-path", "@short_bin"], 1, "short_bin.bin has 1,000 bytes"),
    ("global_batch_vs_micro_batch", ["--global-batch-size", "3"], 1, "not divisible by micro batch x DP"),
    ("global_batch_vs_data_parallel", [], 2, "global batch 2 is not divisible by micro batch x DP = 4"),
    ("micro_batch_zero", ["--micro-batch-size", "0"], 1, "--micro-batch-size must be at least 1"),
    ("tensor_parallel_zero", ["--tensor-model-parallel-size", "0"], 1, "must be at least 1"),
    ("layers_vs_pipeline", ["--global-batch-size", "4", "--pipeline-model-parallel-size", "2", "--num-layers", "3"],
     2, "3 layers do not split evenly"),
    ("heads_vs_tensor_parallel", ["--tensor-model-parallel-size", "2", "--num-attention-heads", "3",
                                  "--hidden-size", "48"], 2, "tp=2 does not divide the attention heads (3)"),
    ("query_groups_vs_tensor_parallel", ["--tensor-model-parallel-size", "2", "--num-attention-heads", "4",
                                         "--group-query-attention", "--num-query-groups", "1"], 2, "query groups (1)"),
    ("heads_vs_query_groups", ["--num-attention-heads", "4", "--group-query-attention", "--num-query-groups", "3"],
     1, "not divisible by num_query_groups 3"),
    ("query_groups_zero", ["--group-query-attention", "--num-query-groups", "0"], 1, "num_query_groups must be"),
    ("hidden_vs_heads", ["--hidden-size", "33"], 1, "hidden_size 33 is not divisible by num_attention_heads 2"),
    ("world_vs_model_parallel", ["--tensor-model-parallel-size", "3", "--num-attention-heads", "3",
                                 "--hidden-size", "48"], 2, "world size 2 is not divisible by TP 3 x PP 1 = 3"),
    ("virtual_stages_vs_layers", ["--global-batch-size", "4", "--pipeline-model-parallel-size", "2",
                                  "--num-layers", "4", "--num-layers-per-virtual-pipeline-stage", "3"], 2,
     "do not split into chunks of 3"),
    ("selective_recompute_with_method", ["--recompute-granularity", "selective", "--recompute-method", "uniform"], 1,
     "--recompute-method is not supported with --recompute-granularity selective"),
    ("fp16_and_bf16", ["--fp16", "--bf16"], 1, "--bf16 and --fp16 are mutually exclusive"),
    ("lr_nan", ["--lr", "nan"], 1, "--lr must be a finite number >= 0, got nan"),
    ("lr_negative", ["--lr=-1e-3"], 1, "--lr must be a finite number >= 0"),
    ("lr_infinite", ["--lr", "inf"], 1, "--lr must be a finite number"),
    ("min_lr_above_lr", ["--min-lr", "1e-2"], 1, "--min-lr 0.01 is above --lr 0.001"),
    ("warmup_init_above_lr", ["--lr-warmup-iters", "1", "--lr-warmup-init", "1"], 1, "--lr-warmup-init 1 is above"),
    ("adam_beta2_one", ["--adam-beta2", "1"], 1, "--adam-beta2 must be a finite number in [0, 1)"),
    ("adam_eps_negative", ["--adam-eps=-1"], 1, "--adam-eps must be"),
    ("weight_decay_negative", ["--weight-decay=-0.1"], 1, "--weight-decay must be"),
    ("clip_grad_negative", ["--clip-grad=-1"], 1, "--clip-grad must be"),
    ("dropout_above_one", ["--hidden-dropout", "1.5"], 1, "--hidden-dropout must be a finite number in [0, 1]"),
    ("init_std_negative", ["--init-method-std=-0.02"], 1, "--init-method-std must be"),
    ("log_interval_zero", ["--log-interval", "0"], 1, "--log-interval must be at least 1"),
    ("eval_interval_negative", ["--eval-interval=-5"], 1, "--eval-interval must be non-negative"),
    ("eval_iters_negative", ["--eval-iters=-1"], 1, "--eval-iters must be non-negative"),
    ("save_interval_negative", ["--save-interval=-2"], 1, "--save-interval must be non-negative"),
    ("vocab_multiple_zero", ["--make-vocab-size-divisible-by", "0"], 1, "--make-vocab-size-divisible-by must be"),
    ("timeout_zero", ["--distributed-timeout-minutes", "0"], 1, "--distributed-timeout-minutes must be"),
    ("ffn_zero", ["--ffn-hidden-size", "0"], 1, "ffn_hidden_size must be a positive integer"),
    ("seed_negative", ["--seed=-1"], 1, "--seed must be non-negative"),
    ("norm_epsilon_negative", ["--norm-epsilon=-1"], 1, "--norm-epsilon must be"),
    ("rotary_percent_zero", ["--position-embedding-type", "rope", "--rotary-percent", "0"], 1, "--rotary-percent"),
    ("exit_duration_negative", ["--exit-duration-in-mins=-1"], 1, "--exit-duration-in-mins must be a finite number"),
    ("decoupled_lr_negative", ["--decoupled-lr=-1"], 1, "--decoupled-lr must be"),
    ("fp16_loss_scale_zero", ["--fp16", "--loss-scale", "0"], 1, "--loss-scale must be positive"),
    ("blend_weight_negative", ["--data-path", "-1", "@good"], 1, "weights must be non-negative"),
    ("mock_and_data_path", ["--mock-data"], 1, "give --data-path or --mock-data, not both"),
    ("virtual_stages_with_uneven_pipeline", ["--pipeline-model-parallel-size", "2", "--num-layers", "4",
                                             "--num-layers-per-virtual-pipeline-stage", "1",
                                             "--decoder-first-pipeline-num-layers", "1"], 2, "cannot go with"),
    ("sequence_parallel_vs_seq_length", ["--global-batch-size", "2", "--tensor-model-parallel-size", "2",
                                         "--sequence-parallel", "--seq-length", "31", "--max-position-embeddings",
                                         "31"], 2, "--seq-length 31 must be divisible by it"),
    ("validation_without_validation_split", ["--split", "100,0,0", "--eval-iters", "2"], 1,
     "--split 100,0,0 leaves no validation data, but --eval-iters 2 asks for validation"),
    ("cache_path_under_a_file", ["--data-cache-path", "@under_a_file"], 1, "cannot be created"),
    # megatron-core's split parser keeps the numbers it finds: "98,2,x" would read as 98,2,0, "-1,2,3" as 1,2,3.
    ("split_with_a_word", ["--split", "98,2,x"], 1, "--split '98,2,x': give up to three non-negative"),
    ("split_negative", ["--split=-1,2,3"], 1, "--split '-1,2,3': give up to three non-negative"),
    ("wsd_without_its_length", ["--lr-decay-style", "WSD"], 1, "--lr-decay-style WSD needs --lr-wsd-decay-iters"),
    ("wsd_longer_than_the_decay", ["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "3"], 1,
     "--lr-wsd-decay-iters 3 must be between 1 and the decay's length (2 iterations)"),
    ("start_weight_decay_when_constant", ["--start-weight-decay", "0.1"], 1,
     "--start-weight-decay goes with --weight-decay-incr-style linear or cosine"),
    ("moving_weight_decay_without_its_end", ["--weight-decay-incr-style", "linear", "--start-weight-decay", "0"], 1,
     "--weight-decay-incr-style linear needs --end-weight-decay"),
    ("end_weight_decay_negative", ["--weight-decay-incr-style", "cosine", "--start-weight-decay", "0",
                                   "--end-weight-decay=-0.1"], 1, "--end-weight-decay must be a finite number >= 0"),
]


def _argv(flags: list[str], data: dict[str, str], saved: Path) -> list[str]:
    """TINY and `flags`, on the good dataset unless the case names one ("@name"), saving into `saved`."""
    flags = [data[f[1:]] if f.startswith("@") else f for f in flags]
    length = [] if "--train-samples" in flags else ["--train-iters", "2"]
    source = [] if "--data-path" in flags else ["--data-path", data["good"]]
    return TINY + length + source + ["--save", str(saved), "--save-interval", "1"] + flags


@pytest.mark.parametrize("flags, world_size, words", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_bad_run_is_one_line_and_exit_2_before_any_work(flags, world_size, words, data, saved, monkeypatch, capsys):
    before = _snapshot(saved)
    try:
        code = _main(_argv(flags, data, saved), monkeypatch, world_size)
    except ReachedWork:
        pytest.fail("the run got past its checks to the process group")
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert words in lines[0], lines[0]
    assert _snapshot(saved) == before


def test_sequence_parallel_at_tensor_parallel_1_is_turned_off_with_megatrons_warning(data, saved, monkeypatch,
                                                                                    capsys):
    """Megatron-LM's validate_args warns and runs without sequence parallelism; so does this."""
    plans = []
    choose_plan = pretrain.choose_plan
    monkeypatch.setattr(pretrain, "choose_plan", lambda *a: plans.append(choose_plan(*a)) or plans[-1])
    with pytest.raises(ReachedWork):
        _main(_argv(["--sequence-parallel"], data, saved), monkeypatch)
    assert capsys.readouterr().err == ""
    assert not any(strategy.sp for strategy in plans[0].layer_strategies)
    args = train.parse_args(TINY + ["--train-iters", "2", "--mock-data", "--sequence-parallel"])
    assert train.megatron_lm_adjustments(args) == [
        "Disabling sequence parallelism because tensor model parallelism is disabled"]


def test_token_ids_of_a_bin_too_large_to_scan_are_checked_as_read(data):
    """Above the scan limit the ids are checked sample by sample: the first sample past the vocabulary
    is one line (every sample of the byte-level data holds ids above 100)."""
    from megatron_auto.errors import UserError
    from megatron_auto.runtime.gpt_data import GPTDatasets, check_token_ids
    from megatron_auto.runtime.settings import DataSettings

    assert check_token_ids(data["good"], VOCAB) is True
    assert check_token_ids(data["good"], 101, max_scan_bytes=0) is False
    datasets = GPTDatasets(DataSettings(blend=(data["good"],), vocab_size=101, eod=100, split="100,0,0"), 32, 1,
                           [8, 0, 0], evaluates=False)
    with pytest.raises(UserError, match=r"token id \d+ is outside the tokenizer's vocabulary of 101"):
        datasets.sample(0)


def _process(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """pretrain_gpt.py as a user runs it (Python's warnings not silenced)."""
    env = {key: value for key, value in env.items() if key != "PYTHONWARNINGS"}
    return subprocess.run([sys.executable, "tools/pretrain_gpt.py", *argv], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_corrupt_idx_is_one_line_with_nothing_more_at_exit(data, saved):
    """megatron-core's IndexedDataset.__del__ raises a second error at interpreter exit when its
    constructor failed; the .idx is read without it."""
    before = _snapshot(saved)
    done = _process(_argv(["--data-path", "@garbage_idx"], data, saved), rank_env(0, 1, free_port()))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "cannot read" in lines[0], done.stderr
    assert _snapshot(saved) == before


def test_a_rank_that_never_comes_times_out_after_the_given_sub_minute_timeout(data, saved):
    """One of two ranks started: the rendezvous gives up after --distributed-timeout-minutes 0.05 (3 s),
    not a whole minute, and says so in one line (torch's own count of the wait included)."""
    flags = ["--global-batch-size", "4", "--distributed-timeout-minutes", "0.05"]
    done = _process(_argv(flags, data, saved), rank_env(0, 2, free_port()))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "within 3 s" in lines[0], done.stderr
    waited = re.search(r"Timed out after (\d+) seconds", lines[0])
    # torch's store counts whole seconds from its start (3 s -> "4 seconds" measured); a minute's rounding: 60.
    assert waited and int(waited.group(1)) <= 10, lines[0]


def test_the_timeout_reaches_megatrons_groups_unrounded(monkeypatch):
    """--distributed-timeout-minutes 0.5 is 0.5 minutes in Megatron's groups, plain and hybrid."""
    from megatron.core import parallel_state

    from megatron_auto.runtime import distributed
    from megatron_auto.runtime.hybrid import hybrid_runtime as hybrid_session
    from megatron_auto.parallel_dims import ParallelDims
    from megatron_auto.runtime.layout import MegatronLayout

    given = []
    monkeypatch.setattr(parallel_state, "model_parallel_is_initialized", lambda: False)
    monkeypatch.setattr(parallel_state, "initialize_model_parallel",
                        lambda **kwargs: given.append(kwargs["distributed_timeout_minutes"]))
    monkeypatch.setattr(distributed.torch.distributed, "get_world_size", lambda: 1)
    monkeypatch.setattr(distributed.torch.distributed, "get_rank", lambda: 0)
    distributed.initialize_parallel(MegatronLayout(ParallelDims(), 1, 1, 1), 30.0)
    plan = type("OnePipelineStage", (), {"pipeline_parallel": 1, "virtual_stages": 1})()
    hybrid_session.initialize_parallel(plan, 30.0)
    assert given == [0.5, 0.5]
