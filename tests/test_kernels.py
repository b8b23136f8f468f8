"""Kernel choices: `auto` resolves per cluster, Megatron-LM's names map onto what runs, and the CLI
prices what it resolved."""
from __future__ import annotations

import pytest

from megatron_auto.cli.job import training_spec
from megatron_auto.cli.parser import parse_args
from megatron_auto.kernel_choice import resolve_attention_backend, resolve_optimizer_impl
from megatron_auto.specs.training import TrainingSpec


@pytest.mark.parametrize("requested,on_gpu,runs", [
    ("auto", True, "flash"), ("auto", False, "unfused"), ("flash", False, "flash"),
    ("fused", True, "flash"), ("local", True, "unfused"), ("unfused", True, "unfused")])
def test_attention_backend_resolution(requested, on_gpu, runs):
    assert resolve_attention_backend(requested, on_gpu) == runs


@pytest.mark.parametrize("requested,on_gpu,runs", [
    ("auto", True, "fused"), ("auto", False, "foreach"), ("foreach", True, "foreach"), ("fused", False, "fused")])
def test_optimizer_impl_resolution(requested, on_gpu, runs):
    assert resolve_optimizer_impl(requested, on_gpu) == runs


def test_unknown_names_are_rejected():
    with pytest.raises(ValueError):
        resolve_attention_backend("triton", True)
    with pytest.raises(ValueError):
        TrainingSpec(8, attention_backend="auto")  # the spec holds what runs, never `auto`


def test_cli_prices_the_cluster_default_or_the_flag():
    base = ["estimate", "--model", "gpt3-1.7b", "--global-batch-size", "16", "--tp", "1", "--pp", "1"]
    gpu = training_spec(parse_args(base + ["--cluster", "dgx-h100-80gb"]), "dgx-h100-80gb", 16)
    assert (gpu.attention_backend, gpu.optimizer_impl) == ("flash", "fused")
    cpu = training_spec(parse_args(base + ["--cluster", "cpu-gloo"]), "cpu-gloo", 16)
    assert (cpu.precision, cpu.attention_backend, cpu.optimizer_impl) == ("fp32", "unfused", "foreach")
    chosen = training_spec(parse_args(base + ["--cluster", "dgx-h100-80gb", "--attention-backend", "unfused",
                                              "--optimizer-impl", "foreach"]), "dgx-h100-80gb", 16)
    assert (chosen.attention_backend, chosen.optimizer_impl) == ("unfused", "foreach")
