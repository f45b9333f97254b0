"""Every field of a case is honoured or refused (harness.launchers.fields), pure: the table
classifies every field for every launcher and program kind, and each combination that used to
be accepted and do nothing is now a located load error, or is honoured (issue 39, item 3)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from harness.launchers import launcher_kinds
from harness.launchers.fields import HONOURED, PROGRAM_KINDS, TABLE, Refused, markdown
from harness.run.plan import make_plan
from harness.scenario.loader import ScenarioFileError, load_text
from harness.scenario.schema import Scenario

SCRIPT = Path(__file__).resolve().parent.parent / "scenarios" / "programs" / "train.py"


def load(text: str, source: str = "fields.yaml"):
    return load_text(textwrap.dedent(text), source)


def problems(text: str, source: str = "fields.yaml"):
    with pytest.raises(ScenarioFileError) as e:
        load(text, source)
    return [f"{p.line}: {p.field}: {p.message}" for p in e.value.problems]


def plan_of(scn, counter_ports):
    return make_plan(scn, "/tmp/torchdist-harness/run-x", counter_ports, netns=True,
                     run_id="x")


# -- the table ---------------------------------------------------------------------------------

def test_every_field_of_a_case_is_classified_for_every_launcher_and_program():
    fields = set(Scenario.model_fields) - {"case"}   # case: set by the loader
    assert set(TABLE) == set(launcher_kinds())
    for kind, by_program in TABLE.items():
        assert set(by_program) == set(PROGRAM_KINDS), kind
        for program, rules in by_program.items():
            missing = fields - set(rules)
            assert not missing, f"{kind}/{program}: fields not classified: {sorted(missing)}"
            assert not set(rules) - fields, f"{kind}/{program}: not fields of a case"
            for name, rule in rules.items():
                assert rule is HONOURED or (isinstance(rule, Refused) and rule.why), \
                    (kind, program, name)


def test_what_the_table_refuses_is_what_the_run_ignores():
    # the worker's own fields are honoured by every launcher that runs it, refused with a program
    for kind in TABLE:
        assert TABLE[kind]["worker"]["timeout"] is HONOURED
        assert TABLE[kind]["worker"]["workload"] is HONOURED
        for name in ("init", "init_url", "init_args", "timeout", "workload"):
            assert isinstance(TABLE[kind]["program"][name], Refused), (kind, name)
    assert TABLE["direct"]["worker"]["init_url"] is HONOURED
    for kind in ("torchrun", "launch", "slurm", "spawn"):
        assert isinstance(TABLE[kind]["worker"]["init_url"], Refused), kind


# -- the silent combinations of the issue, each refused where it is written ----------------------

def test_init_url_under_torchrun_is_refused_where_it_is_written():
    out = problems("""\
        name: t
        about: a
        launcher: torchrun
        init_url: "tcp://{addr}:{port}"
        """)
    assert out == ["4: init_url: init_url is not used by launcher torchrun: the workers init "
                   "from the rendezvous torchrun sets (env://): use program: to call "
                   "init_process_group yourself, or launcher: direct"]
    # and its legacy twin, and srun's tasks, and a spawning parent's children
    for launcher, hosts in (("launch", ""), ("spawn", ""),
                            ("slurm", "hostnames: own\nnodes: 2\n")):
        (line,) = problems(f"name: t\nabout: a\n{hosts}launcher: {launcher}\n"
                           "init_url: 'tcp://{addr}:{port}'\n")
        assert f"init_url: init_url is not used by launcher {launcher}" in line
    # where it is used, it loads
    (scn,) = load("name: t\nabout: a\ninit_url: 'tcp://{addr}:{port}'\n")
    assert scn.init_url


def test_a_workers_init_under_an_agent_is_refused_unless_env():
    (line,) = problems("name: t\nabout: a\nlauncher: torchrun\ninit: tcp\n")
    assert line.startswith("4: init: init is not used by launcher torchrun: torchrun's workers "
                           "initialise from the environment it sets")
    (scn,) = load("name: t\nabout: a\nlauncher: torchrun\ninit: env\n")   # what it does
    assert scn.init == "env"


def test_timeout_beside_a_program_is_refused():
    out = problems(f"""\
        name: t
        about: a
        program: {SCRIPT}
        timeout: 5
        """)
    assert out == ["4: timeout: timeout is not used by launcher direct with a program: timeout "
                   "is the harness's worker's init_process_group timeout; a user's program "
                   "calls init_process_group itself: write the init method, its URL and its "
                   "timeout in the program (deadline: bounds the run)"]
    for name, value in (("init_url", "'tcp://{addr}:{port}'"), ("workload", "[barrier]"),
                        ("init", "tcp")):
        (line,) = problems(f"name: t\nabout: a\nprogram: {SCRIPT}\n{name}: {value}\n")
        assert line.startswith(f"4: {name}: {name} is not used by launcher direct with a "
                               "program"), line


def test_a_top_level_field_merged_into_a_program_case_is_refused_naming_the_merge():
    out = problems(f"""\
        name: t
        about: a
        timeout: 5
        cases:
          worker: {{}}
          program:
            program: {SCRIPT}
        """)
    assert out == ["3: cases.program: timeout: timeout is not used by launcher direct with a "
                   "program: timeout is the harness's worker's init_process_group timeout; a "
                   "user's program calls init_process_group itself: write the init method, its "
                   "URL and its timeout in the program (deadline: bounds the run) (timeout is "
                   "set at the file's top level, merged into case program)"]


def test_master_addr_that_the_run_replaces_is_refused():
    # several hosts: MASTER_ADDR is the master host's address on the link
    (line,) = problems("name: t\nabout: a\nnodes: 2\nmaster_addr: 127.0.0.1\n")
    assert line.startswith("4: master_addr: master_addr is not used by launcher direct: with "
                           "several hosts")
    # torchrun: the rendezvous gives MASTER_ADDR
    (line,) = problems("name: t\nabout: a\nlauncher: torchrun\nmaster_addr: 127.0.0.1\n")
    assert "master_addr is not used by launcher torchrun" in line
    # one host, launcher direct: every rank's MASTER_ADDR
    (scn,) = load("name: t\nabout: a\nmaster_addr: 127.0.0.1\n")
    assert scn.master_addr == "127.0.0.1"


TWO_JOBS = ("name: t\nabout: a\nfaults:\n  - {kind: concurrent_job}\n"
            "  - {kind: concurrent_job, world_size: 1}\n")


def test_two_concurrent_jobs_have_labels_and_rows_of_their_own(counter_ports):
    (scn,) = load(TWO_JOBS + 'expect:\n  ranks: {"job2:1": error, "job3:0": error}\n')
    plan = plan_of(scn, counter_ports)
    assert [r.label for r in plan.ranks] == ["0", "1", "job2:0", "job2:1", "job3:0"]
    assert [r.job for r in plan.ranks] == ["", "", "job2", "job2", "job3"]
    # job3 has one rank: job3:1 is no row of the run
    (line,) = problems(TWO_JOBS + 'expect:\n  ranks: {"job3:1": error}\n')
    assert line.startswith("7: expect.ranks.job3:1:")
    # a second torchrun job's agents are its own too
    (scn,) = load("""\
        name: t
        about: a
        launcher: torchrun
        faults: [{kind: concurrent_job}, {kind: concurrent_job}]
        """)
    plan = plan_of(scn, counter_ports)
    assert [r.label for r in plan.ranks] == ["agent:local", "job2:agent:local",
                                             "job3:agent:local"]


def test_a_job_starts_once_another_jobs_process_has_ended_and_a_missing_one_is_located(
        counter_ports):
    # issue 41: a start ordered on another process's observed state (its end), any job's
    chain = ("name: t\nabout: a\nfaults:\n"
             "  - {kind: concurrent_job, phase: ended, rank: 0, delay: 0.5}\n"
             "  - {kind: concurrent_job, phase: ended, rank: %s}\n")
    (scn,) = load(chain % '"job2:0"')
    plan = plan_of(scn, counter_ports)
    assert [r.label for r in plan.ranks] == ["0", "1", "job2:0", "job2:1", "job3:0", "job3:1"]
    assert [r.release.describe() for r in plan.ranks[2:]] == \
        ["when rank 0 has ended + 0.5 s"] * 2 + ["when job2:0 has ended"] * 2
    (line,) = problems(chain % '"job9:0"')
    assert line.startswith("5: faults[1].rank: job9:0 is not a process of this run")
    assert "ranks job2:0..job2:1" in line and "ranks job3:0..job3:1" in line


def test_a_second_job_runs_a_workload_of_its_own_where_its_launcher_starts_ranks(
        counter_ports):
    (scn,) = load(TWO_JOBS.replace("world_size: 1}", "world_size: 1, workload: [barrier]}"))
    plan = plan_of(scn, counter_ports)
    assert [plan.worker_spec(r).steps for r in plan.ranks] == \
        [plan.workload] * 4 + [["barrier"]]
    (line,) = problems("name: t\nabout: a\nlauncher: torchrun\n"
                       "faults: [{kind: concurrent_job, workload: [barrier]}]\n")
    assert "faults[0].workload: a job's own workload needs a launcher that starts each rank" \
        in line
    (line,) = problems("name: t\nabout: a\nfaults: [{kind: concurrent_job, workload: [fly]}]\n")
    assert "unknown step 'fly'" in line


def test_a_standalone_torchrun_merged_into_a_case_of_two_hosts_is_refused():
    out = problems("""\
        name: t
        about: a
        launcher: {kind: torchrun, standalone: true}
        cases:
          one: {}
          two:
            nodes: 2
        """)
    assert out == ["3: cases.two: launcher.standalone: standalone makes each agent run its own "
                   "rendezvous on its own host: the 2 hosts would run 2 worlds of their own, "
                   "not one job; leave standalone out (several hosts use the static rendezvous "
                   "on the master host) or give one host (launcher.standalone is set at the "
                   "file's top level, merged into case two)"]
    # written in the case itself: located there, no merge named
    out = problems("""\
        name: t
        about: a
        cases:
          two:
            nodes: 2
            launcher: {kind: torchrun, standalone: true}
        """)
    assert out == ["6: cases.two: launcher.standalone: standalone makes each agent run its own "
                   "rendezvous on its own host: the 2 hosts would run 2 worlds of their own, "
                   "not one job; leave standalone out (several hosts use the static rendezvous "
                   "on the master host) or give one host"]
    # one agent's own standalone is refused too
    (line,) = problems("name: t\nabout: a\nnodes: 2\nlauncher: {kind: torchrun, agents: "
                       "{node1: {standalone: true}}}\n")
    assert "launcher.agents.node1.standalone: standalone makes each agent" in line


def test_a_per_agent_master_port_keeps_the_master_address(counter_ports):
    (scn,) = load("""\
        name: t
        about: a
        nodes: 2
        launcher:
          kind: torchrun
          agents:
            node1: {master_port: 29500}
        """)
    plan = plan_of(scn, counter_ports)
    master = plan.host("node0").addr

    def argv(label):
        a = plan.rank(label).argv
        return a[2:a.index("-m", 2)]

    assert argv("agent:node0") == ["--nnodes", "2", "--nproc-per-node", "1", "--node-rank", "0",
                                   "--master-addr", master, "--master-port",
                                   str(plan.master_port)]
    assert argv("agent:node1") == ["--nnodes", "2", "--nproc-per-node", "1", "--node-rank", "1",
                                   "--master-addr", master, "--master-port", "29500"]
    # the launcher's own master_port without master_addr: every agent on the master host
    (scn,) = load("name: t\nabout: a\nnodes: 2\nlauncher: {kind: torchrun, master_port: 29500}\n")
    plan = plan_of(scn, counter_ports)
    for label in ("agent:node0", "agent:node1"):
        a = plan.rank(label).argv
        assert a[a.index("--master-addr") + 1] == master
        assert a[a.index("--master-port") + 1] == "29500"


def test_a_ranks_own_python_where_the_launcher_does_not_start_ranks_is_refused():
    for launcher in ("torchrun", "spawn"):
        (line,) = problems(f"name: t\nabout: a\nlauncher: {launcher}\n"
                           "python: {'1': /usr/bin/python3}\n")
        assert line.startswith(f"4: python: python's entries for rank 1 are not used by "
                               f"launcher {launcher}: a rank's own interpreter needs launcher "
                               "direct"), line
    # every process's interpreter, and a host's, are the agents' too
    (scn,) = load(f"name: t\nabout: a\nlauncher: torchrun\npython: {sys.executable}\n")
    assert scn.python == {"*": sys.executable}
    (scn,) = load(f"name: t\nabout: a\npython: {{'1': {sys.executable}}}\n")   # direct
    assert scn.python == {"1": sys.executable}


def test_a_world_size_the_agents_do_not_start_is_refused():
    (line,) = problems("name: t\nabout: a\nworld_size: 4\n"
                       "launcher: {kind: torchrun, nproc_per_node: 2}\n")
    assert line.startswith("3: world_size: world_size 4 (the agents start 2 workers) is not "
                           "used by launcher torchrun"), line
    (scn,) = load("name: t\nabout: a\nworld_size: 3\nlauncher: torchrun\n")   # nproc: 3
    assert scn.launcher.rows(scn).world == 3


def test_an_etcd_nothing_in_the_run_asks_is_refused():
    (line,) = problems("name: t\nabout: a\nnodes: 2\netcd: {host: etcd}\n")
    assert line.startswith("4: etcd: etcd is not used by launcher direct: the run's etcd "
                           "serves torchrun's etcd rendezvous"), line
    (line,) = problems("name: t\nabout: a\nnodes: 2\netcd: {host: etcd}\n"
                       "launcher: {kind: torchrun, rdzv_backend: c10d}\n")
    assert "etcd is not used by launcher torchrun" in line
    # the etcd rendezvous asks it; a program may; a case that writes etcd: null has none
    for text in ("launcher: {kind: torchrun, rdzv_backend: etcd}\n",
                 f"program: {SCRIPT}\n"):
        (scn,) = load(f"name: t\nabout: a\nnodes: 2\netcd: {{host: etcd}}\n{text}")
        assert scn.etcd is not None
    (scn,) = load("name: t\nabout: a\netcd: {host: etcd}\nlauncher: {kind: torchrun, "
                  "rdzv_backend: etcd}\ncases:\n  c10d:\n    etcd: null\n"
                  "    launcher: {rdzv_backend: c10d}\n")
    assert scn.etcd is None


def test_a_second_jobs_agent_flags_need_that_job():
    (line,) = problems("name: t\nabout: a\nlauncher: {kind: torchrun, agents: "
                       "{'job3:local': {rdzv_id: x}}}\nfaults: [{kind: concurrent_job}]\n")
    assert line == "3: launcher.agents.job3:local: no job job3 in this case (its " \
        "concurrent_job faults start job2)"
    (scn,) = load("name: t\nabout: a\nlauncher: {kind: torchrun, agents: "
                  "{'job2:local': {rdzv_id: x}}}\nfaults: [{kind: concurrent_job}]\n")
    assert "job2:local" in scn.launcher.agents


def test_slurms_world_size_is_for_the_tasks_form():
    (line,) = problems("name: t\nabout: a\nhostnames: own\nnodes: 2\n"
                       "launcher: {kind: slurm, form: torchrun, world_size: 4}\n")
    assert line.startswith("5: launcher.world_size: world_size is written into the tasks' "
                           "script (form tasks)"), line


def test_the_docs_table_is_the_code_table():
    """The table is on the generated launchers page (docs/launchers.md links to it)."""
    docs = (Path(__file__).resolve().parent.parent / "docs" / "reference" /
            "launchers.md").read_text()
    assert "\n" + markdown() + "\n" in docs


def test_a_top_level_launcher_option_merged_into_another_kind_names_the_merge():
    out = problems("""\
        name: t
        about: a
        launcher: {kind: torchrun, nproc_per_node: 2}
        cases:
          tr: {}
          sp:
            launcher: {kind: spawn}
        """)
    assert out == ["3: cases.sp: launcher.nproc_per_node: unknown field of launcher spawn "
                   "(known: kind, method, start_method) (launcher.nproc_per_node is set at the "
                   "file's top level, merged into case sp)"]


def test_a_torchrun_endpoint_may_be_a_name_the_runs_hosts_files_give():
    # issue 41: endpoints as users write them; a real run: hang-defaults.yaml c10d_endpoint_a_name
    base = ("name: t\nabout: a\nhosts:\n  - {name: a, names: {store: a}}\n  - {name: b}\n"
            "launcher: {kind: torchrun, rdzv_backend: c10d, rdzv_endpoint: %s}\n")
    (scn,) = load(base % "store")
    assert scn.launcher.rdzv_endpoint == "store"
    (line,) = problems(base % "trainer-0.example.com")
    assert "could send a DNS query off this machine" in line and "unresolvable" in line \
        and "the a fault for that fault" not in line
