"""Shrink Megatron-LM's functional-test training cases to 4 CPU ranks: tests/megatron_lm_cases/cases.json.

    .venv/bin/python tests/megatron_lm_cases/shrink.py MEGATRON_LM_GIT_DIR > tests/megatron_lm_cases/cases.json

(MEGATRON_LM_GIT_DIR: a clone of NVIDIA/Megatron-LM with the tag core_v0.16.1; needs PyYAML.) Every
tests/functional_tests/test_cases/{gpt,moe,mixtral}/*/model_config.yaml at that tag whose TP x PP x CP divides 4,
except the inference and GRPO cases (not pretraining), becomes one launch line: its MODEL_ARGS as given, less the
paths (data, tokenizer files, checkpoints, TensorBoard), with --mock-data and a 512-token NullTokenizer, sizes
shrunk (hidden 64, 8 heads, 4 query groups, ffn 128, sequence 64, micro-batch 1, global batch 8, 4 iterations,
2 layers per pipeline stage and virtual stage, the embedding and loss counted where the split counts them, at most
8 experts with EP cut to what 4 ranks hold), every other flag unchanged. The verdict of each line, as it is and with
--auto-parallel, is recorded by tests/test_megatron_lm_cases.py --record.
"""
import json
import subprocess
import sys

import yaml

TAG = "core_v0.16.1"
SUITES = ("gpt", "moe", "mixtral")
PATHS = ("--save", "--load", "--data-path", "--vocab-file", "--merge-file", "--tensorboard-dir", "--data-cache-path",
         "--tokenizer-model", "--train-data-path", "--valid-data-path", "--test-data-path", "--pretrained-checkpoint",
         "--tokenizer-type", "--vocab-size", "--fim-data", "--data-args-path", "--per-split-data-args-path")
"""Flags that name files (or the tokenizer they hold): mock data and a NullTokenizer stand in."""
LENGTHS = ("--lr-decay-iters", "--lr-warmup-iters", "--save-interval", "--exit-interval", "--rampup-batch-size",
           "--train-samples", "--lr-decay-samples", "--lr-warmup-samples")
"""Run lengths that would not fit 4 iterations."""
SIZES = {"--hidden-size": 64, "--num-attention-heads": 8, "--num-query-groups": 4, "--ffn-hidden-size": 128,
         "--kv-channels": 8, "--moe-ffn-hidden-size": 64, "--moe-shared-expert-intermediate-size": 64}
"""Shrunk widths (only where the case gives the flag, but for hidden size and heads)."""


def shrink(args: dict):
    """The case's launch line on 4 ranks, or None when its TP x PP x CP does not divide 4 or its split is
    written out (first/last-stage layer counts, a layout)."""
    tp, pp, cp = (int(args.get(f"--{name}-parallel-size", 1)) for name in ("tensor-model", "pipeline-model", "context"))
    split_given = args.get("--decoder-first-pipeline-num-layers") or args.get("--pipeline-model-parallel-layout")
    if 4 % (tp * pp * cp) or split_given:
        return None
    out = {k: v for k, v in args.items() if k not in PATHS + LENGTHS and not (isinstance(v, str) and "${" in v)}
    out.update({k: v for k, v in SIZES.items() if k in out or k in ("--hidden-size", "--num-attention-heads")})
    out["--num-layers"] = _layers(args, pp)
    _shrink_experts(args, out, tp, 4 // (tp * pp * cp))
    out["--seq-length"] = out["--max-position-embeddings"] = 64
    out.update({"--micro-batch-size": 1, "--global-batch-size": 8, "--train-iters": 4, "--eval-iters": 1,
                "--eval-interval": 4})
    return _argv(out) + ["--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "512"]


def _layers(args: dict, pp: int) -> int:
    """Two layers per stage or virtual stage, less the embedding and loss where the split counts them."""
    per_virtual = args.get("--num-layers-per-virtual-pipeline-stage")
    virtual = args.get("--num-virtual-stages-per-pipeline-rank")
    accounted = sum(bool(args.get(f"--account-for-{part}-in-pipeline-split")) for part in ("embedding", "loss"))
    chunks = pp * int(per_virtual) if per_virtual else pp * int(virtual) if virtual else pp
    return 2 * chunks - accounted


def _shrink_experts(args: dict, out: dict, tp: int, dp: int) -> None:
    """EP cut to what tp x dp ranks hold; at most 8 experts (a multiple of EP), top-k at most 2."""
    ep, etp = int(args.get("--expert-model-parallel-size", 1)), int(args.get("--expert-tensor-parallel-size", tp))
    if (tp * dp) % (ep * etp):
        ep = max(1, (tp * dp) // etp)
        out["--expert-model-parallel-size"] = ep
    if "--num-experts" in out:
        experts = max(min(int(out["--num-experts"]), 8), ep)
        out["--num-experts"] = experts - experts % ep
    if "--moe-router-topk" in out:
        out["--moe-router-topk"] = min(int(out["--moe-router-topk"]), 2)


def _argv(flags: dict) -> list[str]:
    """YAML values as a command line: true is the switch alone, false and null leave the flag out."""
    argv = []
    for flag, value in flags.items():
        if value is True:
            argv.append(flag)
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        elif value is not False and value is not None:  # 0 and 0.0 are values, not false
            argv += [flag, str(value)]
    return argv


def main(repo: str) -> None:
    listing = subprocess.run(["git", "-C", repo, "ls-tree", "-r", "--name-only", TAG, "--",
                              *(f"tests/functional_tests/test_cases/{suite}" for suite in SUITES)],
                             capture_output=True, text=True, check=True).stdout.split()
    cases = [case for path in listing if path.endswith("model_config.yaml") for case in _case(repo, path)]
    print(json.dumps({"source": f"NVIDIA/Megatron-LM {TAG}", "cases": cases}, indent=1))


def _case(repo: str, path: str) -> list[dict]:
    text = subprocess.run(["git", "-C", repo, "show", f"{TAG}:{path}"], capture_output=True, text=True).stdout
    cfg = yaml.safe_load(text)
    argv = shrink({k: v for k, v in (cfg.get("MODEL_ARGS") or {}).items()})
    name = path.split("/")[-2]
    if argv and "inference" not in name and "grpo" not in name:
        return [{"name": name, "source": path, "argv": argv}]
    return []


if __name__ == "__main__":
    main(sys.argv[1])
