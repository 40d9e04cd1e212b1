"""The lock-contention message names the holder as well as the lock file lets it."""

from ansible_collections.orbite.qualification.plugins.module_utils._node.locks import describe_owner


def test_a_live_owner_is_named():
    text = describe_owner({"run_id": "r1", "controller": "ctl", "pid": 42, "hostname": "a", "boot_id": "b",
                           "acquired_at": "t0", "state": "held"})
    assert text == "run r1 of controller ctl, pid 42 on a (boot b), since t0"


def test_a_released_record_is_not_taken_for_the_holder():
    # flock held by someone who wrote nothing: the record is the previous owner's, released.
    text = describe_owner({"run_id": "r0", "pid": 7, "state": "released", "released_at": "t1"})
    assert text.startswith("a holder that left no record") and "r0" in text and "t1" in text


def test_an_empty_file():
    assert describe_owner({}) == "an unnamed holder (empty lock file)"
