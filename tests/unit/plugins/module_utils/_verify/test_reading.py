"""Bounded, safe reading of receipts: FIFOs, devices, symlinks out, oversize and deep nesting are coded FAILs.

Before reading.py, a FIFO receipt hung the verifier forever, a symlink to /dev/zero grew without
bound, and JSON nested 2,000 levels deep raised RecursionError. Each of those is now one coded
receipt.* FAIL, fast, with bounded memory and no traceback.
"""

import contextlib
import json
import os
import resource
import shutil
import signal
import stat

import pytest
from helpers import observer_log
from helpers.sim_pair import RAIL_ACCOUNTING, run_pair

from ansible_collections.orbite.qualification.plugins.module_utils._verify import reading
from ansible_collections.orbite.qualification.plugins.module_utils._verify.loader import load_json
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod)")


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("healthy") / "run"
    run_pair(run_dir, "ra", RAIL_ACCOUNTING)
    return run_dir


@pytest.fixture
def run(healthy, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(healthy / "cases" / "ra", run_dir / "cases" / "ra")
    shutil.copy(healthy / "run.json", run_dir / "run.json")
    return run_dir


@contextlib.contextmanager
def _within(seconds):
    """Fail (instead of hanging the suite) when the body takes longer than ``seconds``."""

    def expired(_signum, _frame):
        raise TimeoutError(f"took longer than {seconds} s: the reader blocked or read without bound")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _ledger(run_dir):
    return run_dir / "cases" / "ra" / "requester" / "g1" / "ledger.json"


def _journal(run_dir):
    return run_dir / "cases" / "ra" / "source" / "journal.jsonl"


def _observer_log(run_dir):
    return observer_log.find(run_dir / "cases" / "ra" / "requester" / "g1")


def _verdict(run_dir):
    with _within(20):
        return verify_run(str(run_dir), write=False)


def _finding(verdict, code):
    (found,) = [f for f in verdict["cases"][0]["findings"] if f["code"] == code]
    return found


def _max_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_a_fifo_receipt_is_unsafe_and_never_hangs(run):
    _ledger(run).unlink()
    os.mkfifo(_ledger(run))  # nobody ever writes to it: a blocking open or read would hang forever
    verdict = _verdict(run)
    assert verdict["failed_codes"] == ["receipt.unsafe"]
    assert "a FIFO" in _finding(verdict, "receipt.unsafe")["message"]


def test_a_fifo_journal_and_observer_log_are_unsafe(run):
    for path in (_journal(run), _observer_log(run)):
        path.unlink()
        os.mkfifo(path)
    verdict = _verdict(run)
    assert verdict["failed_codes"] == ["receipt.unsafe"]
    assert verdict["verdict"] == "FAIL"


def test_a_symlink_to_dev_zero_is_refused_with_bounded_memory(run):
    _ledger(run).unlink()
    _ledger(run).symlink_to("/dev/zero")
    before = _max_rss_mib()
    verdict = _verdict(run)
    assert verdict["failed_codes"] == ["receipt.unsafe"]
    assert "outside the run directory" in _finding(verdict, "receipt.unsafe")["message"]
    assert _max_rss_mib() - before < 64


@ROOT_ONLY
def test_a_zero_device_inside_the_run_directory_is_refused_unread(run):
    _ledger(run).unlink()
    os.mknod(_ledger(run), stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers, no symlink
    before = _max_rss_mib()
    verdict = _verdict(run)
    assert verdict["failed_codes"] == ["receipt.unsafe"]
    assert "character device" in _finding(verdict, "receipt.unsafe")["message"]
    assert _max_rss_mib() - before < 64


def test_a_directory_where_a_receipt_belongs_is_unsafe(run):
    _ledger(run).unlink()
    _ledger(run).mkdir()
    assert _verdict(run)["failed_codes"] == ["receipt.unsafe"]


def test_a_symlinked_case_directory_leading_out_is_refused(run, tmp_path):
    outside = tmp_path / "elsewhere"
    (run / "cases" / "ra").rename(outside)
    (run / "cases" / "ra").symlink_to(outside)
    verdict = _verdict(run)
    assert verdict["failed_codes"] == ["receipt.unsafe"]
    assert verdict["cases"][0]["findings"][0]["evidence"].endswith("case.json")


def test_a_symlink_that_stays_inside_the_run_directory_is_followed(run):
    kept = run / "kept" / "ledger.json"
    kept.parent.mkdir()
    _ledger(run).rename(kept)
    _ledger(run).symlink_to(os.path.relpath(kept, _ledger(run).parent))
    assert _verdict(run)["verdict"] == "PASS"


def test_an_oversize_sparse_receipt_is_refused_unread(run):
    os.truncate(_observer_log(run), reading.MAX_LOG_BYTES + 1)  # sparse: reading it would take 256 MiB
    before = _max_rss_mib()
    verdict = _verdict(run)
    assert verdict["failed_codes"] == ["receipt.oversize"]
    assert _max_rss_mib() - before < 64


def test_a_run_json_that_is_a_fifo_is_named_by_its_receipt_code(run):
    (run / "run.json").unlink()
    os.mkfifo(run / "run.json")
    verdict = _verdict(run)
    assert verdict["verdict"] == "FAIL" and verdict["failed_codes"] == ["receipt.unsafe"]
    assert verdict["cases"] == []


@pytest.mark.parametrize("text", ["[" * 2000 + "]" * 2000, '{"a":' * 2000 + "1" + "}" * 2000,
                                  '{"a": ' + "[" * 2000])  # the last one also cut short
def test_json_nested_2000_levels_is_a_coded_fail_not_a_recursion_error(run, text):
    _ledger(run).write_text(text)
    verdict = _verdict(run)
    assert verdict["failed_codes"] == ["receipt.nesting"]


def test_a_deeply_nested_journal_line_names_its_line(run):
    lines = _journal(run).read_text().splitlines()
    lines[3] = '{"ev": "x", "deep": ' + "[" * 2000 + "]" * 2000 + "}"
    _journal(run).write_text("\n".join(lines) + "\n")
    found = _finding(_verdict(run), "receipt.nesting")
    assert found["status"] == "FAIL" and "line 4" in found["message"]


# --- the measuring itself ------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "depth"), [
    (b"", 0), (b"1", 0), (b"{}", 1), (b'{"a": [1, {"b": []}]}', 4),
    (b'{"a": "]]]}}}", "b": "[[[{{{"}', 1),  # brackets inside strings do not count
    (b'{"a": "\\"]]", "b": ["\\\\"]}', 2),  # escaped quotes and backslashes
    (b"[" * 32 + b"]" * 32, 32),
])
def test_nesting_measures_brackets_outside_strings(text, depth):
    assert reading.measure(text)[::2] == (depth, None)


@pytest.mark.parametrize(("text", "why"), [
    (b"[" * 33 + b"]" * 33, "nested deeper than 32 levels"),
    (b'{"a": [}', "brackets do not balance"),
    (b'{"a": "]', "a string is not closed on its line"),
    (b"]" * 10, "brackets do not balance"),
    (b"]" + b"[" * 33, "nested deeper than 32 levels"),  # unclosed openers count: a parser descends first
])
def test_nesting_refuses_too_deep_and_unbalanced_text(text, why):
    assert reading.measure(text) == (None, None, why)


def test_nesting_per_line_keeps_each_line_balanced():
    assert reading.measure(b'{"a": [1,\n2]}\n', lines=True)[2] == "brackets do not balance"
    assert reading.measure(b'{"a": [1,\n2]}\n')[::2] == (2, None)
    assert reading.measure(b'{"a": "x\ny"}', lines=True)[2] == "a string is not closed on its line"


def test_values_are_counted_outside_strings():
    assert reading.measure(b'{"a": [1, 2, {"b": "x,y,[z]"}], "c": 3}') == (3, 6, None)
    # Quotes are paired left to right by counting: a string holding a mark beside empty strings is cut out.
    assert reading.measure(b'{"a": "[", "b": "", "c": "",  "d": "]"}') == (1, 4, None)
    assert reading.measure(b'["", "[", ""]') == (1, 3, None)


def test_nesting_is_linear_in_c_for_a_large_log():
    data = b'{"ev":"wr","ctx":"ctx-0","qpn":1,"wr_id":1,"bytes":1048576,"odd":"{[\\"]"}\n' * 200_000
    with _within(10):
        assert reading.measure(data, lines=True) == (1, 1_200_000, None)  # 6 values a record


def test_a_receipt_of_too_many_values_is_oversize_before_it_is_parsed(run):
    # 3 bytes a record but 64 B of Python each: the values cap, not the bytes, bounds the memory.
    binary = _observer_log(run)
    binary.unlink()  # JSON lines, under the name that says so
    (binary.parent / observer_log.file_name("accounting", "json")).write_bytes(b"{}\n" * (reading.MAX_VALUES + 1))
    before = _max_rss_mib()
    verdict = _verdict(run)
    assert verdict["failed_codes"] == ["receipt.oversize"]
    assert "JSON values" in _finding(verdict, "receipt.oversize")["message"]
    assert _max_rss_mib() - before < 600  # the bytes and their measure, never the 1 GiB of parsed dicts


def test_the_case_budget_bounds_all_its_receipts_together(run):
    ledger = str(_ledger(run))
    budget = reading.Budget(size=os.path.getsize(ledger) * 3 // 2, values=10**9)  # the first read fits, not a second
    assert reading.read_bounded(ledger, str(run), reading.MAX_DOCUMENT_BYTES, budget)[1] is None
    problem = reading.read_bounded(ledger, str(run), reading.MAX_DOCUMENT_BYTES, budget)[1]
    assert problem.code == "receipt.oversize" and "budget" in problem.message


@pytest.mark.parametrize(("text", "result"), [
    (b'{"a": 1}\n{"b": 2}\n', [(1, {"a": 1}), (2, {"b": 2})]),
    (b'{"a": 1}\r\n\n  \n{"b": 2}', [(1, {"a": 1}), (4, {"b": 2})]),  # CRLF, blank lines, no final newline
])
def test_json_lines_parse_with_their_line_numbers(text, result):
    assert reading.parse_json_lines("log", text) == (result, None)


@pytest.mark.parametrize(("text", "code", "where"), [
    (b'{"a": 1}\n{"b": 2', "receipt.truncated", "line 2"),
    (b'{"a": 1}\n{"b": 2\n{"c": 3}\n', "receipt.malformed", "line 2"),
    (b'{"a": 1}, {"b": 2}\n', "receipt.malformed", "line 1"),  # two objects on one line
    (b'{"a": [1,\n2]}\n', "receipt.malformed", "line 1"),  # one object over two lines
    (b'{"a": 1}\n[1]\n', "receipt.malformed", "line 2"),
])
def test_json_lines_name_the_first_bad_line(text, code, where):
    records, problem = reading.parse_json_lines("log", text)
    assert records is None and (problem.code, problem.message.split(":")[0]) == (code, where)


def test_a_document_read_outside_a_run_stays_in_its_own_directory(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "secret.json").write_text(json.dumps({"schema": "x", "version": 1}))
    (tmp_path / "a" / "doc.json").symlink_to("../secret.json")
    assert load_json(str(tmp_path / "a" / "doc.json")).problem.code == "receipt.unsafe"
    assert load_json(str(tmp_path / "a" / "doc.json"), root=str(tmp_path)).ok
