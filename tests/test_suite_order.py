"""tests/conftest.py's file order for `make test`: the files it names exist, and they sort the straggler test
first, the files of tests/ next, then the long launches longest first, then the rest of tests/runtime."""
import importlib.util
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _order():
    spec = importlib.util.spec_from_file_location("suite_order", TESTS / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_file_the_order_names_exists():
    order = _order()
    for name in (order.FIRST, *order.LONGEST):
        assert (TESTS / name).is_file(), name


def test_the_straggler_then_tests_then_long_launches_then_the_rest():
    order = _order()
    ids = ["tests/runtime/test_straggler_replan.py::a", "tests/test_cli.py::b", "tests/test_runtime_overhead.py::c",
           "tests/runtime/test_checkpoint_safety.py::d", "tests/runtime/test_launch_scripts.py::e",
           "tests/runtime/test_layout.py::f"]
    ranks = [order.file_rank(nodeid) for nodeid in ids]
    assert ranks == sorted(ranks) and ranks[1] == ranks[2] and len(set(ranks)) == 5, ranks
