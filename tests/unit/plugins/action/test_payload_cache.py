"""The lean node steps' payload kept between playbooks (plugins/plugin_utils/_payload_cache.py): taken only while
every file it was made of is unchanged and the zip is its own; built again otherwise; never from a directory that
is not the user's private one; never an error."""

import hashlib
import importlib.util
import json
import os

import pytest

from ansible_collections.orbite.qualification.plugins.module_utils._common.files import sha256_file
from ansible_collections.orbite.qualification.plugins.plugin_utils import _node_step, _payload_cache
from ansible_collections.orbite.qualification.plugins.plugin_utils._payload_cache import MANIFEST, cached_payload


class Builder:
    """build() of a payload made of ``sources`` (files in tmp_path), counting its calls."""

    def __init__(self, tmp_path, payload=b"PK payload"):
        self.payload, self.calls = payload, 0
        self.sources = [tmp_path / "job.py", tmp_path / "helper.py"]
        for source in self.sources:
            source.write_text(f"# {source.name}\n")
        self.builder = tmp_path / "builder.py"
        self.builder.write_text("# builds it\n")

    def __call__(self):
        self.calls += 1
        return self.payload, self.sources

    def take(self, directory):
        return cached_payload(str(directory), self, [self.builder])


def test_the_payload_is_built_once_then_taken_from_the_cache(tmp_path):
    build, cache = Builder(tmp_path), tmp_path / "cache"
    assert build.take(cache) == build.payload and build.calls == 1
    assert build.take(cache) == build.payload and build.calls == 1  # kept: not built again
    assert oct(os.stat(cache).st_mode & 0o777) == "0o700"
    manifest = json.loads((cache / MANIFEST).read_text())
    assert sorted(manifest["files"]) == sorted(str(p) for p in [*build.sources, build.builder])
    assert all(oct(os.stat(cache / name).st_mode & 0o777) == "0o600" for name in os.listdir(cache))


@pytest.mark.parametrize("changed", ["job.py", "helper.py", "builder.py"])
def test_a_changed_source_or_builder_makes_it_build_again(tmp_path, changed):
    build, cache = Builder(tmp_path), tmp_path / "cache"
    build.take(cache)
    (tmp_path / changed).write_text("# changed\n")
    build.payload = b"PK another payload"
    assert build.take(cache) == b"PK another payload" and build.calls == 2
    # The payload it replaced is gone: one payload kept.
    assert sorted(n for n in os.listdir(cache) if n.endswith(".zip")) == [
        f"node-steps-{json.loads((cache / MANIFEST).read_text())['payload_sha256']}.zip"]
    assert build.take(cache) == b"PK another payload" and build.calls == 2


def test_a_source_gone_makes_it_build_again(tmp_path):
    build, cache = Builder(tmp_path), tmp_path / "cache"
    build.take(cache)
    build.sources[1].unlink()
    build.sources = build.sources[:1]
    assert build.take(cache) == build.payload and build.calls == 2


def test_a_tampered_or_torn_payload_is_never_used(tmp_path):
    build, cache = Builder(tmp_path), tmp_path / "cache"
    build.take(cache)
    (zipped,) = [cache / n for n in os.listdir(cache) if n.endswith(".zip")]
    zipped.write_bytes(b"PK tampered")
    assert build.take(cache) == build.payload and build.calls == 2
    (cache / MANIFEST).write_text("{not json")
    assert build.take(cache) == build.payload and build.calls == 3


def test_a_kept_zip_that_is_a_link_is_never_followed(tmp_path):
    build, cache = Builder(tmp_path), tmp_path / "cache"
    build.take(cache)
    (zipped,) = [cache / n for n in os.listdir(cache) if n.endswith(".zip")]
    elsewhere = tmp_path / "elsewhere.zip"
    elsewhere.write_bytes(zipped.read_bytes())
    zipped.unlink()
    zipped.symlink_to(elsewhere)
    assert build.take(cache) == build.payload and build.calls == 2


def plant(directory, payload, files):
    """A payload and a manifest of the cache's own layout in ``directory``: what an attacker would write."""
    directory.mkdir(exist_ok=True)
    digest = hashlib.sha256(payload).hexdigest()
    (directory / f"node-steps-{digest}.zip").write_bytes(payload)
    (directory / MANIFEST).write_text(json.dumps({
        "schema": _payload_cache.SCHEMA, "magic": importlib.util.MAGIC_NUMBER.hex(), "payload_sha256": digest,
        "files": {str(path): sha256_file(str(path)) for path in files}}))


def swap_after_the_check(monkeypatch, cache, elsewhere):
    """Between the cache's check and its reads, ``cache`` becomes a link to ``elsewhere`` (the race of a user
    who can rename entries in its parent, made deterministic)."""
    checked = _payload_cache.open_private_dir

    def check_then_swap(path, what):
        fd = checked(path, what)
        os.rename(cache, cache.with_name("cache.checked"))
        os.symlink(elsewhere, cache)
        return fd
    monkeypatch.setattr(_payload_cache, "open_private_dir", check_then_swap)


def test_a_directory_swapped_for_a_link_after_the_check_is_never_read(tmp_path, monkeypatch):
    build, cache, evil = Builder(tmp_path), tmp_path / "cache", tmp_path / "evil"
    build.take(cache)
    # The strongest planted cache: its manifest pins every real file with its real digest.
    plant(evil, b"PK attacker", [*build.sources, build.builder])
    swap_after_the_check(monkeypatch, cache, evil)
    assert build.take(cache) == build.payload and build.calls == 1  # the checked directory's payload


def test_a_payload_built_after_a_swap_is_written_into_the_checked_directory(tmp_path, monkeypatch):
    build, cache, evil = Builder(tmp_path), tmp_path / "cache", tmp_path / "evil"
    plant(evil, b"PK attacker", [*build.sources, build.builder])
    planted = sorted(os.listdir(evil))
    swap_after_the_check(monkeypatch, cache, evil)
    assert build.take(cache) == build.payload and build.calls == 1
    assert sorted(os.listdir(evil)) == planted  # nothing written, nothing removed there
    assert any(n.endswith(".zip") for n in os.listdir(tmp_path / "cache.checked"))


@pytest.mark.parametrize("pinned", ["none", "sources only"])
def test_a_manifest_that_does_not_pin_the_builder_is_never_used(tmp_path, pinned):
    build, cache = Builder(tmp_path), tmp_path / "cache"
    build.take(cache)
    plant(cache, b"PK planted", [] if pinned == "none" else build.sources)
    assert build.take(cache) == build.payload and build.calls == 2


def test_a_cache_directory_that_is_a_link_is_neither_read_nor_written(tmp_path):
    build, cache, evil = Builder(tmp_path), tmp_path / "cache", tmp_path / "evil"
    plant(evil, b"PK attacker", [*build.sources, build.builder])
    cache.symlink_to(evil)
    assert build.take(cache) == build.payload and build.calls == 1
    assert build.take(cache) == build.payload and build.calls == 2  # built each time: nothing kept there


@pytest.mark.parametrize("mode", [0o750, 0o707, 0o777], ids=["0750", "0707", "0777"])
def test_a_directory_others_can_reach_is_neither_read_nor_written(tmp_path, mode):
    build, cache = Builder(tmp_path), tmp_path / "cache"
    build.take(cache)
    os.chmod(cache, mode)
    manifest = (cache / MANIFEST).read_text()
    build.payload = b"PK built"
    assert build.take(cache) == b"PK built" and build.calls == 2  # built, not read from there
    assert (cache / MANIFEST).read_text() == manifest  # nor written there


def test_no_directory_or_one_that_cannot_be_made_builds_in_memory(tmp_path):
    build = Builder(tmp_path)
    assert cached_payload(None, build, [build.builder]) == build.payload
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert build.take(blocker / "cache") == build.payload and build.calls == 2
    assert blocker.read_text() == ""  # left as it was


def test_the_node_steps_payload_from_the_cache_is_the_one_built(tmp_path):
    built = _node_step.build_payload(_node_step.ROOTS)
    take = lambda: cached_payload(str(tmp_path / "cache"), lambda: _node_step._build(_node_step.ROOTS),  # noqa: E731
                                  _node_step.BUILDERS)
    assert take() == built and take() == built == _node_step.PAYLOAD
    files = json.loads((tmp_path / "cache" / MANIFEST).read_text())["files"]
    # Every file the payload holds is checked, and so is the code that builds it.
    assert {str(p.resolve()) for p in _node_step.BUILDERS} <= set(files)
    assert {str(p) for p in _node_step.node_modules(_node_step.ROOTS).values()} <= set(files)
