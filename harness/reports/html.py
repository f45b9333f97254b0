"""The HTML report: one self-contained file made from a session report (``harness.reports.report``).

Everything is inline (CSS, SVG, one small script that only marks the page as laid out), so the
file opens anywhere without a network. It holds a summary, one section per scenario case with
a timeline chart (ranks as rows, phases as coloured bars from the start line, fault actions as
marks, torch's timeout and the harness's deadline as vertical lines, the outcome at each bar's
end), the stacks of hung ranks, tracebacks and stderr tails, and the environment.
"""

from __future__ import annotations

import html as _html
import math
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..core.protocol import row_name
from ..faults.steps import RUN as RUN_STEPS

PHASE_COLOURS = {
    "waiting": "#e6e6e6",
    "init": "#4e79a7",
    "destroy": "#b07aa1",
    "exit": "#76b7b2",
}
STEP_COLOURS = ("#59a14f", "#8cd17d")
OTHER_COLOUR = "#bab0ac"
OUTCOME_COLOURS = {"ok": "#2e7d32", "error": "#d84315", "timeout": "#b26a00", "hang": "#c62828",
                   "crash": "#6a1b9a", "absent": "#757575"}
STATUS_COLOURS = {"passed": "#2e7d32", "failed": "#c62828", "skipped": "#757575",
                  "error": "#6a1b9a"}

# chart geometry (px)
WIDTH, LABEL_W, RIGHT_W = 1000, 120, 250
AXIS_H, ROW_H, BAR_H, FOOT_H = 40, 30, 16, 10


def esc(x: Any) -> str:
    return _html.escape("" if x is None else str(x), quote=True)


def phase_colour(phase: str) -> str:
    if phase.startswith("workload step"):
        try:
            n = int(phase.rsplit(" ", 1)[1])
        except ValueError:
            n = 1
        return STEP_COLOURS[(n - 1) % len(STEP_COLOURS)]
    return PHASE_COLOURS.get(phase, OTHER_COLOUR)


def _nice_step(span: float, ticks: int = 6) -> float:
    raw = max(span / ticks, 1e-6)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _fmt_s(t: float) -> str:
    if t == 0:
        return "0"
    if abs(t) < 0.1:
        return f"{t * 1000:.0f} ms"
    return f"{t:.3g} s" if abs(t) < 10 else f"{t:.0f} s"


def phase_segments(rank: Dict[str, Any], end: float) -> List[Tuple[str, float, float, str]]:
    """(phase, start, end, step) in seconds from the start line, from the rank's phase events
    after the start line (its import happened before it); a late rank is first 'waiting'."""
    segs: List[Tuple[str, float, float, str]] = []
    released = rank.get("released_at")
    phases = [(e["phase"], float(e["t"]), str(e.get("step") or "")) for e in rank.get("events", [])
              if e.get("ev") == "phase" and e.get("t") is not None and e.get("phase")]
    if released:
        segs.append(("waiting", 0.0, min(float(released), end), ""))
    after = [(p, max(t, 0.0), st) for p, t, st in phases if p not in ("start", "import")]
    for i, (p, t, st) in enumerate(after):
        stop = after[i + 1][1] if i + 1 < len(after) else end
        segs.append((p, t, max(t, min(stop, end)), st))
    return segs


def step_rows(steps: Sequence[Dict[str, Any]]) -> List[Tuple[str, List[Dict[str, Any]]]]:
    """The timeline's step rows: the steps that were done, grouped by what they act on, in
    plan order; steps on a rank (its row shows them) and the run's own set-up are left out."""
    rows: Dict[str, List[Dict[str, Any]]] = {}
    for st in steps:
        target = str(st.get("target") or "")
        if st.get("on") is None or target.startswith("rank ") or st.get("fault") == RUN_STEPS:
            continue
        rows.setdefault(target or str(st.get("fault")), []).append(st)
    return list(rows.items())


def _rank_end(rank: Dict[str, Any], fallback: float) -> float:
    for key in ("ended_at",):
        if rank.get(key) is not None:
            return float(rank[key])
    ts = [e["t"] for e in rank.get("events", []) if e.get("t") is not None]
    return max(ts + [fallback]) if ts else fallback


def timeline_svg(case: Dict[str, Any]) -> str:
    """The chart of one case as an inline <svg> (empty string when the case did not run)."""
    tl = case.get("timeline") or {}
    ranks = tl.get("ranks") or []
    if not ranks:
        return ""
    verdicts = {r.get("label"): r for r in case.get("ranks", [])}
    wall = float(tl.get("wall") or 0.0)
    deadline = None if tl.get("deadline") is None else float(tl["deadline"])
    timeout = None if tl.get("timeout") is None else float(tl["timeout"])
    ends = {r["label"]: _rank_end(r, wall) for r in ranks}
    marks_t: List[float] = [float(s.get("t") or 0) for r in ranks for s in r.get("signals", [])]
    groups = step_rows(tl.get("steps") or [])
    marks_t += [float(st.get(k) or 0) for _, sts in groups for st in sts for k in ("on", "off")]
    marks_t += [float(r.get("released_at") or 0) for r in ranks]
    tmax = max([wall, *ends.values(), *marks_t, 0.05])
    hung = any(r.get("killed_at_deadline") for r in ranks)
    show_deadline = deadline is not None and (hung or deadline <= tmax * 1.5)
    if deadline is not None and show_deadline:
        tmax = max(tmax, deadline)
    show_timeout = timeout is not None and timeout <= tmax * 1.05
    tmax *= 1.04
    x0, x1 = LABEL_W, WIDTH - RIGHT_W

    def x(t: float) -> float:
        return round(x0 + (x1 - x0) * max(0.0, min(t, tmax)) / tmax, 2)

    end_all = max(wall, *ends.values())
    rows = len(ranks) + len(groups)
    height = AXIS_H + rows * ROW_H + FOOT_H
    out: List[str] = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="timeline of {esc(case.get("test_id"))}">',
        '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#f3f3f3"/>'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#bbb" stroke-width="2"/></pattern></defs>',
    ]
    bottom = AXIS_H + rows * ROW_H
    _axis(out, x, tmax, bottom)
    for i, r in enumerate(ranks):
        _rank_row(out, i, r, verdicts.get(r.get("label"), {}), ends[r["label"]], x)
    # the faults' steps, drawn from their declaration: a row per thing they act on (a host's
    # network, the port holder...); what a step does to a rank is a mark on the rank's row
    seen = {str(s.get("step")): s for e in case.get("effects") or []
            for t in e.get("targets") or [] for s in t.get("steps") or []}
    _fault_rows(out, groups, seen, len(ranks), end_all, x)
    _limit_lines(out, x, bottom, timeout, show_timeout, deadline, show_deadline)
    out.append("</svg>")
    return "\n".join(out)


Scale = Callable[[float], float]   # seconds from the start line -> x on the chart


def _axis(out: List[str], x: Scale, tmax: float, bottom: float) -> None:
    """The time axis: a tick and a grid line per nice step."""
    x0 = LABEL_W
    step = _nice_step(tmax)
    t = 0.0
    while t <= tmax + 1e-9:
        xt = x(t)
        out.append(f'<line class="grid" x1="{xt}" y1="{AXIS_H - 4}" x2="{xt}" y2="{bottom}" '
                   'stroke="#eee"/>')
        out.append(f'<text class="tick" x="{xt}" y="{AXIS_H - 8}" text-anchor="middle" '
                   f'font-size="11" fill="#666">{esc(_fmt_s(t))}</text>')
        t += step
    out.append(f'<text x="{x0 - 8}" y="{AXIS_H - 8}" text-anchor="end" font-size="11" '
               'fill="#666">from start line</text>')


def _rank_row(out: List[str], i: int, r: Dict[str, Any], v: Dict[str, Any], end: float,
              x: Scale) -> None:
    """Rank ``i``'s row: its phases as bars, its release and signals as marks, its outcome
    after the bar's end."""
    x0 = LABEL_W
    y = AXIS_H + i * ROW_H
    label = r.get("label")
    host = r.get("host") or "local"
    name = f"rank {row_name(label, r.get('claims'))}" + ("" if host == "local" else f" @{host}")
    if i % 2:
        out.append(f'<rect class="rowbg" x="0" y="{y}" width="{WIDTH}" height="{ROW_H}" '
                   'fill="#fafafa"/>')
    out.append(f'<text class="rowlabel" x="{x0 - 8}" y="{y + ROW_H / 2 + 4}" '
               f'text-anchor="end" font-size="12" fill="#222">{esc(name)}</text>')
    by = y + (ROW_H - BAR_H) / 2
    for ph, a, b, stepname in phase_segments(r, end):
        w = max(x(b) - x(a), 1.0)
        fill = phase_colour(ph)
        stroke = ' stroke="#aaa" stroke-dasharray="3,2"' if ph == "waiting" else ""
        what = f"{ph} ({stepname})" if stepname else ph
        out.append(
            f'<rect class="bar" data-rank="{esc(label)}" data-phase="{esc(ph)}" '
            f'x="{x(a)}" y="{by}" width="{w:.2f}" height="{BAR_H}" fill="{fill}"{stroke}>'
            f'<title>rank {esc(label)}: {esc(what)} {a:.3f} to {b:.3f} s</title></rect>')
        inside = ph.replace("workload step", "step") + (f" {stepname}" if stepname else "")
        if ph != "waiting" and w > 7 * len(inside) + 8:
            out.append(f'<text class="barlabel" x="{x(a) + 4}" y="{by + BAR_H - 4}" '
                       f'font-size="10" fill="#fff">{esc(inside)}</text>')
    if r.get("released_at"):
        xr = x(float(r["released_at"]))
        out.append(f'<path class="mark release" d="M{xr - 5},{by - 6} L{xr + 5},{by - 6} '
                   f'L{xr},{by} Z" fill="#555"><title>released '
                   f'{float(r["released_at"]):g} s after the start line</title></path>')
    for s in r.get("signals", []):
        xs = x(float(s.get("t") or 0))
        out.append(f'<line class="mark signal" x1="{xs}" y1="{y + 2}" x2="{xs}" '
                   f'y2="{y + ROW_H - 2}" stroke="#111" stroke-width="2.5">'
                   f'<title>SIG{esc(s.get("signal"))} at {s.get("t")} s '
                   f'({esc(s.get("why"))})</title></line>')
        out.append(f'<text class="marklabel" x="{xs + 3}" y="{y + 9}" font-size="9" '
                   f'font-weight="bold" fill="#111">SIG{esc(s.get("signal"))}</text>')
    outcome = v.get("outcome") or ("hang" if r.get("killed_at_deadline") else "?")
    colour = OUTCOME_COLOURS.get(outcome, "#333")
    xe = x(end)
    if r.get("killed_at_deadline"):
        out.append(f'<path class="mark killed" d="M{xe - 5},{by - 1} L{xe + 5},{by + BAR_H + 1}'
                   f' M{xe + 5},{by - 1} L{xe - 5},{by + BAR_H + 1}" stroke="{colour}" '
                   'stroke-width="2.5"><title>killed by the harness at the deadline'
                   '</title></path>')
    text = outcome
    if v.get("exception"):
        text += f" · {v['exception']}"
    dur = v.get("duration")
    if dur is not None:
        text += f" · {_fmt_s(float(dur))}"
    out.append(f'<text class="outcome" data-outcome="{esc(outcome)}" x="{xe + 8}" '
               f'y="{y + ROW_H / 2 + 4}" font-size="12" font-weight="bold" '
               f'fill="{colour}">{esc(text)}</text>')


def _fault_rows(out: List[str], groups: List[Tuple[str, List[Dict[str, Any]]]],
                seen: Dict[str, Any], n_ranks: int, end_all: float, x: Scale) -> None:
    """The faults' steps, a row per thing they act on, under the ranks' rows; what each
    step's probe saw as dots (``seen``: the effects' steps by id)."""
    x0 = LABEL_W
    for j, (target, sts) in enumerate(groups):
        y = AXIS_H + (n_ranks + j) * ROW_H
        by = y + (ROW_H - BAR_H) / 2
        out.append(f'<text class="rowlabel" x="{x0 - 8}" y="{y + ROW_H / 2 + 4}" '
                   f'text-anchor="end" font-size="12" fill="#555">{esc(target)}</text>')
        for st in sts:
            a = float(st.get("on") or 0.0)
            undone = st.get("off") is not None
            b = float(st["off"]) if undone else end_all
            w = max(x(b) - x(a), 2.0)
            what = str(st.get("what") or "")
            title = f"{st.get('fault')}: {what}, {st.get('when')}" + (
                f"; undone {st.get('undo_when')} ({b:g} s)" if undone else "")
            eff = seen.get(str(st.get("id")))
            if eff is not None:   # what its probe saw (harness.judge.effects)
                title += f"; effect: {eff.get('status')}: {eff.get('summary')}"
                for ev in (eff.get("events") or [])[:50]:
                    if ev.get("t") is None:
                        continue
                    xe_ = x(min(max(float(ev["t"]), 0.0), end_all))
                    out.append(f'<circle class="mark effect" cx="{xe_:.2f}" cy="{by + BAR_H / 2}"'
                               f' r="2.5" fill="#111"><title>{esc(_fmt_s(float(ev["t"])))}: '
                               f'{esc(ev.get("what"))}</title></circle>')
            out.append(f'<rect class="bar step" data-step="{esc(st.get("id"))}" '
                       f'data-fault="{esc(st.get("fault"))}" x="{x(a)}" y="{by}" '
                       f'width="{w:.2f}" height="{BAR_H}" fill="#f4c7c3" stroke="#c62828">'
                       f'<title>{esc(title)}</title></rect>')
            if a > 0:
                out.append(f'<line class="mark step-on" x1="{x(a)}" y1="{y + 2}" x2="{x(a)}" '
                           f'y2="{y + ROW_H - 2}" stroke="#111" stroke-width="2.5"/>')
            if undone:
                out.append(f'<line class="mark step-off" x1="{x(b)}" y1="{y + 2}" '
                           f'x2="{x(b)}" y2="{y + ROW_H - 2}" stroke="#111" '
                           'stroke-width="2.5"/>')
            if w > 6 * len(what) + 8:
                out.append(f'<text class="barlabel" x="{x(a) + 4}" y="{by + BAR_H - 4}" '
                           f'font-size="10" fill="#7f0000">{esc(what)}</text>')


def _limit_lines(out: List[str], x: Scale, bottom: float, timeout: Optional[float],
                 show_timeout: bool, deadline: Optional[float], show_deadline: bool) -> None:
    """torch's timeout and the harness's deadline as vertical lines (the deadline said off the
    chart when it lies far beyond the runs)."""
    x1 = WIDTH - RIGHT_W
    if timeout is not None and show_timeout:
        xt = x(timeout)
        out.append(f'<line class="timeout" x1="{xt}" y1="{AXIS_H - 2}" x2="{xt}" y2="{bottom}" '
                   'stroke="#b26a00" stroke-width="1.2" stroke-dasharray="2,3"/>')
        out.append(f'<text x="{xt + 3}" y="{bottom + FOOT_H - 1}" font-size="9" fill="#b26a00">'
                   f'torch timeout {_fmt_s(timeout)}</text>')
    if deadline is not None and show_deadline:
        xd = x(deadline)
        out.append(f'<line class="deadline" x1="{xd}" y1="3" x2="{xd}" '
                   f'y2="{bottom}" stroke="#c62828" stroke-width="2" stroke-dasharray="6,3"/>')
        out.append(f'<text x="{xd + 4}" y="12" font-size="11" fill="#c62828" '
                   f'font-weight="bold">deadline {_fmt_s(deadline)}</text>')
    elif deadline is not None:
        out.append(f'<text class="deadline-off" x="{x1}" y="12" text-anchor="end" '
                   f'font-size="10" fill="#c62828">deadline {_fmt_s(deadline)} '
                   '(off the chart) →</text>')


def legend_html() -> str:
    items = [("waiting for release", PHASE_COLOURS["waiting"]), ("init", PHASE_COLOURS["init"]),
             ("workload step", STEP_COLOURS[0]), ("next step", STEP_COLOURS[1]),
             ("destroy", PHASE_COLOURS["destroy"]), ("exit", PHASE_COLOURS["exit"])]
    parts = [f'<span class="key"><i style="background:{c}"></i>{esc(n)}</span>' for n, c in items]
    parts += ['<span class="key"><i style="background:#f4c7c3;border-color:#c62828"></i>'
              'a fault step in effect (a held port, a filter rule...)</span>',
              '<span class="key"><b>|</b> signal / release by a fault</span>',
              '<span class="key"><b>▼</b> released late</span>',
              '<span class="key"><b style="color:#c62828">✕</b> killed at the deadline</span>',
              '<span class="key"><b style="color:#c62828">┆</b> deadline</span>',
              '<span class="key"><b style="color:#b26a00">┆</b> torch timeout</span>']
    return '<div class="legend">' + "".join(parts) + "</div>"


CSS = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#222;
background:#fff}
header{background:#263238;color:#fff;padding:14px 24px}
header h1{margin:0;font-size:20px}
header .meta{color:#cfd8dc;font-size:12px;margin-top:4px}
main{padding:8px 24px 40px;max-width:1200px}
h2{font-size:17px;margin:28px 0 6px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:14px;margin:14px 0 4px}
.badge{display:inline-block;border-radius:10px;padding:1px 9px;color:#fff;font-size:12px;
font-weight:600;vertical-align:1px}
.counts .badge{font-size:13px;margin-right:6px}
table{border-collapse:collapse;margin:6px 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top;font-size:13px}
th{background:#f5f5f5}
td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f7f7f7;border:1px solid #e3e3e3;padding:8px;overflow-x:auto;font-size:12px;
white-space:pre-wrap;word-break:break-word;max-height:480px}
details{margin:4px 0}
summary{cursor:pointer;font-weight:600}
.about{white-space:pre-wrap;color:#444;margin:4px 0}
.legend{font-size:12px;color:#444;margin:2px 0 8px}
.legend .key{margin-right:14px;white-space:nowrap}
.legend i{display:inline-block;width:14px;height:10px;margin-right:4px;vertical-align:0;
border:1px solid #aaa}
.legend i.hatch{background:repeating-linear-gradient(45deg,#f3f3f3 0 3px,#bbb 3px 5px)}
.chart{overflow-x:auto}
.muted{color:#777}
.fam{color:#777;font-size:12px}
section.case{margin-bottom:18px}
"""

SCRIPT = """
document.addEventListener('DOMContentLoaded',function(){
var n=0;document.querySelectorAll('svg.timeline rect.bar').forEach(function(r){
var b=r.getBBox();if(b.width>0&&b.height>0){n++;}});
document.body.setAttribute('data-rendered-bars',String(n));});
"""


def _badge(status: Optional[str], colours: Dict[str, str] = STATUS_COLOURS) -> str:
    s = status or "?"
    return f'<span class="badge" style="background:{colours.get(s, "#455a64")}">{esc(s)}</span>'


def _outcome(o: Optional[str]) -> str:
    c = OUTCOME_COLOURS.get(o or "", "#333")
    return f'<b style="color:{c}">{esc(o)}</b>'


def _rank_outcomes(case: Dict[str, Any], r: Dict[str, Any]) -> str:
    """A rank's outcome, or, for a repeated case, its outcome frequencies ('timeout 7/10')."""
    n = case.get("repeat") or 1
    if n > 1 and r.get("outcomes"):
        flaky = ' <b style="color:#c62828">flaky</b>' if r.get("label") in (
            case.get("flaky") or []) else ""
        return " ".join(f"{_outcome(o)} {k}/{n}" for o, k in
                        sorted(r["outcomes"].items(), key=lambda kv: (-kv[1], kv[0]))) + flaky
    return _outcome(r.get("outcome"))


def _dur(d: Any) -> str:
    return "" if d is None else f"{float(d):.2f} s"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _expect_text(exp: Optional[Dict[str, Any]]) -> str:
    """The case's expectation (as the JSON report holds it) in one line."""
    if not exp:
        return ""
    from ..scenario.schema import Expect

    try:
        return Expect.model_validate(exp).summary()
    except ValueError:   # a report written by another version of the harness
        return str(exp)


EFFECT_COLOURS = {"acted": "#2e7d32", "no effect": "#c62828", "not observable": "#777"}


def effects_html(effects: Sequence[Dict[str, Any]]) -> str:
    """What each fault did (harness.judge.effects): per fault and target, its status and evidence
    with times."""
    from ..judge.effects import event_lines

    rows = []
    for e in effects:
        status = str(e.get("status"))
        badge = (f'<span class="effect" data-effect="{esc(status)}" style="color:'
                 f'{EFFECT_COLOURS.get(status, "#777")};font-weight:bold">{esc(status)}</span>'
                 + (" (optional)" if e.get("optional") else ""))
        rows.append([esc(e.get("n")), esc(e.get("what")), badge, esc(e.get("summary")),
                     "<pre>" + esc("\n".join(event_lines(e))) + "</pre>"])
    return "<h3>Fault effects</h3>" + _table(["fault", "what", "effect", "evidence",
                                              "per target, with times"], rows, "effects")


def case_html(i: int, c: Dict[str, Any]) -> str:
    out = [f'<section class="case" id="case-{i}">',
           f'<h2>{_badge(c.get("status"))} {esc(c.get("test_id") or c.get("id"))}</h2>',
           f'<div class="muted">{esc(c.get("id"))}'
           + (f' · torch {esc(c.get("torch_version"))}' if c.get("torch_version") else "")
           + (f' · job {_outcome(c.get("job"))}' if c.get("job") else "")
           + (f' · {_dur(c.get("duration"))}' if c.get("duration") is not None else "")
           + "</div>"]
    if c.get("about"):
        out.append(f'<div class="about">{esc(c["about"])}</div>')
    if (c.get("repeat") or 1) > 1:
        out.append(f'<p><b>{c["repeat"]} runs:</b> ' + "; ".join(
            f"rank {esc(row_name(r.get('label'), r.get('claims')))}: {_rank_outcomes(c, r)}"
            for r in c.get("ranks", []))
            + " (the timeline and the table below are run 1's)</p>")
    if c.get("notes"):
        out.append("<ul>" + "".join(f"<li>fault: {esc(n)}</li>" for n in c["notes"]) + "</ul>")
    if c.get("effects"):
        out.append(effects_html(c["effects"]))
    if c.get("status") == "skipped":
        out.append(f'<p><b>skipped:</b> {esc(c.get("reason"))}</p></section>')
        return "\n".join(out)
    if c.get("expectation"):
        out.append(f'<p><b>expected:</b> {esc(_expect_text(c["expectation"]))}</p>')
    if c.get("mismatches"):
        rows = [[esc(m["label"]), esc(m["field"]), esc(m["expected"]), esc(m["observed"])]
                for m in c["mismatches"]]
        out.append("<h3>Mismatches</h3>" + _table(["rank", "field", "expected", "observed"],
                                                   rows))
    if c.get("status") == "error" or (c.get("status") == "failed" and not c.get("mismatches")):
        out.append(f'<details open><summary>{esc(c.get("reason"))}</summary><pre>'
                   f'{esc(c.get("failure"))}</pre></details>')
    ranks = c.get("ranks") or []
    if ranks:
        out.append(_ranks_table(ranks))
    svg = timeline_svg(c)
    if svg:
        out.append("<h3>Timeline</h3>" + legend_html() + f'<div class="chart">{svg}</div>')
    _rank_details(out, ranks)
    _run_evidence(out, c)
    if c.get("evidence"):
        out.append(f'<p class="muted">evidence: <code>{esc(c["evidence"])}</code></p>')
    out.append("</section>")
    return "\n".join(out)


def _ranks_table(ranks: List[Dict[str, Any]]) -> str:
    """The case's table of rows: outcome, phase, duration, host, exception, message and
    cause with its evidence."""
    rows = []
    for r in ranks:
        msg = esc(r.get("message") or r.get("reason"))
        fam = f'<div class="fam">family: {esc(r["family"])}</div>' if r.get("family") else ""
        rows.append([esc(row_name(r.get("label"), r.get("claims"))),
                     _outcome(r.get("outcome")), esc(r.get("phase")),
                     _dur(r.get("duration")), esc(r.get("host")) + (
                         f" {esc(r['addr'])}" if r.get("addr") else ""),
                     esc(r.get("exception") or ""), msg + fam,
                     esc(r.get("cause") or "") + "".join(
                         f'<div class="fam">{esc(e)}</div>'
                         for e in r.get("cause_evidence") or [])])
    return _table(["rank", "outcome", "phase", "duration", "host", "exception",
                   "message", "cause (harness.diagnose)"], rows, "ranks")


def _rank_details(out: List[str], ranks: List[Dict[str, Any]]) -> None:
    """Each row's stacks (identical ones once), traceback and output tails, folded."""
    from ..scenario.expect import label_ranges, stack_groups

    groups = stack_groups({str(r.get("label")): str(r.get("stacks") or "") for r in ranks})
    for r in ranks:
        label = esc(r.get("label"))
        hung = r.get("outcome") == "hang"
        group = groups.get(str(r.get("label")), [])
        if r.get("stacks") and group and group[0] != str(r.get("label")):
            out.append(f'<p>rank {label}: Python stacks: the same as rank {esc(group[0])}</p>')
        elif r.get("stacks"):
            who = f"ranks {esc(label_ranges(group))}, same stack" if len(group) > 1 \
                else f"rank {label}"
            out.append(f'<details{" open" if hung else ""}><summary>{who}: Python stacks '
                       f'(faulthandler, all threads)</summary><pre>{esc(r["stacks"])}</pre>'
                       '</details>')
        if r.get("native_stacks"):
            out.append(f'<details{" open" if hung else ""}><summary>rank {label}: native stacks '
                       f'(py-spy dump --native)</summary><pre>{esc(r["native_stacks"])}</pre>'
                       '</details>')
        if r.get("traceback"):
            out.append(f'<details><summary>rank {label}: traceback</summary><pre>'
                       f'{esc(r["traceback"])}</pre></details>')
        if r.get("stderr_tail"):
            out.append(f'<details><summary>rank {label}: stderr (tail, with torch\'s C++ log)'
                       f'</summary><pre>{esc(r["stderr_tail"])}</pre></details>')
        if r.get("stderr_key"):
            out.append(f'<details><summary>rank {label}: stderr, torch\'s warning, error and '
                       f'errno lines (all of it)</summary><pre>{esc(r["stderr_key"])}</pre>'
                       '</details>')
        if r.get("stdout_tail"):
            out.append(f'<details><summary>rank {label}: stdout (tail)</summary><pre>'
                       f'{esc(r["stdout_tail"])}</pre></details>')


def _run_evidence(out: List[str], c: Dict[str, Any]) -> None:
    """What the run left beside its rows: who held the master port, each host's nftables
    rules and TCP counters, what the stores held."""
    if c.get("port_owners"):
        rows = [[esc(p.get(k, "")) for k in ("laddr", "pid", "status", "cmdline")]
                if isinstance(p, dict) else [esc(p), "", "", ""] for p in c["port_owners"]]
        out.append("<h3>Who had a socket on the master port</h3>" + _table(
            ["address", "pid", "status", "command"], rows))
    for host, rules in (c.get("rules") or {}).items():
        if rules:
            out.append(f'<details><summary>nftables rules of host {esc(host)} at the end'
                       f'</summary><pre>{esc(rules)}</pre></details>')
    counted = {h: n for h, n in (c.get("counters") or {}).items() if n}
    if counted:
        rows = [[esc(h), esc(k), esc(v)] for h, n in counted.items() for k, v in n.items()]
        out.append("<h3>TCP counters of each host at the end (non-zero)</h3>" + _table(
            ["host", "counter", "count"], rows))
    stores = ([("the store", c["store"])] if c.get("store") else []) + \
        [("a store the workers hosted themselves", x) for x in c.get("stores") or []]
    for what, d in stores:
        from ..net.storeprobe import StoreSnapshot

        snap = StoreSnapshot.from_dict(d)
        keys = "\n".join(f"{k} = {v}" if v else k for k, v in snap.keys.items())
        out.append(f'<details><summary>what {what} held: {esc("; ".join(snap.lines()))}'
                   f'</summary><pre>{esc(keys)}</pre></details>')


def _shown_env(k: str, v: Any) -> str:
    """One environment value as text; the ranks' torch one line per distinct answer (what the
    ranks said from inside: version, where torch lies, their interpreter)."""
    if k == "ranks_torch" and isinstance(v, list):
        return "; ".join(f"torch {one.get('torch')} at {one.get('torch_path')}"
                         + (f" (python {one['python']})" if one.get("python") else "")
                         for one in v if isinstance(one, dict))
    return str(v)


def _env_html(env: Dict[str, Any]) -> str:
    rows = [[esc(k), esc(_shown_env(k, v))] for k, v in env.items() if k != "env"]
    out = _table(["", ""], rows, "env")
    envvars = env.get("env") or {}
    if envvars:
        out += "<h3>Environment variables</h3>" + _table(
            ["name", "value"], [[esc(k), esc(v)] for k, v in envvars.items()])
    else:
        out += '<p class="muted">no TORCH_*, NCCL_*, GLOO_*, MASTER_* ... variables were set</p>'
    return out


def render(report: Dict[str, Any]) -> str:
    """The report as one HTML document (a string)."""
    cases = report.get("cases", [])
    env = report.get("environment") or {}
    summ = report.get("summary") or {}
    title = f"torchdist-harness report · torch {env.get('torch', '?')}"
    counts = " ".join(f'{_badge(s)} {summ.get(s, 0)}' for s in
                      ("passed", "failed", "error", "skipped"))
    rows = []
    for i, c in enumerate(cases):
        rk = ", ".join(f"{r.get('label')}: {_rank_outcomes(c, r)}" for r in c.get("ranks", []))
        rows.append([str(i + 1), f'<a href="#case-{i}">{esc(c.get("test_id") or c.get("id"))}'
                     f'</a><div class="fam">{esc(c.get("file"))}</div>', _badge(c.get("status")),
                     _outcome(c.get("job")) if c.get("job") else "", rk or esc(c.get("reason")),
                     _dur(c.get("duration"))])
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}</style><script>{SCRIPT}</script></head><body>",
        f"<header><h1>{esc(title)}</h1><div class=\"meta\">{esc(report.get('tool'))} · "
        f"{esc(report.get('created'))} · from {esc(report.get('source'))} · "
        f"{summ.get('total', len(cases))} scenario case{'s' * (summ.get('total', len(cases)) != 1)}"
        + (f" in {report['duration']:.1f} s" if report.get("duration") else "")
        + f" · kernel {esc(env.get('kernel'))} · Python {esc(env.get('python'))}</div></header>",
        "<main>", f'<p class="counts">{counts}</p>',
    ]
    if report.get("collect_errors"):
        parts.append("<h2>Scenario files that could not be loaded</h2>" + "".join(
            f"<pre>{esc(e.get('file'))}\n{esc(e.get('message'))}</pre>"
            for e in report["collect_errors"]))
    parts.append("<h2>Summary</h2>" + _table(["#", "case", "status", "job", "ranks", "duration"],
                                             rows, "summary"))
    parts += [case_html(i, c) for i, c in enumerate(cases)]
    parts.append('<h2 id="environment">Environment</h2>' + _env_html(env))
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"


def write_html(report: Dict[str, Any], path: Union[str, Path]) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render(report), encoding="utf-8")
    return p


# -- two runs side by side (harness compare) -----------------------------------------------------

COMPARE_CSS = """
main { max-width: none; }
.sides { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; align-items: start; }
.sides > div { min-width: 0; overflow-x: auto; border: 1px solid #ddd; padding: 4px 8px; }
.sides h4 { margin: 4px 0; }
tr.changed td { background: #fdecea; }
.missing { color: #888; font-style: italic; }
"""


def render_compare(a: Dict[str, Any], b: Dict[str, Any], res: Any, a_name: str, b_name: str,
                   how_sure: str = "") -> str:
    """Two session reports side by side: the behaviour changes first (``res``, a
    :class:`harness.reports.diff.DiffResult`), then every case with side A's record left and
    side B's right (each as the single-report page shows it: timeline, ranks, causes, stacks)."""
    changed = set(res.changed_cases)
    title = (f"torchdist-harness compare · {len(res.changes)} behaviour change"
             f"{'s' * (len(res.changes) != 1)}")
    head = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}{COMPARE_CSS}</style><script>{SCRIPT}</script>"
        "</head><body>",
        f"<header><h1>{esc(title)}</h1><div class=\"meta\">A: {esc(a_name)} "
        f"({esc(a.get('tool'))}) · B: {esc(b_name)} ({esc(b.get('tool'))})</div></header>",
        "<main>"]
    if how_sure:
        head.append(f'<p class="muted">{esc(how_sure)}</p>')
    if res.environment:
        head.append("<h2>Environment differences (context, not counted)</h2>" + _table(
            ["", "A", "B"], [[esc(e["key"]), esc(e["old"]), esc(e["new"])]
                             for e in res.environment]))
    ids = [c["id"] for c in a.get("cases", [])]
    ids += [c["id"] for c in b.get("cases", []) if c["id"] not in set(ids)]
    anchor = {cid: f"pair-{i}" for i, cid in enumerate(ids)}
    if res.changes:
        rows = [[f'<a href="#{anchor.get(c.case, "")}">{esc(c.case)}</a>', esc(c.rank or ""),
                 esc(c.kind), esc(c.old), esc(c.new), esc(c.note)] for c in res.changes]
        head.append("<h2>Behaviour changes</h2>" + _table(
            ["case", "rank", "change", "A", "B", "note"], rows, "changes"))
    else:
        head.append(f"<h2>No behaviour change</h2><p>{res.compared} cases compared.</p>")
    if res.within:
        rows = [[esc(c.case), esc(c.rank or ""), esc(c.kind), esc(c.old), esc(c.new),
                 esc(c.note)] for c in res.within]
        head.append("<details><summary>not counted: differences inside what the scenarios "
                    "declare may vary</summary>" + _table(
                        ["case", "rank", "change", "A", "B", "note"], rows) + "</details>")
    acases = {c["id"]: c for c in a.get("cases", [])}
    bcases = {c["id"]: c for c in b.get("cases", [])}
    body = []
    for i, cid in enumerate(ids):
        mark = " ✗ changed" if cid in changed else ""
        cols = []
        for side, cases, k in (("A", acases, 2 * i), ("B", bcases, 2 * i + 1)):
            c = cases.get(cid)
            inner = case_html(k, c) if c is not None else \
                f'<p class="missing">not in side {side}\'s report</p>'
            cols.append(f"<div><h4>{side}</h4>{inner}</div>")
        body.append(f'<section id="{anchor[cid]}"><h2>{esc(cid)}{esc(mark)}</h2>'
                    f'<div class="sides">{"".join(cols)}</div></section>')
    env = "<h2>Environments</h2><div class=\"sides\">" + "".join(
        f"<div><h4>{side}</h4>{_env_html(r.get('environment') or {})}</div>"
        for side, r in (("A", a), ("B", b))) + "</div>"
    return "\n".join(head + body + [env, "</main></body></html>"]) + "\n"


def write_compare_html(a: Dict[str, Any], b: Dict[str, Any], res: Any, a_name: str,
                       b_name: str, how_sure: str, path: Union[str, Path]) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_compare(a, b, res, a_name, b_name, how_sure), encoding="utf-8")
    return p


# -- harness preflight ----------------------------------------------------------------------------

PREFLIGHT_CSS = """
td.pass { color: #2e7d32; font-weight: bold; } td.fail { color: #c62828; font-weight: bold; }
table.matrix td { text-align: center; } td.ok { background: #e8f5e9; }
td.bad { background: #fdecea; } td.self { background: #f5f5f5; }
"""


def render_preflight(report: Dict[str, Any]) -> str:
    """A ``harness preflight`` report (``harness.tools.preflight.judge``) as one HTML document: the
    per-node table (verdict and reasons), the reachability matrix, the versions, and the
    collective's verdict per node with the stacks of a hang."""
    rows = report.get("nodes", [])
    nodes = [r["node"] for r in rows]
    bad = [r["node"] for r in rows if not r.get("ok")]
    title = (f"torchdist-harness preflight · {len(nodes) - len(bad)}/{len(nodes)} nodes pass"
             + (f" · flagged: {', '.join(bad)}" if bad else ""))
    table = [[esc(r["node"]),
              f'<span class="{"pass" if r.get("ok") else "fail"}">'
              f'{"PASS" if r.get("ok") else "FAIL"}</span>',
              esc(", ".join(r.get("resolves_to") or []) or "-"), esc(r.get("gloo") or "-"),
              esc(r.get("nccl") or "-"), _outcome(r.get("collective")),
              ("<br>".join(esc(x) for x in r.get("reasons") or []) or "all checks passed")
              + "".join(f'<div class="muted">note: {esc(x)}</div>'
                        for x in r.get("notes") or [])]
             for r in rows]
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{esc(title)}</title><style>{CSS}{PREFLIGHT_CSS}</style></head><body>",
        f"<header><h1>{esc(title)}</h1><div class=\"meta\">"
        + (f"wall {report['wall_s']:.1f} s" if report.get("wall_s") is not None else "")
        + "</div></header><main>",
        "<h2>Nodes</h2>" + _table(["node", "verdict", "its name resolves to", "gloo iface/addr",
                                   "NCCL iface", "all_reduce", "reasons"], table, "summary")]
    # the matrix: row = who dials, column = whose ports
    reach = report.get("reach") or {}
    mrows = []
    for src in nodes:
        cells = [f"<b>{esc(src)}</b>"]
        for dst in nodes:
            if src == dst:
                cells.append('<td class="self">-')
                continue
            got = [(k, (reach.get(src) or {}).get("reach", {}).get(f"{dst} {k}"))
                   for k in ("master", "ephemeral")]
            txt = " ".join(f"{k}: {'ok' if v and v.get('ok') else 'FAIL' if v else '?'}"
                           for k, v in got)
            errs = "; ".join(str(v.get("error")) for _, v in got if v and not v.get("ok"))
            ok = all(v and v.get("ok") for _, v in got)
            cells.append(f'<td class="{"ok" if ok else "bad"}" title="{esc(errs)}">{esc(txt)}')
        mrows.append(cells)
    head = "".join(f"<th>{esc(h)}</th>" for h in ["dials \u2192", *nodes])
    body = "".join("<tr><td>" + cells[0] + "</td>" + "".join(c + "</td>" for c in cells[1:])
                   + "</tr>" for cells in mrows)
    parts.append("<h2>Reachability (master port and an ephemeral port)</h2>"
                 f'<table class="matrix"><thead><tr>{head}</tr></thead><tbody>{body}'
                 "</tbody></table>")
    keys = ["python", "torch", "cuda", "nccl", "executable"]
    parts.append("<h2>Versions</h2>" + _table(
        ["node", *keys], [[esc(r["node"]), *[esc((r.get("versions") or {}).get(k) or "-")
                                             for k in keys]] for r in rows]))
    crow = []
    for r in rows:
        c = (report.get("results") or {}).get(r["node"], {}).get("collective") or {}
        crow.append([esc(r["node"]), _outcome(c.get("verdict")), esc(c.get("reason")),
                     _dur(c.get("s"))])
    parts.append("<h2>init_process_group + all_reduce</h2>"
                 + _table(["node", "verdict", "reason", "took"], crow))
    for r in rows:
        if r.get("stacks"):
            parts.append(f"<h3>Stacks of {esc(r['node'])} (hang)</h3><pre>{esc(r['stacks'])}"
                         "</pre>")
    parts.append("</main></body></html>")
    return "\n".join(parts) + "\n"


def write_preflight_html(report: Dict[str, Any], path: Union[str, Path]) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render_preflight(report), encoding="utf-8")
    return p
