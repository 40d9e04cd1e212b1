"""Bench-only callback: total wall time per task name, and how many of its starts every host skipped,
written to $ORBITE_TASK_TIMES as JSON."""

import json
import os
import time
from collections import defaultdict

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self._started = None
        self._name = None
        self._times = defaultdict(float)
        self._count = defaultdict(int)
        self._skipped = defaultdict(int)  # starts of the task that no host ran (all skipped)
        self._ran = False

    def _close(self):
        if self._started is not None:
            self._times[self._name] += time.monotonic() - self._started
            self._count[self._name] += 1
            self._skipped[self._name] += 0 if self._ran else 1
        self._started = None

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._close()
        self._name = task.get_name()
        self._started = time.monotonic()
        self._ran = False

    def _host_ran(self, result, *args, **kwargs):
        self._ran = True

    # An include's result counts as a run too: it included something.
    v2_runner_on_ok = v2_runner_on_failed = v2_runner_on_unreachable = v2_playbook_on_include = _host_ran

    def v2_playbook_on_handler_task_start(self, task):
        self.v2_playbook_on_task_start(task, False)

    def v2_playbook_on_stats(self, stats):
        self._close()
        path = os.environ.get("ORBITE_TASK_TIMES")
        if path:
            rows = [{"task": k, "seconds": round(v, 3), "count": self._count[k],
                     "skipped": self._skipped[k]} for k, v in self._times.items()]
            with open(path, "w", encoding="utf-8") as handle:
                json.dump(sorted(rows, key=lambda r: -r["seconds"]), handle, indent=1)
