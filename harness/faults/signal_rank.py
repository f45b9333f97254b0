"""kill_rank and stop_rank: a signal to a rank at a time or when it enters a phase.

kill_rank sends any signal by name: the fatal ones (KILL, TERM, SEGV...) and the ones a
launcher or a scheduler sends to a live job (USR1 as Slurm's ``--signal``, CHLD, HUP...);
the rank meets it as any program would (its default action, or the program's handler).

kill_rank's ``restart_after``: the killed process is started again that many seconds after it
ended, as a Ctrl-C'd node is started again by hand (a torchrun agent rejoining an elastic
job): a copy of the process the launcher started (same argv, environment and host), always a
fresh interpreter, its own row ``LABEL#2`` (``#3`` for a restart of that one). Only what the
harness starts itself can be started again (a rank under ``direct``, an agent, a spawning
parent); the run goes on while a restart is due, until the deadline at most.
"""

import signal as _signal
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Literal, Optional

from pydantic import Field, field_validator

from ..core.limits import Seconds
from ..core.protocol import ENDED, EVERY_RANK, STACK_SIGNAL, parse_label
from ..core.triggers import Trigger, When
from ..ranks.workload import phase_problem
from . import Fault, Target
from .steps import Effect, Step


@dataclass
class Signal(Step):
    """SIG<signal> to a rank's process group (recorded on the rank as evidence); its undo, for
    a heal, sends ``heal_signal`` (SIGCONT after SIGSTOP). It fires only once the rank was
    released, and never after it ended."""

    rank: str = ""
    signal: str = "KILL"
    heal_signal: Optional[str] = None
    UNDO_AT_TEARDOWN: ClassVar[bool] = False   # the ranks are killed at the end anyway
    # what was sent, to which pid, and whether that pid was alive then (the effect's evidence)
    _sent: List[Dict[str, Any]] = field(default_factory=list, init=False, repr=False,
                                        compare=False)

    def can_fire(self, rt):
        try:
            r = rt.rank(self.rank)
        except KeyError:   # a worker an agent has not started yet
            return False
        return r.released and not r.ended

    def do(self, rt):
        r = rt.rank(self.rank)
        self._send(rt, r, self.signal)
        return {"pid": r.pid, "alive": self._sent[-1]["alive"]}

    def _send(self, rt, r, name: str) -> None:
        pid = r.pid
        state = proc_state(pid)
        # "gone": not on this machine's /proc (a rank on an allocation's node): the supervisor's
        # word that it has not ended is all there is
        alive = pid is not None and not r.ended and state not in ("Z", "X")
        r.signal(name)
        self._sent.append({"t": round(rt.now(), 3), "signal": name, "pid": pid,
                           "alive": alive, "state": state})

    def undo(self, rt):
        if self.heal_signal:
            try:
                r = rt.rank(self.rank)
            except KeyError:
                return
            if not r.ended:
                self._send(rt, r, self.heal_signal)

    def effect(self, rt):
        first = self._sent[0]
        try:
            r = rt.rank(self.rank)
        except KeyError:
            r = None
        obs = getattr(r, "obs", None)
        end = ""
        if obs is not None and obs.ended_at is not None:
            rc = obs.returncode
            how = "" if rc is None else (f", killed by {_signal.Signals(-rc).name}"
                                         if rc < 0 and -rc in _SIGNUMS else f", exit code {rc}")
            end = f"; it ended at {obs.ended_at:.2f} s{how}"
        state = f", state {first['state']}" if first["state"] not in (None, "gone") else ""
        alive = "alive" if first["alive"] else "not alive"
        events = [{"t": s["t"], "what": f"SIG{s['signal']} to pid {s['pid']} "
                                        f"({'alive' if s['alive'] else 'not alive'})"}
                  for s in self._sent]
        if obs is not None and obs.ended_at is not None:
            events.append({"t": obs.ended_at, "what": f"{_who(self.rank)} ended{how}"})
        return Effect(acted=bool(first["alive"]),
                      summary=f"SIG{first['signal']} delivered to pid {first['pid']} ({alive}"
                              f"{state}) at {first['t']:.2f} s{end}",
                      numbers={"pid": first["pid"], "signals": len(self._sent)},
                      events=events)

    def describe(self):
        return f"SIG{self.signal} to {_who(self.rank)}"


@dataclass
class Restart(Step):
    """kill_rank's restart_after: the killed process ``rank`` started again as the row
    ``label`` (the plan's copy of it, ``RunPlan.restarts``), ``delay`` s after it ended (the
    trigger); only once the kill (step ``kill``) was sent. Until it fires the run is held open
    (the other rows may all have ended)."""

    rank: str = ""
    label: str = ""
    kill: str = ""
    UNDO_AT_TEARDOWN: ClassVar[bool] = False   # the restarted process dies with the run
    _started: Dict[str, Any] = field(default_factory=dict, init=False, repr=False,
                                     compare=False)

    def can_fire(self, rt):
        return rt.step_done(self.kill) is not None

    def holds_run(self, rt):
        return rt.step_done(self.kill) is not None

    def do(self, rt):
        ended = getattr(getattr(rt.rank(self.rank), "obs", None), "ended_at", None)
        row = rt.restart(self.label)
        self._started = {"t": round(rt.now(), 3), "pid": row.pid, "ended": ended}
        return {"pid": row.pid, "restart_of": self.rank}

    def effect(self, rt):
        st = self._started
        after = f", {st['t'] - st['ended']:.2f} s after it ended at {st['ended']:.2f} s" \
            if st.get("ended") is not None else ""
        events = [{"t": st["t"], "what": f"{_who(self.rank)} started again as {self.label} "
                                         f"(pid {st['pid']})"}]
        end = ""
        try:
            obs = getattr(rt.rank(self.label), "obs", None)
        except KeyError:
            obs = None
        if obs is not None and obs.ended_at is not None:
            end = f"; {self.label} ended at {obs.ended_at:.2f} s"
            events.append({"t": obs.ended_at, "what": f"{self.label} ended"})
        return Effect(acted=st.get("pid") is not None,
                      summary=f"{_who(self.rank)} started again as {self.label} (pid "
                              f"{st.get('pid')}) at {st['t']:.2f} s{after}{end}",
                      numbers={"pid": st.get("pid"), "started_at": st["t"]}, events=events)

    def describe(self):
        return f"start {_who(self.rank)} again as {self.label}"


_SIGNUMS = {int(s) for s in _signal.Signals}
# signals whose default action leaves a process alive (ignored, or stopped): after one of
# them there is nothing to start again
_NOT_ENDING = {"CHLD": "ignored", "URG": "ignored", "WINCH": "ignored", "TTIN": "stopped",
               "TTOU": "stopped"}


def restart_labels(scn: Any) -> Dict[int, str]:
    """The row of each restart the case's kill_rank faults ask for (restart_after), by the
    fault's index: the killed process's label with ``#2``, or the next number free for it
    (a restart of ``agent:node1#2`` is ``agent:node1#3``)."""
    out: Dict[int, str] = {}
    taken: set = set()
    for i, f in enumerate(scn.faults):
        if getattr(f, "restart_after", None) is None:
            continue
        base = str(f.rank).split("#", 1)[0]
        n = 2
        while f"{base}#{n}" in taken:
            n += 1
        out[i] = f"{base}#{n}"
        taken.add(out[i])
    return out


def proc_state(pid: Optional[int]) -> Optional[str]:
    """A process's state letter from /proc (R, S, T, Z...); "gone" when this machine has no
    such process; None when there is no pid."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def _who(label: str) -> str:
    return f"rank {label}" if label[:1].isdigit() else label


def signal_name(text: str) -> str:
    """A signal's bare name (``USR1``) from what a user writes (``usr1``, ``SIGUSR1``); a
    clear error for an unknown one, for STOP/CONT (stop_rank's) and the harness's own."""
    name = text.strip().upper()
    name = name[3:] if name.startswith("SIG") else name
    sig = getattr(_signal, "SIG" + name, None)
    if not isinstance(sig, _signal.Signals) or name in ("RTMIN", "RTMAX"):
        known = sorted(s.name[3:] for s in _signal.Signals if s.name.startswith("SIG")
                       and not s.name.startswith("SIGRT")
                       and s.name not in ("SIGSTOP", "SIGCONT", "SIGTSTP"))
        raise ValueError(f"unknown signal {text[:12]!r} (known: {', '.join(known)})")
    if name in ("STOP", "CONT", "TSTP"):
        raise ValueError(f"SIG{name} freezes or resumes a rank: use stop_rank (heal_after "
                         "sends SIGCONT)")
    if sig == STACK_SIGNAL:
        raise ValueError(f"SIG{name} is the harness's own stack-dump signal")
    return name


class _SignalRank(Fault, When):
    WHEN_REQUIRED = True
    # rank is the signalled process; `of` names another anchor, and takes '*'
    WILDCARD_FIELDS = ("of",)
    ON_ALLOCATION = None   # works on an allocation's nodes
    rank: Target = Field(
        1, description="the process that gets the signal (and whose phase counts unless `of` "
        "names another): a rank number, or a label such as 'agent:node1' (a torchrun agent), "
        "'1@1' (rank 1's first restart), 'parent:local'")
    of: Optional[Target] = Field(
        None, description="with phase: whose phase (or end: phase ended) sends the signal, "
        "when it is another process's: a gate on that process's state, e.g. SIGKILL to rank 1 "
        "once rank 0 has ended; '*': once every rank of the job (its first attempt) has "
        "entered the phase (default: the signalled process's own)")

    def check(self, scn):
        problems = super().check(scn)
        if self.of is not None and self.phase is None:
            problems.append((("of",), "'of' names whose phase sends the signal: give 'phase' "
                                      "with it"))
        if self.phase == ENDED and self.of is None:
            problems.append((("phase",), "a process cannot be signalled once it has ended: "
                                         "name another process in 'of'"))
        # the worker's own phases are known in advance; an agent's, a parent's or a user
        # program's are not the workload's
        anchor = self.rank if self.of is None else self.of
        worker_rank = (isinstance(anchor, int) or anchor == EVERY_RANK) and not scn.program_argv()
        why = phase_problem(self.phase, scn.workload.steps, scn.workload.destroy) \
            if self.phase is not None and self.phase != ENDED and worker_rank else None
        if why:   # the signal would never be sent
            problems.append((("phase",), why))
        return problems

    def trigger(self) -> Trigger:
        if self.phase is not None and self.of is not None:
            return Trigger.on_phase(self.of, self.phase, self.after)
        return super().trigger()

    def _signal(self) -> str:
        raise NotImplementedError

    def _heal_signal(self) -> Optional[str]:
        return None

    def apply(self, plan, scn):
        self._apply_signal(plan, scn)

    def _apply_signal(self, plan, scn) -> Signal:
        sig = self._signal()
        step = Signal(rank=str(self.rank), signal=sig, heal_signal=self._heal_signal(),
                      trigger=self.trigger(), target=_who(str(self.rank)))
        plan.add_step(self, step)
        step.undo_trigger = self.heal(step.id) if self._heal_signal() else None
        when = self.trigger().describe()
        heal = f", SIG{self._heal_signal()}" + self.healed().replace(", healed", "") \
            if self._heal_signal() else ""
        plan.notes.append(f"{self.kind}: SIG{sig} to {_who(str(self.rank))} {when}{heal}")
        return step


class KillRank(_SignalRank):
    kind: Literal["kill_rank"] = "kill_rank"
    summary = "SIGKILL, or any signal by name (TERM, USR1, CHLD...), to a rank at a time or phase"
    signal: str = Field("KILL", max_length=12, description="the signal's name, with or without "
                        "SIG: KILL, TERM, INT, SEGV, ABRT, USR1, USR2, HUP, CHLD...")
    restart_after: Optional[Seconds] = Field(
        None, description="start the killed process again this many seconds after it ended "
        "(a Ctrl-C'd node started again by hand, a torchrun agent rejoining an elastic job): "
        "the same argv, environment and host as the launcher started it, a fresh interpreter; "
        "its row is the label with '#2' ('agent:node1#2'; '#3' for a restart of that one), "
        "pinned apart from the killed row, which no longer counts for the job's outcome. Only "
        "for a process the harness starts itself: a rank under launcher direct, a torchrun "
        "agent ('agent:HOST'), a spawning parent ('parent:HOST')")

    @field_validator("signal")
    @classmethod
    def _known(cls, v: str) -> str:
        return signal_name(v)

    def check(self, scn):
        problems = super().check(scn)
        if self.heals:
            problems.append((("heal_after" if self.heal_after is not None else "heal_phase",),
                             "a killed rank cannot be healed (stop_rank can: SIGCONT after "
                             "heal_after or at heal_phase)"))
        if self.restart_after is not None:
            why = self._restart_problem(scn, problems)
            if why:
                problems.append((("restart_after",), why))
        return problems

    def _restart_problem(self, scn: Any, problems: List[Any]) -> Optional[str]:
        """Why the target of this kill cannot be started again (None: it can)."""
        if self.signal in _NOT_ENDING:
            return (f"SIG{self.signal} does not end a process (by default it is "
                    f"{_NOT_ENDING[self.signal]}): nothing would be started again; send one "
                    "that ends it (KILL, TERM, INT...) or leave restart_after out")
        why = getattr(scn.launcher, "NO_RESTART", None)
        if why:
            return why
        if any(loc[:1] == ("rank",) for loc, _ in problems):
            return None   # no such process: said at rank
        label = str(self.rank)
        p = parse_label(label.split("#", 1)[0])
        if p is None or p.kind != "rank":
            return None   # an agent, a parent, or a restart of one: started by the harness
        rows = scn.launcher.rows(scn)
        others = rows.agents + rows.parents
        instead = f" (here: {', '.join(others[:4])})" if others else ""
        if p.attempt:
            return (f"rank {label} is a worker its agent starts in restart attempt "
                    f"{p.attempt}, not a process the harness starts: restart_after starts "
                    f"again only what the harness started itself{instead}")
        if not scn.launcher.STARTS_RANKS:
            return (f"rank {label} is a worker that the {scn.launcher.kind} launcher's "
                    f"{'agent' if rows.agents else 'parent'} starts, not the harness: "
                    "restart_after starts again only what the harness started itself "
                    f"(name its agent or parent{instead})")
        return None

    def allocation_problem(self, scn):
        if self.restart_after is not None:
            return ("restart_after: on an allocation's nodes every process is an srun task "
                    "of one step, and a killed one is not started again")
        return super().allocation_problem(scn)

    def extra_labels(self, scn):
        if self.restart_after is None:
            return []
        mine = next((i for i, f in enumerate(scn.faults) if f is self), None)
        label = restart_labels(scn).get(mine) if mine is not None else None
        return [label or f"{str(self.rank).split('#', 1)[0]}#2"]

    def apply(self, plan, scn):
        kill = self._apply_signal(plan, scn)
        if self.restart_after is None:
            return
        mine = next((i for i, f in enumerate(scn.faults) if f is self), None)
        label = restart_labels(scn).get(mine) if mine is not None else None
        label = label or f"{str(self.rank).split('#', 1)[0]}#2"
        plan.add_restart(str(self.rank), label)
        plan.add_step(self, Restart(rank=str(self.rank), label=label, kill=kill.id,
                                    trigger=Trigger.on_phase(str(self.rank), ENDED,
                                                             self.restart_after),
                                    target=label))
        plan.notes.append(f"{self.kind}: {_who(str(self.rank))} started again as {label} "
                          f"{self.restart_after:g} s after it ended")

    def _signal(self) -> str:
        return self.signal


class StopRank(_SignalRank):
    kind: Literal["stop_rank"] = "stop_rank"
    summary = "SIGSTOP a rank at a time or phase (it freezes, like a stuck host); heal_after: " \
        "SIGCONT that many seconds later (or heal_phase: when another process gets there)"

    def _signal(self) -> str:
        return "STOP"

    def _heal_signal(self) -> Optional[str]:
        return "CONT" if self.heals else None

    def check(self, scn):
        problems = super().check(scn)
        if self.heal_phase is not None and (self.heal_rank is None
                                            or str(self.heal_rank) == str(self.rank)):
            problems.append((("heal_phase",), "the frozen process enters no phase and does not "
                             "end while it is stopped: name another process in heal_rank "
                             "(e.g. SIGCONT once rank 0 has ended)"))
        return problems
