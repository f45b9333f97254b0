"""``harness show`` (a scenario's expanded run plan, as the harness would run it here, with
where the job's store is) and ``harness explain`` (the diagnosis of a kept run: a line of cause
per row with its evidence, what the stores held, the hung rows' stacks grouped)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List

from ..core.errors import UsageError
from .common import _console, _text


def plan_for_show(scn: Any) -> Dict[str, Any]:
    """The scenario's RunPlan as a dict, with real ports reserved (and released) from the
    harness's range and an example run directory."""
    from ..machine.ports import PortLease
    from ..machine.rundir import base_dir
    from ..run.plan import make_plan

    base = base_dir()
    try:
        from ..net import topology
        can_netns = not topology.missing()
    except ImportError:
        can_netns = False
    with PortLease() as lease:
        try:
            plan = make_plan(scn, str(base / "run-example0"), lease.take, netns=can_netns,
                             run_id="example0")
        except TypeError:   # a plan module without namespaces
            plan = make_plan(scn, str(base / "run-example0"), lease.take)
    return plan.to_dict()


def _kv(d: Dict[str, Any]) -> str:
    return "\n".join(f"{k}={v}" for k, v in d.items())


def cmd_show(args: argparse.Namespace) -> int:
    from ..scenario.loader import ScenarioFileError, load_file

    path = Path(args.file)
    if not path.is_file():
        raise UsageError(f"{path}: no such file")
    try:
        cases = load_file(path)
    except ScenarioFileError as e:
        con = _console()
        for p in e.problems:
            con.print(_text(str(p), "red"))
        return 1
    if args.case is not None:
        chosen = [c for c in cases if c.case == args.case]
        if not chosen:
            ids = ", ".join(str(c.case) for c in cases)
            raise UsageError(f"{path}: no case {args.case!r} (cases: {ids})")
        cases = chosen
    plans = [(scn, plan_for_show(scn)) for scn in cases]
    if args.json:
        print(json.dumps([p for _, p in plans], indent=1, default=str))
        return 0
    for scn, plan in plans:
        show_plan(scn, plan)
    return 0


def add_show(sub: Any) -> None:
    """``harness show``: its options."""
    sh = sub.add_parser("show", help="the expanded run plan of a scenario",
                        description="Hosts, ranks (env, init, release), faults, every step "
                        "the faults add with when it is done and undone, deadline and "
                        "expectations, as the harness would run it here. Ports are reserved "
                        "briefly from the harness's range.")
    sh.add_argument("file", metavar="FILE", help="a scenario file")
    sh.add_argument("--case", metavar="ID", help="only this case of a file with cases:")
    sh.add_argument("--json", action="store_true", help="the plan(s) as JSON")
    sh.set_defaults(func=cmd_show)


def cmd_explain(args: argparse.Namespace) -> int:
    """The diagnosis of a kept run: one line of cause per row and the evidence it rests on,
    then the stacks of the hung rows, identical ones once ('ranks 1-7, same stack')."""
    from ..core.protocol import row_name
    from ..judge.classify import classify_run
    from ..judge.diagnose import explain_run
    from ..judge.observation import RunObservation
    from ..scenario.expect import innermost_frames, label_ranges, stack_groups

    d = Path(args.dir)
    found = sorted(d.glob("**/observation.json")) if d.is_dir() else []
    if not found:
        raise UsageError(f"{d}: no observation.json in it (give a case's evidence folder)")
    con = _console()
    for path in found:
        try:
            run = RunObservation.from_dict(json.loads(path.read_text()))
        except (ValueError, KeyError, TypeError) as e:
            raise UsageError(f"{path}: not an observation the harness wrote: {e}") from None
        verdicts = explain_run(run, classify_run(run))
        con.rule(_text(str(path.parent), "bold"))
        from ..judge.effects import event_lines
        from ..judge.effects import line as effect_line

        for eff in run.effects:   # what each fault did, with its evidence (harness.judge.effects)
            con.print(_text(effect_line(eff), "bold"))
            for ln in event_lines(eff):
                con.print(_text(f"    {ln}", "dim"))
        # rows with the same outcome, phase and cause are said once ("ranks 1-7: ..."), with
        # the first one's evidence: an 8-rank hang reads on one screen
        alike: Dict[Any, List[Any]] = {}
        for v in verdicts:
            key = (v.outcome, v.phase, v.cause) if v.cause else (v.label,)
            alike.setdefault(key, []).append(v)
        for same in alike.values():
            v = same[0]
            durs = sorted(x.duration for x in same if x.duration is not None)
            dur = "?" if not durs else f"{durs[0]:.2f} s" if durs[-1] - durs[0] < 0.005 \
                else f"{durs[0]:.2f}-{durs[-1]:.2f} s"
            who = f"ranks {label_ranges([x.label for x in same])}" if len(same) > 1 \
                else f"rank {row_name(v.label, v.claims)}" if v.role in ("rank", "worker") \
                else v.label
            con.print(_text(f"{who}: {v.outcome} at {dur} in {v.phase or '-'}"
                            + (f" - {v.cause}" if v.cause else ""), "bold"))
            for ln in v.cause_evidence:
                con.print(_text(f"    {ln}", "dim"))
            if len(same) > 1:
                con.print(_text(f"    (evidence of rank {v.label}; ranks "
                                f"{label_ranges([x.label for x in same[1:]])} have the same "
                                "cause: their own lines are in the JSON report)", "dim"))
        if run.store:
            from ..net.storeprobe import StoreSnapshot

            con.print(_text("what the store held:", "bold"))
            for ln in StoreSnapshot.from_dict(run.store).lines():
                con.print(_text(f"    {ln}", "dim"))
        for other in run.stores:
            from ..net.storeprobe import StoreSnapshot

            con.print(_text("what a store the workers hosted themselves held:", "bold"))
            for ln in StoreSnapshot.from_dict(other).lines():
                con.print(_text(f"    {ln}", "dim"))
        groups = stack_groups({v.label: v.stacks for v in verdicts if v.outcome == "hang"})
        shown = set()
        for v in verdicts:
            group = groups.get(v.label)
            if not group or group[0] in shown:
                continue
            shown.add(group[0])
            who = f"ranks {label_ranges(group)}, same stack" if len(group) > 1 \
                else f"rank {v.label}"
            con.print(_text(f"stack ({who}), innermost frames:", "bold"))
            con.print(_text("    " + innermost_frames(v.stacks).replace("\n", "\n    ")))
    return 0


def add_explain(sub: Any) -> None:
    """``harness explain``: its options."""
    ex = sub.add_parser("explain", help="the diagnosis of a kept run: one line of cause per "
                        "rank, its evidence, identical stacks grouped")
    ex.add_argument("dir", help="a case's evidence folder (holding observation.json)")
    ex.set_defaults(func=cmd_explain)


def _store_header(plan: Dict[str, Any]) -> str:
    """Where the job's store is (harness.core.jobstore), and the lease when the job does not use
    it: ``ports: master`` and the store probe mean the store's port."""
    from ..core.jobstore import JobStore

    lease = f"{plan['master_addr']}:{plan['master_port']}"
    if not plan.get("store"):
        return f"master {lease}"
    st = JobStore.from_dict(plan["store"])
    text = st.describe()
    if st.kind == "file" or st.port != plan.get("master_port"):
        text += f" · the run's leased port {plan['master_port']} is not the store's"
    for other in (plan.get("stores") or {}).values():
        text += f" · {other.get('job')}: " + JobStore.from_dict(other).describe()
    return text


def show_plan(scn: Any, plan: Dict[str, Any]) -> None:
    from rich.table import Table

    con = _console()
    con.rule(_text(scn.test_id + ("" if scn.case is None else f"  (case {scn.case})"), "bold"))
    con.print(_text(scn.about.strip(), "dim"))
    launcher = plan.get("launcher") or {"kind": "direct"}
    program = plan.get("program") or {"worker": True}
    if program.get("worker"):
        own = "".join(f", rank {r} {t:g} s" for r, t in (plan.get("rank_timeouts") or {}).items())
        work = (f"init {scn.init} · torch timeout {plan['timeout']:g} s{own} · workload "
                f"{' → '.join(plan['workload']) or '(init only)'}"
                f"{' → destroy' if plan.get('destroy') else ''}")
    else:   # a user's program: its own init, timeout and work
        work = "program " + " ".join(str(a) for a in program.get("argv", []))
    con.print(_text(
        f"backend {plan['backend']} · world_size {plan['world_size']} · launcher "
        f"{launcher.get('kind', 'direct')} · {work} · deadline {plan['deadline']:g} s (from "
        "the start line)"))
    con.print(_text(_store_header(plan) + " · ports and the run directory are examples: every "
                    "run reserves its own", "dim"))
    if plan.get("hosts"):
        t = Table(title="hosts", title_justify="left")
        for col in ("host", "address", "interface", "namespace"):
            t.add_column(col)
        for h in plan["hosts"]:
            t.add_row(_text(h["name"]), _text(h["addr"]), _text(h["ifname"]),
                      _text(h.get("netns") or "(none: this machine's network)"))
        con.print(t)
    if plan.get("notes"):
        con.print(_text("plan notes (launcher, faults):", "bold"))
        for n in plan["notes"]:
            con.print(_text(f"  • {n}"))
    t = Table(title="ranks", title_justify="left", show_lines=True)
    for col in ("rank", "host", "released", "init", "env", "unset", "user"):
        t.add_column(col, overflow="fold")
    for r in plan["ranks"] + plan.get("restarts", []):
        init = r["init"]
        how = init["method"] + (f" {init['url']}" if init.get("url") else "")
        if init.get("rank") is not None:
            how += f"\nrank={init['rank']} world_size={init['world_size']}"
        host = r.get("host", "local") + (f"\npython {r['python']}" if r.get("python") else "")
        released = "never (absent)" if r.get("absent") else \
            f"when a step starts {r['restart_of']} again" if r.get("restart_of") else "at start" \
            if r.get("release", {}) == {"at": 0.0} else str(r.get("released", ""))
        t.add_row(_text(r["label"]), _text(host), _text(released),
                  _text(how), _text(_kv(r["env"])), _text(" ".join(r.get("unset", []))),
                  _text(r.get("user") or ""))
    con.print(t)
    if plan.get("steps"):
        t = Table(title="steps (what the faults do, and when)", title_justify="left")
        for col in ("step", "does", "to", "when", "undone"):
            t.add_column(col, overflow="fold")
        for st in plan["steps"]:
            t.add_row(_text(st.get("id", "")), _text(st.get("what", "")),
                      _text(st.get("target", "")), _text(st.get("when", "")),
                      _text(st.get("undo_when") or ""))
        con.print(t)
    con.print(_text("expectations:", "bold"))
    for b in scn.expect:
        con.print(_text(f"  {b.summary()}"))
