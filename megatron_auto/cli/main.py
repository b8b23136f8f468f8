"""Entry point of `megatron-auto` and `python -m megatron_auto`."""
from __future__ import annotations

import logging
import sys
from typing import Callable, Optional

from ..errors import UserError
from .parser import parse_args

PROG = "megatron-auto"


def _commands() -> dict[str, Callable]:
    from .estimate_command import run_estimate
    from .plan_command import run_plan
    from .profile_command import run_profile_cluster, run_profile_model
    from .show_command import run_show

    return {"plan": run_plan, "estimate": run_estimate, "show": run_show,
            "profile-cluster": run_profile_cluster, "profile-model": run_profile_model}


def _configure_logging(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
    root = logging.getLogger("megatron_auto")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    root.propagate = False


def one_line(message: object) -> str:
    """An error message folded onto one line."""
    return " ".join(str(message).split()) or "unknown error"


def main(argv: Optional[list[str]] = None) -> int:
    """Run one command; user errors exit 2 with one line on stderr, bugs keep their traceback."""
    args = parse_args(argv)
    _configure_logging(getattr(args, "verbose", False))
    try:
        return _commands()[args.command](args)
    except UserError as error:
        sys.stderr.write(f"{PROG} {args.command}: error: {one_line(error)}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted\n")
        return 130
    except BrokenPipeError:
        sys.stderr.close()  # stdout's reader went away (e.g. `| head`); nothing more to say
        return 1


if __name__ == "__main__":
    sys.exit(main())
