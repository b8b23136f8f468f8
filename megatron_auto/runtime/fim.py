"""Fill-in-the-middle (FIM) samples: Megatron-LM's `--fim-data` (megatron/training/datasets/fim_dataset.py,
GPTFIMDataset, at core_v0.16.1), rebuilt here over megatron-core's GPTDataset.

Each sample of seq_length + 1 tokens is cut at the FIM end-of-document token (`--fim-eod-token`) into
segments; each non-empty segment, and whatever follows the last such token, is turned, with probability
`--fim-rate`, into a FIM example: its text (the tokenizer's detokenization) is cut at two uniformly drawn
character positions into prefix, middle and suffix, each re-tokenized, and laid out as

    PSM: <prefix> prefix <suffix> suffix <middle> middle
    SPM: <prefix> <suffix> suffix <middle> prefix middle      (with probability --fim-spm-rate)

With `--fim-split-sample TOKEN` a segment that holds TOKEN is, with probability `--fim-rate`, cut at it into
fragments, each transformed with probability `--fim-fragment-rate` (TOKEN kept between them). A segment or
fragment whose text starts with `--fim-no-prefix` is left as it is. The result is cut or padded
(`--fim-pad-token`) back to the sample's length. As in Megatron-LM, a segment emptied between two adjacent FIM
end-of-document tokens is dropped together with its token.

One deliberate difference: Megatron-LM draws every sample's choices from one random stream per dataset,
consumed in the order samples are read (so a sample's FIM form depends on the data-parallel layout and on the
iteration a run resumed at). Here sample n draws from its own stream, seeded by (--seed, n), in the same
order and with the same distributions, so sample n is the same at every layout and after a resume, as every
other sample of this runtime is (runtime/data.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..errors import UserError
from .settings import FimSettings
from .tokenizers import TextTokenizer, make_tokenizer


@dataclass(frozen=True)
class FimTokenIds:
    """The ids of the FIM sentinel tokens, and of the split-sample token (None without --fim-split-sample)."""

    prefix: int
    middle: int
    suffix: int
    pad: int
    eod: int
    split_sample: Optional[int] = None


def token_ids(fim: FimSettings, tokenizer: TextTokenizer) -> FimTokenIds:
    """The sentinel tokens' ids in the tokenizer's vocabulary (Megatron-LM looks each up with tokens_to_ids);
    UserError naming the flag of a token the vocabulary lacks."""
    def look_up(flag: str, token: str) -> int:
        found = tokenizer.token_id(token)
        if found is None:
            raise UserError(f"{flag} {token!r}: --tokenizer-type {tokenizer.kind} has no such token "
                            "(FIM needs its sentinel tokens in the vocabulary: give the tokenizer's own with "
                            "--fim-prefix-token/--fim-middle-token/--fim-suffix-token/--fim-pad-token/"
                            "--fim-eod-token)")
        return found

    names = ("prefix", "middle", "suffix", "pad", "eod")
    ids = {name: look_up(f"--fim-{name}-token", getattr(fim, f"{name}_token")) for name in names}
    split = look_up("--fim-split-sample", fim.split_sample) if fim.split_sample is not None else None
    return FimTokenIds(**ids, split_sample=split)


def tokenizer_for(fim: FimSettings) -> TextTokenizer:
    """The run's tokenizer, rebuilt from the flags FimSettings keeps (each rank builds its own)."""
    return make_tokenizer(fim.tokenizer_type, fim.vocab_size, fim.tokenizer_files)


class FimPermuter:
    """Megatron-LM's FIM transformation of one sample (GPTFIMDataset._query_document_sample_shuffle_indices,
    _fim_split_and_permute_sequence and _permute), drawing from the random stream it is given."""

    def __init__(self, fim: FimSettings, ids: FimTokenIds, codec: TextTokenizer) -> None:
        self.fim, self.ids, self.codec = fim, ids, codec

    def transform(self, sample: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
        """The sample in FIM form, cut or padded back to its own length (int64)."""
        length = sample.shape[0]
        pieces: list = []
        start = 0
        for end in np.flatnonzero(sample == self.ids.eod):
            if end > start:  # an empty segment is dropped with its end-of-document token (Megatron-LM's loop)
                pieces += [self._split_and_permute(sample[start:end], rng), [self.ids.eod]]
            start = end + 1
        pieces.append(self._split_and_permute(sample[start:], rng))
        out = np.concatenate([np.asarray(piece, dtype=np.int64) for piece in pieces])
        if out.shape[0] >= length:
            return out[:length]
        return np.concatenate([out, np.full(length - out.shape[0], self.ids.pad, dtype=np.int64)])

    def _split_and_permute(self, segment: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
        """One segment: whole, or (with --fim-split-sample, when it holds that token) fragment by fragment."""
        split = self.ids.split_sample
        breaks = np.flatnonzero(segment == split) if split is not None else np.empty(0, dtype=np.int64)
        if breaks.size == 0:
            return self._permute(segment, self.fim.rate, rng)
        if not rng.binomial(1, self.fim.rate):
            return segment
        pieces: list = []
        start = 0
        for end in breaks:
            if end > start:
                pieces += [self._permute(segment[start:end], self.fim.fragment_rate, rng), [split]]
            start = end + 1
        pieces.append(self._permute(segment[start:], self.fim.fragment_rate, rng))
        return np.concatenate([np.asarray(piece, dtype=np.int64) for piece in pieces])

    def _permute(self, tokens: np.ndarray, rate: Optional[float], rng: np.random.RandomState) -> np.ndarray:
        """With probability `rate`, the PSM or SPM form of `tokens` (cut at two character positions of its
        text); else `tokens` unchanged. The draws are Megatron-LM's, in its order."""
        if not rng.binomial(1, rate):
            return tokens
        text = self.codec.detokenize([int(t) for t in tokens])
        if self.fim.no_prefix is not None and text.startswith(self.fim.no_prefix):
            return tokens
        first, second = sorted(int(b) for b in rng.randint(low=0, high=len(text) + 1, size=2))
        prefix, middle, suffix = (self._ids(part) for part in (text[:first], text[first:second], text[second:]))
        ids = self.ids
        if rng.binomial(1, self.fim.spm_rate):
            parts: Sequence = ([ids.prefix, ids.suffix], suffix, [ids.middle], prefix, middle)
        else:
            parts = ([ids.prefix], prefix, [ids.suffix], suffix, [ids.middle], middle)
        return np.concatenate([np.asarray(part, dtype=np.int64) for part in parts])

    def _ids(self, text: str) -> np.ndarray:
        return np.asarray(self.codec.tokenize(text), dtype=np.int64)


def sample_rng(seed: int, index: int) -> np.random.RandomState:
    """Sample `index`'s own random stream under --seed (see the module's docstring)."""
    return np.random.RandomState([seed & 0xFFFFFFFF, index & 0xFFFFFFFF, index >> 32])


def fim_dataset_class(fim: FimSettings, seed: int):
    """A megatron-core GPTDataset subclass whose samples are in FIM form (Megatron-LM's GPTFIMDataset role)."""
    from megatron.core.datasets.gpt_dataset import GPTDataset

    codec = tokenizer_for(fim)
    permuter = FimPermuter(fim, token_ids(fim, codec), codec)

    class FimGPTDataset(GPTDataset):
        """GPTDataset whose token windows pass through FimPermuter before the labels and masks are made."""

        def _query_document_sample_shuffle_indices(self, idx: int):
            tokens, documents = super()._query_document_sample_shuffle_indices(idx)
            return permuter.transform(tokens, sample_rng(seed, int(idx))), documents

    return FimGPTDataset
