"""``harness doctor``: what this machine can run (torch and its backends, root, the tools,
namespaces, what each scenario kind needs, py-spy and ptrace, free ports, pytest-xdist) and the
leftovers of killed runs; ``--clean`` sweeps those of dead runs."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, List

from .common import _console, _text

MARKS = ("✓", "!", "✗")   # ok, a warning, bad: the first column of the doctor's lines


def _free_ports() -> Dict[str, Any]:
    from ..machine.ports import HIGH, LOW, ephemeral_range, port_is_free

    eph_lo, eph_hi = ephemeral_range()
    hi = min(HIGH, eph_lo - 1)
    free = sum(1 for p in range(LOW, hi + 1) if port_is_free(p)) if hi >= LOW else 0
    return {"range": [LOW, hi], "free": free, "size": max(0, hi - LOW + 1),
            "ephemeral": [eph_lo, eph_hi]}


def _ptrace_ok() -> Dict[str, Any]:
    try:
        scope = int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text().strip())
    except (OSError, ValueError):
        scope = None
    caps = 0
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                caps = int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    cap_ptrace = bool(caps >> 19 & 1)
    return {"ptrace_scope": scope, "cap_sys_ptrace": cap_ptrace,
            "allowed": cap_ptrace or os.geteuid() == 0 or scope in (0, None)}


REQUIREMENTS_OK: Dict[str, str] = {}   # what having a requirement means, for the doctor's lines


def doctor_facts() -> Dict[str, Any]:
    from ..machine.rundir import leftovers
    from ..machine.torch_probe import probe

    env = dict(probe())
    facts: Dict[str, Any] = {"torch": env, "root": os.geteuid() == 0, "euid": os.geteuid()}
    from ..judge.pyspy import executable as _py_spy

    facts["tools"] = {t: shutil.which(t) for t in ("ip", "nft", "chromium")}
    facts["tools"]["py-spy"] = _py_spy()   # also the one beside this Python (a venv)
    try:
        from ..net import topology
        facts["topology_missing"] = topology.missing()
        prefix = getattr(topology, "PREFIX", "thx-")
        try:
            names = topology._list_netns()
        except Exception:  # noqa: BLE001 - only a hint for the reader
            names = []
        facts["namespaces"] = [n for n in names if n.startswith(prefix)]
    except ImportError:
        facts["topology_missing"] = ["harness.net.topology is not installed"]
        facts["namespaces"] = []
    from ..run.requirements import all_requirements

    reqs = all_requirements()
    facts["requirements"] = {r.name: r.missing() for r in reqs}
    facts["resolver_view_missing"] = facts["requirements"].get("resolver view")
    REQUIREMENTS_OK.update({r.name: r.ok for r in reqs if r.ok})
    facts["ptrace"] = _ptrace_ok()
    facts["ports"] = _free_ports()
    facts["leftovers"] = leftovers()
    from ..machine import cgroups
    facts["cgroups"] = [str(p) for p in cgroups.run_cgroups()]
    try:
        import xdist  # noqa: F401
        facts["xdist"] = True
    except ImportError:
        facts["xdist"] = False
    return facts


def _clean() -> Dict[str, List[str]]:
    """``--clean``: what was swept of dead runs (cgroups, run directories, namespaces)."""
    cleaned: Dict[str, List[str]] = {}
    from ..machine import cgroups
    from ..machine.rundir import sweep
    cleaned["cgroups"] = cgroups.sweep()   # while the run directories say which are dead
    cleaned["run directories"] = sweep()
    try:
        from ..net import topology
        if not topology.missing():
            cleaned["namespaces"] = topology.sweep()
    except ImportError:
        pass
    return cleaned


def _torch_lines(t: Dict[str, Any]) -> List[tuple]:
    """The doctor's lines on torch and its backends (``t``: the torch probe's answer)."""
    ok, warn, bad = MARKS
    lines: List[tuple] = []
    if t.get("torch") in (None, "none"):
        lines.append((bad, "torch", f"not importable by {sys.executable}: {t.get('error', '')}"))
    else:
        lines.append((ok, "torch", f"{t['torch']} (git {str(t.get('torch_git'))[:12]}) · "
                      f"Python {t.get('python')}"))
        lines.append((ok if t.get("gloo") else bad, "gloo",
                      "available" if t.get("gloo") else "missing: gloo scenarios are skipped"))
        nccl = "available" + (f" (NCCL {t['nccl_version']})" if t.get("nccl_version") else "") \
            + f", {t.get('gpus', 0)} GPU(s)" if t.get("nccl") else \
            "missing (a CPU build): nccl scenarios are skipped"
        lines.append((ok if t.get("nccl") and t.get("gpus") else warn, "nccl", nccl))
        lines.append((ok if t.get("mpi") else warn, "mpi",
                      "available" if t.get("mpi") else "not built in (not used by scenarios)"))
        lines.append((ok, "libuv store", "default" if t.get("libuv_store_default") else
                      "not the default (torch < 2.4 or USE_LIBUV=0)"))
    return lines


def _machine_lines(facts: Dict[str, Any]) -> List[tuple]:
    """The doctor's lines on the rest of the machine: root, tools, namespaces, requirements,
    py-spy, xdist, ports, leftovers."""
    ok, warn, bad = MARKS
    lines: List[tuple] = []
    lines.append((ok if facts["root"] else warn, "root", "yes" if facts["root"] else
                  f"no (euid {facts['euid']}): network scenarios are skipped"))
    for tool in ("ip", "nft"):
        p = facts["tools"][tool]
        lines.append((ok if p else warn, tool, p or "not found: apt-get install "
                      + ("nftables" if tool == "nft" else "iproute2")))
    miss = facts["topology_missing"]
    lines.append((ok if not miss else warn, "namespaces", "network scenarios can run" if not miss
                  else "network scenarios are skipped: " + "; ".join(miss)))
    # what the scenario kinds need (the faults declare it: harness.run.requirements)
    for name, why in facts["requirements"].items():
        if name == "namespaces":
            continue
        if name == "resolver view":
            text = why + ": scenarios that run in this machine's own network namespace are " \
                "skipped" if why else "ranks resolve names with the harness's hosts file, " \
                "never DNS"
        else:
            text = why + ": scenarios that need it are skipped" if why else \
                REQUIREMENTS_OK.get(name, "available")
        lines.append((ok if not why else warn, name, text))
    spy, pt = facts["tools"]["py-spy"], facts["ptrace"]
    if spy and pt["allowed"]:
        lines.append((ok, "py-spy", f"{spy}: native stacks of hung ranks are captured"))
    elif spy:
        lines.append((warn, "py-spy", f"{spy}, but ptrace is not permitted (ptrace_scope "
                      f"{pt['ptrace_scope']}, no CAP_SYS_PTRACE): no native stacks"))
    else:
        lines.append((warn, "py-spy", "not found (pip install py-spy): hung ranks get Python "
                      "stacks only"))
    lines.append((ok if facts["xdist"] else warn, "pytest-xdist", "installed (-n N works)"
                  if facts["xdist"] else "not installed: `harness run -n` is unavailable"))
    pr = facts["ports"]
    lines.append((ok if pr["free"] > 100 else bad, "ports",
                  f"{pr['free']} of {pr['size']} free in {pr['range'][0]}..{pr['range'][1]} "
                  f"(below the ephemeral range {pr['ephemeral'][0]}..{pr['ephemeral'][1]})"))
    left = facts["leftovers"]
    lines.append((ok if not left else warn, "leftovers",
                  "none" if not left else f"{len(left)} run directories of dead runs "
                  "(`harness doctor --clean` removes them)"))
    if facts["namespaces"]:
        lines.append((warn, "namespaces", f"{len(facts['namespaces'])} harness namespaces exist "
                      "(live runs keep theirs; --clean removes those of dead runs)"))
    if facts["cgroups"]:
        lines.append((warn, "cgroups", f"{len(facts['cgroups'])} harness cgroups exist (live "
                      "runs keep theirs; --clean removes those of dead runs)"))
    return lines


def cmd_doctor(args: argparse.Namespace) -> int:
    con = _console()
    cleaned = _clean() if args.clean else {}
    facts = doctor_facts()
    if args.json:
        print(json.dumps({**facts, "cleaned": cleaned}, indent=1, default=str))
        return 0 if facts["torch"].get("torch") not in (None, "none") else 1
    t = facts["torch"]
    ok, warn, bad = MARKS
    lines = _torch_lines(t) + _machine_lines(facts)
    left = facts["leftovers"]
    from rich.table import Table

    tab = Table(show_header=False, box=None)
    tab.add_column("")
    tab.add_column("", style="bold")
    tab.add_column("", overflow="fold")
    style = {ok: "green", warn: "yellow", bad: "bold red"}
    for mark, name, text in lines:
        tab.add_row(_text(mark, style[mark]), _text(name), _text(text))
    con.print(tab)
    for p in left:
        con.print(_text(f"  leftover: {p}", "dim"))
    for what, items in cleaned.items():
        con.print(_text(f"cleaned {what}: {', '.join(items) if items else 'nothing to clean'}"))
    return 0 if t.get("torch") not in (None, "none") else 1


def add_doctor(sub: Any) -> None:
    """``harness doctor``: its options."""
    doc = sub.add_parser("doctor", help="what this machine can run; leftovers of killed runs")
    doc.add_argument("--clean", action="store_true", help="remove leftovers of dead runs "
                     "(run directories, their processes, network namespaces)")
    doc.add_argument("--json", action="store_true", help="machine-readable output")
    doc.set_defaults(func=cmd_doctor)
