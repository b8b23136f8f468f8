# megatron-auto: `make demo` sets up .venv and plans GPT-3 175B on 1024 A100s;
# `make test` sets up .venv and runs the tests. Both are safe to repeat.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.megatron-auto-installed
TORCH := torch==2.13.0

.PHONY: venv test demo demo-plan demo-train clean-venv

venv: $(STAMP)

# torch first: pip finds the CPU build on local disk; then the package, editable, with the runtime extra.
# (Never add the PyPI package `apex`: megatron-core works without it.) pip compiles what it installs one file
# at a time; compileall does it on every core (`make venv` 54 s instead of 66 here). pip's second install
# keeps one core busy, so torch and what it brought (sympy, networkx: most of the source) compile on the other
# meanwhile, and the last line compiles the rest (`time make venv` in fresh clones, same hour: 53 and 60 s,
# against 66 s before: within this machine's run-to-run noise, one run each).
# Files that do not compile under this Python (torch ships a few for later ones) are skipped, as pip skips them.
FIRST_COMPILED := torch sympy networkx
$(STAMP): pyproject.toml setup.py Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --no-compile $(TORCH)
	site=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	  ($(BIN)/python -m compileall -qq -j 1 $(addprefix $$site/,$(FIRST_COMPILED)) >/dev/null || true) & \
	  compiling=$$!; \
	  $(BIN)/python -m pip install --quiet --no-compile -e '.[runtime]' pytest pytest-xdist; installed=$$?; \
	  wait $$compiling; exit $$installed
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	touch $(STAMP)

# Three pytest workers on two cores, one test file each at a time (--dist loadfile: a file's launched ranks and
# module fixtures stay in one worker): the launches' process start-up, rendezvous, sleeps and timeouts overlap
# the other workers' compute (pytest 12 min 25 s with three, 14 min 50 s with two, same head, same machine).
# Files go out in tests/conftest.py's order (--no-loadscope-reorder keeps xdist's own order, most tests
# first, from replacing it). The repository's modules are compiled once first: where
# PYTHONDONTWRITEBYTECODE is set, as on this machine, every process and forked rank would compile them again.
# --durations 20: the log names the slowest cases, where the next minute of the suite is to be won.
test: venv
	$(BIN)/python -m compileall -q -j 0 megatron_auto patches validation benchmarks tools tests
	$(BIN)/python -m pytest -q -n 3 --dist loadfile --no-loadscope-reorder --durations 20 tests

demo: demo-plan demo-train

demo-plan: venv
	$(BIN)/megatron-auto plan --model gpt3-175b --cluster dgx-a100-80gb --num-nodes 128 --global-batch-size 1536

# 4 gloo ranks on the CPU train a tiny GPT on the shipped corpus; the planner picks the layout.
DATA_PREFIX := data/generated/tiny
demo-train: venv $(DATA_PREFIX)_text_document.bin
	OMP_NUM_THREADS=1 $(BIN)/python -m torch.distributed.run --nproc_per_node 4 tools/pretrain_gpt.py \
		--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64 \
		--max-position-embeddings 64 --micro-batch-size 2 --global-batch-size 16 --train-iters 60 \
		--lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 5 \
		--data-path $(DATA_PREFIX)_text_document --tokenizer-type ByteTokenizer \
		--log-interval 5 --eval-interval 30 --eval-iters 2 --auto-parallel

$(DATA_PREFIX)_text_document.bin: data/tiny_corpus.jsonl tools/preprocess_data.py | venv
	$(BIN)/python tools/preprocess_data.py --input data/tiny_corpus.jsonl \
		--output-prefix $(DATA_PREFIX) --tokenizer-type ByteTokenizer --append-eod

clean-venv:
	rm -rf $(VENV)
