"""The ledger's WR columns are type-checked a whole column at a time in C (loader.wr_columns_problem):
an unsigned array for the int columns, a join for the string ones, and a bool looked for only when the
document's text leaves room for one in its columns. Each fast answer is the exact check's answer."""

import json

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._verify import loader


def _columns(n=4, **changes):
    columns = {name: list(range(n)) if kind == loader.INT else [f"0x{i + 1:x}" for i in range(n)]
               for name, kind in loader.WR_COLUMNS.items()}
    for name, (index, value) in changes.items():
        columns[name][index] = value
    return columns


@pytest.mark.parametrize("bools", [True, False])
def test_an_int_past_64_bits_is_still_an_int(bools):
    # The array refuses it (OverflowError): the exact check answers, and accepts it as JSON does.
    assert loader.wr_columns_problem(_columns(wr_id=(2, 1 << 70)), "$.w", bools) is None


@pytest.mark.parametrize(("change", "words"), [
    ({"bytes": (1, 1.0)}, "$.w.bytes[1]: 1.0 is not int >= 0"),
    ({"lane": (3, -1)}, "$.w.lane[3]: -1 is not int >= 0"),
    ({"cq": (0, None)}, "$.w.cq[0]: None is not str"),
    ({"completed_seq": (2, None)}, None),
    ({"completed_seq": (2, True)}, "$.w.completed_seq[2]: True is not int or null >= 0"),
    ({"slice": (0, False)}, "$.w.slice[0]: False is not int >= 0"),
])
def test_column_checks_name_the_first_offender(change, words):
    problem = loader.wr_columns_problem(_columns(**change), "$.w")
    assert problem == words if words is None else problem.startswith(words), problem


def _ledger(columns, **extra):
    return {"schema": "orbite.runner-ledger", "rails": [{"enabled": True}], **extra,
            "rounds": [{"round": 1, "drain": {"drained": False}, "wrs": columns}]}


@pytest.mark.parametrize(("ledger", "may"), [
    (_ledger(_columns()), False),  # the document's bools all sit outside the columns
    (_ledger(_columns(parent=(1, True))), True),
    (_ledger(_columns(), note="true or false"), True),  # a literal inside a string: counted, so the check runs
    (_ledger(_columns(), errors=[{"retry": False}]), False),
])
def test_a_bool_is_looked_for_in_the_columns_when_the_text_leaves_room(ledger, may):
    text = json.dumps(ledger).encode()
    assert loader._bools_outside(json.loads(text), text) is may
