# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The simulated OrbiTE engine runner (stdlib only, Python >= 3.9).

See docs/runner-contract.md. Modules, one job each:

- ``errors``    typed errors, their ledger form and the exit code each maps to
- ``case``      load and validate the case file
- ``sysfs``     read RNICs from a host root; ``discovery: auto`` selection
- ``verbs``     the modelled verbs objects (context, PD, MR, CQ, channel, QP) and a resource table
- ``wire``      connection set-up, rendezvous messages and data-channel frames
- ``nic``       the per-process NIC threads that move payload on the data channel
- ``content``   seeded input, guards, byte and guard checks
- ``observer``  the modelled accounting observer (observer log, docs/receipts.md section 2)
- ``ledger``    the ledger document and its atomic checkpoints
- ``engine``    what both roles share: contexts, MRs, QP records, slicing, round records, teardown
- ``source``    the source side: rendezvous service, QPs on request, grants and drain
- ``requester`` the requester side: rounds, batches, posting, progress
- ``runner``    command line, exit codes
"""

PROTOCOL = "orbite-installed-host-v4"
RUNNER_NAME = "orbite_sim_runner"
RUNNER_VERSION = "1"
