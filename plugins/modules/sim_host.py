#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors

DOCUMENTATION = r"""
---
module: sim_host
short_description: Create or destroy one fake RNIC host of the simulated lab
version_added: 0.1.0
description:
  - Creates (O(state=present)) or destroys (O(state=absent)) one fake host of the simulated lab
    under O(lab_dir). The host's root directory C(<lab_dir>/<name>) holds the fake host layout
    (C(sys) tree with two mlx5-like RoCE RNICs, hostname, boot ID, kernel release, machine-id) and
    its lock dir C(run/orbite/locks) (mode 0700).
  - A C(local) host is only that directory; node-side modules read it through their C(root) option.
  - A C(namespaced) host (needs root) also runs a mount+UTS+PID namespace showing that root at the
    real paths (C(/sys), C(/proc/sys/kernel/...), C(/run/orbite/locks)) with its own hostname, and
    an sshd on O(ssh_address):O(ssh_port) that accepts only the key in O(authorized_key_file).
  - Idempotent. Every (re)start of a namespaced host writes a fresh boot ID. Destroying a host ends
    only the processes the lab recorded for it (pid checked against its start time), then deletes
    what the lab's record says it created; a directory the lab did not create is never touched.
  - Runs on the controller (the lab lives there).
author:
  - OrbiTE qualification team (@orbite-qualification)
extends_documentation_fragment:
  - orbite.qualification._attributes
  - orbite.qualification._attributes.platform_linux
options:
  name:
    description:
      - The host's name, also its hostname and directory name; one lower-case DNS label.
    type: str
    required: true
  index:
    description:
      - The host's index in the lab (0..99); it selects the host's MACs, GUIDs and GID addresses.
      - Required when O(state=present).
    type: int
  rnics:
    description:
      - How many RNICs the host has, 2 (C(mlx5_0), C(mlx5_1)) or 4 (also C(mlx5_2), C(mlx5_3), at
        C(127.51.101.x)); a 4-RNIC host offers two lanes to the run's case schedule.
      - The first two RNICs are the same whatever the count.
    type: int
    choices: [2, 4]
    default: 2
  lab_dir:
    description:
      - Absolute path of the lab directory holding the hosts' roots and the lab's records.
    type: path
    required: true
  kind:
    description:
      - C(local) for a directory only, C(namespaced) for a namespace reached over SSH (root only).
    type: str
    choices: [local, namespaced]
    default: local
  state:
    description:
      - Whether the host should exist.
    type: str
    choices: [present, absent]
    default: present
  ssh_address:
    description:
      - Loopback address sshd of a namespaced host listens on.
    type: str
    default: 127.0.0.1
  ssh_port:
    description:
      - Port sshd of a namespaced host listens on. Required for O(kind=namespaced), O(state=present).
    type: int
  authorized_key_file:
    description:
      - Public key file of the controller's client key, the only key a namespaced host accepts.
      - Required for O(kind=namespaced), O(state=present).
    type: path
  ssh_user:
    description:
      - The only user sshd of a namespaced host lets in; defaults to the user running the module.
    type: str
  created_by:
    description:
      - The collection directory (a checkout or an installed copy) making the lab; the sim_lab role passes its own.
        Recorded in the host's lab record, so that a refusal to touch what another lab wrote names whose lab it
        is (two checkouts share one default work directory).
    type: path
  sshd:
    description:
      - The sshd binary.
    type: path
    default: /usr/sbin/sshd
  unshare:
    description:
      - The util-linux C(unshare) binary (name or path).
    type: str
    default: unshare
  ssh_keygen:
    description:
      - The C(ssh-keygen) binary (name or path), used to create the host key.
    type: str
    default: ssh-keygen
attributes:
  check_mode:
    support: full
    details:
      - Reports whether the host would be created, restarted or destroyed, changing nothing.
  diff_mode:
    support: none
requirements:
  - For O(kind=namespaced) only, root, util-linux C(unshare), OpenSSH C(sshd) and C(ssh-keygen) on the controller.
notes:
  - The lab layout and how to reach the hosts are documented in C(docs/sim-lab.md).
seealso:
  - module: orbite.qualification.node_identity
    description: Reads a fake host's identity through its O(orbite.qualification.node_identity#module:root).
  - module: orbite.qualification.rdma_inventory
    description: Records a fake host's RDMA inventory through its O(orbite.qualification.rdma_inventory#module:root).
"""

EXAMPLES = r"""
- name: A local fake host
  orbite.qualification.sim_host:
    name: sim-a
    index: 0
    lab_dir: /var/tmp/orbite/sim-lab

- name: A namespaced fake host reached over SSH on 127.0.0.1:2221
  orbite.qualification.sim_host:
    name: sim-a
    index: 0
    kind: namespaced
    lab_dir: /srv/sim-lab-ns
    ssh_port: 2221
    authorized_key_file: /srv/sim-lab-ns/.lab/ssh/id_ed25519.pub
  register: sim_a

- name: Destroy it (ends only its recorded processes)
  orbite.qualification.sim_host:
    name: sim-a
    lab_dir: /srv/sim-lab-ns
    state: absent
"""

RETURN = r"""
host:
  description: The host as created (O(state=present)) or what was destroyed (O(state=absent)).
  returned: always
  type: dict
  contains:
    name:
      description: Host name (also its hostname).
      type: str
      sample: sim-a
    kind:
      description: C(local) or C(namespaced).
      type: str
      sample: local
    index:
      description: The host's index in the lab.
      type: int
      sample: 0
    root:
      description: The host's root directory in the lab.
      type: str
      sample: /home/user/.cache/orbite/sim-lab/sim-a
    orbite_root:
      description: The C(root) option node-side modules must use on this host (C(/) when namespaced).
      type: str
      sample: /home/user/.cache/orbite/sim-lab/sim-a
    lock_dir:
      description: The host's lock dir as node-side modules see it.
      type: str
      sample: /home/user/.cache/orbite/sim-lab/sim-a/run/orbite/locks
    hostname:
      description: The host's hostname.
      type: str
      sample: sim-a
    boot_id:
      description: The host's current boot ID.
      type: str
      sample: e5a05169-2f27-4f32-a880-94e735df8c63
    rails:
      description: Per RNIC port, C(device), C(port), C(gid_index) (RoCE v2, IPv4), C(netdev), C(ipv4),
        C(numa_node) and C(mac).
      type: list
      elements: dict
      sample:
        - {device: mlx5_0, port: 1, gid_index: 3, netdev: ens1f0, ipv4: 127.51.100.10, numa_node: 0,
           mac: "0c:42:a1:00:00:10"}
        - {device: mlx5_1, port: 1, gid_index: 3, netdev: ens2f0, ipv4: 127.51.100.11, numa_node: 1,
           mac: "0c:42:a1:00:01:10"}
    ssh:
      description: Namespaced hosts only; C(address), C(port), C(user), C(host_key) and C(known_hosts_line).
      type: dict
      sample:
        address: 127.0.0.1
        port: 2221
        user: root
        host_key: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHq1b3dNkqS1p7H9m2yYgk0Qf3xJ8f0m4Zb2tq9X5c1R sim-a
        known_hosts_line: >-
          [127.0.0.1]:2221 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHq1b3dNkqS1p7H9m2yYgk0Qf3xJ8f0m4Zb2tq9X5c1R
    processes:
      description: Namespaced hosts only; the recorded C(holder) and C(init) processes (pid, start time,
        machine boot ID) and the C(mount_namespace).
      type: dict
      sample:
        holder: {pid: 48211, start_time: 1234567, machine_boot_id: 4f0c7d3e-5a61-4d7b-9a55-0d1f6f2b9e10}
        init: {pid: 48230, start_time: 1234570, machine_boot_id: 4f0c7d3e-5a61-4d7b-9a55-0d1f6f2b9e10}
        mount_namespace: "mnt:[4026532801]"
    ended_pids:
      description: O(state=absent) only; pids of the lab processes that were running and were ended.
      type: list
      elements: int
      sample: [48211, 48230]
code:
  description:
    - Stable failure code of the lab (bad name or index, a directory the lab did not create, a failed start, ...).
  returned: failure
  type: str
  sample: sim.lab
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.orbite.qualification.plugins.module_utils._common.errors import fail_from
from ansible_collections.orbite.qualification.plugins.module_utils._sim.hosts import (
    KINDS,
    STATES,
    SimLabError,
    build_request,
    ensure_absent,
    ensure_present,
)


def main():
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "index": {"type": "int"},
            "rnics": {"type": "int", "choices": [2, 4], "default": 2},
            "lab_dir": {"type": "path", "required": True},
            "kind": {"type": "str", "choices": list(KINDS), "default": "local"},
            "state": {"type": "str", "choices": list(STATES), "default": "present"},
            "ssh_address": {"type": "str", "default": "127.0.0.1"},
            "ssh_port": {"type": "int"},
            "authorized_key_file": {"type": "path"},
            "ssh_user": {"type": "str"},
            "created_by": {"type": "path"},
            "sshd": {"type": "path", "default": "/usr/sbin/sshd"},
            "unshare": {"type": "str", "default": "unshare"},
            "ssh_keygen": {"type": "str", "default": "ssh-keygen", "no_log": False},  # a program name, not a key
        },
        supports_check_mode=True,
    )
    state = module.params["state"]
    try:
        request = build_request(module.params, state)
        if state == "present":
            changed, host = ensure_present(request, check_mode=module.check_mode)
        else:
            changed, host = ensure_absent(request, check_mode=module.check_mode)
    except SimLabError as error:
        fail_from(module, error, prefix=f"sim_host {module.params['name']}")
    module.exit_json(changed=changed, host=host)


if __name__ == "__main__":
    main()
