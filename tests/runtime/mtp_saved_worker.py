"""One process: the bytes the runtime's whole GPTModel saves for backward with and without multi-token prediction.

Usage (RANK/WORLD_SIZE/MASTER_* set): python mtp_saved_worker.py CASES.json RESULTS.json
Each case: {"name", "model": uniform_model keywords (with "mtp_num_layers"; "mla" as MLASpec keywords)}; on
more than one rank, every rank is one tensor-parallel shard with sequence parallelism (TP = WORLD_SIZE). The
model is built twice by runtime.model.build_chunks (PP1, fp32, unfused attention, dropout 0.1), with the case's
MTP depths and with none, and runs one training forward on the same tokens (labels and loss mask given, as
forward_step passes them); the results hold rank 0's distinct non-parameter storages saved for backward in each,
counted once the forward has returned.
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace

import patches

patches.apply_all()

import torch  # noqa: E402

from megatron_auto.profiling.cluster_profile import init_from_env  # noqa: E402
from megatron_auto.profiling.layer_bench import saved_bytes_of  # noqa: E402
from megatron_auto.runtime.config import transformer_config  # noqa: E402
from megatron_auto.parallel_dims import ParallelDims  # noqa: E402
from megatron_auto.runtime.layout import MegatronLayout  # noqa: E402
from megatron_auto.runtime.model import build_chunks  # noqa: E402
from megatron_auto.runtime.mtp_metrics import reset_mtp_loss_tracker  # noqa: E402
from megatron_auto.runtime.settings import TrainSettings  # noqa: E402
from megatron_auto.specs.model import MLASpec, uniform_model  # noqa: E402

BATCH = 2


def whole_model(model, tp: int):
    """The runtime's GPTModel of `model` at TP `tp` (with SP above 1), PP1, in fp32 with the unfused core,
    seeded alike every build."""
    settings = TrainSettings(precision="fp32", attention_backend="unfused")
    layout = MegatronLayout(ParallelDims(tp=tp, dp=1), micro_batch_size=BATCH, num_micro_batches=1,
                            global_batch_size=BATCH, sequence_parallel=tp > 1)
    config = transformer_config(model, layout, settings, "gloo")
    torch.manual_seed(0)
    return build_chunks(model, layout, settings, config, model.vocab_size, torch.device("cpu"))[0]


def saved_bytes(chunk, seq: int, vocab: int) -> int:
    """Distinct non-parameter storages the training forward saves, counted when it has returned."""
    from megatron.core import tensor_parallel

    reset_mtp_loss_tracker()  # sized by the depth count of the model that filled it
    torch.manual_seed(1)
    tensor_parallel.model_parallel_cuda_manual_seed(1)
    tokens = torch.randint(0, vocab, (BATCH, seq + 1))
    positions = torch.arange(seq).unsqueeze(0).expand(BATCH, seq)
    labels, mask = tokens[:, 1:], torch.ones(BATCH, seq)
    loss, saved = saved_bytes_of(lambda: chunk(tokens[:, :-1], positions, None, labels=labels, loss_mask=mask), chunk)
    loss.sum().backward()
    return saved


def run_case(case: dict, tp: int) -> dict:
    keywords = dict(case["model"])
    if "mla" in keywords:
        keywords["mla"] = MLASpec(**keywords["mla"])
    model = uniform_model(case["name"], **keywords)
    plain = replace(model, mtp_num_layers=0)
    return {"mtp": saved_bytes(whole_model(model, tp), model.seq_length, model.vocab_size),
            "plain": saved_bytes(whole_model(plain, tp), model.seq_length, model.vocab_size)}


def main(cases_path: str, results_path: str) -> None:
    from megatron.core import parallel_state

    init_from_env()
    tp = torch.distributed.get_world_size()
    parallel_state.initialize_model_parallel(tp, 1)
    cases = json.loads(open(cases_path).read())
    results = {case["name"]: run_case(case, tp) for case in cases}
    if torch.distributed.get_rank() == 0:
        with open(results_path, "w") as out:
            json.dump(results, out)


if __name__ == "__main__":
    main(*sys.argv[1:3])
