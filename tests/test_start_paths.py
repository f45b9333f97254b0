"""Issue "every way a program starts torch.distributed", the pure part: init URLs as users
write them, backend strings and backend availability, signals by name, file:// failures and
interface lists, as planned (no process, no socket)."""

from __future__ import annotations

import pytest
import yaml

from harness.faults.file_init import ReadOnlyDir
from harness.faults.signal_rank import signal_name
from harness.faults.wrong_interface import SpareLink
from harness.net.resolver import ENV_READ_ONLY
from harness.run.plan import make_plan
from harness.run.requirements import backend_missing, skip_reason
from harness.scenario.loader import ScenarioFileError, load_text
from harness.scenario.schema import fill_init_url, init_url_parts

RUN_DIR = "/tmp/run-x"
CPU = {"torch": "2.13.0+cpu", "distributed": True, "gloo": True, "nccl": False, "gpus": 0,
       "mpi": False, "ucc": False}
GPU = dict(CPU, nccl=True, gpus=8)


def scn(**fields):
    data = {"name": "p", "about": "planned", "world_size": 2, **fields}
    (s,) = load_text(yaml.safe_dump(data, sort_keys=False), "p.yaml")
    return s


def plan(counter_ports, **fields):
    return make_plan(scn(**fields), RUN_DIR, take_port=counter_ports)


def refused(text_fields) -> str:
    with pytest.raises(ScenarioFileError) as e:
        scn(**text_fields)
    return str(e.value)


# -- init URLs ---------------------------------------------------------------------------------

def test_init_url_is_filled_per_rank_and_passes_rank_and_world_for_tcp(counter_ports):
    p = plan(counter_ports, init_url="tcp://{addr}:{port}")
    port = p.master_port
    assert p.rank("1").init.url == f"tcp://127.0.0.1:{port}"
    assert (p.rank("1").init.rank, p.rank("1").init.world_size) == (1, 2)


def test_init_url_args_choose_what_is_passed(counter_ports):
    p = plan(counter_ports, init_url="tcp://{addr}:{port}", init_args=["world_size"])
    assert p.rank("0").init.rank is None and p.rank("0").init.world_size == 2


def test_env_url_passes_no_arguments_and_keeps_the_query(counter_ports):
    p = plan(counter_ports, init_url="env://?use_libuv=0")
    init = p.rank("1").init
    assert (init.method, init.url, init.rank, init.world_size) == \
        ("env", "env://?use_libuv=0", None, None)


def test_rank_placeholder_differs_per_rank(counter_ports):
    p = plan(counter_ports, init_url="tcp://{addr}:{port}?rank={rank}&world_size={world_size}")
    assert "rank=0&" in p.rank("0").init.url and "rank=1&" in p.rank("1").init.url


def test_port2_is_a_second_reserved_port_only_when_asked(counter_ports):
    p = plan(counter_ports, init_url="tcp://{addr}:{port2}")
    assert p.url_port is not None and p.url_port != p.master_port
    assert p.rank("0").init.url.endswith(f":{p.url_port}")
    assert plan(counter_ports, init_url="tcp://{addr}:{port}").url_port is None


@pytest.mark.parametrize("launcher", ["direct", "torchrun"])
def test_a_programs_port2_argument_is_a_second_reserved_port(counter_ports, launcher):
    p = plan(counter_ports, launcher=launcher,
             program={"module": "train", "args": ["--port", "{port2}", "{port}"]})
    assert p.url_port is not None and p.url_port != p.master_port
    for rp in p.ranks:   # the ranks (direct) or the agent (torchrun) run it so
        assert rp.argv[-3:] == ["--port", str(p.url_port), "{port}"]   # only {port2} is filled
    p = plan(counter_ports, launcher=launcher, program={"module": "train", "args": ["--x"]})
    assert p.url_port is None


def test_file_url_in_the_run_dir(counter_ports):
    p = plan(counter_ports, init_url="file://{run_dir}/store")
    assert p.rank("0").init.url == f"file://{RUN_DIR}/store"


def test_ipv6_addr_gets_brackets_in_a_url():
    assert fill_init_url("tcp://{addr}:{port}", addr="[::1]", port=1) == "tcp://[::1]:1"


@pytest.mark.parametrize("url,scheme,host", [
    ("tcp://{addr}", "tcp", "127.0.0.1"), ("file://", "file", None), ("foo://x", "foo", "x"),
    ("env://", "env", None)])
def test_init_url_parts(url, scheme, host):
    assert init_url_parts(url)[:2] == (scheme, host)


@pytest.mark.parametrize("url,words", [
    ("tcp://{host}:{port}", "unknown placeholder {host}"),
    ("tcp://{addr", "lone {"),
    ("127.0.0.1:29500", "no scheme"),
    ("file:///etc/passwd", "outside the run's folder"),
    ("file://{run_dir}/../../etc/x", "outside"),
])
def test_bad_init_urls_are_located_errors(url, words):
    msg = refused({"init_url": url})
    assert "p.yaml:" in msg and "init_url" in msg
    if words != "outside":
        assert words in msg


def test_an_init_url_host_off_the_machine_is_refused():
    msg = refused({"init_url": "tcp://10.0.0.1:29500"})
    assert "init_url" in msg and "not a loopback address" in msg


def test_an_init_url_host_name_that_could_reach_dns_is_refused():
    msg = refused({"init_url": "tcp://example.org:29500"})
    assert "init_url" in msg and "DNS" in msg


def test_init_args_without_init_url_is_refused():
    assert "init_args goes with init_url" in refused({"init_args": ["rank"]})


# -- backends ----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend,names", [
    ("gloo", ["gloo"]), ("cpu:gloo,cuda:nccl", ["gloo", "nccl"]), ("gloo,", ["gloo"]),
    ("cpu:gloo,cpu:gloo", ["gloo"]), (None, ["gloo"])])
def test_backend_names(backend, names):
    assert scn(backend=backend).backend_names() == names


def test_backend_with_other_characters_is_refused():
    assert "backend" in refused({"backend": "gloo; rm"})


def test_nccl_is_skipped_on_a_cpu_machine_by_default():
    why = skip_reason(scn(backend="nccl"), CPU)
    assert why is not None and "no NCCL" in why


def test_nccl_missing_is_the_subject_when_the_scenario_says_so():
    s = scn(backend="nccl", backend_available=False)
    assert skip_reason(s, CPU) is None
    why = skip_reason(s, GPU)
    assert why is not None and "backend_available: false" in why
    # a CUDA build of torch with fewer GPUs than ranks (or none) cannot give NCCL either: the
    # case runs there too, and torch fails otherwise (ValueError "no GPUs found"), which its
    # expect blocks tell apart by build:
    for gpus in (0, 1):
        assert skip_reason(s, dict(GPU, gpus=gpus)) is None


def test_device_map_with_nccl_needs_nccl():
    assert "no NCCL" in str(backend_missing(scn(backend="cpu:gloo,cuda:nccl"), CPU))
    assert backend_missing(scn(backend="cpu:gloo,cuda:nccl"), GPU) is None


def test_nccl_needs_a_gpu_per_rank():
    assert "needs 2 CUDA GPUs" in str(backend_missing(scn(backend="nccl"), dict(GPU, gpus=1)))


def test_omitted_backend_is_passed_as_none(counter_ports):
    assert plan(counter_ports, backend=None).backend is None


# -- signals -----------------------------------------------------------------------------------

@pytest.mark.parametrize("text,name", [("usr1", "USR1"), ("SIGCHLD", "CHLD"), ("KILL", "KILL"),
                                       (" hup ", "HUP")])
def test_signal_names(text, name):
    assert signal_name(text) == name


@pytest.mark.parametrize("text,words", [("bogus", "unknown signal"), ("STOP", "stop_rank"),
                                        ("cont", "stop_rank"), ("RTMIN", "unknown signal")])
def test_bad_signal_names(text, words):
    with pytest.raises(ValueError, match=words):
        signal_name(text)


def test_kill_rank_with_an_unknown_signal_is_a_located_error():
    msg = refused({"faults": [{"kind": "kill_rank", "rank": 1, "signal": "SIGFOO",
                               "phase": "init"}]})
    assert "faults[0].signal" in msg and "unknown signal" in msg


def test_kill_rank_plans_any_signal(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "kill_rank", "rank": 1, "signal": "usr1",
                                     "phase": "init", "after": 1}])
    (step,) = [s for s in p.steps if s.fault == "kill_rank"]
    assert step.signal == "USR1"


# -- file:// -----------------------------------------------------------------------------------

def test_missing_dir_is_never_made(counter_ports):
    p = plan(counter_ports, init="file", faults=[{"kind": "file_init", "mode": "missing_dir"}])
    url = p.rank("0").init.url
    assert url == f"file://{RUN_DIR}/not-mounted/pg"
    made = [getattr(s, "path", "") for s in p.steps]
    assert not any(m and url[len("file://"):].startswith(m) for m in made), made


def test_read_only_mount_plans_the_folder_and_the_rank_variable(counter_ports):
    p = plan(counter_ports, init="file",
             faults=[{"kind": "file_init", "mode": "read_only_mount"}])
    (step,) = [s for s in p.steps if isinstance(s, ReadOnlyDir)]
    for label in ("0", "1"):
        assert p.rank(label).env[ENV_READ_ONLY] == step.path
        assert p.rank(label).init.url == f"file://{step.path}/pg"


# -- interface lists ---------------------------------------------------------------------------

HOSTS = {"hosts": [{"name": "a"}, {"name": "b"}]}


def test_interface_list_with_a_missing_entry(counter_ports):
    p = plan(counter_ports, **HOSTS, faults=[{"kind": "wrong_interface", "mode": "list"}])
    assert p.rank("1").env["GLOO_SOCKET_IFNAME"] == "eth0,eth9"


def test_interface_list_with_a_down_nic_first(counter_ports):
    p = plan(counter_ports, **HOSTS, faults=[{"kind": "wrong_interface", "mode": "list_down",
                                              "first": True}])
    assert p.rank("0").env["GLOO_SOCKET_IFNAME"] == "eth1,eth0"
    links = [s for s in p.steps if isinstance(s, SpareLink)]
    assert sorted(s.host for s in links) == ["a", "b"]
    assert all(s.trigger.is_setup for s in links)


def test_a_second_card_is_added_up_on_the_hosts_without_touching_the_ranks(counter_ports):
    p = plan(counter_ports, **HOSTS, env={"GLOO_SOCKET_IFNAME": "eth1"},
             faults=[{"kind": "second_nic", "hosts": ["b"]}])
    (link,) = [s for s in p.steps if isinstance(s, SpareLink)]
    assert (link.host, link.ifname, link.up, link.trigger.is_setup) == ("b", "eth1", True, True)
    assert {p.rank(r).env["GLOO_SOCKET_IFNAME"] for r in ("0", "1")} == {"eth1"}
    p = plan(counter_ports, **HOSTS, faults=[{"kind": "second_nic", "up": False}])
    assert sorted((s.host, s.up) for s in p.steps if isinstance(s, SpareLink)) == \
        [("a", False), ("b", False)]


@pytest.mark.parametrize("fault,why", [
    ({"kind": "second_nic", "hosts": ["c"]}, "faults[0].hosts[0]: no host 'c' (hosts: a, b)"),
    ({"kind": "second_nic", "name": "eth0"}, "faults[0].name: eth0 is the host's own link"),
])
def test_a_second_card_on_no_host_or_named_as_the_link_is_refused(fault, why):
    assert why in refused({**HOSTS, "faults": [fault]})


def test_first_outside_the_list_modes_is_refused():
    msg = refused({**HOSTS, "faults": [{"kind": "wrong_interface", "mode": "missing",
                                        "first": True}]})
    assert "first is for the list modes" in msg


# -- subgroups and re-initialisation --------------------------------------------------------------

from harness.ranks.workload import WORKLOAD_RE, is_collective  # noqa: E402
from harness.ranks.workload.new_group import group_ranks  # noqa: E402
from harness.ranks.workload.split_group import split_ranks  # noqa: E402


@pytest.mark.parametrize("entry,want", [
    ("new_group", (None, False)), ("new_group all", (None, False)),
    ("new_group 0,1", ([0, 1], False)), ("new_group 0,2 local", ([0, 2], True)),
    ("new_group local", (None, True))])
def test_group_ranks(entry, want):
    assert group_ranks(entry, 4) == want


def test_split_ranks():
    assert split_ranks("split_group 0,1|2,3") == [[0, 1], [2, 3]]


@pytest.mark.parametrize("entry", ["new_group x", "new_group 0,,1", "split_group", "reinit now",
                                   "group_broadcast", "new_group 0,1 global"])
def test_bad_group_entries_are_not_steps(entry):
    assert not WORKLOAD_RE.match(entry)


def test_group_steps_are_collectives_skip_collective_can_skip():
    assert is_collective("new_group 0,1 local") and is_collective("group_all_reduce")
    assert not is_collective("keep_store") and not is_collective("reinit")


def test_skip_collective_on_a_new_group_step(counter_ports):
    p = plan(counter_ports, world_size=3, workload=["new_group 0,1", "group_all_reduce"],
             faults=[{"kind": "skip_collective", "rank": 1, "phase": "workload step 1"}])
    assert p.rank("1").variation.skip == ["workload step 1"]


def test_rank_workload_gives_one_rank_its_own_steps(counter_ports):
    p = plan(counter_ports, workload=["all_reduce"],
             faults=[{"kind": "rank_workload", "rank": 1, "steps": ["reinit", "barrier"]}])
    assert p.worker_spec(p.rank("1")).steps == ["reinit", "barrier"]
    assert p.worker_spec(p.rank("0")).steps == ["all_reduce"]


def test_rank_workload_with_an_unknown_step_is_located():
    msg = refused({"faults": [{"kind": "rank_workload", "rank": 1, "steps": ["dance"]}]})
    assert "faults[0].steps" in msg and "unknown step 'dance'" in msg


def test_reinit_new_port_reserves_a_second_port_for_every_rank(counter_ports):
    p = plan(counter_ports, workload=["all_reduce", "reinit new_port", "all_reduce"])
    ports = {p.rank(label).init.port2 for label in ("0", "1")}
    assert len(ports) == 1 and None not in ports and p.master_port not in ports


def test_reinit_new_port_in_a_rank_workload_reserves_it_too(counter_ports):
    p = plan(counter_ports, faults=[{"kind": "rank_workload", "rank": 1,
                                     "steps": ["reinit new_port"]}])
    assert p.rank("0").init.port2 is not None


def test_no_second_port_without_a_use(counter_ports):
    assert plan(counter_ports, workload=["all_reduce", "reinit"]).rank("0").init.port2 is None


# -- the legacy launcher ---------------------------------------------------------------------------

def test_legacy_launch_runs_torch_distributed_launch_with_or_without_use_env(counter_ports):
    p = plan(counter_ports, launcher={"kind": "launch"})
    (agent,) = [r for r in p.ranks if r.role == "agent"]
    assert agent.argv[:2] == ["-m", "torch.distributed.launch"]
    assert "--use-env" not in agent.argv
    p = plan(counter_ports, launcher={"kind": "launch", "use_env": True})
    (agent,) = [r for r in p.ranks if r.role == "agent"]
    assert "--use-env" in agent.argv
    assert agent.argv.index("--use-env") < agent.argv.index("harness.ranks.worker")


def test_torchrun_passes_no_use_env(counter_ports):
    p = plan(counter_ports, launcher="torchrun")
    (agent,) = [r for r in p.ranks if r.role == "agent"]
    assert agent.argv[:2] == ["-m", "torch.distributed.run"] and "--use-env" not in agent.argv


def test_the_worker_finds_its_spec_after_the_legacy_local_rank_argument():
    from harness.ranks.worker import _spec_arg

    assert _spec_arg(["--local-rank=1", "{}"]) == "{}"
    assert _spec_arg(["--local_rank=0", "{}"]) == "{}"
    assert _spec_arg(["{}"]) == "{}"
