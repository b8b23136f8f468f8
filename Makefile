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
# (Never add the PyPI package `apex`: megatron-core works without it.)
$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH)
	$(BIN)/python -m pip install --quiet -e '.[runtime]' pytest
	touch $(STAMP)

test: venv
	$(BIN)/python -m pytest -q tests

demo: demo-plan demo-train

demo-plan: venv
	$(BIN)/megatron-auto plan --model gpt3-175b --cluster dgx-a100-80gb --num-nodes 128 --global-batch-size 1536

# ---- demo-train: 4-rank CPU/gloo training run (the lead finalizes this target) ----
# Runs only once tools/pretrain_gpt.py exists; replace the arguments below with the
# command from that script's docstring.
demo-train: venv
	@if [ -f tools/pretrain_gpt.py ]; then \
		$(BIN)/python tools/pretrain_gpt.py --help >/dev/null && \
		echo "demo-train: tools/pretrain_gpt.py found; TODO(lead): put the 4-rank training command here"; \
	else \
		echo "demo-train: tools/pretrain_gpt.py is not in this tree yet; skipping the training run"; \
	fi
# ---- end demo-train ----

clean-venv:
	rm -rf $(VENV)
