"""slurm_node_down: the run's Slurm controller sets a node DOWN while the job runs
(``scontrol update NodeName=N State=DOWN``), as an administrator or a health check does; a
heal (``heal_after``) resumes it. Only with ``launcher: slurm`` (its test cluster).

Evidence: the node's state as the controller gives it back right after the update
(``scontrol show node``: DOWN, with the fault's reason), and at the end of the run the jobs
the controller failed for a node (``scontrol show job``: JobState NODE_FAIL, on a node list
with this node). It acted when a job on the node was failed for it (NODE_FAIL) by the end, or
the node read back DOWN with a job running on it."""

from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Literal, Optional, Sequence

from pydantic import Field

from ..core.limits import MAX_NAME
from ..core.triggers import When
from ..machine.requirement import NAMESPACES, Requirement
from . import Fault
from .steps import Step, StepError


@dataclass
class NodeState(Step):
    """``scontrol update`` of one node, asked on the controller's host."""

    node: str = ""
    controller: str = ""
    reason: str = "harness: slurm_node_down"
    UNDO_AT_TEARDOWN: ClassVar[bool] = False   # the cluster goes with the run
    _seen: Optional[Dict[str, Any]] = field(default=None, init=False, repr=False, compare=False)

    def _update(self, rt: Any, state: str) -> Dict[str, Any]:
        argv = ["scontrol", "update", f"NodeName={self.node}", f"State={state}"]
        if state == "DOWN":
            argv.append(f"Reason={self.reason}")
        done = rt.run_helper("scontrol update", argv, host=self.controller, timeout=30)
        if done.returncode != 0:
            raise StepError(f"scontrol update NodeName={self.node} State={state} failed "
                            f"(status {done.returncode}): {done.stderr.strip()[-300:]}")
        return {"node": self.node, "state": state}

    def _show(self, rt: Any, what: List[str]) -> str:
        done = rt.run_helper("scontrol show", ["scontrol", "show", "-o", *what],
                             host=self.controller, timeout=30)
        if done.returncode != 0:
            raise StepError(f"scontrol show {' '.join(what)} failed (status {done.returncode})"
                            f": {done.stderr.strip()[-300:]}")
        return done.stdout

    def do(self, rt: Any) -> Optional[Dict[str, Any]]:
        info = self._update(rt, "DOWN")
        try:
            fields = scontrol_fields(self._show(rt, ["node", self.node]))
            self._seen = {"t": round(rt.now(), 3), "state": fields[0].get("State", "?")
                          if fields else "?", "reason": fields[0].get("Reason", "")
                          if fields else ""}
        except StepError as e:
            self._seen = {"t": round(rt.now(), 3), "state": "?", "reason": str(e)}
        # the jobs on the node as it went down: whether slurmctld then records NODE_FAIL or
        # the job's own end (srun failed, the batch script exited: FAILED) first is Slurm's race
        try:
            self._seen["jobs"] = self._jobs_on_node(rt, ("RUNNING", "COMPLETING",
                                                         "NODE_FAIL", "CONFIGURING"))
        except StepError:
            self._seen["jobs"] = []
        info["read_back"] = self._seen["state"]
        return info

    def _jobs_on_node(self, rt: Any, states: Sequence[str]) -> List[str]:
        """``job N STATE (reason)`` of the jobs on this node in one of ``states``."""
        return [f"job {j.get('JobId')} {j.get('JobState')} ({j.get('Reason', '?')})"
                for j in scontrol_fields(self._show(rt, ["job"]))
                if j.get("JobState") in states
                and self.node in self._hostnames(rt, j.get("NodeList", ""))]

    def effect(self, rt: Any) -> Any:
        from .steps import Effect

        assert self._seen is not None
        seen = self._seen
        down = "DOWN" in str(seen["state"]).split("+")
        on = list(seen.get("jobs") or [])              # on the node as it went down
        jobs = self._jobs_on_node(rt, ("NODE_FAIL",))  # failed for it by the end
        events = [{"t": seen["t"], "what": f"scontrol show node {self.node}: "
                   f"State={seen['state']}" + (f" Reason={seen['reason']}"
                                               if seen["reason"] else "")}]
        events += [{"t": seen["t"], "what": f"on the node as it went down: {j}"} for j in on]
        events += [{"t": round(rt.now(), 3), "what": f"scontrol show job: {j}"} for j in jobs]
        if not down and jobs:
            # slurmctld failed a job for this node all the same: the read-back came before
            # the update showed (watched under load: State=IDLE, then NODE_FAIL (NodeDown))
            summary = (f"node {self.node} read back State={seen['state']} at {seen['t']:.2f} s,"
                       f" yet {'; '.join(jobs)} by the end")
        elif not down:
            summary = f"node {self.node} read back State={seen['state']}, not DOWN"
        else:
            said = jobs or [f"{j} as it went down" for j in on]
            summary = (f"node {self.node} read back DOWN at {seen['t']:.2f} s; "
                       + ("; ".join(said) if said else "no job was on the node"))
        return Effect(acted=bool(jobs) or (down and bool(on)), summary=summary,
                      numbers={"failed_jobs": len(jobs), "jobs_on_node": len(on)},
                      events=events)

    def _hostnames(self, rt: Any, nodelist: str) -> List[str]:
        """A Slurm node list (``node[0-1]``) in names (``scontrol show hostnames``)."""
        if "[" not in nodelist:
            return [n for n in nodelist.split(",") if n]
        done = rt.run_helper("scontrol show", ["scontrol", "show", "hostnames", nodelist],
                             host=self.controller, timeout=30)
        return done.stdout.split()

    def undo(self, rt: Any) -> None:
        self._update(rt, "RESUME")

    def describe(self) -> str:
        return f"set Slurm node {self.node} DOWN"


def scontrol_fields(text: str) -> List[Dict[str, str]]:
    """``scontrol show -o``'s lines (one record a line, ``Key=Value`` words) as dicts (pure).
    A value with spaces (a Reason) keeps the words up to the next ``Key=``."""
    out: List[Dict[str, str]] = []
    for ln in text.splitlines():
        rec: Dict[str, str] = {}
        key = None
        for word in ln.split():
            k, eq, v = word.partition("=")
            if eq and k and k[0].isalpha() and k.replace(":", "").replace("/", "").isalnum():
                key, rec[k] = k, v
            elif key is not None:
                rec[key] += " " + word
        if rec:
            out.append(rec)
    return out


class SlurmNodeDown(Fault, When):
    kind: Literal["slurm_node_down"] = "slurm_node_down"
    ON_ALLOCATION = (
        "it sets a node DOWN with scontrol update, a Slurm administrator's command: never on a "
        "real allocation")
    summary = "the Slurm controller sets a node DOWN while the job runs (launcher: slurm)"
    needs_netns = True
    WHEN_REQUIRED = True
    REQUIRES: ClassVar[Sequence[Requirement]] = (NAMESPACES,)
    host: str = Field(max_length=MAX_NAME, description="the scenario host whose node goes DOWN")

    def check(self, scn):
        problems = super().check(scn)
        if self.host not in scn.host_names():
            problems.append((("host",), f"no host {self.host!r} (hosts: "
                                        f"{', '.join(scn.host_names())})"))
        if getattr(scn.launcher, "kind", "") != "slurm":
            problems.append((("kind",), "a Slurm node exists only with launcher: slurm"))
        return problems

    def apply(self, plan, scn):
        host = plan.host(self.host)
        node = host.machine.hostname or host.name
        controller = scn.master_host or plan.hosts[0].name
        step = NodeState(node=node, controller=controller, trigger=self.trigger(),
                         target=f"node {node}")
        plan.add_step(self, step)
        step.undo_trigger = self.heal(step.id)
        plan.notes.append(f"slurm_node_down: node {node} set DOWN {self.when()}")
