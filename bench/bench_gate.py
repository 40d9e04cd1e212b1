"""Time-to-verdict of the rail-accounting gate on the local simulated lab, against the same runner
invocations run directly (no Ansible, no supervisor), side by side in one run; prints the ratio,
Ansible's own floor on this machine (what a playbook start, a module call and a skipped task cost on
the lab's two hosts), where the overhead goes (per-task wall time from bench/callback_plugins/task_times.py)
and what each node module costs on top of Ansible's own (its AnsiballZ payload, built once per run on the
controller, and the collection code every call of it imports on the node). The same gate with its node steps
run as AnsiballZ modules (``orbite_node_steps=module``) runs beside it in each round, and one lean node step's
call against the same module's AnsiballZ call (docs/node-steps.md).

    .venv/bin/python bench/bench_gate.py [--rounds N] [--floor-tasks N] [--no-modules] [--no-module-steps]
        [--templates]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / ".collections"), str(ROOT / "tests" / "fixtures" / "sim")]

import sim_harness  # noqa: E402 - the simulated runner's harness: the same two invocations, no Ansible

RAIL_ACCOUNTING = sim_harness.profile("installed-rail-accounting")  # the frozen profile


def _env(**extra):
    return dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
                PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", **extra)


# ansible-playbook with each Jinja template and conditional Ansible compiles counted (ansible-core 2.19's template
# engine; forked workers included): one line per compile appended to $ORBITE_TEMPLATE_COUNT, "t" or "e".
COUNTED_PLAYBOOK = (
    "import os, sys\n"
    "from ansible._internal._templating import _engine\n"
    "def counted(name, kind):\n"
    "    original = getattr(_engine.TemplateEngine, name)\n"
    "    def compile_counted(self, *args, **kwargs):\n"
    "        fd = os.open(os.environ['ORBITE_TEMPLATE_COUNT'], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)\n"
    "        os.write(fd, kind)\n"
    "        os.close(fd)\n"
    "        return original(self, *args, **kwargs)\n"
    "    setattr(_engine.TemplateEngine, name, compile_counted)\n"
    "counted('_compile_template', b't\\n')\n"
    "counted('_compile_expression', b'e\\n')\n"
    "from ansible.cli.playbook import main\n"
    "sys.argv[0] = 'ansible-playbook'\n"
    "sys.exit(main())\n"
)


def gate(base, times_path, extra=(), count=None):
    """Seconds from the gate's start to its verdict; with ``count`` (a file), each template compile counted there."""
    env = _env(ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "bench" / "callback_plugins"),
               ANSIBLE_CALLBACKS_ENABLED="task_times")
    timed_env = dict(env, ORBITE_TASK_TIMES=str(times_path))
    lab = Path(base) / "lab"
    common = ["-e", f"sim_lab_dir={lab}"]
    subprocess.run(["ansible-playbook", "playbooks/sim_lab.yml", *common], cwd=ROOT, env=env, check=True,
                   capture_output=True)
    playbook = [sys.executable, "-c", COUNTED_PLAYBOOK] if count else ["ansible-playbook"]
    if count:
        timed_env["ORBITE_TEMPLATE_COUNT"] = str(count)
    started = time.monotonic()
    result = subprocess.run([*playbook, "-i", "inventories/sim", "playbooks/rail_accounting.yml", *common,
                             "-e", f"orbite_output_dir={base}/runs", *extra], cwd=ROOT, env=timed_env,
                            capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - started
    subprocess.run(["ansible-playbook", "playbooks/sim_lab.yml", *common, "-e", "sim_lab_state=absent"], cwd=ROOT,
                   env=env, check=False, capture_output=True)
    if result.returncode != 0:
        sys.exit(f"the gate failed:\n{result.stdout[-3000:]}")
    return elapsed


# Ansible's floor: playbooks of N identical tasks on the lab's two hosts (local connection, as the gate).
FLOOR_TASKS = {
    "start": None,  # no task: ansible-playbook's start, one play, exit
    "module": "ansible.builtin.ping: {}",  # one module execution per host
    "skipped": "ansible.builtin.ping: {}\n      when: false",  # a conditional task skipped on both hosts
    "action": "ansible.builtin.set_fact: {orbite_floor: 1}",  # a controller-side action, no module
}


def floor(base, count):
    """Seconds of each FLOOR_TASKS playbook (``count`` tasks; "start" has none)."""
    env = _env()
    seconds = {}
    for kind, task in FLOOR_TASKS.items():
        tasks = "".join(f"    - name: {kind} {i}\n      {task}\n" for i in range(count)) if task else "    []\n"
        book = Path(base) / f"floor-{kind}.yml"
        book.write_text(f"- hosts: sim\n  gather_facts: false\n  tasks:\n{tasks}", encoding="utf-8")
        started = time.monotonic()
        subprocess.run(["ansible-playbook", "-i", "inventories/sim", str(book)], cwd=ROOT, env=env, check=True,
                       capture_output=True)
        seconds[kind] = time.monotonic() - started
    return seconds


# The node-side modules of a case (and the run's one deploy), against the module every floor above runs.
NODE_MODULES = ("ansible.builtin.ping", "orbite.qualification.node_supervisor", "orbite.qualification.runner",
                "orbite.qualification.fetch_receipts", "orbite.qualification.deploy_artifacts")
_IMPORT_LINE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| (\S+)$")


# Builds a module's AnsiballZ payload as its first call in a run does: python -c BUILD collections name out rounds
# tmp [module_args as JSON]; prints the best build time.
BUILD = (
    "import json, sys, tempfile\n"
    "from ansible import constants as C\n"
    "from ansible.executor import module_common\n"
    "from ansible.plugins.loader import init_plugin_loader, module_loader\n"
    "from ansible.template import Templar\n"
    "init_plugin_loader([sys.argv[1]])\n"
    "import time\n"
    "name, out, rounds = sys.argv[2], sys.argv[3], int(sys.argv[4])\n"
    "module_args = json.loads(sys.argv[6]) if len(sys.argv) > 6 else {}\n"
    "path = module_loader.find_plugin_with_context(name).plugin_resolved_path\n"
    "best = None\n"
    "for _ in range(rounds):\n"
    "    C.DEFAULT_LOCAL_TMP = tempfile.mkdtemp(dir=sys.argv[5])\n"
    "    started = time.perf_counter()\n"
    "    built = module_common.modify_module(module_name=name, module_path=path, module_args=module_args,\n"
    "        templar=Templar(loader=None), task_vars={'ansible_python_interpreter': sys.executable},\n"
    "        module_compression='ZIP_DEFLATED')\n"
    "    best = min(best or 1e9, time.perf_counter() - started)\n"
    "open(out, 'wb').write(built.b_module_data)\n"
    "print(json.dumps(best))\n"
)


def node_modules(base, rounds=3):
    """{module: (payload KiB, build s, import s)}: the AnsiballZ payload a module's first call in a run builds on the
    controller (a cold cache each time; best of ``rounds``), and the time a call of it spends importing
    ansible_collections.* on the node (``python -X importtime`` of that payload run with no arguments: it imports
    everything, then refuses; best of ``rounds``). A module that imports code it never needs pays it in every call:
    AnsiballZ ships sources, so each call compiles each module again."""
    figures = {}
    for name in NODE_MODULES:
        payload = Path(base) / f"AnsiballZ_{name.rsplit('.', 1)[1]}.py"
        built = subprocess.run([sys.executable, "-c", BUILD, str(ROOT / ".collections"), name, str(payload),
                                str(rounds), str(base)], env=_env(), check=True, capture_output=True, text=True)
        imports = []
        for _ in range(rounds):
            run = subprocess.run([sys.executable, "-X", "importtime", str(payload)], env=_env(), check=False,
                                 capture_output=True, text=True, stdin=subprocess.DEVNULL)
            lines = [_IMPORT_LINE.search(line) for line in run.stderr.splitlines()]
            # Top-level imports of the collection's code (nested ones are inside their parent's cumulative time).
            imports.append(sum(int(m.group(1)) for m in lines if m and m.group(2).startswith("ansible_collections."))
                           / 1e6)
        figures[name] = (payload.stat().st_size / 1024, json.loads(built.stdout), min(imports))
    return figures


def node_step_call(base, rounds=5):
    """(lean s, AnsiballZ s, lean payload KiB, its build s, its load from the cache s): one node_supervisor status
    call on the node, as the lean step makes it (plugin_utils/_node_step.py) and as the module's AnsiballZ payload
    runs it; best of ``rounds``."""
    code = (
        "import json, subprocess, sys, time\n"
        "from ansible_collections.orbite.qualification.plugins.plugin_utils import _node_step\n"
        "started = time.perf_counter()\n"
        "_node_step.build_payload(_node_step.ROOTS)\n"
        "build = time.perf_counter() - started\n"
        # A playbook after the first takes the payload kept in the work directory's cache (checked, not built).
        "from ansible_collections.orbite.qualification.plugins.plugin_utils._payload_cache import cached_payload\n"
        "def kept():\n"
        "    return cached_payload(sys.argv[4], lambda: _node_step._build(_node_step.ROOTS), _node_step.BUILDERS)\n"
        "kept()\n"
        "started = time.perf_counter()\n"
        "assert kept() == _node_step.PAYLOAD\n"
        "load = time.perf_counter() - started\n"
        # The arguments as the step validates them on the controller: the job's own SPEC, its defaults.
        "from ansible_collections.orbite.qualification.plugins.module_utils._node_steps import node_supervisor\n"
        "from ansible_collections.orbite.qualification.plugins.plugin_utils._in_process import validate\n"
        "params, _no_log, message = validate('orbite.qualification.node_supervisor', node_supervisor.SPEC,\n"
        "                                    {'state': 'status', 'run_id': 'bench', 'root': sys.argv[1]})\n"
        "assert message is None, message\n"
        "request = json.dumps({'job': 'node_supervisor', 'params': params, 'check_mode': False}).encode()\n"
        "lean, module = [], []\n"
        "for _ in range(int(sys.argv[3])):\n"
        "    started = time.perf_counter()\n"
        "    subprocess.run([sys.executable, '-I', '-c', _node_step.BOOTSTRAP], check=True, capture_output=True,\n"
        "                   input=request + b'\\n' + _node_step.PAYLOAD)\n"
        "    lean.append(time.perf_counter() - started)\n"
        "    started = time.perf_counter()\n"
        "    subprocess.run([sys.executable, sys.argv[2]], check=True, capture_output=True)\n"
        "    module.append(time.perf_counter() - started)\n"
        "print(json.dumps([min(lean), min(module), len(_node_step.PAYLOAD) / 1024, build, load]))\n"
    )
    root = Path(base) / "step-root"
    (root / "proc" / "sys" / "kernel" / "random").mkdir(parents=True, exist_ok=True)
    payload = Path(base) / "AnsiballZ_node_supervisor_status.py"
    status = json.dumps({"state": "status", "run_id": "bench", "root": str(root)})
    subprocess.run([sys.executable, "-c", BUILD, str(ROOT / ".collections"), "orbite.qualification.node_supervisor",
                    str(payload), "1", str(base), status], env=_env(), check=True, capture_output=True)
    done = subprocess.run([sys.executable, "-c", code, str(root), str(payload), str(rounds), str(Path(base) / "cache")],
                          env=_env(PYTHONPATH=str(ROOT / ".collections")), check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="alternating measurements of each side")
    parser.add_argument("--top", type=int, default=25, help="how many tasks of the breakdown to print (0: all)")
    parser.add_argument("--times", type=Path, help="also keep the last run's per-task times (JSON) here")
    parser.add_argument("--floor-tasks", type=int, default=10, help="tasks per floor playbook (0: no floor)")
    parser.add_argument("--no-modules", action="store_true", help="skip the node modules' payload and import figures")
    parser.add_argument("--no-module-steps", action="store_true",
                        help="skip the gate with its node steps run as AnsiballZ modules (orbite_node_steps=module)")
    parser.add_argument("--templates", action="store_true",
                        help="one more gate run (untimed) counting the Jinja templates and conditionals it compiles")
    args = parser.parse_args()
    direct_times, gate_times, module_step_times, floors = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        sim_harness.make_hosts()  # build the fake hosts outside the timed part
        for index in range(args.rounds):
            started = time.monotonic()
            for case_id, changes in (("read-polling", {}), ("write-events", {"operation": "write",
                                                                             "rdma_events": True})):
                result = sim_harness.run_pair(f"{tmp}/direct{index}/{case_id}", dict(RAIL_ACCOUNTING, **changes))
                assert result["rc"] == {"source": 0, "requester": 0}, result["stderr"]
            direct_times.append(time.monotonic() - started)
            if not args.no_module_steps:
                module_step_times.append(gate(f"{tmp}/modsteps{index}", Path(tmp) / "times-module-steps.json",
                                              ["-e", "orbite_node_steps=module"]))
            gate_times.append(gate(f"{tmp}/gate{index}", Path(tmp) / "times.json"))
            if args.floor_tasks > 0:
                floors.append(floor(tmp, args.floor_tasks))
        tasks = json.loads((Path(tmp) / "times.json").read_text())
        compiles = None
        if args.templates:
            gate(f"{tmp}/counted", Path(tmp) / "times-counted.json", count=Path(tmp) / "compiles")
            kinds = (Path(tmp) / "compiles").read_text().split()
            compiles = (kinds.count("t"), kinds.count("e"))
        modules = {} if args.no_modules else node_modules(tmp)
        step_call = None if args.no_modules else node_step_call(tmp)
        if args.times:
            args.times.write_text(json.dumps(tasks, indent=1) + "\n")
    direct, full = min(direct_times), min(gate_times)
    print(f"direct runner invocations (2 cases): {direct:.2f} s   (best of {args.rounds})")
    print(f"rail_accounting.yml to verdict:      {full:.2f} s   (best of {args.rounds})")
    print(f"ratio gate / direct:                 {full / direct:.2f}x   (goal <= 3x)")
    if compiles:
        print(f"templates compiled by the gate: {compiles[0]} templates, {compiles[1]} conditionals (one run; every "
              "worker compiles what its task renders)")
    if module_step_times:
        slow = min(module_step_times)
        print(f"the same gate, node steps as AnsiballZ modules (orbite_node_steps=module): {slow:.2f} s, "
              f"{slow / direct:.2f}x; the lean node steps save {slow - full:.2f} s (best of {args.rounds}, alternated)")
    if floors:
        best = {kind: min(f[kind] for f in floors) for kind in FLOOR_TASKS}
        per = {kind: (best[kind] - best["start"]) / args.floor_tasks for kind in FLOOR_TASKS if kind != "start"}
        print(f"Ansible's floor here (2 hosts, local connection, best of {len(floors)}): playbook start and exit "
              f"{best['start']:.2f} s; per task on both hosts: module call {per['module']:.3f} s, "
              f"skipped task {per['skipped']:.3f} s, controller action (set_fact) {per['action']:.3f} s")
        skips = sum(row.get("skipped", 0) for row in tasks)
        print(f"  the gate's last run: {sum(row['count'] for row in tasks) - skips} task starts ran on some host, "
              f"{skips} were skipped on every host (about {skips * per['skipped']:.2f} s at the floor)")
    if modules:
        print("node modules (first call of a run builds the payload on the controller; every call imports the "
              "collection's code on the node, from source):")
        for name, (kib, build, imports) in modules.items():
            print(f"  {name:42} payload {kib:4.0f} KiB, build {build:.2f} s, imports of ansible_collections.* "
                  f"{imports * 1000:3.0f} ms")
    if step_call:
        lean, module, kib, build, load = step_call
        print(f"one node step on the node (node_supervisor status, best of 5): lean {lean * 1000:.0f} ms (payload "
              f"{kib:.0f} KiB, built in {build * 1000:.0f} ms by a playbook's first import, taken from the cache "
              f"in {load * 1000:.0f} ms by the next) against its AnsiballZ module {module * 1000:.0f} ms "
              f"({module / lean:.1f}x)")
    total = sum(row["seconds"] for row in tasks)
    runs = sum(row["count"] for row in tasks)
    shown = tasks[:args.top] if args.top > 0 else tasks
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} (1 min) at the end")
    print(f"where the gate's time goes (last run: {len(tasks)} distinct tasks started {runs} times, {total:.1f} s; "
          f"{'top ' + str(len(shown)) if len(shown) < len(tasks) else 'all'}):")
    for row in shown:
        skipped = f" (skipped x{row['skipped']})" if row.get("skipped") else ""
        print(f"  {row['seconds']:7.2f}  x{row['count']:<3} {row['task']}{skipped}")


if __name__ == "__main__":
    main()
