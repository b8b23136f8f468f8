"""Every flag of Megatron-LM 0.16.1's parser has a verdict here: honoured, without effect (logged), or refused.

The list is megatron_auto/train/megatron_lm_flags_0_16_1.txt, generated once from Megatron-LM's source by
`python -m megatron_auto.train.flag_list` (its header names the command and the commit). No process group is
started: these tests only parse launch lines.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from megatron_auto.runtime import compat_flags
from megatron_auto.train import flag_list, flag_table, flag_verdicts
from megatron_auto.train.arguments import build_parser, parse_args
from megatron_auto.train.flag_verdicts_tables import NO_EFFECT, REFUSED

REPO = Path(__file__).resolve().parents[1]
BASE = ["--num-layers", "8", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "128",
        "--train-iters", "10", "--mock-data"]
SPECS = flag_list.read_list()
# The flags the issue found meeting "unrecognized arguments" in Megatron-LM's functional tests.
ISSUE_FLAGS = ("--dist-ckpt-optim-fully-reshardable", "--num-virtual-stages-per-pipeline-rank",
               "--apply-query-key-layer-scaling", "--overlap-param-gather-with-optimizer-step",
               "--cross-entropy-fusion-impl", "--enable-experimental", "--rotary-interleaved", "--squared-relu",
               "--fim-data", "--fim-rate", "--fim-spm-rate", "--test-mode", "--rerun-mode")


def values_for(spec: flag_list.FlagSpec) -> list[str]:
    """Values that Megatron-LM's parser would consume after the flag."""
    if not spec.takes_value or spec.nargs == "?":
        return []
    return ["1"] * int(spec.nargs) if spec.nargs.isdigit() else ["1", "2"] if spec.nargs == "+" else ["1"]


def test_committed_list_names_its_command_and_source():
    header = flag_list.DEFAULT_LIST.read_text().splitlines()[:2]
    assert "python -m megatron_auto.train.flag_list --repo" in header[0]
    assert "core_v0.16.1 = commit 55ac7082517c3878ae653c07c09c534b8aed49f6" in header[1]
    spellings = {s for spec in SPECS for s in spec.spellings}
    assert len(SPECS) == 653 and set(ISSUE_FLAGS) <= spellings
    # Flags from both sources: add_argument calls and ArgumentGroupFactory dataclasses (with --no-/--disable-).
    assert {"--num-layers", "--rampup-batch-size", "--no-gradient-accumulation-fusion",
            "--disable-bias-linear", "--no-persist-layer-norm", "--override-opt-param-scheduler"} <= spellings


def test_every_megatron_lm_flag_has_a_verdict():
    known = build_parser()._option_string_actions
    prefixes = tuple(compat_flags.REFUSED_PREFIXES)
    missing = [s for spec in SPECS for s in spec.spellings if s not in known and not s.startswith(prefixes)]
    assert not missing, f"Megatron-LM flags without a verdict: {missing}"
    assert {flag_table.verdict(spec, known) for spec in SPECS} <= {flag_table.HONOURED, flag_table.ONE_VALUE,
                                                             flag_table.NO_EFFECT_VERDICT, flag_table.REFUSED_VERDICT}


def test_the_tables_name_megatron_lm_flags_once():
    # Megatron-LM's flags: its parser's, and the post-training ones its GPT functional tests pass to pretraining
    first_options = {spec.options[0] for spec in SPECS} | {spec[0][0] for spec in flag_verdicts.POST_TRAINING_SPECS}
    assert not set(NO_EFFECT) & set(REFUSED)
    assert set(NO_EFFECT) | set(REFUSED) <= first_options, "a verdict for a flag Megatron-LM 0.16.1 does not define"


def test_every_flag_takes_values_as_megatron_lm_does():
    known = build_parser()._option_string_actions
    for spec in SPECS:
        for spelling in (s for s in spec.spellings if s in known):
            action = known[spelling]
            assert (action.nargs != 0) == (spec.takes_value and spec.action != "BooleanOptionalAction"), spelling
            if spec.takes_value and spec.nargs != "-":
                assert str(action.nargs) == spec.nargs or {str(action.nargs), spec.nargs} <= {"+", "*"}, spelling


def test_no_effect_flags_parse_and_are_named_with_their_reason():
    for spec in flag_verdicts.covered_specs():
        if spec.options[0] not in NO_EFFECT:
            continue
        for spelling in spec.spellings:
            args = parse_args(BASE + [spelling, *values_for(spec), "--seed", "7"])
            assert args.seed == 7, spelling  # the flag took only its own values
            assert (spec.options[0], NO_EFFECT[spec.options[0]]) in flag_verdicts.no_effect(args), spelling


def test_refused_flags_stop_with_one_line_and_exit_2(capsys):
    for spec in flag_verdicts.covered_specs():
        if spec.options[0] not in REFUSED:
            continue
        for spelling in spec.spellings:
            with pytest.raises(SystemExit) as exit_info:
                parse_args(BASE + [spelling, *values_for(spec)])
            err = capsys.readouterr().err.strip().splitlines()
            assert exit_info.value.code == 2 and len(err) == 1, (spelling, err)
            assert f"{spec.options[0]}: {REFUSED[spec.options[0]]}" in err[0]


@pytest.mark.parametrize("flags, reason", [
    (["--fp8-format", "hybrid"], "fp8 training needs Transformer Engine"),
    (["--batch-size", "4"], "use --micro-batch-size instead"),
    (["--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss"], "several load-balancing losses"),
])
def test_issue_flags_refused_with_their_reason(capsys, flags, reason):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(BASE + flags)
    assert exit_info.value.code == 2 and reason in capsys.readouterr().err


def test_issue_flags_accepted_without_effect_and_logged():
    args = parse_args(BASE + ["--dist-ckpt-optim-fully-reshardable", "--apply-query-key-layer-scaling",
                              "--overlap-param-gather-with-optimizer-step", "--cross-entropy-fusion-impl", "te",
                              "--enable-experimental", "--test-mode", "--rerun-mode", "validate_results",
                              "--cuda-graph-scope", "attn", "mlp", "--seed", "3"])
    named = {flag for flag, _ in flag_verdicts.no_effect(args)}
    assert {"--dist-ckpt-optim-fully-reshardable", "--rerun-mode", "--cuda-graph-scope", "--test-mode"} <= named
    assert args.seed == 3
    # Honoured: Megatron-Core's TransformerConfig takes both (tests/runtime/test_pretrain_flags.py)
    assert "--apply-query-key-layer-scaling" not in named and args.apply_query_key_layer_scaling
    assert parse_args(BASE + ["--rotary-interleaved"]).rotary_interleaved
    assert parse_args(BASE + ["--squared-relu"]).squared_relu


def test_megatron_lm_list_forms_of_one_value_are_unwrapped():
    args = parse_args(BASE + ["--moe-router-load-balancing-type", "seq_aux_loss", "--moe-aux-loss-coeff", "0.01"])
    assert (args.moe_router_load_balancing_type, args.moe_aux_loss_coeff) == ("seq_aux_loss", 0.01)
    assert parse_args(BASE).moe_router_load_balancing_type == "aux_loss"


def test_spelling_aliases_are_honoured():
    args = parse_args(BASE + ["--override-opt-param-scheduler", "--persistent-save-interval", "5"])
    assert args.override_opt_param_scheduler and args.save_interval == 5


@pytest.mark.parametrize("flags, layers_per_virtual_stage", [
    (["--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2"], 2),
    (["--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "1"], None),
    (["--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "5",
      "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"], 1),
])
def test_virtual_stages_per_rank_is_the_layers_per_virtual_stage_layout(flags, layers_per_virtual_stage):
    assert parse_args(BASE + flags).num_layers_per_virtual_pipeline_stage == layers_per_virtual_stage


@pytest.mark.parametrize("flags, message", [
    (["--num-virtual-stages-per-pipeline-rank", "2", "--num-layers-per-virtual-pipeline-stage", "2"],
     "No more than one of"),
    (["--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "3"], "2 x 3 chunks"),
    (["--num-virtual-stages-per-pipeline-rank", "2", "--decoder-first-pipeline-num-layers", "3"],
     "--pipeline-model-parallel-layout"),
])
def test_virtual_stages_per_rank_problems_are_one_line(capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(BASE + ["--pipeline-model-parallel-size", "2"] + flags)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_readme_table_is_generated_from_the_verdicts():
    readme = (REPO / "README.md").read_text()
    assert flag_table.readme_section(readme) == flag_table.readme_table(), \
        "README.md's flag table differs from the verdicts: run `python -m megatron_auto.train.flag_table`"


def test_encoder_spellings_are_megatron_lms_older_num_layers_and_seq_length(capsys):
    plain = ["--hidden-size", "256", "--num-attention-heads", "8", "--train-iters", "10", "--mock-data"]
    args = parse_args(plain + ["--encoder-num-layers", "6", "--encoder-seq-length", "64"])
    assert (args.num_layers, args.seq_length) == (6, 64)
    for flags, message in ((["--num-layers", "6", "--encoder-num-layers", "6", "--seq-length", "64"],
                            "cannot have both num-layers and encoder-num-layers"),
                           (["--num-layers", "6"], "required: --seq-length")):
        with pytest.raises(SystemExit) as exit_info:
            parse_args(plain + flags)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
