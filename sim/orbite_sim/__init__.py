# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The simulated OrbiTE engine runner (stdlib only, Python >= 3.9).

See docs/runner-contract.md. It drives a verbs provider through ctypes for every verbs operation
and only posts and polls: the provider moves the payload, and the observer logs are written by the
real native observers the gate preloads. Modules, one job each:

- ``errors``    typed errors, their ledger form and the exit code each maps to
- ``case``      load and validate the case file
- ``sysfs``     read RNICs from a host root; ``discovery: auto`` selection
- ``verbs``     ctypes binding of the verbs provider (libibverbs.so.1, the loopback provider in the lab):
                loading it pinned, contexts, PDs, MRs, CQs, channels, QPs, and a resource table
- ``wire``      connection set-up and the rendezvous messages (never payload)
- ``content``   seeded input, guards, byte and guard checks
- ``ledger``    the ledger document and its atomic checkpoints
- ``engine``    what both roles share: contexts, MRs, QP records, slicing, round records, teardown
- ``source``    the source side: rendezvous service, QPs on request, grants and drain
- ``requester`` the requester side: rounds, batches, posting, progress
- ``runner``    command line, exit codes
"""

PROTOCOL = "orbite-installed-host-v4"
RUNNER_NAME = "orbite_sim_runner"
RUNNER_VERSION = "1"
