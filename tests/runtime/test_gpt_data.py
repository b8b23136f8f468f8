"""Blended, weighted `--data-path` and `--split` through megatron-core's dataset builder
(runtime/gpt_data.py), and the .bin/.idx check."""
from __future__ import annotations

import collections
import shutil
import subprocess
import sys

import pytest

from validation.launcher import REPO, rank_env, run_script
from megatron_auto.errors import UserError
from megatron_auto.runtime.gpt_data import (GPTDatasets, check_bin_matches_idx, parse_blend, parse_split,
                                            split_sizes)
from megatron_auto.runtime.settings import DataSettings

DOCUMENTS = 700  # lines of data/tiny_corpus.jsonl


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory) -> tuple[str, str]:
    """Two byte-level datasets of the corpus (the second a copy under another name)."""
    root = tmp_path_factory.mktemp("datasets")
    done = run_script(["tools/preprocess_data.py", "--input", "data/tiny_corpus.jsonl", "--output-prefix",
                       str(root / "a"), "--tokenizer-type", "ByteTokenizer", "--append-eod"], rank_env(0, 1, 0),
                      timeout_s=300)
    assert done.returncode == 0, done.stderr
    for suffix in (".bin", ".idx"):
        shutil.copy(root / f"a_text_document{suffix}", root / f"b_text_document{suffix}")
    return str(root / "a_text_document"), str(root / "b_text_document")


def _datasets(blend: tuple[str, ...], split: str, sizes: list[int], seq_length: int = 32) -> GPTDatasets:
    return GPTDatasets(DataSettings(blend=blend, vocab_size=257, eod=256, split=split), seq_length, 1234,
                       sizes, evaluates=False)


def test_blend_forms_of_megatron_lm():
    assert parse_blend(["p"]) == (["p"], None)
    assert parse_blend(["p", "q"]) == (["p", "q"], None)
    assert parse_blend(["0.3", "p", "0.7", "q"]) == (["p", "q"], [0.3, 0.7])
    with pytest.raises(UserError, match="not a mix"):
        parse_blend(["0.3", "p", "q", "r"])
    with pytest.raises(UserError, match="positive sum"):
        parse_blend(["0", "p", "0", "q"])


def test_split_is_parsed_as_megatron_and_bad_splits_are_user_errors():
    assert parse_split("949,50,1") == pytest.approx([0.949, 0.05, 0.001])
    assert parse_split("99,1") == pytest.approx([0.99, 0.01, 0.0])
    assert parse_split("'99,1,0'") == pytest.approx([0.99, 0.01, 0.0])  # as Megatron-LM's llama3 script quotes it
    for bad in ("0,1,1", "a,b", "1,2,3,4"):
        with pytest.raises(UserError, match="--split"):
            parse_split(bad)


def test_split_sizes_follow_megatron_lm():
    # train_iters x B; (train_iters // eval_interval + 1) x eval_iters x B; eval_iters x B.
    assert split_sizes(100, 30, 2, 8) == [800, 4 * 2 * 8, 16]
    assert split_sizes(100, 0, 2, 8) == [800, 16, 16]


def test_weights_set_the_share_of_each_dataset_in_the_samples(prefixes):
    datasets = _datasets(("0.3", prefixes[0], "0.7", prefixes[1]), "949,50,1", [1000, 100, 10])
    train = datasets.splits["train"]
    counts = collections.Counter(int(train[i]["dataset_id"]) for i in range(1000))
    # megatron-core's blending picks, sample by sample, the dataset furthest below its share:
    # each count is within one sample of weight x samples.
    assert abs(counts[0] - 300) <= 1 and abs(counts[1] - 700) <= 1


def test_prefixes_without_weights_are_weighted_by_size(prefixes):
    datasets = _datasets((prefixes[0], prefixes[1]), "100,0,0", [None, None, None])
    train = datasets.splits["train"]
    counts = collections.Counter(int(train[i]["dataset_id"]) for i in range(len(train)))
    assert counts[0] == counts[1] > 0  # equal sizes, equal shares
    assert datasets.splits["eval"] is None and datasets.splits["test"] is None


def test_split_divides_the_documents_as_megatron(prefixes):
    datasets = _datasets((prefixes[0],), "949,50,1", [64, 32, 8])
    # Megatron: split i takes documents [round(c_i x N), round(c_{i+1} x N)) for the cumulative shares c.
    cumulative = [0.0, 0.949, 0.999, 1.0]
    bounds = [round(c * DOCUMENTS) for c in cumulative]
    for name, begin, end in zip(("train", "eval", "test"), bounds, bounds[1:]):
        documents = datasets.splits[name].indices
        assert (documents.min(), documents.max() + 1, len(documents)) == (begin, end, end - begin)
    assert len(datasets.splits["train"]) >= 64 and len(datasets.splits["eval"]) >= 32


def test_samples_are_the_token_stream_of_their_split(prefixes):
    import numpy as np
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    datasets = _datasets((prefixes[0],), "949,50,1", [64, 32, 8], seq_length=16)
    documents = IndexedDataset(prefixes[0])
    stream = np.concatenate([np.array(documents[d]) for d in range(664, 699)])
    item = datasets.sample(0, "eval")
    sample = np.concatenate([item["tokens"].numpy(), item["labels"][-1:].numpy()])
    assert sample.shape == (17,)
    np.testing.assert_array_equal(item["tokens"][1:].numpy(), item["labels"][:-1].numpy())
    starts = [i for i in range(len(stream) - 16) if (stream[i:i + 17] == sample).all()]
    assert starts  # the validation sample is a window of the validation documents


def test_truncated_bin_is_one_line_before_any_work(prefixes, tmp_path):
    truncated = tmp_path / "cut"
    shutil.copy(prefixes[0] + ".idx", f"{truncated}.idx")
    with open(prefixes[0] + ".bin", "rb") as source:
        (tmp_path / "cut.bin").write_bytes(source.read(1000))
    with pytest.raises(UserError, match=r"cut.bin has 1,000 bytes but .* indexes"):
        check_bin_matches_idx(str(truncated))
    done = subprocess.run([sys.executable, "tools/pretrain_gpt.py", "--num-layers", "2", "--hidden-size", "32",
                           "--num-attention-heads", "2", "--seq-length", "32", "--train-iters", "2",
                           "--tokenizer-type", "ByteTokenizer", "--data-path", str(truncated)],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=rank_env(0, 1, 29998))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "cut.bin has 1,000 bytes" in done.stderr


def test_missing_validation_split_is_refused_when_evaluating(prefixes):
    with pytest.raises(UserError, match="leaves no validation data"):
        GPTDatasets(DataSettings(blend=(prefixes[0],), vocab_size=257, eod=256, split="100,0,0"), 32, 1,
                    [64, 32, 8], evaluates=True)


def test_eod_mask_loss_and_reset_position_ids_reach_the_samples(prefixes):
    data = DataSettings(blend=(prefixes[0],), vocab_size=257, eod=256, split="949,50,1",
                        eod_mask_loss=True, reset_position_ids=True)
    datasets = GPTDatasets(data, 64, 1234, [64, 32, 8], evaluates=False)
    seen_eod = 0
    for index in range(16):
        item = datasets.sample(index)
        tokens = item["tokens"].tolist()
        # Megatron-LM: no loss where the input is end-of-document; positions restart after it.
        assert item["loss_mask"].tolist() == [0.0 if t == 256 else 1.0 for t in tokens]
        expected, position = [], 0
        for token in tokens:
            expected.append(position)
            position = 0 if token == 256 else position + 1
        assert item["position_ids"].tolist() == expected
        seen_eod += tokens.count(256)
    assert seen_eod > 0  # documents of ~230 bytes: 16 windows of 64 cross several ends


def test_split_that_leaves_a_needed_split_no_document_is_refused(prefixes):
    """Megatron-LM's Mixtral line splits 99990,8,2: 0.008% of 700 documents rounds to none, and
    megatron-core's GPTDataset would count epochs of zero tokens forever; here it is one line."""
    with pytest.raises(UserError, match="the validation split of .* gets none of its 700 documents"):
        _datasets((prefixes[0],), "99990,8,2", [80, 16, 0])
    with pytest.raises(UserError, match="the test split"):  # megatron-core builds it even for 0 samples
        _datasets((prefixes[0],), "99990,100,2", [80, 16, 0])
    assert _datasets((prefixes[0],), "99990,100,0", [80, 16, 0]).splits["eval"]  # weight 0: not built


def test_mock_data_is_megatron_cores_mock_gpt_dataset():
    """--mock-data as Megatron-LM's pretrain_gpt.py builds it: megatron-core's MockGPTDataset over an even split,
    documents of 1, 2, 3, ... (mod the vocabulary) each closed by the end-of-document id."""
    from megatron.core.datasets.gpt_dataset import MockGPTDataset

    from megatron_auto.runtime.data import MockTokens, open_source
    from megatron_auto.runtime.settings import TrainSettings

    data = DataSettings(vocab_size=512, eod=511, mock_dataset=True)
    datasets = GPTDatasets(data, 64, 1234, [64, 16, 16], evaluates=True)
    assert all(isinstance(split, MockGPTDataset) for split in datasets.splits.values())
    tokens = datasets.sample(0)["tokens"].tolist()
    steps = {b - a for a, b in zip(tokens, tokens[1:]) if 511 not in (a, b)}
    assert steps <= {1, 1 - 511}, tokens  # consecutive ids, wrapping below the end-of-document id's vocabulary
    assert datasets.sample(0, "eval")["tokens"].tolist() != tokens
    settings = TrainSettings(train_iters=2, eval_iters=1, eval_interval=2, data=data)
    assert isinstance(open_source(settings, 64, 8), GPTDatasets)
    assert isinstance(open_source(TrainSettings(train_iters=2, data=DataSettings()), 64, 8), MockTokens)


def test_the_mock_data_flag_asks_for_megatron_cores_mock_dataset():
    from megatron_auto.train.arguments import parse_args
    from megatron_auto.train.settings import data_from_args

    common = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
              "--max-position-embeddings", "32", "--micro-batch-size", "1", "--train-iters", "2",
              "--tokenizer-type", "NullTokenizer", "--vocab-size", "128"]
    assert data_from_args(parse_args([*common, "--mock-data"]), 129).mock_dataset
