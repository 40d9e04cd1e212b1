"""The one schedule of a short wait (module_utils/_common/waits.backoff)."""

from itertools import islice

from ansible_collections.orbite.qualification.plugins.module_utils._common.waits import backoff


def test_the_sleeps_start_short_and_double_up_to_the_cap():
    assert list(islice(backoff(0.0005, 0.01), 7)) == [0.0005, 0.001, 0.002, 0.004, 0.008, 0.01, 0.01]


def test_a_first_sleep_above_the_cap_is_the_cap():
    assert list(islice(backoff(0.1, 0.05), 2)) == [0.05, 0.05]
