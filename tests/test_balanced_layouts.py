"""Interleaved chunks where no stock split interleaves (search/balanced_layouts.py): NVIDIA's DeepSeek-V3 layout."""
from __future__ import annotations

from megatron_auto.pipeline_layout import layout_of_chunk_layers
from megatron_auto.search import search_plan
from megatron_auto.search.balanced_layouts import balanced_layout, balanced_layouts
from megatron_auto.search.constraints import SearchConstraints
from megatron_auto.specs.loaders import load_cluster
from megatron_auto.specs.model import uniform_model
from megatron_auto.specs.training import TrainingSpec

# 13 MoE layers: neither 13, 14 nor 15 divides over 4 stages, so stock Megatron interleaves nothing at pp 4.
ODD = uniform_model("odd-moe", 13, 64, 4, seq_length=32, vocab_size=128, ffn_hidden_size=128, num_query_groups=2,
                    num_experts=4, moe_router_topk=2, normalization="RMSNorm", add_bias_linear=False,
                    position_embedding_type="rope")
CLUSTER = load_cluster("dgx-h100-80gb", 1)


def test_deepseek_v3_on_8_stages_of_4_chunks_is_nvidias_layout_as_megatron_auto_builds_it():
    """Megatron-Bridge's 'Et|(tt|)*30mL' with the MTP module beside the last chunk's layer: 'Et|(tt|)*29t|tL'."""
    layout = balanced_layout(61, 8, 4)
    assert layout == (1,) + (2,) * 29 + (1, 1)
    assert layout_of_chunk_layers(layout, 1) == "Et|" + "t*2|" * 29 + "t|tmL"


def test_every_chunk_holds_a_layer_and_the_counted_units_differ_by_one_at_most():
    for layers, pp in ((61, 4), (61, 8), (61, 16), (13, 4), (93, 8)):
        for layout in balanced_layouts(layers, pp):
            units = [count + (index == 0) + (index == len(layout) - 1) for index, count in enumerate(layout)]
            assert sum(layout) == layers and min(layout) >= 1 and max(units) - min(units) <= 1
    assert balanced_layout(61, 16, 4) is None  # 64 chunks for 63 units: one would hold nothing
    assert balanced_layouts(61, 1) == []


def test_the_search_offers_them_for_the_ep_overlap_where_no_stock_split_interleaves():
    """Megatron-Core refuses the EP overlap at pp > 1 with one chunk per stage: at pp 4 the 13 layers then plan
    only in a balanced layout; without the overlap the search keeps to stock splits."""
    pinned = SearchConstraints(tp=1, pp=4, ep=2, micro_batch_size=1)
    overlap = search_plan(ODD, CLUSTER, TrainingSpec(64, moe_ep_overlap=True), "megatron", pinned).plan
    assert overlap.virtual_stages > 1
    assert tuple(len(chunk.layers) for chunk in overlap.chunks) == balanced_layout(13, 4, overlap.virtual_stages)
    plain = search_plan(ODD, CLUSTER, TrainingSpec(64), "megatron", pinned).plan
    assert plain.virtual_stages == 1
