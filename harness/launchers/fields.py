"""Which fields of a case each launcher honours, per program kind: the one table the loader
checks a case against.

A case is started by a launcher (``direct``, ``torchrun``, ``launch``, ``spawn``, ``slurm``) and
runs either the harness's worker (``worker``: the default, whose init and workload the case
describes) or a user's program (``program:``, which calls ``init_process_group`` itself). A
field a case sets is honoured only where the run does something with it; anywhere else it
would be accepted and have no effect, so it is refused at load, located, naming the field and
the launcher (:func:`field_problems`).

``TABLE[launcher kind][program kind]`` maps every field of a case
(``harness.scenario.schema.Scenario``; ``case`` is the loader's own) to :data:`HONOURED` or a
:class:`Refused` with its reason. ``tests/test_fields.py`` asserts that every field is classified
for every launcher and program kind: a new field cannot be added without saying where it is
honoured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

WORKER, PROGRAM = "worker", "program"
PROGRAM_KINDS = (WORKER, PROGRAM)
HONOURED = None


@dataclass(frozen=True)
class Refused:
    """A field a launcher (with this program kind) does not use: its reason, and, when only
    some values are refused, the test that a case's value is one (``when(scn)``: refused)."""

    why: str
    when: Optional[Callable[[Any], bool]] = None
    what: Optional[Callable[[Any], str]] = None   # what is refused, when not the whole field
    short: str = ""   # docs: the values it honours, where ``when`` refuses only some


# -- what every launcher and program honours: what the case is, where it runs, what it expects ---
_EVERYWHERE: Dict[str, Any] = {f: HONOURED for f in (
    "name", "about", "expect", "repeat", "race", "marks", "deadline", "launcher", "program",
    "faults",            # each fault checks itself against the launcher (Fault.check)
    "hosts", "nodes", "ranks_per_node", "hostnames", "master_host", "ip", "isolate",
    "dns",               # the run's name server: every host resolves through it
    "env",               # every process's environment (an agent's workers inherit it)
    "backend",           # the worker's backend; for a program: what the machine must give
    "backend_available", "gpus",   # whether the case runs here (harness.run.requirements)
    "start",             # fresh or fork: a process that cannot fork says why (start_note)
    "world_size",
    "python",            # the interpreter(s); rank entries only where the launcher starts
    #                      each rank (_per_rank_python)
)}

_PROGRAM_INITS = ("a user's program calls init_process_group itself: write the init method, "
                  "its URL and its timeout in the program")
_PROGRAM_OWN = {
    "etcd": HONOURED,   # the program may use it
    "init": Refused("the harness's worker inits as init: says; a user's program calls "
                    "init_process_group and runs itself"),
    "workload": Refused("the workload is what the harness's worker runs; a user's program "
                        "runs itself"),
    "init_url": Refused(_PROGRAM_INITS),
    "init_args": Refused(_PROGRAM_INITS),
    "timeout": Refused("timeout is the harness's worker's init_process_group timeout; "
                       + _PROGRAM_INITS + " (deadline: bounds the run)"),
    "rank_timeouts": Refused("rank_timeouts are the harness's worker's timeouts; "
                             + _PROGRAM_INITS),
}


def _link(scn: Any) -> bool:
    """The run's hosts are linked (several hosts, a name server, an etcd host of its own, a
    fault that needs the link: as harness.run.plan.make_plan decides): MASTER_ADDR is then the
    master host's address on the link."""
    multi = scn.hosts is not None and len(scn.hosts) > 1
    own_etcd = scn.etcd is not None and scn.etcd.own_host(scn.host_names())
    return multi or scn.dns is not None or own_etcd or any(f.needs_link for f in scn.faults)


_LINKED_MASTER = Refused(
    "with several hosts (or a dns: or etcd host) MASTER_ADDR is the master host's address on "
    "the run's link: leave master_addr out (master_host: picks the host; env: MASTER_ADDR "
    "sets a wrong one on purpose)", when=_link, short="one host only")


_ETCD_WHY = ("the run's etcd serves torchrun's etcd rendezvous (rdzv_backend: etcd or "
             "etcd-v2) or a program of yours; the harness's worker never asks it")


def _no_etcd_rendezvous(scn: Any) -> bool:
    from .torchrun import ETCD_BACKENDS

    launcher = scn.launcher
    flags = [launcher, *launcher.agents.values()]
    return not any(f.rdzv_backend in ETCD_BACKENDS for f in flags)


def _direct(program: str) -> Dict[str, Any]:
    out = {**_EVERYWHERE, "init": HONOURED, "init_url": HONOURED, "init_args": HONOURED,
           "timeout": HONOURED, "rank_timeouts": HONOURED, "workload": HONOURED,
           "master_addr": _LINKED_MASTER,
           "etcd": Refused(_ETCD_WHY)}
    if program == PROGRAM:
        out.update(_PROGRAM_OWN)
    return out


def _rank_pythons(scn: Any) -> bool:
    return any(k != "*" for k in scn.python)


def _per_rank_python(who: str) -> Refused:
    return Refused(f"a rank's own interpreter needs launcher direct: {who} with the "
                   "interpreter of its host (a host's python:, or python: PATH for every "
                   "process)", when=_rank_pythons, short="`*` and hosts' only",
                   what=lambda scn: "python's entries for rank " + ", ".join(
                       k for k in scn.python if k != "*") + " are")


def _torchrun_world(scn: Any) -> bool:
    """world_size says other than the workers the agents start (nproc_per_node per host)."""
    return scn.world_size != scn.launcher._world(scn)


def _agents(kind: str, program: str, who: str) -> Dict[str, Any]:
    """torchrun, launch and slurm: the workers init from what the launcher sets."""
    rdzv = (f"the workers init from the rendezvous {who} sets (env://): use program: to call "
            "init_process_group yourself, or launcher: direct")
    starter = {"slurm": "each srun task runs"}.get(kind, "each agent's workers run")
    out = {**_EVERYWHERE, "timeout": HONOURED, "rank_timeouts": HONOURED, "workload": HONOURED,
           "python": _per_rank_python(starter),
           "init": Refused(f"{who}'s workers initialise from the environment it sets: use "
                           "init: env", when=lambda scn: scn.init != "env", short="env only"),
           "init_url": Refused(rdzv), "init_args": Refused(rdzv),
           "master_addr": Refused(
               f"{who} gives its workers MASTER_ADDR itself: "
               + ("set the launcher's master_addr or rdzv_endpoint" if kind != "slurm" else
                  "the launcher's master_addr says how the task's script derives it"))}
    out["etcd"] = Refused(_ETCD_WHY, when=None if kind == "slurm" else _no_etcd_rendezvous,
                          short="" if kind == "slurm" else "with rdzv_backend etcd(-v2)")
    if kind != "slurm":
        out["world_size"] = Refused(
            "the world is the workers the agents start (nproc_per_node on each host, default "
            "the host's ranks): leave world_size out, or make nproc_per_node agree",
            when=_torchrun_world, short="= the workers started",
            what=lambda scn: f"world_size {scn.world_size} (the agents "
            f"start {scn.launcher._world(scn)} workers) is")
    if program == PROGRAM:
        out.update(_PROGRAM_OWN)
    return out


def _spawn(program: str) -> Dict[str, Any]:
    out = {**_EVERYWHERE, "init": HONOURED, "timeout": HONOURED, "rank_timeouts": HONOURED,
           "workload": HONOURED,
           "python": _per_rank_python("each parent's children run"),
           "init_url": Refused("each spawned child inits with init: env, tcp or file (its "
                               "rank from its spawn index); an init_url as written is for "
                               "launcher: direct"),
           "init_args": Refused("init_args goes with init_url, which launcher spawn does not "
                                "use"),
           "master_addr": _LINKED_MASTER, "etcd": Refused(_ETCD_WHY)}
    if program == PROGRAM:
        out.update(_PROGRAM_OWN)
    return out


def _table() -> Dict[str, Dict[str, Dict[str, Any]]]:
    return {
        "direct": {p: _direct(p) for p in PROGRAM_KINDS},
        "torchrun": {p: _agents("torchrun", p, "torchrun") for p in PROGRAM_KINDS},
        "launch": {p: _agents("launch", p, "torch.distributed.launch") for p in PROGRAM_KINDS},
        "spawn": {p: _spawn(p) for p in PROGRAM_KINDS},
        "slurm": {p: _agents("slurm", p, "srun") for p in PROGRAM_KINDS},
    }


TABLE: Dict[str, Dict[str, Dict[str, Any]]] = _table()


def program_kind(scn: Any) -> str:
    return PROGRAM if scn.program is not None else WORKER


def honoured(kind: str, program: str) -> List[str]:
    """The fields launcher ``kind`` honours with this program kind (whatever their value)."""
    return [f for f, rule in TABLE[kind][program].items() if rule is HONOURED]


def field_problems(scn: Any, written: List[str]) -> List[Tuple[str, str]]:
    """(field, message) for each field a case sets (``written``: its keys, the file's top level
    merged in) that its launcher does not use with its program kind."""
    kind = scn.launcher.kind
    program = program_kind(scn)
    rules = TABLE.get(kind, {}).get(program, {})
    out = []
    for name in written:
        rule = rules.get(name)
        if not isinstance(rule, Refused) or (rule.when is not None and not rule.when(scn)):
            continue
        with_program = " with a program" if program == PROGRAM else ""
        what = rule.what(scn) if rule.what is not None else f"{name} is"
        out.append((name, f"{what} not used by launcher {kind}{with_program}: {rule.why}"))
    return out


def markdown() -> str:
    """The table for the generated docs/reference/launchers.md: each field some launcher or
    program kind refuses, per launcher, as "worker / program" (yes, no, or the values it
    honours)."""
    def cell(rule: Any) -> str:
        if rule is HONOURED:
            return "yes"
        return rule.short if rule.when is not None and rule.short else "no"

    kinds = list(TABLE)
    fields = [f for f in TABLE["direct"][WORKER]
              if any(TABLE[k][p][f] is not HONOURED for k in kinds for p in PROGRAM_KINDS)]
    lines = ["| field | " + " | ".join(f"`{k}`" for k in kinds) + " |",
             "|---" * (len(kinds) + 1) + "|"]
    for f in fields:
        pairs = [(cell(TABLE[k][WORKER][f]), cell(TABLE[k][PROGRAM][f])) for k in kinds]
        lines.append(f"| `{f}` | " + " | ".join(w if w == p else f"{w} / {p}"
                                                 for w, p in pairs) + " |")
    return "\n".join(lines)
