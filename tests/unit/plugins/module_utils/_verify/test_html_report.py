"""verdict.html: one self-contained page, read back with html.parser.

Every failing code appears in its case's failing table with its evidence (receipt path, JSON path,
expected and observed where the rule states them); every plotted point equals the receipt figure it
draws (the ledgers' per-rail counters and the model's expectation, the observer log's WRs in flight,
the journals' events, the inventories); no script and no external reference. Receipts are real
simulated-runner output (tests/helpers/sim_pair.py), broken by defect switches.
"""

import json
import random
import re
import shutil
from collections import defaultdict
from html.parser import HTMLParser
from types import SimpleNamespace

import pytest
from helpers import observer_log
from helpers.receipts import edit_json
from helpers.sim_pair import RAIL_ACCOUNTING, SMALL_HOST, run_pair

from ansible_collections.orbite.qualification.plugins.module_utils._profile import model
from ansible_collections.orbite.qualification.plugins.module_utils._verify import html_report, plots
from ansible_collections.orbite.qualification.plugins.module_utils._verify.html_report import render_html
from ansible_collections.orbite.qualification.plugins.module_utils._verify.loader import ObserverLog
from ansible_collections.orbite.qualification.plugins.module_utils._verify.reports import markdown
from ansible_collections.orbite.qualification.plugins.module_utils._verify.verdict import verify_run

DEFECTS = ["exceed_sq_depth", "skew_native_counter"]


class Page(HTMLParser):
    """Every element's tag and attributes, and the text of each table cell by class."""

    def __init__(self):
        super().__init__()
        self.elements, self.rows, self._row, self._cell = [], [], None, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs))
        if tag == "tr":
            self._row = {"attrs": attrs, "cells": defaultdict(str)}
            self.rows.append(self._row)
        elif tag == "td" and self._row is not None:
            self._cell = attrs.get("class") or ""

    def handle_endtag(self, tag):
        if tag == "td":
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._row["cells"][self._cell] += data


def parse(text):
    page = Page()
    page.feed(text)
    page.close()
    return page


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("html") / "run"
    run_pair(run_dir, "ra", dict(RAIL_ACCOUNTING, discovery="auto"), defects=DEFECTS)
    run_pair(run_dir, "ih", SMALL_HOST, defects=DEFECTS)
    out = run_dir / "out"
    verdict = verify_run(str(run_dir), output_dir=str(out))
    return run_dir, verdict, (out / "verdict.html").read_text()


def test_every_failing_code_appears_with_its_evidence(broken):
    _run_dir, verdict, text = broken
    page = parse(text)
    failing = [r for r in page.rows if r["attrs"].get("class") == "finding FAIL"]
    shown = {(r["attrs"]["data-case"], r["attrs"]["data-code"]): r["cells"] for r in failing}
    wanted = [(c["case"], f) for c in verdict["cases"] for f in c["findings"] if f["status"] == "FAIL"]
    wanted += [("run", f) for f in verdict["run_findings"] if f["status"] == "FAIL"]
    assert {"qps.sq_depth", "counters.native_public", "run.diagnostic"} <= {f["code"] for _c, f in wanted}
    assert set(shown) == {(case, f["code"]) for case, f in wanted}
    for case, found in wanted:
        cells = shown[(case, found["code"])]
        path, _sep, where = (found["evidence"] or "").partition("#")
        assert (cells["evidence-path mono"], cells["evidence-json mono"]) == (path, where)
        if found.get("figures"):
            figure = found["figures"][0]
            assert json.loads(cells["expected mono"]) == figure["expected"]
            assert json.loads(cells["observed mono"]) == figure["observed"]
    # The figures a rule states are the receipts': the skewed native counter and the ninth WR.
    native = next(f for f in verdict["cases"][1]["findings"] if f["code"] == "counters.native_public")
    assert native["figures"][0]["observed"]["bytes"] == native["figures"][0]["expected"]["bytes"] + 1
    # Failing codes come before every other finding of their case.
    for case in verdict["cases"]:
        order = [r["attrs"].get("class") for r in page.rows if r["attrs"].get("data-case") == case["case"]]
        assert order == sorted(order, key=lambda css: css != "finding FAIL")


def test_plot_points_are_the_receipt_figures(broken):
    run_dir, _verdict, text = broken
    case_dir = run_dir / "cases" / "ra"
    ledger = json.loads((case_dir / "requester" / "g1" / "ledger.json").read_text())
    profile = json.loads((run_dir / "run.json").read_text())["profiles"]["ra"]
    expected = model.derive_workload(model.validate_profile(profile))["per_rail"]
    # Both cases draw bars of the same keys: read the ra section only.
    sections = text.split('<section class="case"')
    ra_page = parse(next(s for s in sections if 'data-case="ra"' in s[:40]))
    bars = {(a["data-round"], a["data-rail"], a["data-kind"]): a["data-value"] for tag, a in ra_page.elements
            if tag == "rect" and a.get("class") == "bar"}
    want = {}
    for rnd in ledger["rounds"]:
        for rail, figure in rnd["counters"]["public"]["per_rail"].items():
            want[(str(rnd["round"]), rail, "public")] = str(figure)
            want[(str(rnd["round"]), rail, "native")] = str(rnd["counters"]["native"]["per_rail"][rail]["bytes"])
            want[(str(rnd["round"]), rail, "expected")] = str(expected[rail]["bytes"])
    assert bars == want
    assert bars[("1", "0", "native")] != bars[("1", "0", "expected")]  # the skew is drawn, not smoothed

    # WRs in flight per QP: replayed here from the observer log's lines; the observer's own maxima agree.
    events = observer_log.read(observer_log.find(case_dir / "requester" / "g1"))
    count, series = defaultdict(int), defaultdict(list)
    flow = [e for e in events if e.get("ev") in ("wr", "cqe", "withheld")]
    for index, event in enumerate(flow):
        count[event["qpn"]] += 1 if event["ev"] == "wr" else -1
        series[event["qpn"]].append(f"{index}:{count[event['qpn']]}")
    lines = {a["data-qpn"]: a for tag, a in ra_page.elements if tag == "polyline" and a.get("class") == "series"}
    assert {q: a["data-points"].split() for q, a in lines.items()} == {str(q): s for q, s in series.items()}
    summary = next(e for e in events if e.get("ev") == "summary")
    assert {q: int(a["data-max"]) for q, a in lines.items()} == {
        q: n for q, n in summary["max_inflight_per_qp"].items()}
    assert max(int(a["data-max"]) for a in lines.values()) == 9  # exceed_sq_depth, above the drawn bound
    assert [a["data-bound"] for tag, a in ra_page.elements if tag == "line" and a.get("class") == "bound"] == ["8"]

    # The node timeline: one marker per journal event, at its time from the case's first event.
    journals = {role: [json.loads(line) for line in (case_dir / role / "journal.jsonl").read_text().splitlines()]
                for role in ("source", "requester")}
    origin = min(e["t"] for events in journals.values() for e in events)
    marks = [(a["data-role"], a["data-ev"], float(a["data-t"])) for tag, a in ra_page.elements
             if tag == "circle" and a.get("class") == "event"]
    assert marks == [(role, e["ev"], round(e["t"] - origin, 6)) for role in sorted(journals) for e in journals[role]]
    evs = {ev for _r, ev, _t in marks}
    assert {"lock_acquire", "child_start", "child_exit", "lock_release"} <= evs

    # Inventories: identical before and after on a healthy host.
    inventory = [a for tag, a in ra_page.elements if tag == "p" and a.get("class") == "inventory"]
    assert [(a["data-role"], a["data-changed"]) for a in inventory] == [("requester", "0"), ("source", "0")]


TIMELINE = re.compile(r'<svg class="plot" data-plot="timeline".*?</svg>', re.DOTALL)
LANE_LABEL = re.compile(r'<text class="lane-label" x="([\d.]+)"[^>]*text-anchor="end"[^>]*>([^<]*)</text>')


def test_the_timeline_has_a_time_axis_that_places_every_marker(broken):
    _run_dir, _verdict, text = broken
    timelines = TIMELINE.findall(text)
    assert len(timelines) == 2  # one per case
    for svg in timelines:
        page = parse(svg)
        ticks = [(float(a["data-t"]), float(a["x1"])) for tag, a in page.elements if a.get("class") == "tick"]
        marks = [(float(a["data-t"]), float(a["cx"])) for tag, a in page.elements if a.get("class") == "event"]
        assert len(ticks) >= 3 and ticks[0][0] == 0 and [t for t, _x in ticks] == sorted(t for t, _x in ticks)
        steps = {round(b[0] - a[0], 9) for a, b in zip(ticks, ticks[1:])}
        assert len(steps) == 1 and f"{steps.pop():.0e}"[0] in "125"  # one round step
        # The axis's seconds are the markers': both map time to x the same way.
        (t0, x0), (t1, x1) = ticks[0], ticks[-1]
        scale = (x1 - x0) / (t1 - t0)
        assert max(t for t, _x in marks) >= ticks[-1][0]
        for when, x in marks:
            assert abs(x0 + when * scale - x) <= 0.15, (when, x)
        for tick, _x in ticks:
            assert f">{html_report._seconds_label(tick, ticks[1][0])}</text>" in svg


def test_the_timeline_key_names_each_lanes_colour(broken):
    _run_dir, _verdict, text = broken
    page = parse(TIMELINE.findall(text)[0])
    keys = [a["data-lane"] for tag, a in page.elements if tag == "g" and a.get("class") == "key"]
    assert keys == list(plots.LANES)
    fills = {}
    for tag, attrs in page.elements:
        if tag == "circle" and attrs.get("class") == "event":
            fills.setdefault(attrs["data-lane"], set()).add(attrs["fill"])
    assert fills == {lane: {html_report.LANE_COLORS[lane]} for lane in plots.LANES}
    key = dict(re.findall(r'<g class="key" data-lane="(\w+)"><circle [^>]*fill="([^"]+)"/>', text))
    assert key == {lane: html_report.LANE_COLORS[lane] for lane in plots.LANES}


def test_no_marker_overlaps_a_lane_label(broken):
    _run_dir, _verdict, text = broken
    for svg in TIMELINE.findall(text):
        labels = LANE_LABEL.findall(svg)
        assert {name.split(" ", 1)[1] for _x, name in labels} == set(plots.LANES)
        page = parse(svg)
        first = min(float(a["cx"]) - float(a["r"]) for tag, a in page.elements if a.get("class") == "event")
        for x, name in labels:
            # The label ends at x (text-anchor end), left of any marker, and starts inside the plot.
            assert float(x) < first, (name, x, first)
            assert float(x) - len(name) * html_report.LABEL_CHAR_PX >= 0, name


def test_codes_never_break_inside_a_word(broken):
    _run_dir, _verdict, text = broken
    assert "break-all" not in html_report.STYLE and "td.code{white-space:nowrap}" in html_report.STYLE
    page = parse(text)
    findings = [r for r in page.rows if r["attrs"].get("class", "").startswith("finding ")]
    assert findings and all(r["cells"]["code"] == r["attrs"]["data-code"] for r in findings)


def test_inventory_diff_is_drawn(broken, tmp_path):
    run_dir, _verdict, _text = broken
    copy = tmp_path / "run"
    shutil.copytree(run_dir / "cases" / "ra", copy / "cases" / "ra")
    plan = json.loads((run_dir / "run.json").read_text())
    (copy / "run.json").write_text(json.dumps(dict(plan, cases=["ra"])))
    after = copy / "cases" / "ra" / "source" / "g1" / "inventory-after.json"
    edit_json(after, lambda inv: inv["devices"]["mlx5_0"].update(fw_ver="99.0.0"))
    verify_run(str(copy), output_dir=str(tmp_path / "out"))
    page = parse((tmp_path / "out" / "verdict.html").read_text())
    inventory = {a["data-role"]: a["data-changed"] for tag, a in page.elements if a.get("class") == "inventory"}
    assert inventory == {"requester": "0", "source": "1"}
    diffs = [r["cells"] for r in page.rows if r["attrs"].get("class") == "inventory-diff"]
    assert [(d["path mono"], json.loads(d["before mono"]), json.loads(d["after mono"])) for d in diffs] == [
        ("$.devices.mlx5_0.fw_ver", "16.35.2000", "99.0.0")]


def test_self_contained_and_escaped(broken):
    _run_dir, verdict, text = broken
    page = parse(text)
    tags = {tag for tag, _a in page.elements}
    assert "script" not in tags and "iframe" not in tags and "link" not in tags and "img" not in tags
    for _tag, attrs in page.elements:
        assert "src" not in attrs
        assert not any(k.startswith("on") for k in attrs)  # no event handlers either
        if "href" in attrs:
            assert attrs["href"].startswith("#")
    assert "http://" not in text and "https://" not in text and "url(" not in text
    # A hostile message is text on the page, never markup.
    hostile = dict(verdict, run_id="<script>alert(1)</script>")
    hostile["cases"] = [dict(verdict["cases"][0], findings=[dict(verdict["cases"][0]["findings"][0], status="FAIL",
                                                                 message='<img src="http://x/">&')])]
    page = parse(render_html(hostile))
    assert not {tag for tag, _a in page.elements} & {"script", "img"}


HOSTILE_TEXT = ['<script>alert(1)</script>', '<img src=x onerror=alert(2)>', '![pixel](http://x/p.png)',
                '[click](javascript:alert(3))', '&lt;script&gt;', '\\<b>bold\\</b>', '`</td><img src=x>`', 'a|b\n| c |']


def _hostile_verdict(verdict):
    """The verdict with receipt-borne text in every field verdict.md shows: finding messages, case names, the
    run ID, artifact paths and tool names, the rerun's origin and the defect switches."""
    hostile = json.loads(json.dumps(verdict))
    case = hostile["cases"][0]
    case["case"] = HOSTILE_TEXT[0]
    case["findings"] = [dict(case["findings"][0], status="FAIL", message=text) for text in HOSTILE_TEXT]
    hostile.update(run_id=HOSTILE_TEXT[1], origin={"run_id": HOSTILE_TEXT[2], "run_dir": HOSTILE_TEXT[3]},
                   defects=[HOSTILE_TEXT[4]])
    hostile["artifacts"]["observers"][HOSTILE_TEXT[6]] = {"sha256": "0" * 64, "path": HOSTILE_TEXT[5]}
    return hostile


def test_verdict_md_shows_receipt_text_as_text_never_markup(broken):
    text = markdown(_hostile_verdict(broken[1]))
    assert "<" not in text and ">" not in text.replace(" -> ", "")  # no raw HTML at all
    markdown_it = pytest.importorskip("markdown_it", reason="markdown-it-py (a dependency of rich) renders it")
    rendered = markdown_it.MarkdownIt("commonmark").enable("table").render(text)
    page = parse(rendered)
    assert not {tag for tag, _a in page.elements} & {"script", "img", "a", "b"}, rendered
    shown = "".join(cell for row in page.rows for cell in row["cells"].values())
    for hostile in HOSTILE_TEXT:  # every hostile message is in its table cell, as typed (one line)
        assert hostile.replace("\n", " ") in shown, hostile
    assert shown.count("a|b") == 1  # the pipe stayed in its cell


BROWSER = shutil.which("chromium-headless-shell") or shutil.which("chromium")


@pytest.mark.skipif(BROWSER is None, reason="no headless chromium (optional: apt-get install chromium-headless-shell)")
def test_a_real_browser_renders_the_page(broken, tmp_path):
    import subprocess

    _run_dir, _verdict, text = broken
    page = tmp_path / "verdict.html"
    page.write_text(text)
    shot = tmp_path / "shot.png"
    subprocess.run([BROWSER, "--no-sandbox", "--disable-gpu", f"--screenshot={shot}", "--window-size=1200,2400",
                    page.as_uri()], capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


class _Flow(ObserverLog):
    """An observer log of given WR and completion events: only what plots.inflight reads."""

    def __init__(self, kinds, qpns):
        super().__init__("observer-accounting.bin")
        self.flow_kinds, self.qpns = kinds, qpns

    def flow(self):
        return {"kind": self.flow_kinds, "qpn": self.qpns}


@pytest.mark.parametrize("max_points", [1, 3, 7, 2000])
def test_inflight_buckets_keep_each_runs_first_highest_point(monkeypatch, max_points):
    # Long logs are drawn as buckets (plots.MAX_POINTS): each run of events keeps its first highest
    # point per QP, counted here event by event; completions before their WR go below zero.
    monkeypatch.setattr(plots, "MAX_POINTS", max_points)
    rng = random.Random(max_points)
    kinds = bytes(rng.choice((1, 1, 2, 3)) for _ in range(400))
    qpns = [rng.choice((7, 9, 11)) for _ in range(400)]
    case = SimpleNamespace(observer_logs={("requester", 1, "accounting"): _Flow(kinds, qpns)},
                           workload={"send_queue_depth": 8})
    bucket = max(1, -(-len(kinds) // max_points))
    count, want = defaultdict(int), defaultdict(dict)
    for index, (kind, qpn) in enumerate(zip(kinds, qpns)):
        count[qpn] += 1 if kind == 1 else -1
        slot = want[str(qpn)]
        if index // bucket not in slot or count[qpn] > slot[index // bucket][1]:
            slot[index // bucket] = [index, count[qpn]]
    (entry,) = plots.inflight(case)
    assert entry["bucket"] == bucket
    assert entry["qps"] == {qpn: [slot[s] for s in sorted(slot)] for qpn, slot in want.items()}
    assert entry["max"] == {qpn: max(n for _i, n in points) for qpn, points in entry["qps"].items()}
