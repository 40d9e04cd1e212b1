"""fetch_receipts: a node's receipts of one case packed into one archive and unpacked on the controller, byte
for byte, private, with what find and one fetch per file chose before (regular files matching the patterns,
never a symbolic link) and nothing that was not listed or arrived changed."""

import hashlib
import io
import json
import os
import stat
import tarfile

import pytest
from helpers.modules import run_module

from ansible_collections.orbite.qualification.plugins.module_utils._run.receipts import (
    ReceiptsError,
    archive_path_for,
    pack,
    unpack,
)

PATTERNS = ["ledger.json", "observer-*.bin", "observer-*.jsonl", "inventory-*.json", "case.json", "ready.json",
            "runner.stdout", "runner.stderr"]


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def _node(tmp_path):
    """A role's receipt directory as a runner leaves it, with what must not travel beside what must."""
    src = tmp_path / "node" / "case" / "source"
    for gen in ("g1", "g2"):
        (src / gen).mkdir(parents=True)
        (src / gen / "ledger.json").write_text(json.dumps({"gen": gen}) + "\n")
        (src / gen / "observer-accounting.bin").write_bytes(bytes(range(256)) * 3 + b"\x00")
        (src / gen / "progress.json").write_text("{}\n")  # not a receipt the verifier reads: not fetched
    (src / "g1" / ".ledger.json").write_text("hidden\n")
    (src / "g2" / "runner.stdout").write_bytes(b"")  # an empty receipt travels too
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "ledger.json").write_text("secret\n")
    os.symlink(outside / "ledger.json", src / "g1" / "runner.stderr")  # a link named like a receipt
    os.symlink(outside, src / "linked")  # a linked directory is not walked
    journal = tmp_path / "node" / "journal.jsonl"
    journal.write_text('{"ev":"journal_close"}\n')
    return src, journal


def test_pack_and_unpack_carry_exactly_the_receipts_byte_for_byte(tmp_path):
    src, journal = _node(tmp_path)
    archive = archive_path_for(str(src))
    members, skipped = pack(str(src), PATTERNS, {"journal.jsonl": str(journal),
                                                 "relay.jsonl": str(tmp_path / "none")}, archive)
    names = sorted(m["name"] for m in members)
    assert names == ["g1/ledger.json", "g1/observer-accounting.bin", "g2/ledger.json",
                     "g2/observer-accounting.bin", "g2/runner.stdout", "journal.jsonl"]
    assert skipped == [{"name": "relay.jsonl", "path": str(tmp_path / "none"), "why": "missing"}]
    assert archive == str(src) + ".receipts.tar" and _mode(archive) == 0o600
    dest = tmp_path / "runs" / "r1" / "cases" / "c1" / "source"
    dest.parent.mkdir(parents=True)
    dest.mkdir(mode=0o755)
    (dest / "node-failure.json").write_text("{}\n")  # written by the role's rescue before the fetch
    (dest / "node-failure.json").chmod(0o644)
    written, errors = unpack(archive, members, str(dest))
    assert errors == {} and sorted(written) == names
    for name in names:
        origin = journal if name == "journal.jsonl" else src / name
        assert (dest / name).read_bytes() == origin.read_bytes(), name
    assert not (dest / "g1" / "runner.stderr").exists() and not (dest / "linked").exists()
    assert not (dest / "g1" / "progress.json").exists() and not (dest / "g1" / ".ledger.json").exists()
    modes = {os.path.relpath(os.path.join(b, n), dest): _mode(os.path.join(b, n))
             for b, dirs, files in os.walk(dest) for n in dirs + files}
    assert {p: m for p, m in modes.items() if m != (0o700 if os.path.isdir(dest / p) else 0o600)} == {}
    assert _mode(dest) == 0o700


def test_nothing_to_fetch_writes_no_archive_and_makes_no_directory(tmp_path):
    archive = archive_path_for(str(tmp_path / "never-made" / "source"))
    assert pack(str(tmp_path / "never-made" / "source"), PATTERNS, {}, archive)[0] == []
    assert not os.path.exists(archive) and not (tmp_path / "never-made").exists()


def _archive(tmp_path, entries):
    """A tar of (TarInfo, bytes) entries, as a tampered or broken transfer might bring."""
    path = tmp_path / "forged.tar"
    with tarfile.open(path, "w") as archive:
        for info, data in entries:
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return str(path)


def _entry(name, data, kind=tarfile.REGTYPE):
    info = tarfile.TarInfo(name)
    info.type = kind
    return info, data


def _listed(name, data):
    return {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_a_member_changed_in_transit_is_refused_never_written(tmp_path):
    archive = _archive(tmp_path, [_entry("g1/ledger.json", b'{"bytes": 2}\n'), _entry("ready.json", b"{}\n")])
    written, errors = unpack(archive, [_listed("g1/ledger.json", b'{"bytes": 1}\n'), _listed("ready.json", b"{}\n")],
                             str(tmp_path / "dest"))
    assert written == ["ready.json"] and list(errors) == ["g1/ledger.json"]
    assert "another sha256 than the node's" in errors["g1/ledger.json"]
    assert not (tmp_path / "dest" / "g1" / "ledger.json").exists()


@pytest.mark.parametrize("entry", [
    _entry("../escape.json", b"x"),
    _entry("/abs/ledger.json", b"x"),
    _entry("g1/ledger.json", b"", tarfile.SYMTYPE),
    _entry("unlisted.json", b"x"),
])
def test_a_member_that_is_unlisted_unsafe_or_not_a_file_is_refused(tmp_path, entry):
    archive = _archive(tmp_path, [entry])
    listing = [] if entry[0].name == "unlisted.json" else [_listed(entry[0].name, b"x")]
    written, errors = unpack(archive, listing, str(tmp_path / "dest" / "source"))
    assert written == [] and entry[0].name in errors
    assert not (tmp_path / "escape.json").exists() and not (tmp_path / "dest" / "source").exists()


def test_a_member_that_cannot_be_written_is_named_and_the_others_land(tmp_path):
    data = b"{}\n"
    archive = _archive(tmp_path, [_entry("g1/ledger.json", data), _entry("journal.jsonl", data)])
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "g1").write_text("a file where the generation's directory goes\n")
    written, errors = unpack(archive, [_listed("g1/ledger.json", data), _listed("journal.jsonl", data)], str(dest))
    assert written == ["journal.jsonl"] and list(errors) == ["g1/ledger.json"]
    assert (dest / "journal.jsonl").read_bytes() == data


def test_a_named_file_must_have_a_plain_name(tmp_path):
    with pytest.raises(ReceiptsError, match=r"member name '\.\./journal\.jsonl' must be a plain file name"):
        pack(str(tmp_path), PATTERNS, {"../journal.jsonl": "/dev/null"}, str(tmp_path / "a.tar"))


def test_the_module_packs_on_the_node_and_lists_in_check_mode(tmp_path):
    src, journal = _node(tmp_path)
    base = {"src": str(src), "dest": str(tmp_path / "dest"), "files": {"journal.jsonl": str(journal)}}
    listed = run_module("fetch_receipts", tmp_path, dict(base, _ansible_check_mode=True))
    assert sorted(m["name"] for m in listed["members"]) == [
        "g1/ledger.json", "g1/observer-accounting.bin", "g2/ledger.json", "g2/observer-accounting.bin",
        "g2/runner.stdout"]
    assert not os.path.exists(archive_path_for(str(src)))
    packed = run_module("fetch_receipts", tmp_path, base)
    assert packed["archive"] == archive_path_for(str(src)) and not packed.get("failed")
    with tarfile.open(packed["archive"]) as archive:
        assert sorted(archive.getnames()) == sorted(m["name"] for m in packed["members"])
    assert not (tmp_path / "dest").exists()  # the controller's side is the action plugin's
