"""Megatron-LM's --pipeline-model-parallel-layout grammar, read and written without Megatron-Core."""
from __future__ import annotations

import pytest

from megatron_auto.errors import UserError
from megatron_auto.pipeline_layout import (chunk_layers_of_layout, layout_of_chunk_layers, mtp_chunk_of_layout,
                                          mtp_layers_of_layout, runtime_chunk_problem, runtime_mtp_problem,
                                          unrolled_chunks)


@pytest.mark.parametrize("text, chunks", [
    ("Ettt|(tt|)*2,m|L", ["Ettt", "tt", "tt", "m", "L"]),  # Megatron-Core's docstring example, shortened
    ("Et*3|t*4L", ["Ettt", "ttttL"]),
    ("(ab|cd|ef)*2", ["ab", "cd", "efab", "cd", "ef"]),  # a group's last chunk runs into the next copy
    ("(|ab)*2,cd", ["", "ab", "abcd"]),
    ("E,t,t|t,t,L", ["Ett", "ttL"]),
])
def test_repeats_and_commas_unroll_as_megatron_core_unrolls_them(text, chunks):
    assert unrolled_chunks(text) == chunks


def test_deepseek_v3s_layout_gives_its_mtp_layer_a_chunk_of_its_own():
    # DeepSeek-V3 (61 layers, PP16 x VP2): 3 + 29 x 2 decoder layers, its MTP layer alone in chunk 30 (stage 14's
    # last: Megatron-Core's standalone MTP), the loss alone in chunk 31. estimate prices it; this runtime does not
    # build it.
    chunks = unrolled_chunks("Et*3|(tt|)*29,m|L")
    assert len(chunks) == 32 and sum(chunk.count("t") for chunk in chunks) == 61
    counts = chunk_layers_of_layout("Et*3|(tt|)*29,m|L", 16, 61)
    assert counts[0] == 3 and counts[-2:] == (0, 0) and mtp_chunk_of_layout("Et*3|(tt|)*29,m|L") == 30
    assert layout_of_chunk_layers(counts, 1, 30).endswith("|t*2|m|L")
    assert mtp_chunk_of_layout("Et*3|tmL") is None and mtp_chunk_of_layout("Et*3|tL") is None
    assert runtime_mtp_problem(30).startswith("the multi-token-prediction layers (m) in chunk 30, a stage of their")
    assert runtime_mtp_problem(None) == ""


@pytest.mark.parametrize("text, stages, message", [
    ("Et|m|t|L", 2, "after every decoder layer"),  # a decoder layer after the MTP layer
    ("Et|tm|t|mL", 2, "in one chunk"),
    ("Ett|m|L", 1, "last chunk of a pipeline stage"),  # one stage of three chunks: the MTP in its middle one
])
def test_mtp_placements_megatron_core_refuses(text, stages, message):
    with pytest.raises(UserError, match=message):
        chunk_layers_of_layout(text, stages, sum(chunk.count("t") for chunk in unrolled_chunks(text)))


def test_mtp_layers_go_after_the_last_chunks_decoder_layers():
    assert chunk_layers_of_layout("Et*3|tmL", 2, 4) == (3, 1)
    assert mtp_layers_of_layout("Et*3|tm*2L") == 2 and mtp_layers_of_layout("Et*3|tL") == 0
    for misplaced in ("Et*3|mtL", "Et*2m|ttL"):
        with pytest.raises(UserError, match="multi-token-prediction"):
            chunk_layers_of_layout(misplaced, 2, 4)
    assert layout_of_chunk_layers((3, 1), mtp_num_layers=1) == "Et*3|tmL"


@pytest.mark.parametrize("counts", [(1,), (3, 4, 4, 3), (1, 2, 1, 2), (5, 1, 1, 1, 1, 1, 1, 5)])
def test_written_layouts_read_back_to_the_same_chunks(counts):
    text = layout_of_chunk_layers(counts)
    assert chunk_layers_of_layout(text, 1, sum(counts)) == counts
    assert chunk_layers_of_layout(text, len(counts), sum(counts)) == counts


def test_a_written_layout_names_the_embedding_first_and_the_loss_last():
    assert layout_of_chunk_layers((3, 4, 4, 3)) == "Et*3|t*4|t*4|t*3L"
    assert layout_of_chunk_layers((1,)) == "EtL"


def test_chunks_that_hold_only_the_embedding_the_mtp_layers_or_the_loss_have_no_decoder_layers():
    # Megatron-Bridge's DeepSeek-V3 recipe on 1,024 H100s: its last virtual stage holds only the MTP layer and the
    # loss (perf_recipes/deepseek/h100/deepseek_v3.py); Megatron-Core builds such chunks, estimate prices them.
    counts = chunk_layers_of_layout("Et|(tt|)*30mL", 8, 61)
    assert len(counts) == 32 and counts[0] == 1 and counts[-1] == 0 and set(counts[1:-1]) == {2}
    assert chunk_layers_of_layout("E|t*4|t*2L", 3, 6) == (0, 4, 2)
    with pytest.raises(UserError, match="chunk 1 holds nothing"):
        chunk_layers_of_layout("Et*2||t*2L", 3, 4)


@pytest.mark.parametrize("counts, mtp, text", [((0, 4, 4, 6), 0, "E|t*4|t*4|t*6L"),
                                               ((1, 2, 2, 0), 1, "Et|t*2|t*2|mL"),
                                               ((2, 0), 0, "Et*2|L")])
def test_written_layouts_with_chunks_of_no_decoder_layer_read_back(counts, mtp, text):
    assert layout_of_chunk_layers(counts, mtp_num_layers=mtp) == text
    assert chunk_layers_of_layout(text, 2, sum(counts)) == counts


def test_this_runtime_names_the_chunk_it_cannot_build():
    assert runtime_chunk_problem((1, 2, 2)) == ""
    assert runtime_chunk_problem((1, 2, 0)).startswith("chunk 2 holds no decoder layer")
