"""Megatron-LM's pretrain_gpt.py on the planner's plan: its flags and their checks (arguments*, validation),
the flags mapped to specs and settings (settings), the plan choice (plan_choice, dry_run) and the run
(pretrain); tools/pretrain_gpt.py calls `main`. The names below are the package's public ones."""
from .arguments import build_parser, parse_args
from .arguments_model import position_embedding_type
from .dry_run import own_flags_plan
from .plan_choice import (check_plan_runs, choose_plan, manual_flags, plan_basis, replanner, search_constraints,
                          training_for_job, with_plan_recompute_modules)
from .pretrain import configure_logging, main, megatron_lm_adjustments, run
from .settings import (data_from_args, model_from_args, moe_settings, no_effect_flags, no_effect_reasons,
                       precision_from_args, precision_summary, settings_from_args)

__all__ = ["build_parser", "check_plan_runs", "choose_plan", "configure_logging", "data_from_args", "main",
           "manual_flags", "megatron_lm_adjustments", "model_from_args", "moe_settings", "no_effect_flags",
           "no_effect_reasons", "own_flags_plan", "parse_args", "plan_basis", "position_embedding_type",
           "precision_from_args", "precision_summary", "replanner", "run", "search_constraints",
           "settings_from_args", "training_for_job", "with_plan_recompute_modules"]
