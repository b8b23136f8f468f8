"""`estimate` picks the pipeline split when the layers do not divide evenly and no split flag is given (issue #37).

NVIDIA runs Llama 3.1 405B (126 layers) at pp 8 x vp 8 with the embedding and the loss counted in the split
(126 + 2 = 128 = 8 x 8 x 2), and DeepSeek-V3 (61 layers) at pp 16 with first/last-stage layer counts; Megatron-LM
refuses both without a split flag, and so did `estimate`.
"""
from __future__ import annotations

import json

import pytest

from megatron_auto.cli.main import main
from megatron_auto.cli.parser import parse_args
from megatron_auto.search.uniform import UniformConfig, best_uniform_plan

H100_128 = ["--cluster", "dgx-h100-80gb", "--num-nodes", "128", "--global-batch-size", "2048"]
LLAMA_405B = ["estimate", "--model", "llama3.1-405b", *H100_128, "--tp", "8", "--pp", "8", "--cp", "2"]
DEEPSEEK_V3 = ["estimate", "--model", "deepseek-v3", *H100_128, "--tp", "2", "--pp", "16", "--sequence-parallel",
               "--ep", "16", "--etp", "1", "--micro-batch-size", "1", "--recompute", "selective",
               "--distributed-optimizer"]
SPLIT_FLAGS = ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
               "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
               "--pipeline-model-parallel-layout")


def estimate_json(capsys, *argv: str) -> dict:
    """`megatron-auto estimate ... --json`, run in this process."""
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def chunk_layers(data: dict) -> list[int]:
    return [len(chunk["layers"]) for chunk in data["plan"]["chunks"]]


def flag_value(flags: list[str], name: str):
    return flags[flags.index(name) + 1] if name in flags else None


def test_llama_405b_at_pp8_vp8_prices_with_the_embedding_and_loss_counted(capsys):
    data = estimate_json(capsys, *LLAMA_405B, "--virtual-stages", "8")
    split = data["picked"]["pipeline_split"]
    assert split == ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    assert set(data["picked"]) == {"pipeline_split", "micro_batch_size"}  # --virtual-stages was given
    chunks = chunk_layers(data)
    assert sum(chunks) == 126 and len(chunks) == 8 * 8 and data["virtual_stages"] == 8
    assert chunks == [1] + [2] * 62 + [1]  # 128 counted layers in chunks of 2; embedding and loss take a slot each
    flags = data["megatron_flags"]
    assert flag_value(flags, "--num-layers-per-virtual-pipeline-stage") == "2" and set(split) <= set(flags)
    # The picked split's flags, given back, price the same plan.
    given = estimate_json(capsys, *LLAMA_405B, "--virtual-stages", "8", "--micro-batch-size",
                          str(data["micro_batch_size"]), *split)
    assert given["picked"] == {} and given["iteration_time_s"] == data["iteration_time_s"]
    assert given["megatron_flags"] == flags


def test_llama_405b_text_output_names_the_split(capsys):
    assert main([*LLAMA_405B, "--virtual-stages", "8", "--micro-batch-size", "1"]) == 0
    first_line = capsys.readouterr().out.splitlines()[0]
    assert first_line == ("picked pipeline split --account-for-embedding-in-pipeline-split "
                          "--account-for-loss-in-pipeline-split (the fastest that fits)")


def test_deepseek_v3_at_pp16_picks_the_fastest_first_and_last_stage_split(capsys):
    data = estimate_json(capsys, *DEEPSEEK_V3)
    split = data["picked"]["pipeline_split"]
    chunks = chunk_layers(data)
    assert sum(chunks) == 61 and len(chunks) == 16 and data["picked"]["virtual_stages"] == 1
    # 61 + 1 or 2 counted layers do not divide by 16: only first/last-stage counts split it.
    assert split and set(split[::2]) <= {"--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"}
    first = int(flag_value(split, "--decoder-first-pipeline-num-layers") or chunks[1])
    last = int(flag_value(split, "--decoder-last-pipeline-num-layers") or chunks[1])
    assert (chunks[0], chunks[-1]) == (first, last) and len(set(chunks[1:-1])) == 1
    given = estimate_json(capsys, *DEEPSEEK_V3, *split)
    assert given["iteration_time_s"] == data["iteration_time_s"] and given["megatron_flags"] == data["megatron_flags"]
    # No hand-picked split near the average prices better (fitting first, as the pick ranks them).
    for first_layers, last_layers in (("3", "2"), ("2", "3"), ("1", "4")):
        priced = estimate_json(capsys, *DEEPSEEK_V3, "--decoder-first-pipeline-num-layers", first_layers,
                               "--decoder-last-pipeline-num-layers", last_layers)
        assert (not data["fits"], data["iteration_time_s"]) <= (not priced["fits"], priced["iteration_time_s"])


def test_an_even_split_is_priced_as_before_and_picks_no_split(capsys):
    argv = ["estimate", "--model", "gpt3-1.7b", "--cluster", "dgx-a100-80gb", "--global-batch-size", "32",
            "--tp", "2", "--pp", "4"]
    data = estimate_json(capsys, *argv)
    assert set(data["picked"]) == {"micro_batch_size", "virtual_stages"}
    assert not set(SPLIT_FLAGS) & set(data["megatron_flags"])
    assert len(set(chunk_layers(data))) == 1 and sum(chunk_layers(data)) == 24
    # The same search as before the split pick: best_uniform_plan over micro-batch and virtual stages.
    from megatron_auto.cli.job import load_job

    model, cluster, training = load_job(parse_args(argv))
    before = best_uniform_plan(model, cluster, training, UniformConfig(tp=2, pp=4, micro_batch_size=1),
                               choose_micro_batch=True, choose_virtual_stages=True)
    assert data["iteration_time_s"] == before.prediction.iteration_time_s
    assert data["virtual_stages"] == before.virtual_stages


def test_no_split_megatron_accepts_is_one_line_exit_2(capsys):
    # 8 layers over 4 stages x 4 chunks: 2 per stage do not halve twice, and 9 or 10 counted do not divide by 4.
    argv = ["estimate", "--model", "tiny-gpt-8l", "--cluster", "cpu-gloo", "--global-batch-size", "16",
            "--tp", "1", "--pp", "4", "--virtual-stages", "4"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "8 layers do not split over 4 pipeline stages x 4 chunks" in err
    assert "any split Megatron-LM accepts" in err


def test_other_flag_errors_still_surface_first(capsys):
    assert main([*LLAMA_405B, "--virtual-stages", "8", "--micro-batch-size", "3"]) == 2
    assert "global batch 2048 is not divisible by micro batch x DP = 24 (3 x 8)" in capsys.readouterr().err


def megatron_core_chunks(flags: list[str], num_layers: int, pp: int) -> list[int]:
    """Decoder layers per chunk, in chunk order, that Megatron-Core 0.16.1 builds for these Megatron-LM flags
    (TransformerConfig validates the split; get_num_layers_to_build counts each chunk). The virtual size of
    --num-layers-per-virtual-pipeline-stage is Megatron-LM's (arguments.py): counted layers / pp / that."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig

    embedding = "--account-for-embedding-in-pipeline-split" in flags
    loss = "--account-for-loss-in-pipeline-split" in flags
    per_chunk = flag_value(flags, "--num-layers-per-virtual-pipeline-stage")
    vp = (num_layers + embedding + loss) // pp // int(per_chunk) if per_chunk else None
    first, last = (flag_value(flags, name) for name in SPLIT_FLAGS[:2])
    config = TransformerConfig(num_layers=num_layers, hidden_size=64, num_attention_heads=4,
                               pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vp,
                               pipeline_dtype=torch.bfloat16, account_for_embedding_in_pipeline_split=embedding,
                               account_for_loss_in_pipeline_split=loss,
                               num_layers_in_first_pipeline_stage=int(first) if first else None,
                               num_layers_in_last_pipeline_stage=int(last) if last else None)
    return [get_num_layers_to_build(config, vp_stage=v if vp else None, pp_rank=rank)
            for v in range(vp or 1) for rank in range(pp)]


@pytest.mark.parametrize("argv, num_layers, pp", [((*LLAMA_405B, "--virtual-stages", "8"), 126, 8),
                                                  (DEEPSEEK_V3, 61, 16)], ids=["llama3.1-405b", "deepseek-v3"])
def test_megatron_core_builds_the_picked_split_from_the_plans_flags(capsys, argv, num_layers, pp):
    data = estimate_json(capsys, *argv)
    assert megatron_core_chunks(data["megatron_flags"], num_layers, pp) == chunk_layers(data)
