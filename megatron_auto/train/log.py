"""The log of a pretrain_gpt.py run: one logger, named as Megatron-LM's script and kept outside the
`megatron_auto` hierarchy (whose level and handlers the megatron-auto command line sets for itself)."""
import logging

logger = logging.getLogger("pretrain_gpt")
