"""The rdma_inventory module: save_to, check mode, clear failures; save_inventory's rules."""

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest
from helpers import bounded

from ansible_collections.orbite.qualification.plugins.module_utils._sim import fake_sysfs as fs
from ansible_collections.orbite.qualification.plugins.module_utils._inventory import sysfs as si


@pytest.fixture
def sim_root(tmp_path):
    root = str(tmp_path / "sim-a")
    spec = fs.sim_host_spec(0, "sim-a")
    for dev in spec["devices"]:
        dev["ports"][0]["gid_tbl_len"] = 16
    fs.write_host(root, spec)
    return root


# ---------------------------------------------------------------- save_inventory


def test_save_writes_atomically_and_reports_change(tmp_path, sim_root):
    text = si.render_inventory(si.read_inventory(sim_root))
    target = tmp_path / "out" / "inv.json"
    target.parent.mkdir()
    assert si.save_inventory(text, str(target), root=sim_root) is True
    assert target.read_text() == text and (target.stat().st_mode & 0o777) == 0o600  # names hosts, addresses
    assert si.save_inventory(text, str(target), root=sim_root) is False  # same content: unchanged
    assert os.listdir(target.parent) == ["inv.json"]  # no temporary file left behind
    saved = json.loads(target.read_text())
    assert (saved["schema"], saved["version"]) == ("orbite.rdma-inventory", 1)


def test_save_dry_run_writes_nothing(tmp_path, sim_root):
    # Guards save_inventory's `if dry_run: return True` (check mode).
    target = tmp_path / "inv.json"
    assert si.save_inventory("{}\n", str(target), root=sim_root, dry_run=True) is True
    assert not target.exists()


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("{root}/sys/inv.json", "inside .*/sys; refusing to write there"),
        ("{root}/proc/sys/inv.json", "inside .*/proc; refusing to write there"),
        ("/sys/orbite-inv.json", "inside /sys; refusing"),
        ("{tmp}/missing/inv.json", "directory '.*missing' does not exist"),
        ("{tmp}", "is a directory"),
    ],
)
def test_save_refusals_name_the_path_and_rule(tmp_path, sim_root, where, message):
    path = where.format(root=sim_root, tmp=tmp_path)
    with pytest.raises(si.InventorySaveError, match=message):
        si.save_inventory("{}\n", path, root=sim_root)


def test_save_rewrites_a_same_content_file_that_is_not_private(tmp_path, sim_root):
    # An inventory saved 0644 by an older version is made private, not kept because its text matches.
    text = si.render_inventory(si.read_inventory(sim_root))
    target = tmp_path / "inv.json"
    target.write_text(text)
    target.chmod(0o644)
    assert si.save_inventory(text, str(target), root=sim_root) is True
    assert (target.stat().st_mode & 0o777) == 0o600 and target.read_text() == text


_SAVE_IN_CHILD = """
from ansible_collections.orbite.qualification.plugins.module_utils._inventory import sysfs as si
try:
    si.save_inventory("{}\\n", sys.argv[1])
    print(json.dumps("saved"))
except si.InventorySaveError as error:
    print(json.dumps([error.code, str(error)]))
"""


def test_save_to_a_fifo_is_refused_and_never_hangs(tmp_path):
    fifo = tmp_path / "inv.json"
    os.mkfifo(fifo)
    run = bounded.run_bounded(_SAVE_IN_CHILD, timeout=20, args=[fifo])
    assert not run.hung and run.returncode == 0, run.explain()
    code, message = run.result
    assert code == "inventory.error" and message.endswith("is a FIFO, not a regular file; refusing to replace it")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_save_replaces_a_link_without_writing_through_it(tmp_path, sim_root):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    link = tmp_path / "inv.json"
    link.symlink_to(victim)
    assert si.save_inventory("{}\n", str(link), root=sim_root) is True
    assert victim.read_text() == "keep\n" and not link.is_symlink() and link.read_text() == "{}\n"


# ---------------------------------------------------------------- the module, through ansible-playbook


PLAYBOOK = """
- name: rdma_inventory module
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Check mode reads and reports, writes nothing
      orbite.qualification.rdma_inventory:
        root: "{root}"
        save_to: "{out}/inv.json"
      check_mode: true
      register: dry

    - name: Saves
      orbite.qualification.rdma_inventory:
        root: "{root}"
        save_to: "{out}/inv.json"
      register: first

    - name: Saves again, unchanged
      orbite.qualification.rdma_inventory:
        root: "{root}"
        save_to: "{out}/inv.json"
      register: second

    - name: Missing root fails clearly
      orbite.qualification.rdma_inventory:
        root: "{out}/nowhere"
      register: missing
      ignore_errors: true

    - name: save_to inside the host's sysfs is refused
      orbite.qualification.rdma_inventory:
        root: "{root}"
        save_to: "{root}/sys/inv.json"
      register: refused
      ignore_errors: true

    - name: Results
      ansible.builtin.copy:
        dest: "{out}/results.json"
        content: "{{{{ {{'dry': dry, 'first': first, 'second': second, 'missing': missing,
                       'refused': refused, 'diff': first.inventory
                       | orbite.qualification.inventory_diff(second.inventory),
                       'expect': first.inventory | orbite.qualification.discovery_expectations(
                       whitelist='mlx5_0,mlx5_1', blacklist=['mlx5_0', 'mlx5_1'], strict_gid_index='255'),
                       'ip': first.inventory.devices.mlx5_0.ports['1'].gids[3].gid
                       | orbite.qualification.gid_to_ip}} | to_json }}}}"
        mode: "0600"
"""


@pytest.mark.slow
def test_module_through_ansible_playbook(tmp_path, sim_root, ansible_env, repo_root):
    out = tmp_path / "out"
    out.mkdir()
    playbook = tmp_path / "play.yml"
    playbook.write_text(textwrap.dedent(PLAYBOOK).format(root=sim_root, out=out))
    run = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            str(playbook),
        ],
        env=ansible_env,
        cwd=repo_root,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    results = json.loads((out / "results.json").read_text())
    dry, first, second = results["dry"], results["first"], results["second"]
    assert dry["changed"] is True and dry["save_to"] == {"path": f"{out}/inv.json", "changed": True, "written": False}
    assert first["changed"] is True and first["save_to"]["written"] is True
    assert second["changed"] is False and second["save_to"]["written"] is False
    assert dry["inventory"] == first["inventory"] == json.loads((out / "inv.json").read_text())
    assert stat.S_IMODE(os.stat(out / "inv.json").st_mode) == 0o600  # it names the host and its addresses
    assert first["inventory"]["node"]["hostname"] == "sim-a"
    assert results["missing"]["failed"] is True
    assert results["missing"]["msg"] == f"rdma_inventory: root '{out}/nowhere': does not exist or is not a directory"
    assert results["refused"]["failed"] is True
    assert "refusing to write there" in results["refused"]["msg"]
    assert not os.path.exists(os.path.join(sim_root, "sys", "inv.json"))
    # The filters resolve by FQCN in templates; survey-style strings are accepted.
    assert results["diff"] == []
    assert results["expect"]["candidates"] == ["mlx5_0", "mlx5_1"]
    assert results["expect"]["strict_gid_pin"]["expected"] == "Unavailable"
    assert results["ip"] == "127.51.100.10"
