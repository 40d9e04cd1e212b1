# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The one schedule of a wait for what usually happens within milliseconds (a process letting go of its lock, a
relay ending or holding its grant): probe again soon, then less and less often up to the wait's old period."""


def backoff(first, cap):
    """The sleeps between two probes: ``first`` (at most ``cap``), doubling up to ``cap``, without end. A fixed first
    sleep of ``cap`` was most of such a wait's time whenever the first probe came too early."""
    delay = min(first, cap)
    while True:
        yield delay
        delay = min(delay * 2, cap)
