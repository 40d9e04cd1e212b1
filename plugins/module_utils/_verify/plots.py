# SPDX-License-Identifier: Apache-2.0
# Copyright: OrbiTE qualification contributors
"""The figures a report draws, taken from one case's receipts as the verifier loaded them (case.py).

Data only (JSON-able), no drawing: ``html_report`` draws it, the verdict keeps the headline
``figures`` of each case for ``compare``. Expected figures come from the profile model
(``derive_workload``), observed ones from the receipts; a receipt the verifier could not read
gives no series (the page says so), never a guess. Shares no code with any runner.
"""

from __future__ import annotations

from bisect import bisect_left

MAX_POINTS = 2000  # per QP series: longer logs are cut into buckets, each drawn as its highest point
INVENTORY_DIFFS_SHOWN = 50


def _int(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _rail_figures(per_rail):
    """{rail text: int} of a ledger per_rail object (values plain, or objects with ``bytes``)."""
    out = {}
    for rail, value in (per_rail or {}).items() if isinstance(per_rail, dict) else ():
        figure = value.get("bytes") if isinstance(value, dict) else value
        if _int(figure) is not None:
            out[str(rail)] = figure
    return out


def rail_bytes(case):
    """Payload bytes per rail per round: expected (the model's placement) against the requester's public
    and native counters. [{"generation", "round", "rail", "expected", "public", "native"}]."""
    expected = {str(rail): figures["bytes"] for rail, figures in case.workload["per_rail"].items()}
    points = []
    for (role, generation), receipt in sorted(case.ledgers.items()):
        if role != "requester" or not receipt.ok:
            continue
        for rnd in receipt.data.get("rounds") or []:
            counters = rnd.get("counters") or {}
            public = _rail_figures((counters.get("public") or {}).get("per_rail"))
            native = _rail_figures((counters.get("native") or {}).get("per_rail"))
            for rail in sorted(set(expected) | set(public) | set(native), key=lambda r: (len(r), r)):
                points.append({"generation": generation, "round": rnd.get("round"), "rail": rail,
                               "expected": expected.get(rail, 0), "public": public.get(rail),
                               "native": native.get(rail)})
    return points


def inflight(case):
    """Payload WRs in flight per QP over the observer log (log order: one step per WR or completion),
    with the SQ-depth bound. [{"generation", "tool", "path", "bound", "events", "bucket", "qps":
    {qpn text: [[event index, in flight], ...]}, "max": {qpn text: int}}]."""
    out = []
    for (_role, generation, tool), log in sorted(case.observer_logs.items()):
        if not log.ok:
            continue
        events = len(log.flow()["kind"])
        bucket = max(1, -(-events // MAX_POINTS))
        qps, most, runs = {}, {}, log.inflight()
        for qpn in sorted(runs):
            index, counts = runs[qpn]  # each QP's events and its count after each (a running sum, in C)
            qps[str(qpn)] = _buckets(index, counts, bucket)
            most[str(qpn)] = max(counts, default=0)
        out.append({"generation": generation, "tool": tool, "path": log.path,
                    "bound": case.workload["send_queue_depth"], "events": events, "bucket": bucket,
                    "qps": qps, "max": most})
    return out


def _buckets(index, counts, bucket):
    """[[event index, in flight]] of one QP (its events' indexes, ascending, and counts): the first highest
    point of each run of ``bucket`` events (every point when bucket is 1). A bisection and a max() a run."""
    if bucket == 1:
        return [list(point) for point in zip(index, counts)]
    points, low = [], 0
    while low < len(index):
        high = bisect_left(index, (index[low] // bucket + 1) * bucket, low)
        top = max(counts[low:high])
        at = counts.index(top, low, high)
        points.append([index[at], top])
        low = high
    return points


LANES = ("locks", "children", "supervisor")


def lane(event):
    """Which row of the node timeline a journal event is drawn on."""
    if event.startswith("lock_"):
        return "locks"
    if event.startswith(("child_", "signal")):
        return "children"
    return "supervisor"


def timeline(case):
    """The journals' events by role, time relative to the case's first event.
    [{"role", "path", "events": [{"seq", "ev", "t", "lane", "label"}]}], and the origin time."""
    rows, times = [], []
    for role, receipt in sorted(case.journals.items()):
        if not receipt.ok:
            continue
        events = [e for e in [receipt.data["header"], *receipt.data["events"]] if isinstance(e, dict)]
        times += [e["t"] for e in events if isinstance(e.get("t"), (int, float)) and not isinstance(e["t"], bool)]
        rows.append((role, receipt.path, events))
    origin = min(times, default=0.0)
    out = []
    for role, path, events in rows:
        drawn = []
        for event in events:
            when, name = event.get("t"), event.get("ev")
            if not isinstance(when, (int, float)) or isinstance(when, bool) or not isinstance(name, str):
                continue
            drawn.append({"seq": event.get("seq"), "ev": name, "t": round(when - origin, 6), "lane": lane(name),
                          "label": _label(event)})
        out.append({"role": role, "path": path, "events": drawn})
    return out


def _label(event):
    """What a timeline marker says beside its event name: the RNIC, the child, the signal."""
    parts = [str(event[key]) for key in ("rnic", "child_id", "pid", "exit_code", "exit_signal_name", "signal_name",
                                         "reason") if event.get(key) is not None]
    return " ".join(parts)


def _flatten(value, where, out):
    if isinstance(value, dict):
        for key, item in value.items():
            _flatten(item, f"{where}.{key}", out)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _flatten(item, f"{where}[{index}]", out)
    else:
        out[where] = value
    return out


def inventory_diff(case):
    """Each node's inventory before and after its child (discovery: auto), as the differing JSON paths.
    [{"role", "generation", "before", "after", "entries", "changed": [{"path", "before", "after"}], "cut"}]."""
    out = []
    for (role, generation, when), receipt in sorted(case.inventories.items()):
        if when != "before":
            continue
        after = case.inventories.get((role, generation, "after"))
        entry = {"role": role, "generation": generation, "before": receipt.path,
                 "after": after.path if after else None, "entries": 0, "changed": [], "cut": 0, "readable": False}
        if receipt.ok and after is not None and after.ok:
            old, new = _flatten(receipt.data, "$", {}), _flatten(after.data, "$", {})
            changed = [{"path": path, "before": old.get(path), "after": new.get(path)}
                       for path in sorted(set(old) | set(new)) if old.get(path, KeyError) != new.get(path, KeyError)]
            entry.update(readable=True, entries=len(old), changed=changed[:INVENTORY_DIFFS_SHOWN],
                         cut=max(0, len(changed) - INVENTORY_DIFFS_SHOWN))
        out.append(entry)
    return out


def headline(case):
    """The case's figures ``compare`` holds between runs: per role and generation, the ledger's totals
    and per QP the most WRs in flight; per observer log its summary counts. {name: number}."""
    figures = {}
    for (role, generation), receipt in sorted(case.ledgers.items()):
        if not receipt.ok:
            continue
        totals = receipt.data.get("totals") or {}
        for key in ("rounds_completed", "wrs_posted", "cqes", "public_bytes", "native_bytes", "qps_created",
                    "persistent_mrs"):
            if _int(totals.get(key)) is not None:
                figures[f"{role}.g{generation}.{key}"] = totals[key]
        if _int(receipt.data.get("exit_code")) is not None:
            figures[f"{role}.g{generation}.exit_code"] = receipt.data["exit_code"]
        for rnd in receipt.data.get("rounds") or []:
            for usage in rnd.get("qp_usage") or []:
                value = _int(usage.get("max_inflight_wrs"))
                if value is not None and usage.get("rail") is not None:
                    name = f"{role}.g{generation}.rail{usage['rail']}.lane{usage.get('lane')}.max_inflight_wrs"
                    figures[name] = max(figures.get(name, 0), value)
    for (role, generation, tool), log in sorted(case.observer_logs.items()):
        if log.ok and isinstance(log.summary, dict):
            for key in ("accepted_wrs", "joined", "unjoined"):
                if _int(log.summary.get(key)) is not None:
                    figures[f"{role}.g{generation}.{tool}.{key}"] = log.summary[key]
    return figures


def case_plots(case):
    """Everything the HTML report draws for one case."""
    return {"bytes": rail_bytes(case), "inflight": inflight(case), "timeline": timeline(case),
            "inventory": inventory_diff(case)}
