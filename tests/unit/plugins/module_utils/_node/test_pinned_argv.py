"""Pinning the files a runner reads by name (argv entries, env values) and journaling what it got.

The simulated runner is ``python <zipapp> --case <case.json> ...``: argv[0] is the interpreter, the
code that runs is argv[1] and the case file argv[3]. With ``argv_pins`` the supervisor hands the
runner sealed copies of those files (``/proc/self/fd/N``), so rewriting them after the launch changes
nothing, and ``child_start`` records the sha256 of every file the runner was given: the verifier's
witness of which runner and which case file ran (docs/supervisor.md, docs/verifier.md).
"""

import hashlib
import json
import os
import sys
import zipfile

import pytest
from helpers.node_root import events, make_root
from ansible_collections.orbite.qualification.plugins.module_utils._node.client import (
    SupervisorClient,
    SupervisorInputError,
    SupervisorRequestError,
    start_supervisor,
)

# The "runner": reports the argv it got, what it read through each name, and an env-named file.
MAIN = """
import json, os, sys
out = {"argv": sys.argv, "case": open(sys.argv[1]).read(), "lib": None}
if os.environ.get("ORBITE_LIB"):
    out["lib"] = [os.environ["ORBITE_LIB"], open(os.environ["ORBITE_LIB"], "rb").read().decode()]
with open(sys.argv[2], "w") as handle:
    json.dump(out, handle)
"""


def _sha(data):
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def sup(tmp_path):
    root = make_root(tmp_path / "root")
    run_dir = os.path.join(root, "run", "orbite", "supervisors", "pins")
    start_supervisor(run_dir, "pins", ["mlx5_0"], os.path.join(root, "run", "orbite", "locks"), root=root,
                     lease=120, lock_timeout=5)
    client = SupervisorClient(run_dir)
    yield client
    client.stop(force=True)


@pytest.fixture
def files(tmp_path):
    app = tmp_path / "runner.pyz"
    with zipfile.ZipFile(app, "w") as archive:
        archive.writestr("__main__.py", MAIN)
    case = tmp_path / "case.json"
    case.write_text('{"role": "source"}')
    return app, case, tmp_path / "report.json"


def _run(client, argv, **kwargs):
    child = client.launch(argv, env=kwargs.pop("env", {"PATH": "/usr/bin:/bin"}), **kwargs)
    assert client.wait(child["child_id"], timeout=30)["exit_code"] == 0
    return child


def test_pinned_zipapp_and_case_file_are_what_runs_and_are_journaled(sup, files):
    app, case, report = files
    app_sha, case_sha = _sha(app.read_bytes()), _sha(case.read_bytes())
    child = _run(sup, [sys.executable, str(app), str(case), str(report)],
                                argv_pins={1: app_sha, 2: None}, record_json=[2])
    got = json.loads(report.read_text())
    # The runner was given the copies' names, and read the bytes that were hashed.
    assert got["argv"][0].startswith("/proc/self/fd/") and got["argv"][1].startswith("/proc/self/fd/")
    assert got["case"] == case.read_text()
    (start,) = events(sup.journal_path, "child_start")
    assert start["argv"] == [sys.executable, str(app), str(case), str(report)]  # the names asked for
    assert [(p["what"], p["path"], p["sha256"], p["size"]) for p in start["pinned"]] == [
        ("argv[1]", str(app), app_sha, app.stat().st_size),
        ("argv[2]", str(case), case_sha, case.stat().st_size),  # null pin: recorded, not checked
    ]
    assert start["pinned"][1]["loaded_as"] == got["argv"][1]
    assert start["pinned"][1]["json"] == {"role": "source"} and "json" not in start["pinned"][0]
    assert start["exe"] is None and start["ld_preload"] == []
    assert child["pinned"] == start["pinned"] and child["argv"] == start["argv"]


def test_a_file_rewritten_after_the_launch_is_not_what_the_runner_reads(sup, files, tmp_path):
    _app, case, report = files
    slow = tmp_path / "slow.py"  # reads its case file only after it was rewritten
    slow.write_text("import sys, time\ntime.sleep(0.5)\nopen(sys.argv[2], 'w').write(open(sys.argv[1]).read())\n")
    child = sup.launch([sys.executable, str(slow), str(case), str(report)], env={"PATH": "/usr/bin"},
                       argv_pins={1: _sha(slow.read_bytes()), 2: _sha(case.read_bytes())})
    case.write_text('{"role": "requester"}')
    assert sup.wait(child["child_id"], timeout=30)["exit_code"] == 0
    assert report.read_text() == '{"role": "source"}'


def test_a_mismatched_argv_pin_runs_nothing(sup, files):
    app, case, report = files
    with pytest.raises(SupervisorRequestError) as caught:
        sup.launch([sys.executable, str(app), str(case), str(report)], argv_pins={1: "0" * 64})
    assert caught.value.code == "supervisor.hash_mismatch" and "argv[1]" in str(caught.value)
    assert not report.exists() and events(sup.journal_path, "child_start") == []
    (failed,) = events(sup.journal_path, "child_launch_failed")
    assert failed["error"] == "supervisor.hash_mismatch"


@pytest.mark.parametrize("content", ["not json", "[1, 2]", "[" * 100_000 + "]" * 100_000, "{}" + " " * 300_000])
def test_a_recorded_file_that_is_not_a_small_json_object_runs_nothing(sup, files, content):
    app, case, report = files
    case.write_text(content)
    with pytest.raises(SupervisorRequestError) as caught:
        sup.launch([sys.executable, str(app), str(case), str(report)], argv_pins={2: None}, record_json=[2])
    assert caught.value.code == "supervisor.pin_failed" and "argv[2]" in str(caught.value)
    assert not report.exists() and events(sup.journal_path, "child_start") == []
    assert sup.status()["ok"]  # the supervisor serves on


def test_env_pin_gives_the_runner_the_copy(sup, files, tmp_path):
    app, case, report = files
    lib = tmp_path / "libprovider.so"
    lib.write_text("provider bytes")
    _run(sup, [sys.executable, str(app), str(case), str(report)],
         env={"PATH": "/usr/bin", "ORBITE_LIB": str(lib)}, env_pins={"ORBITE_LIB": _sha(lib.read_bytes())})
    name, content = json.loads(report.read_text())["lib"]
    assert name.startswith("/proc/self/fd/") and content == "provider bytes"
    (start,) = events(sup.journal_path, "child_start")
    assert [(p["what"], p["sha256"], p["loaded_as"]) for p in start["pinned"]] == [
        ("env[ORBITE_LIB]", _sha(b"provider bytes"), name)]


def test_argv_zero_pinned_through_argv_pins_is_execd_from_its_copy(sup, tmp_path):
    tool = tmp_path / "tool"
    tool.write_text(f"#!{sys.executable}\nimport sys\nopen(sys.argv[1], 'w').write('ran')\n")
    tool.chmod(0o700)
    out = tmp_path / "exe"
    child = _run(sup, [str(tool), str(out)], argv_pins={0: None})
    (start,) = events(sup.journal_path, "child_start")
    assert start["exe"]["sha256"] == _sha(tool.read_bytes()) == start["pinned"][0]["sha256"]
    assert start["pinned"][0]["what"] == "argv[0]" and child["argv"] == [str(tool), str(out)]
    assert out.read_text() == "ran"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"argv_pins": {9: None}}, "argv_pins[9]: argv has 4 entries"),
    ({"argv_pins": {0: None}, "exe_sha256": "0" * 64}, "argv_pins[0]: argv[0] is already pinned by exe_sha256"),
    ({"argv_pins": {1: "ABC"}}, "argv_pins[1] 'ABC': must be 64 lowercase hex digits or null"),
    ({"argv_pins": {-1: None}}, "argv_pins {-1: None}: must map argv indexes"),
    ({"argv_pins": {3: None}}, "argv[3] (pinned by argv_pins) 'relative': must be an absolute path"),
    ({"env_pins": {"ORBITE_NONE": None}}, "env_pins[ORBITE_NONE]: must name a variable of env"),
    ({"argv_pins": {1: None}, "record_json": [2]}, "record_json [2]: must be a list of argv indexes that argv_pins"),
    ({"env_pins": {"LD_LIBRARY_PATH": None}}, "env_pins[LD_LIBRARY_PATH]: must name a variable of env that the "
                                              "child keeps"),
])
def test_bad_pins_are_refused_before_the_supervisor_is_asked(sup, files, kwargs, message):
    app, case, _report = files
    env = {"PATH": "/usr/bin", "LD_LIBRARY_PATH": str(case)}
    with pytest.raises(SupervisorInputError) as caught:
        sup.launch([sys.executable, str(app), str(case), "relative"], env=env, **kwargs)
    assert message in str(caught.value)


def test_the_supervisor_checks_pins_itself(sup, files, tmp_path):
    app, case, _report = files
    link = tmp_path / "link.json"
    link.symlink_to(case)
    for pins, message in (({"1": None, "01": None}, "argv_pins key '01'"),
                          ({"2": None}, "must be an existing regular file (not a symlink)"),
                          ({"x": None}, "argv_pins key 'x'")):
        with pytest.raises(SupervisorRequestError) as caught:
            sup.request({"op": "launch", "argv": [sys.executable, str(app), str(link)], "argv_pins": pins})
        assert caught.value.code == "supervisor.bad_request" and message in str(caught.value), caught.value
    assert events(sup.journal_path, "child_start") == []
