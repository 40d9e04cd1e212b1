"""_common.errors: the error root, quote(), and fail_from's one failure shape (in-process and in a real module)."""

import json
import subprocess
import sys
import textwrap

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._common import errors
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import (
    OrbiteError,
    fail_from,
    quote,
)
from helpers.paths import COLLECTIONS


class Failed(Exception):
    """Raised by the recorder where AnsibleModule.fail_json would exit."""


class Recorder:
    """Stands for AnsibleModule: keeps what fail_json received, then stops like it does."""

    def __init__(self):
        self.calls = []

    def fail_json(self, **kwargs):
        self.calls.append(kwargs)
        raise Failed


def _fail(error, /, **kwargs):
    module = Recorder()
    with pytest.raises(Failed):
        fail_from(module, error, **kwargs)
    assert len(module.calls) == 1
    return module.calls[0]


class LockHeld(OrbiteError):
    code = "lock.held"


# ---------------------------------------------------------------- the shape


def test_orbite_error_gives_msg_code_details_and_result():
    error = LockHeld("rnic mlx5_0 is held by run r1", rnic="mlx5_0", owner="r1")
    shown = _fail(error, lock_file="/run/orbite/locks/mlx5_0.lock")
    assert shown == {
        "msg": "rnic mlx5_0 is held by run r1",
        "code": "lock.held",
        "changed": False,
        "rnic": "mlx5_0",
        "owner": "r1",
        "lock_file": "/run/orbite/locks/mlx5_0.lock",
    }


def test_prefix_goes_before_the_message():
    shown = _fail(OrbiteError("3 rules broken", code="profile.invalid"), prefix="invalid profile")
    assert shown["msg"] == "invalid profile: 3 rules broken"
    assert shown["code"] == "profile.invalid"


def test_per_instance_code_beats_the_class_code_and_empty_keeps_it():
    assert _fail(LockHeld("x", code="lock.stale"))["code"] == "lock.stale"
    assert _fail(LockHeld("x", code=""))["code"] == "lock.held"
    assert _fail(OrbiteError("x"))["code"] == "orbite.error"


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (FileNotFoundError(2, "No such file or directory", "/srv/lab"), "os.FileNotFoundError"),
        (PermissionError(13, "Permission denied", "/run/orbite"), "os.PermissionError"),
        (OSError(5, "Input/output error"), "os.OSError"),
        (ValueError("bad"), "error.ValueError"),
        (KeyError("field"), "error.KeyError"),
    ],
)
def test_errors_from_elsewhere_get_a_code_from_their_class(error, code):
    shown = _fail(error)
    assert shown["code"] == code
    assert shown["msg"] == str(error)
    assert set(shown) == {"msg", "code", "changed"}


def test_an_oserror_message_names_the_path():
    shown = _fail(FileNotFoundError(2, "No such file or directory", "/srv/lab"), prefix="sim_host")
    assert shown["msg"] == "sim_host: [Errno 2] No such file or directory: '/srv/lab'"


def test_an_error_key_in_the_result_is_allowed():
    # `error` is positional-only in fail_from, so modules may return an `error` word beside it.
    shown = _fail(OrbiteError("refused", code="save.refused"), error="refused", path="/sys/x")
    assert shown["error"] == "refused" and shown["path"] == "/sys/x" and shown["code"] == "save.refused"


def test_result_wins_over_details_and_reserved_keys_cannot_clobber_the_shape():
    error = OrbiteError("boom", code="a.b", msg="hidden", failed=False, field="from-details")
    shown = _fail(error, field="from-result", code="ignored", msg="ignored too")
    assert shown["msg"] == "boom" and shown["code"] == "a.b"
    assert shown["field"] == "from-result"
    assert "failed" not in shown  # fail_json sets it


def test_changed_comes_from_the_result_only():
    assert _fail(OrbiteError("x", changed=True))["changed"] is False
    assert _fail(OrbiteError("x"), changed=True)["changed"] is True


def test_no_traceback_is_ever_asked_for():
    try:
        raise OSError(28, "No space left on device")
    except OSError as error:
        shown = _fail(error)
    assert "exception" not in shown and "traceback" not in shown


def test_details_are_a_copy():
    error = OrbiteError("x", code="c.d", host="sim-a")
    _fail(error, host="sim-b")
    assert error.details == {"host": "sim-a"}


# ---------------------------------------------------------------- quote


def test_quote_is_repr_cut_to_the_limit():
    assert quote("sim-a") == "'sim-a'"
    assert quote("a\n") == "'a\\n'"
    long = quote("x" * 10_000)
    assert len(long) == errors.QUOTE_LIMIT and long.endswith("...")
    assert quote("x" * 10, limit=8) == "'xxxx..."


# ---------------------------------------------------------------- a real AnsibleModule

MODULE = textwrap.dedent(
    """
    from ansible.module_utils.basic import AnsibleModule
    from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from

    module = AnsibleModule(argument_spec={"path": {"type": "path"}})
    try:
        open(module.params["path"], encoding="utf-8")
    except OSError as error:
        fail_from(module, error, prefix="reading the profile", error="unreadable")
    """
)


def test_a_real_module_fails_in_the_one_shape_without_a_traceback(tmp_path):
    script = tmp_path / "module.py"
    script.write_text(MODULE)
    args = tmp_path / "args.json"
    missing = tmp_path / "absent.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"path": str(missing)}}))
    env = {"PYTHONPATH": str(COLLECTIONS), "PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"}
    done = subprocess.run(
        [sys.executable, str(script), str(args)], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["failed"] is True and result["changed"] is False
    assert result["code"] == "os.FileNotFoundError"
    assert result["error"] == "unreadable"
    assert result["msg"] == f"reading the profile: [Errno 2] No such file or directory: '{missing}'"
    assert "exception" not in result
