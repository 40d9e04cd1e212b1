"""Run a collection module as Ansible runs it: a Python process of its own reading its arguments file."""

import json
import os
import subprocess
import sys

from helpers.paths import COLLECTIONS

PACKAGE = "ansible_collections.orbite.qualification.plugins.modules"


def run_module(name, work_dir, args, env=None, timeout=120):
    """Run module ``name`` with ``args``; return its JSON result (never a traceback)."""
    args_file = work_dir / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = env if env is not None else dict(os.environ, PYTHONPATH=str(COLLECTIONS))
    run = subprocess.run([sys.executable, "-m", f"{PACKAGE}.{name}", str(args_file)], capture_output=True,
                         text=True, env=env, check=False, timeout=timeout)
    assert run.stdout.strip(), run.stderr
    assert "Traceback" not in run.stdout + run.stderr, run.stdout + run.stderr
    return json.loads(run.stdout)
