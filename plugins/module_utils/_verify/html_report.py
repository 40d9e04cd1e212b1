# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The verdict as one self-contained HTML page: no script, no external reference, inline SVG plots.

Per case, the failing codes first with their evidence (receipt path, JSON path, expected and observed
figures where the rule states them), then the plots of ``plots.case_plots``: payload bytes per rail
per round (expected against observed), WRs in flight per QP over the observer log with the SQ-depth
bound, the node timeline from the journals, and the inventory before/after diff. Every text is
escaped; every drawn point carries its figure in ``data-*`` attributes, so a test reads back exactly
what was drawn. Readable in a browser and in AWX's artifact view (plain HTML with a little CSS).
"""

from __future__ import annotations

import json
import math
from html import escape

from ansible_collections.orbite.qualification.plugins.module_utils._verify.plots import LANES

FAIL, PASS, SKIP, INCOMPLETE = "FAIL", "PASS", "SKIP", "INCOMPLETE"
WIDTH, PAD = 760, 48
COLORS = {"expected": "#9aa5b1", "public": "#2f6fb0", "native": "#6a9f3a", "bad": "#c0392b"}
QP_COLORS = ("#2f6fb0", "#d35400", "#6a9f3a", "#8e44ad", "#16a085", "#7f8c8d")
LANE_COLORS = {"locks": "#2f6fb0", "children": "#d35400", "supervisor": "#7f8c8d"}

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#1d2329;max-width:1100px}
h1 .FAIL,h2 .FAIL,.FAIL{color:#c0392b}.PASS{color:#1e7d32}.INCOMPLETE,.SKIP{color:#8a6d00}
table{border-collapse:collapse;margin:.5em 0 1em}td,th{border:1px solid #ccd;padding:.25em .5em;
vertical-align:top;text-align:left;font-size:.9em}th{background:#eef1f4}code,.mono{font-family:monospace}
.mono{overflow-wrap:anywhere}td.code{white-space:nowrap}svg{border:1px solid #ccd;background:#fff;margin:.25em 0 1em}
details{margin:.5em 0}.note{color:#555;font-size:.9em}
"""


def _e(value):
    return escape("" if value is None else str(value), quote=True)


def _json(value):
    return _e(json.dumps(value, sort_keys=True, default=str)) if value is not None else ""


def _split_evidence(evidence):
    """(receipt path, JSON path) of a finding's evidence ``<path>#<json path>``."""
    if not evidence:
        return "", ""
    path, _sep, where = str(evidence).partition("#")
    return path, where


def _finding_rows(findings, case_id):
    rows = []
    for found in findings:
        path, where = _split_evidence(found.get("evidence"))
        figures = found.get("figures") or [{}]
        first = figures[0]
        rows.append(
            f'<tr class="finding {_e(found["status"])}" data-case="{_e(case_id)}" data-code="{_e(found["code"])}">'
            f'<td class="code"><code>{_e(found["code"])}</code></td>'
            f'<td class="{_e(found["status"])}">{_e(found["status"])}</td>'
            f'<td>{_e(found.get("message") or found.get("meaning"))}</td>'
            f'<td class="evidence-path mono">{_e(path)}</td><td class="evidence-json mono">{_e(where)}</td>'
            f'<td class="expected mono">{_json(first.get("expected"))}</td>'
            f'<td class="observed mono">{_json(first.get("observed"))}</td></tr>')
        for more in figures[1:]:
            more_path, more_where = _split_evidence(more.get("evidence"))
            rows.append(f'<tr class="figure" data-code="{_e(found["code"])}"><td></td><td></td><td></td>'
                        f'<td class="evidence-path mono">{_e(more_path)}</td>'
                        f'<td class="evidence-json mono">{_e(more_where)}</td>'
                        f'<td class="expected mono">{_json(more.get("expected"))}</td>'
                        f'<td class="observed mono">{_json(more.get("observed"))}</td></tr>')
    return rows


def _findings_table(findings, case_id, css):
    head = ("<tr><th>code</th><th>status</th><th>detail</th><th>receipt</th><th>JSON path</th>"
            "<th>expected</th><th>observed</th></tr>")
    return [f'<table class="{css}">', head, *_finding_rows(findings, case_id), "</table>"]


# --- plots ----------------------------------------------------------------------------------------


def _svg(kind, height, body, title):
    return (f'<svg class="plot" data-plot="{_e(kind)}" width="{WIDTH}" '
            f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="{_e(title)}">'
            f"<title>{_e(title)}</title>{''.join(body)}</svg>")


def _text(x, y, text, size=11, anchor="start", fill="#1d2329"):
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="{fill}">{_e(text)}</text>')


def bytes_plot(points):
    """Grouped bars: per generation and round, per rail, expected then public then native."""
    if not points:
        return '<p class="note">No payload bytes to draw: the requester\'s ledger could not be read.</p>'
    height = 260
    top = max([p["expected"] for p in points] + [p[k] or 0 for p in points for k in ("public", "native")] + [1])
    groups = []
    for point in points:
        key = (point["generation"], point["round"])
        if not groups or groups[-1][0] != key:
            groups.append((key, []))
        groups[-1][1].append(point)
    span = (WIDTH - 2 * PAD) / max(1, sum(len(g[1]) for g in groups) + len(groups))
    bar_w = span / 3.5
    body = [_text(PAD, 16, f"payload bytes per rail per round (max {top:,} B)", 12)]
    base = height - 40
    x = PAD
    for (generation, rnd), rails in groups:
        body.append(_text(x + span * len(rails) / 2, base + 28, f"g{generation} r{rnd}", 10, "middle"))
        for point in rails:
            for offset, kind in enumerate(("expected", "public", "native")):
                value = point[kind]
                color = COLORS[kind] if kind == "expected" or value == point["expected"] else COLORS["bad"]
                h = (value or 0) / top * (base - 30)
                body.append(f'<rect class="bar" data-generation="{_e(generation)}" data-round="{_e(rnd)}" '
                            f'data-rail="{_e(point["rail"])}" data-kind="{kind}" data-value="{_e(value)}" '
                            f'x="{x + offset * bar_w:.1f}" y="{base - h:.1f}" width="{bar_w * 0.9:.1f}" '
                            f'height="{h:.1f}" fill="{color}"><title>g{_e(generation)} round {_e(rnd)} rail '
                            f'{_e(point["rail"])} {kind}: {_e(value)} B</title></rect>')
            body.append(_text(x + bar_w * 1.5, base + 14, f"rail {point['rail']}", 9, "middle"))
            x += span
        x += span
    body.append(f'<line x1="{PAD}" y1="{base}" x2="{WIDTH - PAD}" y2="{base}" stroke="#333"/>')
    legend = [(k, COLORS[k]) for k in ("expected", "public", "native")] + [("differs", COLORS["bad"])]
    for index, (name, color) in enumerate(legend):
        body.append(f'<rect x="{WIDTH - 330 + index * 80}" y="8" width="10" height="10" fill="{color}"/>')
        body.append(_text(WIDTH - 316 + index * 80, 17, name, 10))
    return _svg("bytes", height, body, "payload bytes per rail per round, expected against observed")


def inflight_plot(entry):
    """One line per QP of WRs in flight over the log's events, and the SQ-depth bound."""
    height = 240
    bound = entry["bound"]
    top = max([bound + 1] + [v for points in entry["qps"].values() for _i, v in points])
    events = max(1, entry["events"])
    base, left, right = height - 30, PAD, WIDTH - PAD

    def xy(index, value):
        return left + index / events * (right - left), base - value / top * (base - 30)

    bucketed = f" (highest of each {entry['bucket']})" if entry["bucket"] > 1 else ""
    body = [_text(PAD, 16, f"g{entry['generation']} {entry['tool']}: payload WRs in flight per QP over "
                           f"{entry['events']} logged events{bucketed}", 12)]
    bx, by = xy(0, bound)
    body.append(f'<line class="bound" data-bound="{_e(bound)}" x1="{bx:.1f}" y1="{by:.1f}" x2="{right}" '
                f'y2="{by:.1f}" stroke="{COLORS["bad"]}" stroke-dasharray="6 4"/>')
    body.append(_text(right, by - 4, f"SQ depth {bound}", 10, "end", COLORS["bad"]))
    for tick in sorted({0, top}):
        body.append(_text(left - 4, xy(0, tick)[1] + 4, str(tick), 10, "end"))
    for index, (qpn, points) in enumerate(entry["qps"].items()):
        color = QP_COLORS[index % len(QP_COLORS)]
        coords = " ".join("{:.1f},{:.1f}".format(*xy(i, v)) for i, v in points)
        data = " ".join(f"{i}:{v}" for i, v in points)
        body.append(f'<polyline class="series" data-qpn="{_e(qpn)}" data-max="{_e(entry["max"][qpn])}" '
                    f'data-points="{_e(data)}" points="{coords}" fill="none" stroke="{color}" stroke-width="1.2">'
                    f'<title>QP {_e(qpn)}: at most {_e(entry["max"][qpn])} in flight</title></polyline>')
        body.append(_text(left + 4 + index * 120, height - 8, f"QP {qpn} (max {entry['max'][qpn]})", 10, "start",
                          color))
    body.append(f'<line x1="{left}" y1="{base}" x2="{right}" y2="{base}" stroke="#333"/>')
    return _svg("inflight", height, body, f"WRs in flight per QP, g{entry['generation']} {entry['tool']}")


LABEL_CHAR_PX = 6.5  # an upper bound of a 10 px sans-serif character's width, to keep labels clear of the markers
MARKER_R = 4


def _nice_step(span, ticks=6):
    """A round tick step (1, 2 or 5 times a power of ten) giving at most ``ticks`` intervals over ``span``."""
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= raw)


def _seconds_label(value, step):
    decimals = max(0, -math.floor(math.log10(step)))
    return f"{value:.{decimals}f} s"


def _time_axis(left, right, y, end):
    """Ticks and labels in seconds from the case's first event, under the lanes."""
    step = _nice_step(end)
    body = [f'<line x1="{left}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#333"/>']
    count = int(end / step + 1e-9)
    for index in range(count + 1):
        value = index * step
        x = left + value / end * (right - left)
        body.append(f'<line class="tick" data-t="{value:g}" x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{y + 5:.1f}" '
                    'stroke="#333"/>')
        body.append(_text(x, y + 17, _seconds_label(value, step), 10, "middle"))
    body.append(_text(right, y + 31, "seconds since the case's first journal event", 10, "end", "#555"))
    return body


def _timeline_key(y):
    """What a marker's colour says, and that each marker is one journal event."""
    body = [_text(PAD, y, "key: one dot per journal event, by lane:", 10, "start", "#555")]
    x = PAD + 215
    for lane_name in LANES:
        body.append(f'<g class="key" data-lane="{_e(lane_name)}"><circle cx="{x:.1f}" cy="{y - 3.5:.1f}" '
                    f'r="{MARKER_R}" fill="{LANE_COLORS[lane_name]}"/>{_text(x + 8, y, lane_name, 10)}</g>')
        x += 16 + len(lane_name) * LABEL_CHAR_PX + 14
    return body


def timeline_plot(rows):
    """One band per role, one row per lane (locks, children, supervisor); a marker per journal event, under a time
    axis in seconds and a key of the lanes' colours. The lane labels end left of the first possible marker."""
    if not rows:
        return '<p class="note">No node timeline: no journal could be read.</p>'
    row_h = 22
    lanes_h = len(rows) * (len(LANES) * row_h + 16)
    height = 48 + lanes_h + 44
    end = max([e["t"] for row in rows for e in row["events"]] + [1e-6])
    longest = max(len(f"{row['role']} {lane_name}") for row in rows for lane_name in LANES)
    label_end = PAD + longest * LABEL_CHAR_PX
    left, right = label_end + 2 * MARKER_R + 8, WIDTH - PAD
    body = [_text(PAD, 16, f"node timeline from the supervisor journals ({end:.3f} s)", 12), *_timeline_key(34)]
    y = 46
    for row in rows:
        for lane_index, lane_name in enumerate(LANES):
            ly = y + lane_index * row_h + row_h / 2
            body.append(f'<text class="lane-label" x="{label_end:.1f}" y="{ly + 4:.1f}" font-size="10" '
                        f'text-anchor="end" fill="#1d2329">{_e(row["role"])} {_e(lane_name)}</text>')
            body.append(f'<line x1="{left}" y1="{ly:.1f}" x2="{right}" y2="{ly:.1f}" stroke="#dde"/>')
        for event in row["events"]:
            lane_index = LANES.index(event["lane"])
            ex = left + event["t"] / end * (right - left)
            ey = y + lane_index * row_h + row_h / 2
            body.append(f'<circle class="event" data-role="{_e(row["role"])}" data-ev="{_e(event["ev"])}" '
                        f'data-lane="{_e(event["lane"])}" data-t="{_e(event["t"])}" data-seq="{_e(event["seq"])}" '
                        f'cx="{ex:.1f}" cy="{ey:.1f}" r="{MARKER_R}" fill="{LANE_COLORS[event["lane"]]}">'
                        f'<title>{_e(row["role"])} +{event["t"]:.6f} s {_e(event["ev"])} {_e(event["label"])}'
                        f'</title></circle>')
        y += len(LANES) * row_h + 16
    body += _time_axis(left, right, y, end)
    return _svg("timeline", height, body, "node timeline: locks, children, supervisor")


def inventory_table(entries):
    if not entries:
        return ""
    out = ["<h4>Inventory before and after the child</h4>"]
    for entry in entries:
        label = f"{entry['role']} g{entry['generation']}"
        if not entry["readable"]:
            out.append(f'<p class="inventory" data-role="{_e(entry["role"])}" data-changed="unknown">{_e(label)}: '
                       "an inventory could not be read (see the receipt findings).</p>")
            continue
        changed = entry["changed"]
        out.append(f'<p class="inventory" data-role="{_e(entry["role"])}" data-generation="{_e(entry["generation"])}" '
                   f'data-changed="{len(changed) + entry["cut"]}">{_e(label)}: '
                   + (f"{len(changed) + entry['cut']} of {entry['entries']} entries differ" if changed
                      else f"identical ({entry['entries']} entries)") + "</p>")
        if changed:
            out += ["<table><tr><th>JSON path</th><th>before</th><th>after</th></tr>"]
            out += [f'<tr class="inventory-diff"><td class="path mono">{_e(c["path"])}</td><td class="before mono">'
                    f'{_json(c["before"])}</td><td class="after mono">{_json(c["after"])}</td></tr>' for c in changed]
            out.append("</table>")
            if entry["cut"]:
                out.append(f'<p class="note">{entry["cut"]} more not shown.</p>')
    return "".join(out)


def _plots(plots):
    if not plots:
        return ['<p class="note">No plots: the case\'s receipts were not read in this verification.</p>']
    out = ["<h3>Plots</h3>", bytes_plot(plots.get("bytes") or [])]
    for entry in plots.get("inflight") or []:
        out.append(inflight_plot(entry))
    out.append(timeline_plot(plots.get("timeline") or []))
    out.append(inventory_table(plots.get("inventory") or []))
    return out


# --- the page -------------------------------------------------------------------------------------


def render_html(verdict, plots=None, artifact_lines=()):
    """The page. ``plots``: {case id: case_plots(...)} of the cases read in this verification."""
    plots = plots or {}
    counts = verdict.get("counts") or {}
    status = verdict.get("verdict")
    title = f"Verdict {status}: run {verdict.get('run_id')}"
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>",
           f'<h1>Verdict: <span class="{_e(status)}" id="verdict">{_e(status)}</span></h1>']
    if verdict.get("diagnostic_only"):
        defects = ", ".join(verdict.get("defects") or []) or "none"
        out.append(f'<p class="FAIL"><strong>Diagnostic only</strong>: defect switches {_e(defects)} or a dirty '
                   "build; it qualifies nothing.</p>")
    if status == INCOMPLETE:
        out.append("<p><strong>INCOMPLETE, not a PASS</strong>: not every planned case was verified.</p>")
    if verdict.get("reports_cut"):
        out.append(f"<p>Short form only: {_e(verdict['reports_cut'])}.</p>")
    if verdict.get("origin"):
        origin = verdict["origin"]
        out.append(f'<p class="origin">Rerun of <code>{_e(origin.get("run_id"))}</code> '
                   f'(<span class="mono">{_e(origin.get("run_dir"))}</span>): the cases that did not pass there.</p>')
    out.append(f"<p>Run <code>{_e(verdict.get('run_id'))}</code>, {counts.get('pass', 0)} rules passed, "
               f"{counts.get('fail', 0)} failed, {counts.get('skip', 0)} skipped over {counts.get('cases', 0)} "
               f"planned case(s): {counts.get('cases_passed', 0)} passed, {counts.get('cases_failed', 0)} failed, "
               f"{counts.get('cases_incomplete', 0)} not verified. Failed codes: "
               f'<span id="failed-codes">{_e(", ".join(verdict.get("failed_codes") or []) or "none")}</span>.</p>')
    out.append("<h2>Artifacts qualified</h2><table><tr><th>artifact</th><th>sha256 and path</th></tr>")
    out += [f'<tr><td><code>{_e(name)}</code></td><td class="mono">{_e(value)}</td></tr>'
            for name, value in artifact_lines]
    out.append("</table>")
    out.append('<h2>Contents</h2><ul>' + "".join(
        f'<li><a href="#case-{_e(c["case"])}">{_e(c["case"])}</a>: <span class="{_e(c["verdict"])}">'
        f'{_e(c["verdict"])}</span></li>' for c in verdict.get("cases") or []) + "</ul>")
    run_findings = verdict.get("run_findings") or []
    out.append('<h2 id="run">Run findings</h2>')
    failed_first = sorted(run_findings, key=lambda finding: finding["status"] != FAIL)  # stable: order kept
    out += _findings_table(failed_first, "run", "run-findings")
    for case in verdict.get("cases") or []:
        case_id = case["case"]
        out.append(f'<section class="case" id="case-{_e(case_id)}" data-case="{_e(case_id)}">'
                   f'<h2>{_e(case_id)}: <span class="{_e(case["verdict"])}">{_e(case["verdict"])}</span></h2>')
        if case["verdict"] == INCOMPLETE:
            out.append("<p>Not verified: the run did not finish.</p></section>")
            continue
        failing = [f for f in case["findings"] if f["status"] == FAIL]
        others = [f for f in case["findings"] if f["status"] != FAIL]
        if failing:
            out.append(f"<h3>Failing codes ({len(failing)})</h3>")
            out += _findings_table(failing, case_id, "failing")
        out.append(f"<details><summary>{len(others)} other finding(s): "
                   f"{sum(f['status'] == PASS for f in others)} passed, "
                   f"{sum(f['status'] == SKIP for f in others)} skipped</summary>")
        out += _findings_table(others, case_id, "others")
        out.append("</details>")
        out += _plots(plots.get(case_id))
        out.append("</section>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
