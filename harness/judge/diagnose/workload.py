"""Rules of what the rank was told and what its program did: torch refusing the set-up or a
call, a program that exited on its own, DDP's checks, collectives out of step or missed by a
faulted peer, groups that disagree, a re-init that met the old store."""

from __future__ import annotations

import re
from typing import Dict, Optional, Tuple

from ..observation import RankObservation
from ._core import Cause, RankContext, _exc_line, _first_line, rule
from ._shared import CLOSED, _job, _starved


@rule(order=340, evidence=("info",))
def program_exited(c: RankContext) -> Optional[Cause]:
    """A program that ended with a non-zero status of its own accord (sys.exit, no exception
    from torch): the program is the cause."""
    v, o = c.verdict, c.obs
    # an observed program (it said hello: torchrun's workers, a program started directly), not
    # the harness's own worker
    observed = bool(o.info) or any(e.ev == "hello" for e in o.events) if o is not None else False
    if o is None or v.outcome != "error" or v.exception or not observed \
            or not re.match(r"exited with status \d+$", v.reason or ""):
        return None
    return Cause(f"the program itself {v.reason} in {v.phase or 'its own code'} (it raised no "
                 "exception through torch)", [v.reason])


@rule(order=350, evidence=("exception",))
def ddp_params_differ(c: RankContext) -> Optional[Cause]:
    """DDP's check at construction: this process's parameters differ from rank 0's."""
    m = re.search(r"params\[\d+\] in this process with sizes \[[^\]]*\] appears not to match "
                  r"sizes of the same param in process \d+", c.verdict.message or "")
    if m is None:
        n = re.search(r"Rank (\d+) has (\d+) params, while rank (\d+) has inconsistent (\d+) "
                      r"params", c.verdict.message or "")
        if n is None:
            return None
        return Cause(f"the model differs between ranks: rank {n.group(1)} has {n.group(2)} "
                     f"parameters, rank {n.group(3)} has {n.group(4)} (DDP's check at "
                     "construction)", [_exc_line(c.verdict)])
    return Cause(f"the model differs between ranks: {m.group(0)}", [_exc_line(c.verdict)])


@rule(order=360, evidence=("exception",))
def ddp_unused_parameters(c: RankContext) -> Optional[Cause]:
    """DDP's reducer found that the previous step's reduction never finished: some parameters
    took no part in this rank's loss (a module skipped in forward) without
    find_unused_parameters=True."""
    msg = c.verdict.message or ""
    if "Expected to have finished reduction in the prior iteration" not in msg:
        return None
    idx = re.search(r"Parameter indices which did not receive grad for rank (\d+): ([\d ]+)", msg)
    which = f" (parameters {idx.group(2).strip()} got no gradient on rank {idx.group(1)})" \
        if idx else ""
    return Cause("DDP's previous step never finished its reduction: some parameters took no "
                 f"part in this rank's loss{which}, a module its forward skipped, and the model "
                 "was wrapped without find_unused_parameters=True", [_exc_line(c.verdict)])


CONFIG_EXC = ("ValueError", "AssertionError", "TypeError", "KeyError")
CONFIG_MSG = re.compile(r"doesn't have \w+ built in|No rendezvous handler|"
                        r"Unknown (?:c10d )?backend|enforce fail at \S*gloo/context\.cc|"
                        r"must have value from|cannot be 0|"
                        r"Duplicate device type|No device associated", re.I)
ENV_MISSING = re.compile(r"environment variable (\w+) expected, but not set")
NOT_INT = re.compile(r"invalid literal for int\(\) with base 10: '([^']*)'")
GLOO_RANK_CHECK = re.compile(r"gloo/context\.cc:\d+\] (rank [<>]=? ?\w+)\. (-?\d+) vs (-?\d+)")


@rule(order=30, evidence=("exception", "plan"))
def torch_refused_the_setup(c: RankContext) -> Optional[Cause]:
    """init_process_group (or importing torch.distributed) refused what the rank was given: a
    missing or malformed variable, an unknown backend or scheme, a rank out of range. torch's
    own message says which; the rule names the variable when it can."""
    v = c.verdict
    if v.outcome != "error" or v.phase not in ("import", "init") or v.role not in (
            "rank", "worker"):
        return None
    cls = (v.exception or "").rsplit(".", 1)[-1]
    if cls not in CONFIG_EXC and not CONFIG_MSG.search(v.message or ""):
        return None
    msg = _first_line(v.message)
    env = c.env(v.label)
    text = f"torch refused the set-up in {v.phase}: {msg}"
    m = ENV_MISSING.search(msg)
    n = NOT_INT.search(msg)
    g = GLOO_RANK_CHECK.search(v.message or "")
    if m is not None:
        text = f"torch refused the set-up: {m.group(1)} was not set for this rank " \
            f"(init_method env:// needs MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE)"
    elif n is not None:
        which = [k for k, val in env.items() if val == n.group(1)]
        if which:
            text = f"torch refused the set-up: {which[0]}={n.group(1)!r} is not a number"
    elif g is not None:
        text = f"torch refused the set-up: gloo's check {g.group(1)} failed ({g.group(2)} vs " \
            f"{g.group(3)}): RANK={env.get('RANK', g.group(2))} is outside WORLD_SIZE=" \
            f"{env.get('WORLD_SIZE', g.group(3) if 'size' in g.group(1) else '?')}"
    return Cause(text, [_exc_line(v)])


COLLECTIVE_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (recv|send) operation|"
                                r"Application timeout caused pair closure|"
                                r"failed to pass monitoredBarrier|received errors while waiting "
                                r"for send/recv from rank", re.I)


@rule(order=590, evidence=("exception", "plan", "steps"))
def a_peer_missed_the_collective(c: RankContext) -> Optional[Cause]:
    """A collective timed out in gloo (or in monitored_barrier) while a peer, by the scenario's
    own faults, was sleeping in that step or skipped it."""
    v = c.verdict
    if v.outcome not in ("timeout", "error") or not COLLECTIVE_TIMEOUT.search(v.message or ""):
        return None
    why = []
    for rp in c.run.plan.get("ranks", []):
        label = str(rp.get("label"))
        if label == v.label or rp.get("role", "rank") not in ("rank", "worker"):
            continue
        var = rp.get("variation") or {}
        slow = (var.get("slow_at") or {}).get(v.phase)
        if slow:
            why.append(f"rank {label} slept {float(slow):g} s in {v.phase} (the scenario's "
                       "slow_rank fault)")
        elif v.phase in (var.get("skip") or []):
            why.append(f"rank {label} skipped this collective (the scenario's skip_collective "
                       "fault)")
        elif var.get("skip"):
            why.append(f"rank {label} skipped its collective in {', '.join(var['skip'])} (the "
                       "scenario's skip_collective fault): from there on the ranks' "
                       "collectives paired out of step")
        else:
            starved = next((st for st in c.run.step_log if st.fault == "cpu_contention"
                            and st.target == f"rank {label}"), None)
            if starved is not None:
                why.append(f"rank {label} was starved of CPU (the scenario's cpu_contention "
                           f"fault: {starved.what})")
    own = (c.plan_rank(v.label).get("variation") or {}).get("skip")
    if not why and (starved := _starved(c, v.label)) is not None:
        why.append(f"this rank was starved of CPU (the scenario's cpu_contention fault: "
                   f"{starved.what})")
    if not why and own:
        why.append(f"this rank skipped its collective in {', '.join(own)} (the scenario's "
                   "skip_collective fault): its later collectives paired with the others' "
                   "earlier ones")
    if not why:
        return None
    m = re.search(r"(\d+)ms", v.message or "")
    waited = f" after {int(m.group(1)) / 1000:g} s" if m else ""
    if not m and re.search(r"Application timeout caused pair closure", v.message or "") and \
            c.run.plan.get("timeout"):
        # gloo's other wording of the same wait: the pair's own timeout, the group's
        waited = f" after {float(c.run.plan['timeout']):g} s"
    return Cause(f"its collective in {v.phase} timed out{waited}: " + "; ".join(why),
                 [_exc_line(v)])


def _collective_ops(o: Optional[RankObservation]) -> Dict[int, str]:
    """A program's collectives as the observer saw them: their number -> the call's name."""
    out: Dict[int, str] = {}
    for e in (o.events if o is not None else []):
        m = re.fullmatch(r"collective (\d+)", str(e.data.get("phase") or "")) \
            if e.ev == "phase" else None
        if m and e.data.get("op"):
            out[int(m.group(1))] = str(e.data["op"])
    return out


@rule(order=600, evidence=("events",))
def collectives_out_of_step(c: RankContext) -> Optional[Cause]:
    """A program whose ranks called different collectives at the same point (a rank-dependent
    branch: ``if rank == 0: dist.barrier()``): gloo pairs them out of step, and the one left
    waiting times out or hangs."""
    v = c.verdict
    m = re.fullmatch(r"collective (\d+)", v.phase or "")
    if m is None or v.outcome not in ("timeout", "hang", "error"):
        return None
    n = int(m.group(1))
    mine = _collective_ops(c.obs)
    for k in range(1, n + 1):
        calls = {}
        for o in c.run.ranks:
            if o.role in ("rank", "worker") and _job(o.label) == _job(v.label):
                op = _collective_ops(o).get(k)
                if op is not None:
                    calls[o.label] = op
        if len(set(calls.values())) > 1 and v.label in calls:
            said = ", ".join(f"rank {lb} {op}" for lb, op in sorted(calls.items()))
            return Cause(f"the ranks called different collectives at their collective {k} "
                         f"({said}: a rank-dependent branch in the program): gloo paired them out "
                         f"of step, and this rank's {mine.get(n, 'collective')} in collective "
                         f"{n} {'hung' if v.outcome == 'hang' else 'never completed'}",
                         [_exc_line(v) if v.exception else v.reason])
    return None


def _last_step(o: Optional[RankObservation]) -> Tuple[str, str]:
    """(phase, workload step) of a row's last phase event: ("workload step 3", "reinit")."""
    if o is None:
        return "", ""
    ph = [e for e in o.events if e.ev == "phase"]
    if not ph:
        return "", ""
    return str(ph[-1].data.get("phase") or ""), str(ph[-1].data.get("step") or "")


@rule(order=320, evidence=("exception", "events", "plan", "verdicts"))
def reinit_on_the_old_store(c: RankContext) -> Optional[Cause]:
    """A rank that failed in its ``reinit`` step (destroy_process_group, then
    init_process_group on the same MASTER_PORT): its new client reached the old store as it went
    away, or the new group read the old group's keys from a store the program kept."""
    v = c.verdict
    phase, step = _last_step(c.obs)
    phases = [e.data for e in (c.obs.events if c.obs else []) if e.ev == "phase"]
    steps = [str(d.get("step") or "") for d in phases]
    port = c.env(v.label).get("MASTER_PORT", "")
    if not step.startswith("reinit") and len(steps) >= 2 and steps[-2] == "reinit" \
            and v.outcome == "error" and CLOSED.search(v.message or ""):
        # its re-init went through at once: on the old store (or the one the program kept),
        # the old group's keys, and pairs to the peer's old group, still open until the peer's
        # destroy closed them, while the peer stayed in its own re-init
        stuck = [o for o in c.run.ranks if o.label != v.label
                 and _last_step(o)[1] == "reinit"
                 and (c.verdict_of(o.label) or v).outcome in ("timeout", "hang")]
        if stuck:
            who = f"rank {stuck[0].label}" if stuck[0].label.isdigit() else stuck[0].label
            before = str(phases[-2].get("phase") or "")
            if "keep_store" in steps:
                return Cause(f"in its re-init ({before}) the new group read the old group's "
                             "gloo addresses from the store the program kept across the "
                             f"destroy (keep_store): its pairs joined {who}'s old group, "
                             f"which {who}'s destroy closed, so its next collective ({phase}) "
                             f"failed, while {who} stayed in its own re-init", [_exc_line(v)])
            return Cause(f"in its re-init ({before}) its client reached the old store on "
                         f"MASTER_PORT {port} before {who}'s destroy closed it, and the new "
                         "group read the old group's gloo addresses there: its pairs joined "
                         f"{who}'s old group, whose destroy closed them, so its next "
                         f"collective ({phase}) failed, while {who}'s new store waited for it",
                         [_exc_line(v)])
    if not step.startswith("reinit") or "new_port" in step:
        return None
    if "keep_store" in steps and re.search(r"connect ?timeout|connection refused|"
                                           r"connectFullMesh", v.message or "", re.I):
        return Cause(f"in its re-init ({phase}) the new group read the old group's gloo "
                     "addresses from the store the program kept across the destroy "
                     "(keep_store): it dialled pairs nobody listens on any more",
                     [_exc_line(v)])
    peers_reinit = any(_last_step(o)[1].startswith("reinit") for o in c.run.ranks
                       if o.label != v.label)
    if peers_reinit and re.search(r"connect ?timeout|connection refused|connectFullMesh",
                                  v.message or "", re.I):
        # no store kept, every rank re-initialising: the new client still reached the old store
        # (rank 0's destroy had not yet closed it), whose keys under the reset group prefix
        # are the old group's (a rank that re-initialises alone is out of step instead)
        return Cause(f"in its re-init ({phase}) its client reached the old store on "
                     f"MASTER_PORT {port} before rank 0's destroy closed it, and the new group "
                     "read the old group's gloo addresses there: it dialled pairs nobody "
                     "listens on any more", [_exc_line(v)])
    if v.outcome == "error" and CLOSED.search(v.message or ""):
        return Cause(f"in its re-init ({phase}) it dialled MASTER_PORT {port} again while the "
                     "old store on that port was going away (rank 0's destroy of the old "
                     "group): the connection was closed under it", [_exc_line(v)])
    return None


@rule(order=640, evidence=("plan",))
def groups_disagree(c: RankContext) -> Optional[Cause]:
    """A hang in a workload step (new_group, a collective) while another rank, by the
    scenario's fault, never calls that step or makes its steps in another order: a deadlock."""
    v = c.verdict
    if v.outcome not in ("hang", "timeout") or not (v.phase or "").startswith("workload step"):
        return None
    plan_steps = list(c.run.plan.get("workload") or [])
    why = []
    own = (c.plan_rank(v.label).get("variation") or {}).get("steps")
    if own and list(own) != plan_steps:
        return Cause(f"this rank makes its steps in another order ({', '.join(map(str, own))} "
                     f"against {', '.join(map(str, plan_steps))}: the scenario's rank_workload "
                     f"fault): in {v.phase} it waits for ranks that are in another step",
                     [v.reason if not v.exception else _exc_line(v)])
    for rp in c.run.plan.get("ranks", []):
        label = str(rp.get("label"))
        if label == v.label or rp.get("role", "rank") not in ("rank", "worker"):
            continue
        var = rp.get("variation") or {}
        if v.phase in (var.get("skip") or []):
            n = int(v.phase.rsplit(" ", 1)[1])
            step = plan_steps[n - 1] if 0 < n <= len(plan_steps) else v.phase
            why.append(f"rank {label} never called {step} (the scenario's skip_collective "
                       "fault)")
        elif var.get("steps") and list(var["steps"]) != plan_steps:
            mine, theirs = ", ".join(map(str, var["steps"])), ", ".join(map(str, plan_steps))
            why.append(f"rank {label} makes its steps in another order ({mine} against "
                       f"{theirs}: the scenario's rank_workload fault)")
    if not why:
        return None
    return Cause(f"waiting in {v.phase} for a peer that will not come: " + "; ".join(why),
                 [v.reason if not v.exception else _exc_line(v)])


@rule(order=630, evidence=("exception",))
def torch_refused_the_call(c: RankContext) -> Optional[Cause]:
    """torch refused a call of the workload (split_group without a device, ...) at once."""
    v = c.verdict
    if v.outcome != "error" or not (v.phase or "").startswith("workload step") or \
            not CONFIG_MSG.search(v.message or ""):
        return None
    return Cause(f"torch refused the call in {v.phase}: {_first_line(v.message)}",
                 [_exc_line(v)])
