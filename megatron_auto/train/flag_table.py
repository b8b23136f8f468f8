"""README.md's table of Megatron-LM flags accepted without effect or refused, generated from the verdicts.

The README must say what happens to every Megatron-LM flag, and say it as the code does: this module writes
that part of the "Megatron-LM flags, flag by flag" section from runtime/compat_flags.py and
flag_verdicts_tables.py, with the counts over megatron_lm_flags_0_16_1.txt (the honoured flags keep their
hand-written rows above it). tests/test_flag_verdicts.py fails when the README differs. Rewrite it with

    .venv/bin/python -m megatron_auto.train.flag_table [README.md]
"""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Collection

from megatron_auto.markdown_sections import marked_section, replace_marked_section
from megatron_auto.runtime import compat_flags

from .arguments import build_parser
from .flag_list import FlagSpec, read_list
from .flag_verdicts_tables import NO_EFFECT, REFUSED

README_BEGIN = ("<!-- flag verdicts: generated from megatron_auto/runtime/compat_flags.py and "
                "megatron_auto/train/flag_verdicts_tables.py by `python -m megatron_auto.train.flag_table` -->")
README_END = "<!-- end of flag verdicts -->"
HONOURED, NO_EFFECT_VERDICT, REFUSED_VERDICT, ONE_VALUE = ("honoured", "without effect", "refused",
                                                           "honoured with one value, other values refused")


def verdict(spec: FlagSpec, defined: Collection[str]) -> str:
    """What tools/pretrain_gpt.py does with one Megatron-LM argument (all its spellings share it), `defined`
    being the option strings its parser defines (a refused prefix covers only flags it leaves undefined)."""
    flag = spec.options[0]
    no_effect = {**compat_flags.NO_EFFECT_SWITCHES, **compat_flags.NO_EFFECT_VALUES, **compat_flags.NO_EFFECT_LISTS,
                 **compat_flags.MOE_NO_EFFECT_SWITCHES, **NO_EFFECT}
    refused = {**compat_flags.REFUSED_ANY_VALUE, **compat_flags.REFUSED_SWITCHES, **REFUSED}
    if flag in no_effect:
        return NO_EFFECT_VERDICT
    if flag in refused or (flag not in defined and flag.startswith(tuple(compat_flags.REFUSED_PREFIXES))):
        return REFUSED_VERDICT
    return ONE_VALUE if flag in compat_flags.REFUSED_UNLESS else HONOURED


def _rows() -> list[tuple[str, str, str]]:
    """(flags, verdict, why) rows: refused first, then without effect; flags sharing a reason share a row."""
    spellings = {spec.options[0]: ", ".join(spec.spellings) for spec in read_list()}
    grouped: dict[tuple[str, str], list[str]] = {}
    refused = [(f"`{p}*`", why) for p, why in compat_flags.REFUSED_PREFIXES.items()]
    refused += [(f"`{f}` other than `{value}`", why) for f, (value, why) in compat_flags.REFUSED_UNLESS.items()]
    refused += [(f"`{f}` > 1", why) for f, why in compat_flags.REFUSED_ABOVE_ONE.items()]
    refused += [(f"`{spellings.get(f, f)}`", why) for f, why in
                {**compat_flags.REFUSED_ANY_VALUE, **compat_flags.REFUSED_SWITCHES, **REFUSED}.items()]
    no_effect = {**compat_flags.NO_EFFECT_SWITCHES, **compat_flags.NO_EFFECT_VALUES, **compat_flags.NO_EFFECT_LISTS,
                 **compat_flags.MOE_NO_EFFECT_SWITCHES, **NO_EFFECT}
    for verdict_name, pairs in ((REFUSED_VERDICT, refused),
                                (NO_EFFECT_VERDICT, [(f"`{spellings.get(f, f)}`", why)
                                                     for f, why in no_effect.items()])):
        for flags, why in pairs:
            grouped.setdefault((verdict_name, why), []).append(flags)
    return [(", ".join(flags), verdict_name, why) for (verdict_name, why), flags in grouped.items()]


def readme_table() -> str:
    """The generated section: the counts over Megatron-LM's parser, then one row per verdict and reason."""
    specs = read_list()
    defined = build_parser()._option_string_actions
    counts = Counter(verdict(spec, defined) for spec in specs)
    spellings = sum(len(spec.spellings) for spec in specs)
    lines = [README_BEGIN, "",
             f"Megatron-LM 0.16.1's parser defines {len(specs)} flags ({spellings} spellings with aliases; "
             "`megatron_auto/train/megatron_lm_flags_0_16_1.txt`, generated from its source by "
             "`python -m megatron_auto.train.flag_list`): "
             + ", ".join(f"{counts[name]} {name}" for name in (HONOURED, ONE_VALUE, NO_EFFECT_VERDICT, REFUSED_VERDICT))
             + ". None meets \"unrecognized arguments\".", "",
             "| flag | here | why |", "|---|---|---|"]
    lines += [f"| {flags} | {verdict_name} | {why} |" for flags, verdict_name, why in _rows()]
    return "\n".join(lines + ["", README_END])


def readme_section(readme_text: str) -> str:
    """The generated section as it stands in `readme_text` (empty when its markers are missing)."""
    return marked_section(readme_text, README_BEGIN, README_END)


def write_readme(path: Path) -> bool:
    """Replace the section between the markers of the README at `path`; True when the text changed."""
    return replace_marked_section(path, README_BEGIN, README_END, readme_table())


if __name__ == "__main__":
    write_readme(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "README.md")
