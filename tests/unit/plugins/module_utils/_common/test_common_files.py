"""_common.files: the one atomic writer (content, mode, fsync, old file kept until the rename, no temp left)."""

import json
import os
import stat

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._common import files
from ansible_collections.orbite.qualification.plugins.module_utils._common.files import (
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
)


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_writes_the_content_with_a_private_mode_by_default(tmp_path):
    target = tmp_path / "receipt.bin"
    atomic_write_bytes(str(target), b"\x00payload\xff")
    assert target.read_bytes() == b"\x00payload\xff"
    assert _mode(target) == 0o600
    assert os.listdir(tmp_path) == ["receipt.bin"]


@pytest.mark.parametrize("mode", [0o644, 0o600, 0o640, 0o400])
def test_mode_is_exact_whatever_the_umask(tmp_path, mode):
    target = tmp_path / "inv.json"
    old = os.umask(0o077)
    try:
        atomic_write_text(str(target), "{}\n", mode)
    finally:
        os.umask(old)
    assert _mode(target) == mode


def test_replacing_sets_the_new_mode_and_content(tmp_path):
    target = tmp_path / "plan.json"
    target.write_text("old")
    os.chmod(target, 0o666)
    atomic_write_text(str(target), "new ✓", 0o640)
    assert target.read_text(encoding="utf-8") == "new ✓"
    assert _mode(target) == 0o640
    assert os.listdir(tmp_path) == ["plan.json"]


def test_json_has_sorted_keys_and_a_final_newline(tmp_path):
    target = tmp_path / "verdict.json"
    atomic_write_json(str(target), {"b": 1, "a": [1, 2]}, indent=1)
    text = target.read_text()
    assert text == '{\n "a": [\n  1,\n  2\n ],\n "b": 1\n}\n'
    assert json.loads(text) == {"a": [1, 2], "b": 1}


def test_a_relative_path_is_written_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    atomic_write_text("relative.txt", "here")
    assert (tmp_path / "relative.txt").read_text() == "here"


def test_old_file_stays_visible_until_the_rename(tmp_path, monkeypatch):
    """At the moment of the rename the target still holds the old content and the temporary file
    beside it holds all of the new content (already fsynced): a reader sees one or the other."""
    target = tmp_path / "state.json"
    target.write_text("old content")
    synced = []
    seen = {}
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    def replace(source, destination, **at):
        seen["target"] = target.read_text()
        with open(source, encoding="utf-8") as handle:
            seen["temporary"] = handle.read()
        seen["same_dir"] = os.path.dirname(os.path.abspath(source)) == str(tmp_path)
        seen["synced_before"] = list(synced)
        real_replace(source, destination, **at)

    monkeypatch.setattr(files.os, "fsync", fsync)
    monkeypatch.setattr(files.os, "replace", replace)
    atomic_write_text(str(target), "new content")
    assert seen == {
        "target": "old content",
        "temporary": "new content",
        "same_dir": True,
        "synced_before": [False],  # the file, before it becomes visible
    }
    assert synced == [False, True]  # then the directory, so the rename survives a crash
    assert target.read_text() == "new content"


def test_through_a_directory_descriptor_the_name_lands_in_that_directory_whatever_its_path_became(tmp_path):
    checked = tmp_path / "checked"
    checked.mkdir()
    dir_fd = os.open(checked, os.O_RDONLY | os.O_DIRECTORY)
    try:
        checked.rename(tmp_path / "moved")
        checked.symlink_to(tmp_path / "elsewhere")  # a dangling link where the path was
        atomic_write_json("state.json", {"b": 1}, dir_fd=dir_fd)
        with pytest.raises(TypeError):
            atomic_write_bytes("torn", "text, not bytes", dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    assert os.listdir(tmp_path / "moved") == ["state.json"]  # and no temporary left
    assert (tmp_path / "moved" / "state.json").read_text() == '{\n  "b": 1\n}\n'
    assert oct(os.stat(tmp_path / "moved" / "state.json").st_mode & 0o777) == "0o600"
    assert not (tmp_path / "elsewhere").exists()


class Interrupted(BaseException):
    """Stands for a KeyboardInterrupt or SystemExit arriving mid-write."""


@pytest.mark.parametrize(
    "failure",
    [OSError(28, "No space left on device"), OSError(5, "Input/output error"), Interrupted()],
    ids=["ENOSPC", "EIO", "interrupt"],
)
def test_a_failure_mid_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, failure):
    target = tmp_path / "inventory.json"
    target.write_text("old content")

    def fsync(fd):
        raise failure

    monkeypatch.setattr(files.os, "fsync", fsync)
    with pytest.raises(type(failure)):
        atomic_write_text(str(target), "new content that never lands")
    assert target.read_text() == "old content"
    assert os.listdir(tmp_path) == ["inventory.json"]


def test_a_failed_rename_leaves_no_temporary(tmp_path):
    target = tmp_path / "occupied"
    target.mkdir()
    (target / "keep").write_text("x")
    with pytest.raises(OSError):
        atomic_write_text(str(target), "cannot replace a directory")
    assert sorted(os.listdir(tmp_path)) == ["occupied"]
    assert os.listdir(target) == ["keep"]


def test_content_that_cannot_be_written_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.bin"
    with pytest.raises(TypeError):
        atomic_write_bytes(str(target), "text, not bytes")
    assert os.listdir(tmp_path) == []


def test_a_missing_directory_is_an_error_and_nothing_is_created(tmp_path):
    with pytest.raises(FileNotFoundError):
        atomic_write_text(str(tmp_path / "absent" / "file.txt"), "x")
    assert os.listdir(tmp_path) == []


def test_json_that_cannot_be_encoded_touches_nothing(tmp_path):
    target = tmp_path / "verdict.json"
    target.write_text("old")
    with pytest.raises(TypeError):
        atomic_write_json(str(target), {"when": object()})
    assert target.read_text() == "old"
    assert os.listdir(tmp_path) == ["verdict.json"]


def test_private_dir_creates_every_missing_parent_private_whatever_the_umask(tmp_path):
    old = os.umask(0o777)  # a umask that would leave the new directories unusable
    try:
        made = files.private_dir(str(tmp_path / "a" / "b" / "c"), "run_dir")
    finally:
        os.umask(old)
    assert made == str(tmp_path / "a" / "b" / "c")
    assert [_mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o700, 0o700, 0o700]


def test_private_dir_tightens_an_existing_directory_of_ours_and_leaves_its_parents(tmp_path):
    (tmp_path / "open" / "leaf").mkdir(parents=True)
    os.chmod(tmp_path / "open", 0o755)
    os.chmod(tmp_path / "open" / "leaf", 0o777)
    files.private_dir(str(tmp_path / "open" / "leaf"))
    assert (_mode(tmp_path / "open"), _mode(tmp_path / "open" / "leaf")) == (0o755, 0o700)


def test_private_dir_refuses_a_link_even_to_a_directory_of_ours(tmp_path):
    (tmp_path / "real").mkdir(mode=0o755)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(files.NotPrivateDir) as caught:
        files.private_dir(str(tmp_path / "link"), "state_dir")
    assert caught.value.code == "file.not_private" and "state_dir" in str(caught.value)
    assert _mode(tmp_path / "real") == 0o755  # nothing was changed through the link


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_private_dir_refuses_another_users_directory(tmp_path):
    (tmp_path / "theirs").mkdir(mode=0o755)
    os.chown(tmp_path / "theirs", 65534, 65534)
    with pytest.raises(files.NotPrivateDir) as caught:
        files.private_dir(str(tmp_path / "theirs"), "out_dir")
    assert "owned by uid 65534" in str(caught.value)
    assert _mode(tmp_path / "theirs") == 0o755
