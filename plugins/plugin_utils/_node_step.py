# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""Run a node-side module's job in one lean Python on the node: no AnsiballZ, no ansible.module_utils there.

Private to the collection. A node step (node_supervisor, runner, fetch_receipts, deploy_artifacts,
supervised_process, control_relay) is a module whose argument spec and job live in
``module_utils/_node_steps/<module>.py`` (``SPEC``, ``run(module)``). Run as Ansible runs a module, each call
pays node CPU before the job starts: AnsiballZ's payload carries sources only, so the node compiles
``ansible.module_utils.basic``, its imports and the collection's code again at every call
(bench/bench_gate.py measures one call each way). The action plugin of the same name subclasses
:class:`NodeStepAction`, which

- validates the task's arguments here with the module's SPEC (ArgumentSpecValidator, as the in-process
  controller steps do: the module's own message, before anything runs on the node);
- sends one request over the task's connection: a short fixed program (``-c``, no task data in the command)
  reading from stdin one JSON line (the job's name, the validated arguments, check mode) and then the
  collection's node code as a zip of checked-hash bytecode (``PAYLOAD``: the jobs and every module they import,
  made once in the controller's main process, as module_utils/_run/package.py builds the simulated runner's, and
  kept between playbooks: plugin_utils/_payload_cache.py), imported from an anonymous memory file (nothing written
  on the node, nothing left);
- reads the job's one JSON line back and finishes the result as AnsibleModule would (invocation, warnings,
  no_log values masked: plugin_utils/_in_process.py ``finish``).

The interpreter is the one Ansible would run the module with (``ansible_python_interpreter``, or the one
discovered); ``-I`` keeps the node's PYTHON* variables and user site out. The task's ``environment`` and
become apply as to a module. The module runs as Ansible runs it instead (AnsiballZ) when the host says
``orbite_node_steps: module``, when the interpreter is not known yet (discovery runs with that first call),
for ``async``, a delegated task, a connection that cannot take stdin, or a become method that cannot pipeline.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import shlex
import zipfile
from pathlib import Path

from ansible.errors import AnsibleLookupError
from ansible.executor.module_common import _get_shebang
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible.utils.vars import merge_hash
from ansible_collections.orbite.qualification.plugins.lookup.work_dir import default_work_dir
from ansible_collections.orbite.qualification.plugins.module_utils._node_steps.entry import JOBS
from ansible_collections.orbite.qualification.plugins.module_utils._run.package import with_bytecode
from ansible_collections.orbite.qualification.plugins.plugin_utils._in_process import finish, read_args
from ansible_collections.orbite.qualification.plugins.plugin_utils._payload_cache import cached_payload

COLLECTION = "ansible_collections.orbite.qualification"
_MODULE_UTILS = f"{COLLECTION}.plugins.module_utils"
ENTRY = f"{_MODULE_UTILS}._node_steps.entry"
_ROOT = Path(__file__).resolve().parents[2]  # the collection's directory
TRANSPORTS = ("lean", "module")
display = Display()

# The node's side of the transport: the request line, then the zip into a memory file put on sys.path.
BOOTSTRAP = (
    "import os, sys\n"
    "data = sys.stdin.buffer.read()\n"
    "end = data.index(b'\\n')\n"
    "fd = os.memfd_create('orbite-node-step')\n"
    "rest = memoryview(data)[end + 1:]\n"
    "while rest:\n"
    "    rest = rest[os.write(fd, rest):]\n"
    "sys.path.insert(0, '/proc/self/fd/%d' % fd)\n"
    f"from {ENTRY} import main\n"
    "main(data[:end])\n"
)


def _module_file(name):
    """The file of the collection's module ``name`` (a package's __init__.py), or None if it is not one."""
    if not name.startswith(COLLECTION + "."):
        return None
    base = _ROOT.joinpath(*name.split(".")[3:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def node_modules(roots):
    """{dotted name: file} of ``roots`` and every collection module they import, directly or not (read with ast,
    imports inside functions included: the supervisor program is imported by a function, and copied by name)."""
    found, todo = {}, list(roots)
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None or name in found:
            continue
        found[name] = path
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                todo += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                todo += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def _build(roots):
    """(the zip (bytes) of ``roots`` and what they import, each package with its __init__.py, with bytecode; the
    files it was made of)."""
    modules = node_modules(roots)
    members, sources = {}, set(modules.values())
    for name, path in modules.items():
        parts = name.split(".")
        # Every enclosing package a regular one (an empty __init__ where the collection has none: the
        # namespace levels ansible_collections, orbite, qualification), so this zip wins over any other.
        for depth in range(1, len(parts)):
            members.setdefault("/".join(parts[:depth]) + "/__init__.py", b"")
        member = "/".join(parts) + ("/__init__.py" if path.name == "__init__.py" else ".py")
        members[member] = path.read_bytes()
    for name in list(members):
        init = _ROOT.joinpath(*name.split("/")[3:])
        if name.endswith("/__init__.py") and not members[name] and init.is_file():
            members[name] = init.read_bytes()
            sources.add(init)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zipped:
        for member in sorted(members):
            zipped.writestr(zipfile.ZipInfo(member, (1980, 1, 1, 0, 0, 0)), members[member],
                            compress_type=zipfile.ZIP_DEFLATED)
    return with_bytecode(buffer.getvalue()), sources


def build_payload(roots):
    """The zip (bytes) of ``roots`` and what they import, each package with its __init__.py, with bytecode."""
    return _build(roots)[0]


def _cache_dir():
    """Where the payload is kept between playbooks: <the controller's work directory>/cache/node-steps-<this
    collection's place>, else None (each checkout or installation of the collection keeps its own)."""
    try:
        place = hashlib.sha256(str(_ROOT).encode("utf-8")).hexdigest()[:16]
        return os.path.join(default_work_dir(), "cache", f"node-steps-{place}")
    except AnsibleLookupError:  # a relative ORBITE_WORK_DIR: no cache (the playbook's own lookup says why)
        return None


# The jobs and what they import, and the code that makes their payload (a change there changes the bytes).
ROOTS = [ENTRY] + [f"{_MODULE_UTILS}._node_steps.{job}" for job in JOBS]
BUILDERS = [Path(__file__).resolve(), _ROOT / "plugins" / "module_utils" / "_run" / "package.py",
            _ROOT / "plugins" / "module_utils" / "_common" / "bytecode.py"]

# Made here, in the controller's main process (Ansible imports the action plugins there before it forks each
# task's worker): once per playbook, inherited by every worker; kept between playbooks (plugin_utils/_payload_cache).
PAYLOAD = cached_payload(_cache_dir(), lambda: _build(ROOTS), BUILDERS)


class NodeStepAction(ActionBase):
    """Action plugin of a node-side module: its job in one lean Python on the node. Subclasses set ``JOB``."""

    JOB = None  # the module's job: module_utils/_node_steps/<module>.py, holding SPEC and run(module)
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # not used since Ansible 2.5
        args, failure = self.prepare(dict(self._task.args))
        if failure is not None:
            return merge_hash(result, failure)
        return self.after(merge_hash(result, self.run_step(task_vars, args)))

    def prepare(self, args):
        """(the module's arguments for the step, None), or (None, the failed result): the controller's part
        before the step (a subclass reads files to send, checks a controller path)."""
        return args, None

    def after(self, result):
        """The task's result from the step's: the controller's part after it (a subclass fetches what it packed)."""
        return result

    def _module_name(self):
        return f"orbite.qualification.{self.JOB.__name__.rsplit('.', 1)[1]}"

    def run_step(self, task_vars, module_args=None):
        """The module's result on ``module_args`` (default: the task's arguments), by the lean step or the module."""
        args = dict(self._task.args if module_args is None else module_args)
        name, task_vars = self._module_name(), task_vars or {}
        transport = str(self._templar.template(task_vars.get("orbite_node_steps", "lean"))).strip()
        if transport not in TRANSPORTS:
            return {"failed": True, "code": "node_step.transport",
                    "msg": f"orbite_node_steps={transport!r}: must be one of {', '.join(TRANSPORTS)}"}
        command, why = (None, "orbite_node_steps=module") if transport == "module" else self._lean_command(task_vars)
        host = task_vars.get("inventory_hostname", "")
        if command is None:
            display.vv(f"<{host}> {name}: run as a module ({why})")
            wrap_async = bool(self._task.async_val) and not self._connection.has_native_async
            result = self._execute_module(module_name=name, module_args=args, task_vars=task_vars,
                                          wrap_async=wrap_async)
            if not wrap_async:
                self._remove_tmp_path(self._connection._shell.tmpdir)
            return result
        params, no_log, message, failed = read_args(name, self.JOB.SPEC, args)
        if failed is not None:
            return finish(failed, params, [], no_log)
        if message is not None:
            return finish({"failed": True, "msg": message}, params, [], no_log)
        display.vv(f"<{host}> {name}: lean node step")
        request = json.dumps({"job": name.rsplit(".", 1)[1], "params": params,
                              "check_mode": bool(self._task.check_mode)}).encode("utf-8")
        done = self._low_level_execute_command(command, sudoable=True, in_data=request + b"\n" + PAYLOAD)
        response = _response(done.get("stdout", ""))
        if response is None:
            stderr = (done.get("stderr") or "").strip()
            result = {"failed": True, "code": "node_step.no_result", "rc": done.get("rc"),
                      "stdout": done.get("stdout", ""), "stderr": stderr,
                      "msg": f"{name} on the node returned no result (rc={done.get('rc')}): "
                             f"{stderr.splitlines()[-1] if stderr else 'nothing on stderr'}; "
                             "orbite_node_steps=module runs it as a module instead"}
            return finish(result, params, [], no_log)
        return finish(response["result"], params, response.get("warnings") or [], no_log)

    def _lean_command(self, task_vars):
        """(the node's command line for a lean step, None) or (None, why the module must run as Ansible runs it)."""
        connection = self._connection
        become = connection.become
        for why, applies in (("async", self._task.async_val), ("delegated", self._task.delegate_to),
                             ("the connection takes no stdin", not connection.has_pipelining),
                             ("the become method cannot pipeline", become is not None and not become.pipelining)):
            if applies:
                return None, why
        try:
            shebang, _interpreter = _get_shebang("/usr/bin/python", task_vars, self._templar,
                                                 remote_is_local=bool(getattr(connection, "_remote_is_local", False)))
        except Exception:  # pylint: disable=broad-except  # discovery not run yet (or refused): the module's way
            return None, "the interpreter is discovered by this call"
        argv = [*shlex.split(shebang[2:]), "-I", "-c", BOOTSTRAP]
        return self._compute_environment_string() + " ".join(shlex.quote(arg) for arg in argv), None


def _response(stdout):
    """The job's response: the last line of stdout, a JSON object with a result object; else None."""
    lines = [line for line in (stdout or "").splitlines() if line.strip()]
    try:
        response = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    if isinstance(response, dict) and isinstance(response.get("result"), dict):
        return response
    return None
