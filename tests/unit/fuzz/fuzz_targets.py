"""Fuzz targets run in a bounded child process by test_fuzz_inputs.py: profile model, sysfs reader, receipt loader.

Each target runs a hypothesis search in this process and returns a summary (examples run, slowest
call); a property that fails raises, and the child prints the falsifying example. The parent gives
the child an address-space limit (RLIMIT_AS) and a timeout, so a blow-up or a hang fails the test
instead of the machine. Every property states the contract of issue 13: arbitrary input gives a
result or a typed, coded error, quickly, and never a traceback.

    ORBITE_FUZZ_EXAMPLES=2000 ORBITE_FUZZ_RANDOM=1 .venv/bin/pytest tests/unit/fuzz    # a longer, random search
"""

import json
import os
import shutil
import stat
import tempfile
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Slowest acceptable call on hostile input: the healthy inputs here take milliseconds.
CALL_SECONDS = 5.0
SECRET = "ORBITE-OUTSIDE-SECRET"


def _settings(examples):
    return settings(
        max_examples=int(os.environ.get("ORBITE_FUZZ_EXAMPLES", examples)),
        deadline=None,
        database=None,
        derandomize=os.environ.get("ORBITE_FUZZ_RANDOM", "") != "1",
        suppress_health_check=list(HealthCheck),
    )


class _Clock:
    def __init__(self):
        self.calls, self.slowest = 0, 0.0

    def time(self, call, *args, **kwargs):
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            spent = time.perf_counter() - start
            self.calls += 1
            self.slowest = max(self.slowest, spent)
            assert spent < CALL_SECONDS, f"{getattr(call, '__name__', call)} took {spent:.1f} s"

    def summary(self):
        return {"calls": self.calls, "slowest_ms": round(self.slowest * 1000, 1)}


# --------------------------------------------------------------------------- shared strategies

_json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20)
json_values = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=25,
)
# Text that looks like what the readers meet, and their favourite garbage.
_TOKENS = [
    "{", "}", "[", "]", ":", ",", '"', "'", "-", " ", "  ", "\n", "\t", "&a", "*a", "<<", "!!python/object:os.system",
    "!!binary", "!!set", "? ", "---", "...", "#", "0", "1", "16", "4194305", "0x11", "-1", "1e999", "NaN",
    "\u00b2", "\u0661", "\U0001d7cf", "\u202e", "\x00", "\ufeff", "true", "yes", "mode", "source", "requester",
    "installed-host", "installed-rail-accounting", "sim-a", "9" * 5000, "[" * 200, "{" * 200, "0-999999999",
    "4: ACTIVE", "100 Gb/sec (4X EDR)", "fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2",
]
token_text = st.lists(st.sampled_from(_TOKENS), max_size=40).map("".join)
any_text = st.text(max_size=300) | token_text


def _run(inner, clock):
    inner()
    return clock.summary()


# --------------------------------------------------------------------------- profile model


def profile(examples):
    from ansible_collections.orbite.qualification.plugins.module_utils._profile import model as pm

    clock = _Clock()
    base = {
        "source": "sim-a", "requester": "sim-b", "source_kind": "cpu", "requester_kind": "cpu", "transport": "rdma",
        "mode": "installed-host", "operation": "read", "rdma_events": False, "parents": 1, "payload": 4096,
        "block": 4096, "num_lanes": 1, "mask": 1,
    }
    fields = st.sampled_from([*pm.KNOWN_FIELDS, "extra", "<<", ""])
    as_profile = st.dictionaries(fields, json_values | any_text, max_size=6).map(lambda changes: dict(base, **changes))
    as_text = any_text | as_profile.map(json.dumps) | as_profile.map(
        lambda p: "".join(f"{k}: {json.dumps(v)}\n" for k, v in p.items())
    )
    tmp = tempfile.mkdtemp(prefix="orbite-fuzz-profile-")

    def check(call, *args, **kwargs):
        try:
            normalized, workload = clock.time(call, *args, **kwargs)
        except pm.ProfileError as error:
            assert error.violations and len(str(error)) < 20_000
            for violation in error.violations:
                assert isinstance(violation.code, str) and violation.code, violation
                assert len(violation.message) < 2_000, violation.message[:200]
            json.dumps([v.as_dict() for v in error.violations])
        else:
            assert workload["backing_per_peer"] <= pm.MAX_BACKING_PER_PEER
            json.dumps([normalized, workload])

    @_settings(examples)
    @given(st.one_of(as_text, as_profile, json_values), st.sampled_from(["value", "text", "file"]))
    def inner(given, how):
        if how == "value":
            check(pm.load_and_derive, profile=given)
        elif how == "text":
            check(pm.load_and_derive, profile=given if isinstance(given, str) else json.dumps(given))
        else:
            path = os.path.join(tmp, "profile.yml")
            data = given.encode("utf-8", "surrogatepass") if isinstance(given, str) else json.dumps(given).encode()
            with open(path, "wb") as handle:
                handle.write(data)
            check(pm.load_and_derive, path=path)

    try:
        return _run(inner, clock)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------- sysfs reader


def sysfs(examples):
    from ansible_collections.orbite.qualification.plugins.module_utils._inventory import sysfs as si
    from ansible_collections.orbite.qualification.plugins.module_utils._sim import fake_sysfs as fs

    clock = _Clock()
    base = tempfile.mkdtemp(prefix="orbite-fuzz-sysfs-")
    template = os.path.join(base, "template")
    spec = fs.sim_host_spec(0, "sim-a")
    for dev in spec["devices"]:
        dev["ports"][0]["gid_tbl_len"] = 4
    fs.write_host(template, spec)
    files, dirs = [], []
    for top, subdirs, names in os.walk(template):
        rel = os.path.relpath(top, template)
        if rel.startswith("run"):
            continue
        dirs += [os.path.normpath(os.path.join(rel, d)) for d in subdirs]
        files += [os.path.normpath(os.path.join(rel, n)) for n in names if not os.path.islink(os.path.join(top, n))]
    files.sort()
    dirs.sort()
    root, outside = os.path.join(base, "case"), os.path.join(base, "outside")

    def fresh():
        for path in (root, outside):
            if os.path.lexists(path):
                shutil.rmtree(path)
        shutil.copytree(template, root, symlinks=True)
        os.makedirs(os.path.join(outside, "dir", "ports", "1"))
        for name in ("secret", "dir/node_type", "dir/node_guid", "dir/fw_ver", "dir/ports/1/state", "dir/cpulist"):
            with open(os.path.join(outside, name), "w") as handle:
                handle.write(SECRET + "\n")

    def mine(path):
        """Only ever change the case's tree (a link made earlier may lead anywhere)."""
        real = os.path.realpath(path)
        return any(real == top or real.startswith(top + os.sep) for top in (root, outside))

    targets = {
        "secret": lambda: os.path.join(outside, "secret"),
        "outside-dir": lambda: os.path.join(outside, "dir"),
        "dev-zero": lambda: "/dev/zero",
        "proc": lambda: "/proc/self/status",
        "dangling": lambda: os.path.join(root, "nowhere"),
        "loop": lambda: "loop",
        "in-root": lambda: os.path.join(root, files[0]),
    }
    names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1,
                    max_size=8).filter(lambda n: n not in (".", ".."))
    contents = st.binary(max_size=300) | any_text.map(lambda t: t.encode("utf-8", "surrogatepass"))
    mutation = st.one_of(
        st.tuples(st.just("write"), st.sampled_from(files), contents),
        st.tuples(st.just("big"), st.sampled_from(files), st.integers(si.READ_LIMIT - 1, si.READ_LIMIT + 2)),
        st.tuples(st.just("fifo"), st.sampled_from(files), st.none()),
        st.tuples(st.just("remove"), st.sampled_from(files + dirs), st.none()),
        st.tuples(st.just("link"), st.sampled_from(files + dirs), st.sampled_from(sorted(targets))),
        st.tuples(st.just("mkdir"), st.sampled_from(dirs), names),
    )

    def apply(kind, rel, arg):
        path = os.path.join(root, rel)
        if (not os.path.lexists(path) and kind != "mkdir") or not mine(os.path.dirname(path)):
            return
        if kind in ("write", "big"):
            if not mine(path) or not stat.S_ISREG(os.stat(path).st_mode):  # opening a FIFO to write blocks
                return
            with open(path, "wb") as handle:
                handle.write(arg if kind == "write" else b"7" * arg)
            return
        if kind == "mkdir":
            if os.path.isdir(path) and mine(path):
                os.mkdir(os.path.join(path, arg))
            return
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "link":
            os.symlink(targets[arg](), path)

    @_settings(examples)
    @given(st.lists(mutation, max_size=6))
    def inner(mutations):
        fresh()
        for kind, rel, arg in mutations:
            try:
                apply(kind, rel, arg)
            except (OSError, UnicodeError):
                pass  # a name the file system refuses, a path a previous mutation removed
        inventory = clock.time(si.read_inventory, root)
        text = si.render_inventory(inventory)
        assert SECRET not in text, "read outside root"
        json.loads(text)
        for error in inventory["errors"]:
            assert set(error) == {"path", "file", "value", "error"}, error
            assert error["value"] is None or (isinstance(error["value"], str) and len(error["value"]) <= 200)

    try:
        return _run(inner, clock)
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------- receipt loader (read only)


def _from_shape(shape, loader, depth=0):
    """Values that mostly follow a loader shape (so the search gets past the schema) and sometimes not."""
    kinds = {"int": st.integers(-(2**70), 2**70), "str": st.text(max_size=12), "bool": st.booleans(),
             "list": st.lists(_json_scalars, max_size=3), "dict": st.dictionaries(st.text(max_size=4), _json_scalars,
                                                                                   max_size=3),
             "number": st.integers() | st.floats(allow_nan=True)}
    if depth > 4:
        return json_values
    if isinstance(shape, str):
        good = kinds.get(shape, json_values)
    elif isinstance(shape, list) and shape:
        good = st.lists(_from_shape(shape[0], loader, depth + 1), max_size=3)
    elif isinstance(shape, dict):
        good = st.fixed_dictionaries({}, optional={k: _from_shape(v, loader, depth + 1) for k, v in shape.items()})
    else:
        good = json_values
    return st.one_of(good, good, good, json_values)


def receipts(examples):
    from ansible_collections.orbite.qualification.plugins.module_utils._verify import loader

    clock = _Clock()
    root = tempfile.mkdtemp(prefix="orbite-fuzz-receipts-")
    where = os.path.join(root, "cases", "c1", "source", "g1")
    os.makedirs(where)
    outside = tempfile.mkdtemp(prefix="orbite-fuzz-outside-")
    with open(os.path.join(outside, "ledger.json"), "w") as handle:
        json.dump({"schema": loader.LEDGER_SCHEMA[0], "version": 1, "note": SECRET}, handle)

    ledger_shape = getattr(loader, "LEDGER_SHAPE", {})
    ledger = _from_shape(ledger_shape, loader).map(
        lambda d: dict(d, schema=loader.LEDGER_SCHEMA[0], version=1) if isinstance(d, dict) else d
    )
    obs_lines = getattr(loader, "_OBS_LINE", {})
    event = st.sampled_from(sorted(obs_lines) or ["wr"]).flatmap(
        lambda kind: _from_shape(obs_lines.get(kind, {}), loader).map(
            lambda d, kind=kind: dict(d, ev=kind) if isinstance(d, dict) else d
        )
    )
    header = st.just({"schema": loader.OBSERVER_SCHEMA[0], "version": 1}) | json_values
    log = st.tuples(header, st.lists(event | json_values, max_size=8)).map(
        lambda hl: "".join(json.dumps(x) + "\n" for x in [hl[0], *hl[1]])
    )
    binary_head = json.dumps({"schema": loader.OBSERVER_SCHEMA[0], "version": 2, "tool": "accounting", "pid": 1,
                              "format": "binary", "record_bytes": 80, "digest": "sha256",
                              "guard_bytes": 4096}).encode() + b"\n"
    record = st.tuples(st.integers(0, 6), st.integers(0, 255), st.integers(0, 80), st.binary(min_size=76,
                                                                                             max_size=76)).map(
        lambda r: bytes([r[0], r[1]]) + r[2].to_bytes(2, "little") + r[3])
    text = st.sampled_from([b'{"ev":"dev","index":0,"dev":"mlx5_0"}', b'{"ev":"summary","accepted_wrs":0,"joined":0,'
                            b'"unjoined":0,"max_inflight_per_qp":{}}', b'{"ev":"destroy"}', b"[" * 60])
    text_record = text.map(lambda t: bytes([5, 0]) + len(t[:76]).to_bytes(2, "little") + t[:76].ljust(76, b"\0"))
    binary_log = st.tuples(st.lists(record | text_record, max_size=8), st.integers(0, 79)).map(
        lambda rc: binary_head + b"".join(rc[0]) + b"\0" * (rc[1] if rc[1] < 8 else 0))
    documents = st.one_of(
        st.binary(max_size=400),
        any_text.map(lambda t: t.encode("utf-8", "surrogatepass")),
        json_values.map(lambda v: json.dumps(v).encode()),
        ledger.map(lambda v: json.dumps(v).encode()),
        log.map(str.encode),
        log.map(lambda t: t[: len(t) // 2].encode()),  # cut mid-line: a killed writer
        binary_log,  # the observers' binary format: a JSON header line, then 80-byte records
        st.integers(1, 5000).map(lambda n: (b"[" * n) + (b"]" * n)),
        st.sampled_from(["fifo", "link-out", "link-dir", "sparse", "dir", "absent"]),
    )
    loaders = {
        "load_json": lambda p: loader.load_json(p, root=root),
        "load_ledger": lambda p: loader.load_ledger(p, root=root),
        "load_observer_log": lambda p: loader.load_observer_log(p, root=root),
        "load_journal": lambda p: loader.load_journal(p, root=root),
    }

    def place(path, content):
        if os.path.lexists(path):
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            else:
                os.unlink(path)
        if isinstance(content, bytes):
            with open(path, "wb") as handle:
                handle.write(content)
        elif content == "fifo":
            os.mkfifo(path)
        elif content == "link-out":
            os.symlink(os.path.join(outside, "ledger.json"), path)
        elif content == "link-dir":
            os.symlink(outside, path)
        elif content == "sparse":
            with open(path, "wb") as handle:
                handle.truncate(1 << 40)  # claims a TiB, holds nothing
        elif content == "dir":
            os.mkdir(path)

    @_settings(examples)
    @given(st.sampled_from(sorted(loaders)), documents)
    def inner(name, content):
        path = os.path.join(where, "receipt")
        place(path, content)
        result = clock.time(loaders[name], path)
        assert isinstance(result, (loader.Receipt, loader.ObserverLog)), type(result)
        if result.problem is not None:
            problem = result.problem
            assert isinstance(problem.code, str) and problem.code.split(".")[0] in ("receipt", "case", "run"), problem
            assert isinstance(problem.message, str)
        assert SECRET not in repr(result.data if isinstance(result, loader.Receipt) else result.events)

    try:
        return _run(inner, clock)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(outside, ignore_errors=True)


# --------------------------------------------------------------------------- the harness's own checks


def blow_up(_examples):
    """Allocates far past any sane limit: the parent must see a failure, not a swapping machine."""
    hog = [bytearray(64 << 20) for _ in range(64)]
    return {"calls": len(hog)}


def hang(_examples):
    """Blocks forever on a FIFO, as an unbounded reader would: the parent must time it out."""
    path = os.path.join(tempfile.mkdtemp(prefix="orbite-fuzz-hang-"), "fifo")
    os.mkfifo(path)
    with open(path, "rb") as handle:
        return {"calls": len(handle.read())}


TARGETS = {"profile": profile, "sysfs": sysfs, "receipts": receipts, "blow_up": blow_up, "hang": hang}


def run(name, examples):
    return TARGETS[name](examples)
