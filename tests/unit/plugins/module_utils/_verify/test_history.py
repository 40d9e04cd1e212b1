"""The runs index (index.json, index.html) and the comparison of two runs (run_compare).

A clean run and a run with one defect switch, both real simulated-runner output
(tests/helpers/sim_pair.py) under one ``runs/`` directory, verified by the verdict writer.
"""

import hashlib
import json
import multiprocessing
import shutil
from html.parser import HTMLParser

import pytest
from helpers.modules import run_module
from helpers.receipts import edit_json
from helpers.sim_pair import RAIL_ACCOUNTING, run_pair

from ansible_collections.orbite.qualification.plugins.module_utils._verify import history
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

NEW = [{"case": "ra", "code": "qps.sq_depth"}, {"case": "run", "code": "run.diagnostic"}]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    runs_dir = tmp_path_factory.mktemp("work") / "runs"
    run_pair(runs_dir / "clean", "ra", RAIL_ACCOUNTING)
    run_pair(runs_dir / "defect", "ra", RAIL_ACCOUNTING, defects=["exceed_sq_depth"])
    verdicts = {name: verify_run(str(runs_dir / name), index_dir=str(runs_dir)) for name in ("clean", "defect")}
    return runs_dir, verdicts


def test_compare_lists_exactly_the_defect_as_new(runs):
    runs_dir, verdicts = runs
    assert verdicts["clean"]["verdict"] == "PASS"
    result = history.compare_runs(str(runs_dir / "clean"), str(runs_dir / "defect"))
    # The one rule the switch breaks, and run.diagnostic: a plan naming a defect switch never passes.
    assert result["newly_failing"] == NEW
    assert (result["newly_passing"], result["still_failing"], result["no_longer_checked"]) == ([], [], [])
    assert result["b"]["defects"] == ["exceed_sq_depth"]
    moved = {m["figure"]: (m["a"], m["b"]) for m in result["moved"]}
    nine = {name: pair for name, pair in moved.items() if name.endswith("max_inflight_wrs")}
    assert nine and all(pair[1] == 9 and pair[0] <= 8 for pair in nine.values())
    assert not any(name.endswith(("public_bytes", "wrs_posted", "rounds_completed")) for name in moved)

    back = history.compare_runs(str(runs_dir / "defect"), str(runs_dir / "clean"))
    assert back["newly_passing"] == result["newly_failing"] and back["newly_failing"] == []
    same = history.compare_runs(str(runs_dir / "defect"), str(runs_dir / "defect"))
    assert same["still_failing"] == result["newly_failing"] and same["moved"] == []


def test_compare_module_by_run_id(runs, tmp_path):
    runs_dir, _verdicts = runs
    out = run_module("run_compare", tmp_path, {"a": "clean", "b": "defect", "runs_dir": str(runs_dir),
                                               "output": str(tmp_path / "compare.json")})
    assert not out.get("failed"), out
    assert out["newly_failing"] == NEW
    assert out["lines"][1] == "newly failing: ra:qps.sq_depth, run:run.diagnostic"
    assert json.loads((tmp_path / "compare.json").read_text())["newly_failing"] == out["newly_failing"]
    bad = run_module("run_compare", tmp_path, {"a": "../etc", "b": "defect", "runs_dir": str(runs_dir)})
    assert bad["failed"] and bad["code"] == "history.invalid" and "a='../etc'" in bad["msg"]
    missing = run_module("run_compare", tmp_path, {"a": "nope", "b": "defect", "runs_dir": str(runs_dir)})
    assert missing["failed"] and "has no verdict.json" in missing["msg"]


def test_the_index_names_every_run(runs):
    runs_dir, verdicts = runs
    index = json.loads((runs_dir / "index.json").read_text())
    assert index["schema"] == "orbite.run-index"
    entries = {run["run_id"]: run for run in index["runs"]}
    assert set(entries) == {"clean", "defect"}
    for name, verdict in verdicts.items():
        entry = entries[name]
        plan = json.loads((runs_dir / name / "run.json").read_text())
        assert (entry["verdict"], entry["failed_codes"]) == (verdict["verdict"], verdict["failed_codes"])
        assert entry["hosts"] == plan["hosts"] and entry["profiles"]["ra"]["mode"] == "installed-rail-accounting"
        assert entry["artifacts"]["runner"] == plan["artifacts"]["runner"]["sha256"]
        assert entry["artifacts"]["observer.accounting"] == plan["artifacts"]["observers"]["accounting"]["sha256"]
        for report in entry["reports"].values():
            assert report["sha256"] == hashlib.sha256((runs_dir / name / report["path"]).read_bytes()).hexdigest()
    assert entries["defect"]["defects"] == ["exceed_sq_depth"]

    class Rows(HTMLParser):
        def __init__(self):
            super().__init__()
            self.runs, self.hrefs, self.tags = {}, [], set()

        def handle_starttag(self, tag, attrs):
            attrs = dict(attrs)
            self.tags.add(tag)
            if tag == "tr" and attrs.get("class") == "run":
                self.runs[attrs["data-run"]] = attrs["data-verdict"]
            if "href" in attrs:
                self.hrefs.append(attrs["href"])

    page = Rows()
    page.feed((runs_dir / "index.html").read_text())
    assert page.runs == {"clean": "PASS", "defect": "FAIL"}
    assert sorted(page.hrefs) == ["clean/verdict.html", "defect/verdict.html"] and "script" not in page.tags


def _hammer(args):
    index_dir, worker = args
    for number in range(15):
        history.update_index(index_dir, {"run_id": f"w{worker}-{number}", "date": f"2026-12-01T00:{number:02d}:00Z",
                                         "verdict": "PASS", "failed_codes": []})


def test_concurrent_runs_never_lose_an_entry(tmp_path):
    with multiprocessing.get_context("fork").Pool(6) as pool:
        pool.map(_hammer, [(str(tmp_path), worker) for worker in range(6)])
    index = json.loads((tmp_path / "index.json").read_text())
    assert sorted(run["run_id"] for run in index["runs"]) == sorted(f"w{w}-{n}" for w in range(6) for n in range(15))


def test_an_unreadable_index_is_kept_aside(tmp_path):
    (tmp_path / "index.json").write_text('{"schema": "orbite.run-index", "runs": [')
    history.update_index(str(tmp_path), {"run_id": "r1", "date": None, "verdict": "FAIL", "failed_codes": ["x.y"]})
    assert (tmp_path / "index.json.unreadable").read_text().endswith("[")
    assert [run["run_id"] for run in json.loads((tmp_path / "index.json").read_text())["runs"]] == ["r1"]


def test_the_verdict_names_the_origin_of_a_rerun(runs, tmp_path):
    runs_dir, _verdicts = runs
    rerun = tmp_path / "runs" / "clean"
    shutil.copytree(runs_dir / "clean", rerun, ignore=shutil.ignore_patterns("verdict.*"))
    origin = {"run_id": "defect", "run_dir": str(runs_dir / "defect"), "cases": ["ra"]}
    edit_json(rerun / "run.json", lambda plan: plan.update(origin=origin))
    verdict = verify_run(str(rerun), index_dir=str(tmp_path / "runs"))
    assert verdict["verdict"] == "PASS" and verdict["origin"] == origin
    assert json.loads((rerun / "verdict.json").read_text())["origin"] == origin
    assert f"Rerun of `defect` ({runs_dir / 'defect'})" in (rerun / "verdict.md").read_text()
    assert 'class="origin">Rerun of <code>defect</code>' in (rerun / "verdict.html").read_text()
    (entry,) = json.loads((tmp_path / "runs" / "index.json").read_text())["runs"]
    assert entry["origin"] == origin
    # An origin that is not a run's is a plan that breaks a rule: run.plan, never a PASS.
    edit_json(rerun / "run.json", lambda plan: plan.update(origin={"run_id": "../x", "run_dir": "/r", "cases": []}))
    broken = verify_run(str(rerun), write=False)
    assert broken["verdict"] == "FAIL" and broken["failed_codes"] == ["run.plan"]
    assert "origin=" in broken["run_findings"][0]["message"]
