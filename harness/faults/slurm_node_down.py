"""slurm_node_down: the run's Slurm controller sets a node DOWN while the job runs
(``scontrol update NodeName=N State=DOWN``), as an administrator or a health check does; a
heal (``heal_after``) resumes it. Only with ``launcher: slurm`` (its test cluster)."""

from dataclasses import dataclass
from typing import Any, ClassVar, Dict, Literal, Optional, Sequence

from pydantic import Field

from ..limits import MAX_NAME
from ..machine import NAMESPACES, Requirement
from ..steps import Step, StepError
from ..triggers import When
from . import Fault


@dataclass
class NodeState(Step):
    """``scontrol update`` of one node, asked on the controller's host."""

    node: str = ""
    controller: str = ""
    reason: str = "harness: slurm_node_down"
    UNDO_AT_TEARDOWN: ClassVar[bool] = False   # the cluster goes with the run

    def _update(self, rt: Any, state: str) -> Dict[str, Any]:
        argv = ["scontrol", "update", f"NodeName={self.node}", f"State={state}"]
        if state == "DOWN":
            argv.append(f"Reason={self.reason}")
        done = rt.run_helper("scontrol update", argv, host=self.controller, timeout=30)
        if done.returncode != 0:
            raise StepError(f"scontrol update NodeName={self.node} State={state} failed "
                            f"(status {done.returncode}): {done.stderr.strip()[-300:]}")
        return {"node": self.node, "state": state}

    def do(self, rt: Any) -> Optional[Dict[str, Any]]:
        return self._update(rt, "DOWN")

    def undo(self, rt: Any) -> None:
        self._update(rt, "RESUME")

    def describe(self) -> str:
        return f"set Slurm node {self.node} DOWN"


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
