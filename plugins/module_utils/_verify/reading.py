# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Bounded, safe reading of receipts: regular files inside the run directory, size- and depth-capped.

A receipt is read only when it is a regular file that resolves inside the run directory; its
directories are opened one by one with O_NOFOLLOW (a path swapped for a symlink after the check
fails closed), and the file itself by the collection's one bounded reader
(``_common.files.read_regular_bytes``: stat before open, O_NOFOLLOW|O_NONBLOCK, fstat S_ISREG,
never more than its cap read, so a FIFO never blocks and /dev/zero never fills memory). Its
bracket nesting is measured without recursion before any JSON parser sees it, so a document
nested 2,000 levels deep is refused instead of raising RecursionError. Each refusal is a
``ReceiptProblem`` with a stable ``receipt.*`` code (registered in rules/receipts.py):

- ``receipt.unsafe``: not a regular file (FIFO, device, socket, directory), or a symlink leading
  out of the run directory;
- ``receipt.oversize``: larger than its cap;
- ``receipt.nesting``: nested deeper than ``MAX_DEPTH``.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import re
import stat
from contextlib import contextmanager
from dataclasses import dataclass

from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    FileTooLarge,
    NotRegularFile,
    read_regular_bytes,
)

# The caps are the verifier's side of the gate's bound on payload WRs a round (the profile model's
# MAX_WRS_PER_ROUND): the largest case the preflight accepts (a restart survivor logging the bound in each of
# 3 generations x 3 rounds, JSON lines) fills at most half of each (tests/unit/sim/test_sim_restart.py).
# One JSON document (ledger, inventory, case.json, run.json, a gate note): the largest healthy one,
# a rail-accounting ledger, is about 70 kB; a ledger listing 500,000 WRs (bench/bench_verifier.py)
# about 100 MB.
MAX_DOCUMENT_BYTES = 128 << 20
# A JSON-lines log (observer log, supervisor journal): one million observer records take ~110 MB.
MAX_LOG_BYTES = 256 << 20
# Healthy receipts nest at most six levels (ledger -> rounds -> round -> counters -> native -> per_rail).
MAX_DEPTH = 32
# JSON values (containers and the items separated by commas) in one receipt: what bounds the memory
# a parse may take (a value costs 50-100 B in Python), whatever the bytes; a million observer
# records hold about nine million.
MAX_VALUES = 1 << 24
# All the receipts of one case together.
MAX_CASE_BYTES = 512 << 20
MAX_CASE_VALUES = 1 << 25


class Budget:
    """What the receipts of one case may still take together: bytes read and JSON values parsed."""

    def __init__(self, size=MAX_CASE_BYTES, values=MAX_CASE_VALUES):
        self.size, self.values = size, values


@dataclass
class ReceiptProblem:
    code: str  # a registered receipt.* code (or case.meta / run.plan for the plan's own files)
    path: str
    message: str


@contextmanager
def no_gc():
    """The cyclic garbage collector paused while a large acyclic structure is built (an observer
    log's columns, a replay's key tuples): every few hundred tuples it would rescan all the young
    ones, which costs more than building them. Nothing built under it forms a cycle."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def problem_at(code, path, line, message):
    return ReceiptProblem(code, path, f"line {line}: {message}")


def _inside(path, root):
    """(relative parts of ``path`` resolved inside ``root``, None) or (None, ReceiptProblem)."""
    root_real = os.path.realpath(root)
    real = os.path.realpath(path)  # resolves every symlink on the way; no content is read
    relative = os.path.relpath(real, root_real)
    if relative in (os.curdir, os.pardir) or relative.startswith(os.pardir + os.sep):
        return root_real, None, ReceiptProblem(
            "receipt.unsafe", path, f"resolves to {real}, outside the run directory {root_real}: receipts must be "
            "regular files inside it (a symlink leading out is refused)")
    return root_real, relative.split(os.sep), None


def read_bounded(path, root, limit, budget=None):
    """(bytes, None) of the regular file ``path`` inside ``root``, at most ``limit`` bytes; else (None, problem).

    With a ``budget``, the file must also fit what is left of it, and takes its share.
    """
    if budget is not None and budget.size < limit:
        limit = budget.size
    try:
        root_real, parts, problem = _inside(path, root)
    except (OSError, ValueError) as error:
        return None, ReceiptProblem("receipt.malformed", path, f"cannot be resolved: {error}")
    if problem:
        return None, problem
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_DIRECTORY
    fds = []
    try:
        fds.append(os.open(root_real, flags))
        for part in parts[:-1]:  # no symlink below the run directory: a swap after realpath fails closed
            fds.append(os.open(part, flags | os.O_NOFOLLOW, dir_fd=fds[-1]))
        info = os.stat(parts[-1], dir_fd=fds[-1], follow_symlinks=False)
        if stat.S_ISREG(info.st_mode) and info.st_size > limit:  # refused unread (a sparse file claims any size)
            raise FileTooLarge(parts[-1])
        data = read_regular_bytes(parts[-1], limit, dir_fd=fds[-1], follow_symlinks=False)
        if budget is not None:
            budget.size -= len(data)
        return data, None
    except NotRegularFile as error:
        return None, ReceiptProblem("receipt.unsafe", path, f"{error.args[0].split(': ', 1)[-1]} (receipts are "
                                    "read from regular files only)")
    except FileTooLarge:
        whose = " (what is left of the case's receipts' budget)" if budget is not None and budget.size == limit else ""
        return None, ReceiptProblem("receipt.oversize", path, f"is larger than its cap of {limit} B{whose}")
    except OSError as error:
        if error.errno == errno.ENOENT:
            return None, ReceiptProblem("receipt.missing", path, "receipt is missing")
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            return None, ReceiptProblem("receipt.unsafe", path, f"changed under the reader (a symlink or a file "
                                        f"where a directory was): {error.strerror}")
        return None, ReceiptProblem("receipt.malformed", path, f"cannot be read: {error.strerror or error}")
    finally:
        for fd in reversed(fds):
            os.close(fd)


# --- nesting and size, measured without recursion ------------------------------------------------

_DROP_LINES = bytes(c for c in range(256) if c not in b'"[]{},\n')  # newlines kept: a barrier per line
_DROP = bytes(c for c in range(256) if c not in b'"[]{},')
_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"\n]*"')
_OPENERS = re.compile(rb"[\[{]+")


def measure(data, limit=MAX_DEPTH, lines=False):
    """(depth, values, None) of ``data`` (bytes): bracket depth and JSON values outside strings; else (None, None, why).

    Linear passes in C, no recursion: escapes are dropped, then everything but quotes, brackets,
    commas and newlines; string contents go (a quote pair); containers and commas are counted (the
    values); innermost ``{}``/``[]`` pairs are removed once per level, at most ``limit`` times.
    With ``lines``, a newline stays a barrier, so brackets must balance on every line of a
    JSON-lines log, or the text is refused as unbalanced.
    """
    if b"\\" in data:
        data = _ESCAPE.sub(b"", data)
    marks = data.translate(None, _DROP_LINES if lines else _DROP)
    # Strings without brackets or commas leave an empty quote pair: when every quote is in one (counted,
    # left to right, as a replace would pair them) the quotes just go; else each string is cut out.
    if marks.count(b'"') != 2 * marks.count(b'""'):
        marks = _STRING.sub(b"", marks)
        if b'"' in marks:
            return None, None, "a string is not closed on its line"
    values = marks.count(b",") + marks.count(b"{") + marks.count(b"[")
    brackets = marks.translate(None, b'",')
    depth = 0
    while True:
        reduced = brackets.replace(b"{}", b"\0").replace(b"[]", b"\0").replace(b"\0", b"")
        if len(reduced) == len(brackets):
            break
        depth += 1
        if depth > limit:
            return None, None, f"nested deeper than {limit} levels"
        brackets = reduced
    residue = brackets.replace(b"\n", b"") if lines else brackets
    if residue:
        # Unclosed openers still count: a parser would descend into them before failing.
        if depth + max((len(run) for run in _OPENERS.findall(residue)), default=0) > limit:
            return None, None, f"nested deeper than {limit} levels"
        return None, None, "brackets do not balance"
    return depth, values, None


def _measured(path, data, budget, lines, line=None):
    """None when ``data`` may be parsed (within depth and values; the budget takes its share), else the problem."""
    depth, values, why = measure(data, lines=lines)
    where = f"line {line}: " if line else ""
    if depth is None:
        code = "receipt.nesting" if why.startswith("nested") else "receipt.malformed"
        return ReceiptProblem(code, path, f"{where}is not valid JSON ({why})")
    cap = MAX_VALUES if budget is None else min(MAX_VALUES, budget.values)
    if values > cap:
        return ReceiptProblem("receipt.oversize", path, f"{where}holds about {values} JSON values, over the cap of "
                              f"{cap}" + ("" if cap == MAX_VALUES else " (what is left of the case's budget)"))
    if budget is not None:
        budget.values -= values
    return None


def _text_problem(path, data, problem):
    """receipt.truncated for a document cut short (no closing brace at the end), else the problem."""
    stripped = data.rstrip()
    if problem.code == "receipt.malformed" and stripped and not stripped.endswith(b"}"):
        problem.code = "receipt.truncated"
    return problem


def parse_json(path, data, budget=None):
    """(value, None) of one JSON document (bytes), or (None, ReceiptProblem)."""
    problem = _measured(path, data, budget, lines=False)
    if problem:
        return None, _text_problem(path, data, problem)
    try:
        return json.loads(data), None
    except (ValueError, RecursionError) as error:  # RecursionError: cannot happen below MAX_DEPTH
        return None, _text_problem(path, data, ReceiptProblem("receipt.malformed", path,
                                                              f"is not valid JSON ({error})"))


def parse_json_lines(path, data, budget=None):
    """([(line number, object)], None) of a JSON-lines text (bytes), or (None, ReceiptProblem).

    Fast path: the whole text measured once and parsed as one JSON array; when that fails (or a
    line holds other than exactly one object) each line is read on its own, to name the first bad
    line. A last line without its newline that does not parse is ``receipt.truncated``.
    """
    body = data[:-1] if data.endswith(b"\n") else data
    if body and b"\n\n" not in body:
        left = None if budget is None else budget.values
        problem = _measured(path, data, budget, lines=True)
        if problem and problem.code == "receipt.oversize":
            return None, problem
        if problem is None:
            try:
                records = json.loads(b"[" + body.replace(b"\n", b",") + b"]")
            except (ValueError, RecursionError):
                records = None
            if records is not None and len(records) == body.count(b"\n") + 1 and all(
                    isinstance(record, dict) for record in records):
                return list(enumerate(records, start=1)), None
            if budget is not None:
                budget.values = left  # measured again line by line
    return _lines_one_by_one(path, data, budget)


def _lines_one_by_one(path, data, budget):
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    cut = not data.endswith(b"\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last = number == len(lines)
        problem = _measured(path, line, budget, lines=False, line=number)
        if problem:
            if problem.code == "receipt.malformed" and last and cut:
                problem.code = "receipt.truncated"
            return None, problem
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            code = "receipt.truncated" if last and cut else "receipt.malformed"
            return None, problem_at(code, path, number, "is not a JSON object line")
        if not isinstance(record, dict):
            return None, problem_at("receipt.malformed", path, number, "is not a JSON object")
        records.append((number, record))
    return records, None
