"""Bounded fuzzing of the inputs the gate reads: profiles, a host's sysfs tree, receipts (issue 13).

Each search (fuzz_targets.py) runs in a child process under RLIMIT_AS and a timeout: arbitrary
input must give a result or a typed, coded error within those bounds, never a traceback, a hang or
a blow-up. The first two tests prove the bounds are real. Examples per search are fixed and the
search is derandomized, so CI is repeatable; ORBITE_FUZZ_EXAMPLES and ORBITE_FUZZ_RANDOM=1 widen it.
"""

import os

import pytest
from helpers import bounded

HERE = os.path.dirname(os.path.abspath(__file__))
MEMORY = 1 << 30  # a search, the collection and hypothesis fit in far less
TIMEOUT = 300.0

_CHILD = """
sys.path.insert(0, sys.argv[1])
import fuzz_targets
print(json.dumps(fuzz_targets.run(sys.argv[2], int(sys.argv[3]))))
"""


def _search(name, examples, memory=MEMORY, timeout=TIMEOUT):
    return bounded.run_bounded(_CHILD, memory=memory, timeout=timeout, args=[HERE, name, examples])


def test_the_memory_bound_is_enforced():
    run = _search("blow_up", 1, memory=512 << 20)
    assert not run.hung and run.returncode != 0 and "MemoryError" in run.stderr, run.explain()


def test_the_time_bound_is_enforced():
    run = _search("hang", 1, timeout=3)
    assert run.hung and run.seconds < 30, run.explain()


@pytest.mark.slow
@pytest.mark.parametrize(("target", "examples"), [("profile", 400), ("sysfs", 150), ("receipts", 400)])
def test_arbitrary_input_gives_a_result_or_a_typed_error(target, examples):
    run = _search(target, examples)
    assert not run.hung and run.returncode == 0, run.explain()
    summary = run.result
    assert summary["calls"] >= examples  # the search ran (hypothesis may add its own examples)
    print(f"{target}: {summary['calls']} calls, slowest {summary['slowest_ms']} ms")
