"""Fill-in-the-middle samples (megatron_auto/runtime/fim.py), torch-free: Megatron-LM's GPTFIMDataset
transformation (megatron/training/datasets/fim_dataset.py at core_v0.16.1) over a character tokenizer, whose
text round trip keeps every token, so the token multiset can be checked."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from megatron_auto.runtime.fim import FimPermuter, FimTokenIds, sample_rng, token_ids
from megatron_auto.runtime.settings import FimSettings

PREFIX, MIDDLE, SUFFIX, PAD, EOD, SPLIT = 1, 2, 3, 4, 5, 6
SPECIALS = {"<fim_prefix>": PREFIX, "<fim_middle>": MIDDLE, "<fim_suffix>": SUFFIX, "<fim_pad>": PAD,
            "<|endoftext|>": EOD, "<file>": SPLIT}
SENTINELS = (PREFIX, MIDDLE, SUFFIX)


class CharTokenizer:
    """One id per character (its code point); the sentinels have ids below 32."""

    kind = "chars"

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def detokenize(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)

    def token_id(self, token: str):
        return SPECIALS.get(token)


def permuter(**fields) -> FimPermuter:
    fim = FimSettings(**fields)
    return FimPermuter(fim, token_ids(fim, CharTokenizer()), CharTokenizer())


def sample(text: str, eods: bool = True) -> np.ndarray:
    """The text's ids with an end-of-document token after each ';'."""
    ids = []
    for c in text:
        ids.append(ord(c))
        if eods and c == ";":
            ids.append(EOD)
    return np.asarray(ids, dtype=np.int64)


TEXT = "def add(a, b): return a + b;class Point: x = 1; y = 2;print(add(3, 4)) # and more"


def test_rate_zero_leaves_every_sample_unchanged():
    fim = permuter(rate=0.0, spm_rate=0.5)
    for index in range(20):
        original = sample(TEXT)
        assert np.array_equal(fim.transform(original, sample_rng(1234, index)), original)


def _segments(ids: np.ndarray) -> list[list[int]]:
    out, current = [], []
    for token in ids.tolist():
        if token == EOD:
            out.append(current)
            current = []
        else:
            current.append(token)
    return [*out, current]


@pytest.mark.parametrize("spm_rate", [0.0, 1.0])
def test_rate_one_puts_every_segment_in_fim_form_and_keeps_its_tokens(spm_rate):
    fim = permuter(rate=1.0, spm_rate=spm_rate)
    original = sample(TEXT)
    for index in range(20):
        out = fim.transform(original, sample_rng(1234, index))
        assert out.shape == original.shape and out.dtype == np.int64
        kept = [t for t in out.tolist() if t not in SENTINELS and t != PAD]
        # Only truncation (3 sentinels per segment) drops tokens: what is kept is a sub-multiset.
        assert not Counter(kept) - Counter(original.tolist())
        for segment in _segments(out)[:-1]:  # the last one may be cut by the truncation
            assert segment[0] == PREFIX
            if spm_rate == 1.0:
                assert segment[1] == SUFFIX and segment.index(MIDDLE) > 1
            else:
                assert segment.index(SUFFIX) < segment.index(MIDDLE)
            assert Counter(t for t in segment if t not in SENTINELS) <= Counter(original.tolist())


def test_without_truncation_the_tokens_are_exactly_kept():
    fim = permuter(rate=1.0, spm_rate=0.5)
    original = sample("no end of document in this one", eods=False)
    for index in range(10):  # the segment's transformation before the cut back to the sample's length
        out = fim._split_and_permute(original, sample_rng(7, index)).tolist()
        assert Counter(t for t in out if t not in SENTINELS) == Counter(original.tolist())
        assert sorted(t for t in out if t in SENTINELS) == [PREFIX, MIDDLE, SUFFIX]


def test_the_same_seed_and_index_give_the_same_sample_and_others_differ():
    fim = permuter(rate=0.5, spm_rate=0.5)
    original = sample(TEXT)
    first = [fim.transform(original, sample_rng(1234, i)) for i in range(8)]
    again = [fim.transform(original, sample_rng(1234, i)) for i in range(8)]
    other = [fim.transform(original, sample_rng(99, i)) for i in range(8)]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))
    assert len({a.tobytes() for a in first}) > 1


def test_split_sample_puts_each_fragment_in_fim_form_after_its_split_token():
    fim = permuter(rate=1.0, spm_rate=0.0, split_sample="<file>", fragment_rate=1.0)
    text = [ord(c) for c in "import os"] + [SPLIT] + [ord(c) for c in "x = os.sep"]
    out = fim._split_and_permute(np.asarray(text, dtype=np.int64), sample_rng(3, 0)).tolist()
    at = out.index(SPLIT)
    assert out[0] == PREFIX and out[at + 1] == PREFIX  # as Megatron-LM's unit test checks
    assert Counter(t for t in out if t not in SENTINELS) == Counter(text)
    assert len(out) == len(text) + 6


def test_no_prefix_leaves_matching_segments_alone():
    fim = permuter(rate=1.0, spm_rate=0.0, no_prefix="#")
    original = sample("# a comment", eods=False)
    assert np.array_equal(fim.transform(original, sample_rng(5, 0)), original)


def test_a_token_the_vocabulary_lacks_is_one_line_naming_its_flag():
    from megatron_auto.errors import UserError

    with pytest.raises(UserError, match="--fim-pad-token '<nope>'"):
        token_ids(FimSettings(pad_token="<nope>"), CharTokenizer())
