"""kill_rank and stop_rank: a signal to a rank at a time or when it enters a phase.

kill_rank sends any signal by name: the fatal ones (KILL, TERM, SEGV...) and the ones a
launcher or a scheduler sends to a live job (USR1 as Slurm's ``--signal``, CHLD, HUP...);
the rank meets it as any program would (its default action, or the program's handler).
"""

import signal as _signal
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Literal, Optional

from pydantic import Field, field_validator

from ..core.protocol import ENDED, EVERY_RANK, STACK_SIGNAL
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


_SIGNUMS = {int(s) for s in _signal.Signals}


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
        sig = self._signal()
        step = Signal(rank=str(self.rank), signal=sig, heal_signal=self._heal_signal(),
                      trigger=self.trigger(), target=_who(str(self.rank)))
        plan.add_step(self, step)
        step.undo_trigger = self.heal(step.id) if self._heal_signal() else None
        when = self.trigger().describe()
        heal = f", SIG{self._heal_signal()} {self.heal_after:g} s later" \
            if self._heal_signal() and self.heal_after else ""
        plan.notes.append(f"{self.kind}: SIG{sig} to {_who(str(self.rank))} {when}{heal}")


class KillRank(_SignalRank):
    kind: Literal["kill_rank"] = "kill_rank"
    summary = "SIGKILL, or any signal by name (TERM, USR1, CHLD...), to a rank at a time or phase"
    signal: str = Field("KILL", max_length=12, description="the signal's name, with or without "
                        "SIG: KILL, TERM, INT, SEGV, ABRT, USR1, USR2, HUP, CHLD...")

    @field_validator("signal")
    @classmethod
    def _known(cls, v: str) -> str:
        return signal_name(v)

    def check(self, scn):
        problems = super().check(scn)
        if self.heal_after is not None:
            problems.append((("heal_after",), "a killed rank cannot be healed (stop_rank can: "
                                              "SIGCONT after heal_after)"))
        return problems

    def _signal(self) -> str:
        return self.signal


class StopRank(_SignalRank):
    kind: Literal["stop_rank"] = "stop_rank"
    summary = "SIGSTOP a rank at a time or phase (it freezes, like a stuck host); heal_after: " \
        "SIGCONT that many seconds later"

    def _signal(self) -> str:
        return "STOP"

    def _heal_signal(self) -> Optional[str]:
        return "CONT" if self.heal_after is not None else None
