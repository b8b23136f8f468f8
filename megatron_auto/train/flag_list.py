"""Every flag of Megatron-LM's parser, read from its source with `ast` (nothing of Megatron-LM is imported).

The verdict test (tests/test_flag_verdicts.py) needs the whole list of flags Megatron-LM 0.16.1 accepts, with
the shape of each (switch or value, and how many values), so that a launch line written for Megatron-LM never
meets "unrecognized arguments" here. Megatron-LM builds its parser from `add_argument` calls in
megatron/training/arguments.py and from dataclasses through its ArgumentGroupFactory (argument_utils.py:
a field becomes `--field-name`; a bool defaulting to False a store_true switch, any other bool a store_false
switch spelt `--no-...` and `--disable-...`; a list `nargs='+'`; a field's `argparse_meta` overrides). Both are
read here. Regenerate the committed list (megatron_lm_flags_0_16_1.txt) from a Megatron-LM git mirror with

    .venv/bin/python -m megatron_auto.train.flag_list --repo MIRROR.git --rev core_v0.16.1 \
        --out megatron_auto/train/megatron_lm_flags_0_16_1.txt
"""
from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path
from typing import Callable, NamedTuple, Optional

ARGUMENTS_PY = "megatron/training/arguments.py"
CONFIG_SOURCES = {
    "ModelParallelConfig": "megatron/core/model_parallel_config.py",
    "TransformerConfig": "megatron/core/transformer/transformer_config.py",
    "TrainingConfig": "megatron/training/training_config.py",
    "ValidationConfig": "megatron/training/training_config.py",
    "SchedulerConfig": "megatron/training/training_config.py",
    "LoggerConfig": "megatron/training/training_config.py",
    "CheckpointConfig": "megatron/training/training_config.py",
    "RerunStateMachineConfig": "megatron/training/resilience_config.py",
    "StragglerDetectionConfig": "megatron/training/resilience_config.py",
    "RNGConfig": "megatron/training/common_config.py",
    "ProfilingConfig": "megatron/training/common_config.py",
}
"""The dataclasses Megatron-LM 0.16.1's ArgumentGroupFactory turns into flags (and their bases), by file."""
DEFAULT_LIST = Path(__file__).with_name("megatron_lm_flags_0_16_1.txt")


class FlagSpec(NamedTuple):
    """One add_argument of Megatron-LM's parser: its option strings, action and nargs ('-' when unset)."""
    options: tuple[str, ...]
    action: str
    nargs: str

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every option string argparse accepts for it (BooleanOptionalAction adds `--no-X` to each `--X`)."""
        if self.action != "BooleanOptionalAction":
            return self.options
        return self.options + tuple("--no-" + o[2:] for o in self.options if o.startswith("--"))

    @property
    def takes_value(self) -> bool:
        return self.action in ("-", "store", "append") and self.nargs != "0"


def _constant(node: ast.AST):
    """A literal's value (a list or a dict of literals too), a dotted name as text, or None."""
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def _spec_from_call(call: ast.Call) -> Optional[FlagSpec]:
    """The FlagSpec of an `add_argument(...)` call with literal option strings, or None."""
    options = tuple(a.value for a in call.args if isinstance(a, ast.Constant) and str(a.value).startswith("-"))
    if not options:
        return None
    keywords = {k.arg: _constant(k.value) for k in call.keywords if k.arg}
    action = str(keywords.get("action", "-")).replace("argparse.", "")
    return FlagSpec(options, action, str(keywords.get("nargs", "-")))


def _annotation_kind(annotation: ast.AST) -> str:
    """'bool', 'list' or 'value' for a field's annotation, Optional / `| None` unwrapped."""
    text = ast.unparse(annotation).replace(" ", "")
    for wrapper in ("Optional[", "typing.Optional["):
        if text.startswith(wrapper):
            text = text[len(wrapper):-1]
    text = text.removesuffix("|None")
    if text == "bool":
        return "bool"
    return "list" if text.startswith(("list[", "List[", "typing.List[")) else "value"


def _field_spec(node: ast.AnnAssign) -> Optional[FlagSpec]:
    """The flag ArgumentGroupFactory makes of one dataclass field (None for `init=False` fields)."""
    name, default, meta = node.target.id, None, {}
    value = node.value
    if isinstance(value, ast.Call) and ast.unparse(value.func) in ("field", "dataclasses.field"):
        keywords = {k.arg: k.value for k in value.keywords}
        if "init" in keywords and _constant(keywords["init"]) is False:
            return None
        default = _constant(keywords["default"]) if "default" in keywords else None
        meta = (_constant(keywords["metadata"]) if "metadata" in keywords else {}).get("argparse_meta", {})
    elif value is not None:
        default = _constant(value)
    options, action, nargs = ("--" + name.replace("_", "-"),), "-", "-"
    kind = _annotation_kind(node.annotation)
    if kind == "bool":
        action = "store_true" if default is False else "store_false"
        if action == "store_false":
            options = ("--no-" + options[0][2:], "--disable-" + options[0][2:])
    elif kind == "list":
        nargs = "+"
    options = tuple(meta.get("arg_names", options))
    return FlagSpec(options, str(meta.get("action", action)), str(meta.get("nargs", nargs)))


def dataclass_flags(class_name: str, read: Callable[[str], str], exclude: frozenset[str]) -> list[FlagSpec]:
    """The flags of a dataclass, its first base's fields first (dataclasses.fields order), minus `exclude`."""
    tree = ast.parse(read(CONFIG_SOURCES[class_name]))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    fields: dict[str, Optional[FlagSpec]] = {}
    if node.bases and ast.unparse(node.bases[0]) in CONFIG_SOURCES:
        base = ast.unparse(node.bases[0])
        fields.update({spec.options[0]: spec for spec in dataclass_flags(base, read, exclude)})
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            if "ClassVar" in ast.unparse(item.annotation) or item.target.id in exclude:
                continue
            spec = _field_spec(item)
            fields[item.target.id] = spec
    return [spec for spec in fields.values() if spec is not None]


def _factory_flags(call: ast.Call, function: ast.AST, read: Callable[[str], str]) -> list[FlagSpec]:
    """The flags of `ArgumentGroupFactory(Config, exclude=...)`, a named exclude list looked up in its function."""
    exclude_node = next((k.value for k in call.keywords if k.arg == "exclude"), None)
    if isinstance(exclude_node, ast.Name):
        assigns = [n for n in ast.walk(function) if isinstance(n, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == exclude_node.id for t in n.targets)]
        exclude_node = assigns[-1].value
    exclude = frozenset(_constant(exclude_node)) if exclude_node is not None else frozenset()
    return dataclass_flags(ast.unparse(call.args[0]), read, exclude)


def megatron_lm_flags(read: Callable[[str], str]) -> list[FlagSpec]:
    """Every flag of Megatron-LM's arguments.py, in source order, `read` giving a repository file's text."""
    tree = ast.parse(read(ARGUMENTS_PY))
    found: list[tuple[int, int, list[FlagSpec]]] = []
    for function in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        for call in (n for n in ast.walk(function) if isinstance(n, ast.Call)):
            name = ast.unparse(call.func)
            if name.endswith(".add_argument"):
                spec = _spec_from_call(call)
                found += [(call.lineno, call.col_offset, [spec])] if spec else []
            elif name == "ArgumentGroupFactory":
                found.append((call.lineno, call.col_offset, _factory_flags(call, function, read)))
    specs, seen = [], set()
    for _, _, group in sorted(found, key=lambda item: item[:2]):
        for spec in group:
            if spec.options not in seen:
                seen.add(spec.options)
                specs.append(spec)
    return specs


def format_list(specs: list[FlagSpec], command: str, source: str) -> str:
    """The committed file: a header naming the command and the source, then `options<TAB>action<TAB>nargs`."""
    lines = [f"# Megatron-LM's parser flags, generated by: {command}",
             f"# source: {source}",
             "# one add_argument per line: option strings (space-separated)<TAB>action<TAB>nargs ('-': unset)"]
    return "\n".join(lines + [f"{' '.join(s.options)}\t{s.action}\t{s.nargs}" for s in specs]) + "\n"


def read_list(path: Path = DEFAULT_LIST) -> list[FlagSpec]:
    """The committed list back as FlagSpecs."""
    specs = []
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            options, action, nargs = line.split("\t")
            specs.append(FlagSpec(tuple(options.split()), action, nargs))
    return specs


def main(argv: Optional[list[str]] = None) -> int:
    """Write the list from a Megatron-LM git mirror at a revision (read with `git show`, nothing imported)."""
    parser = argparse.ArgumentParser(prog="python -m megatron_auto.train.flag_list", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", required=True, help="a Megatron-LM git directory (bare mirror or checkout)")
    parser.add_argument("--rev", default="core_v0.16.1", help="tag or commit to read")
    parser.add_argument("--out", type=Path, default=DEFAULT_LIST)
    args = parser.parse_args(argv)

    def git(*words: str) -> str:
        done = subprocess.run(["git", "-C", args.repo, *words], capture_output=True, text=True)
        if done.returncode:
            reason = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
            sys.stderr.write(f"git {' '.join(words)}: {reason}\n")
            raise SystemExit(2)
        return done.stdout

    commit = git("rev-parse", f"{args.rev}^{{commit}}").strip()
    specs = megatron_lm_flags(lambda path: git("show", f"{commit}:{path}"))
    command = f"python -m megatron_auto.train.flag_list --repo MEGATRON_LM_GIT --rev {args.rev}"
    source = f"NVIDIA/Megatron-LM {args.rev} = commit {commit} (MEGATRON_LM_GIT: a clone or mirror of it)"
    args.out.write_text(format_list(specs, command, source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
