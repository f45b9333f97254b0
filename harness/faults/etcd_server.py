"""etcd_server: a fault on the run's etcd (the scenario's ``etcd:`` block), the rendezvous
service of torchrun's ``etcd`` / ``etcd-v2`` backends.

Modes: ``absent`` (never started: nothing listens at the endpoint the agents are given; no
time), ``killed`` (SIGKILL; ``heal_after``: started again on its data), ``frozen`` (SIGSTOP;
``heal_after``: SIGCONT), ``dropped`` (an nftables drop of its client port on its host, live
connections too; ``hosts``: only from these scenario hosts; ``heal_after``: removed),
``wiped`` (SIGKILL, its data directory removed, started again empty at once: every key of the
rendezvous is gone; ``restart: dialled``: started again only once every agent's host has
dialled the dead etcd, its connects refused as by a closed port, at most 30 s: whether an
agent meets etcd gone no longer depends on when its poll falls), ``slow`` (a duty cycle:
SIGSTOP for ``stopped_ms``, SIGCONT for ``running_ms``, again, until the heal). The timed
modes take the usual trigger (``at``, or ``phase`` + ``rank`` + ``after``): "during rendezvous" is
``{phase: rendezvous, rank: "agent:node0"}``, "in training step k" ``{phase: "train step k",
rank: 0}`` (a ``ddp`` workload).

Evidence (harness.faults._etcd, per step): absent, a connection to the endpoint refused at the
end; killed / wiped, etcd's exit status (SIGKILL), its data gone, the new etcd's pid; frozen,
the kernel saw it stopped and requests waited unread on its client port before the heal (0:
nobody asked it anything while frozen); slow, the stops and how many a request waited through;
dropped, the packets its rules dropped.
"""

from __future__ import annotations

from typing import Any, ClassVar, List, Literal, Sequence

from pydantic import Field

from ..core.triggers import Trigger, When
from ..machine.requirement import NAMESPACES, Requirement
from ..services.etcd import ETCD, PYTHON_ETCD
from . import Fault
from ._etcd import EtcdAbsent, EtcdDrop, EtcdFreeze, EtcdKill, EtcdSlow


class EtcdServer(Fault, When):
    kind: Literal["etcd_server"] = "etcd_server"
    ON_ALLOCATION = (
        "it acts on the run's own etcd, a service on the harness's machine or in its "
        "namespaces: not built for an allocation's nodes")
    summary = "the run's etcd (torchrun's etcd rendezvous): never started, killed, frozen, " \
        "unreachable, wiped, slow"
    HINTS = ("a rendezvous service that is down", "etcd killed", "etcd frozen")
    REQUIRES: ClassVar[Sequence[Requirement]] = (ETCD, PYTHON_ETCD, NAMESPACES)
    mode: Literal["absent", "killed", "frozen", "dropped", "wiped", "slow"] = Field(
        description="absent: never started; killed: SIGKILL (heal: started again on its "
        "data); frozen: SIGSTOP (heal: SIGCONT); dropped: its client port dropped on its host "
        "(heal: removed); wiped: killed, data removed, started again empty; slow: stopped "
        "stopped_ms, running running_ms, again (heal: running)")
    stopped_ms: int = Field(200, ge=1, le=60000, description="slow only: how long each stop "
                            "lasts (ms)")
    running_ms: int = Field(50, ge=1, le=60000, description="slow only: how long it runs "
                            "between stops (ms)")
    hosts: List[str] = Field(
        default_factory=list, max_length=16, description="dropped only: the scenario hosts "
        "cut off from etcd (default: every host)")
    restart: Literal["at_once", "dialled"] = Field(
        "at_once", description="wiped only: when the new empty etcd starts: at_once, or "
        "dialled: once every agent's host has dialled the dead etcd (its connects refused, "
        "as by a closed port; at most 30 s)")

    def requirements(self, scn: Any) -> Sequence[Requirement]:
        return (ETCD, PYTHON_ETCD, NAMESPACES) if self.mode == "dropped" \
            else (ETCD, PYTHON_ETCD)

    def check(self, scn: Any) -> List[Any]:
        problems = super().check(scn)
        if getattr(scn, "etcd", None) is None:
            return problems + [(("kind",), "etcd_server needs the scenario's etcd: block (the "
                                "run's own etcd)")]
        timed = self.at is not None or self.phase is not None
        if self.mode == "absent":
            if timed or self.heals:
                problems.append((("mode",), "absent: etcd never starts; give no at, phase, "
                                 "heal_after or heal_phase (killed is the mode for a time)"))
        elif not timed:
            problems.append((("mode",), f"{self.mode}: give when, 'at' (seconds) or 'phase' "
                             "(+ rank), e.g. {phase: rendezvous, rank: 'agent:node0'}"))
        if self.mode != "slow" and ({"stopped_ms", "running_ms"} & self.model_fields_set):
            problems.append((("mode",), "stopped_ms and running_ms are for mode slow"))
        if self.restart != "at_once" and self.mode != "wiped":
            problems.append((("restart",), "restart is for mode wiped (when the new empty "
                             "etcd starts)"))
        if self.restart == "dialled" and not scn.needs_namespaces():
            problems.append((("restart",), "restart: dialled counts the agents' dials on "
                             "etcd's host: etcd needs a host of the run's network (etcd: "
                             "host: a host of its own)"))
        if self.mode == "wiped" and self.heals:
            field = "heal_after" if self.heal_after is not None else "heal_phase"
            problems.append(((field,), "wiped has nothing to heal: the new etcd is already "
                             "running"))
        names = scn.host_names()
        for i, h in enumerate(self.hosts):
            if self.mode != "dropped":
                problems.append((("hosts",), "hosts is for mode dropped (etcd cut off from "
                                 "some hosts)"))
                break
            if h not in names:
                problems.append((("hosts", i), f"no host {h!r} in this scenario (hosts: "
                                 f"{', '.join(names)})"))
            elif h == scn.etcd.host:
                problems.append((("hosts", i), f"{h!r} is etcd's own host: its own traffic "
                                 "does not come from a peer"))
        if self.mode == "dropped" and not scn.needs_namespaces():
            problems.append((("mode",), "dropped needs etcd on a host of the run's network "
                             "(etcd: host: a host of its own or a scenario host), not on the "
                             "machine's loopback"))
        return problems

    def apply(self, plan: Any, scn: Any) -> None:
        etcd = plan.etcd
        if self.mode == "absent":
            etcd.start = False
            plan.add_step(self, EtcdAbsent(etcd=etcd, target=etcd.where()))
            plan.notes.append(f"etcd_server: etcd is never started ({etcd.endpoint})")
            return
        target = etcd.where()
        step: Any
        if self.mode in ("killed", "wiped"):
            dialled = [h for h in scn.host_names() if h != etcd.host] \
                if self.restart == "dialled" else []
            step = EtcdKill(etcd=etcd, wipe=self.mode == "wiped", dialled=dialled,
                            trigger=self.trigger(), target=target)
            if dialled:   # the restart is the undo, gated on the dials (EtcdKill.can_undo)
                plan.add_step(self, step)
                step.undo_trigger = Trigger.after_step(step.id)
                plan.notes.append(f"etcd_server: wiped, {self.when()}; started again once "
                                  f"{', '.join(dialled)} dialled it")
                return
        elif self.mode == "frozen":
            step = EtcdFreeze(etcd=etcd, trigger=self.trigger(), target=target)
        elif self.mode == "slow":
            step = EtcdSlow(etcd=etcd, stopped_ms=self.stopped_ms, running_ms=self.running_ms,
                            trigger=self.trigger(), target=target)
        else:
            step = EtcdDrop(etcd=etcd, peers=list(self.hosts), trigger=self.trigger(),
                            target=target)
        plan.add_step(self, step)
        step.undo_trigger = self.heal(step.id)
        plan.notes.append(f"etcd_server: {self.mode}, {self.when()}")
