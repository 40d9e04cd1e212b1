"""The requester's peer address from its source node's start results (plan.peer_address, the peer_address filter):
only a ready record of the registration the plan gives the peer counts."""

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.orbite.qualification.plugins.filter.gate import FilterModule
from ansible_collections.orbite.qualification.plugins.module_utils._run.plan import RunPlanError, peer_address

SOURCE = {"changed": True, "ready": {"registration_id": "run-1-c2-source", "service_address": "127.0.0.11:7471"}}
RELAY = {"changed": True, "ready": {"address": "127.0.0.11:7571", "upstream": "127.0.0.11:7471"}}


def test_the_source_or_the_relay_by_the_plans_word():
    assert peer_address([SOURCE, RELAY], "run-1-c2-source", "source") == "127.0.0.11:7471"
    assert peer_address([SOURCE, RELAY], "run-1-c2-source", "relay") == "127.0.0.11:7571"


def test_an_earlier_cases_ready_record_or_none_gives_no_address():
    earlier = {"ready": dict(SOURCE["ready"], registration_id="run-1-c1-source")}
    assert peer_address([earlier, RELAY], "run-1-c2-source", "source") == ""
    assert peer_address([earlier, RELAY], "run-1-c2-source", "relay") == ""  # its relay is the earlier case's too
    skipped = {"changed": False, "skipped": True}
    assert peer_address([skipped, {}], "run-1-c2-source", "source") == ""
    assert peer_address([SOURCE, {}], "run-1-c2-source", "relay") == ""  # a relay that did not start
    assert peer_address([SOURCE, RELAY], "run-1-c2-source", None) == ""  # the source's own launch


@pytest.mark.parametrize(("started", "peer", "message"), [
    ([SOURCE], "source", r"started=.*: must be \[the source's start result, the relay's\]"),
    ("x", "source", r"started='x': must be"),
    ([SOURCE, RELAY], "proxy", r"peer='proxy': is not a peer of the plan \(source, relay\)"),
])
def test_bad_input_names_the_field(started, peer, message):
    with pytest.raises(RunPlanError, match=message):
        peer_address(started, "run-1-c2-source", peer)


def test_the_filter_names_the_code():
    peer_filter = FilterModule().filters()["peer_address"]
    assert peer_filter([SOURCE, RELAY], "run-1-c2-source", "relay") == "127.0.0.11:7571"
    with pytest.raises(AnsibleFilterError, match=r"run_plan\.invalid"):
        peer_filter([SOURCE, RELAY], "run-1-c2-source", "proxy")
