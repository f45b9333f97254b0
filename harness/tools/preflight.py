"""``harness preflight``: check the nodes of a real Slurm allocation before a training job.

No root, no namespaces: one task per node (``srun --ntasks-per-node=1``) looks at its own node
and at the others, and rank 0 prints a per-node table with a verdict and the reason.

Per node:

* names: what the node's own host name and every other node's name resolve to *on this node*
  (the Debian 127.0.1.1 trap: a node whose name resolves to loopback makes gloo and c10d
  advertise an address its peers cannot dial);
* gloo's interface: ``GLOO_SOCKET_IFNAME`` when set, else the interface holding the address the
  host name resolves to (what gloo does), and that address;
* reachability: every node listens on the master port and on one ephemeral port (the range
  gloo's pairs use) and dials every other node's gloo address on both, all in parallel threads,
  each connect bounded (``--connect-timeout``): the matrix costs one bound, not N*N;
* versions: Python, torch, CUDA and NCCL where present; a node that differs from the majority
  (ties: from rank 0) is a stale image;
* a real ``init_process_group("gloo")`` + ``all_reduce`` across all nodes, in a child process
  with a short timeout, classified with the harness's words: ok / error / timeout / hang (the
  child outlived timeout + grace: its stacks are taken with faulthandler on SIGUSR1, then it is
  killed).

The channel between the tasks is a directory every node sees (``--dir``; on clusters the home or
scratch file system, on the test cluster the machine's): it needs no network, so a broken network
still gives a full report, and what each node said stays on disk as evidence. Each phase is one
JSON file per node written atomically (rename); a wait for the other nodes is bounded and a node
that never wrote is flagged "no answer".
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import faulthandler
import ipaddress
import json
import os
import platform
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

DEFAULT_PORT = 29500
PHASE_WAIT = 60.0          # how long a node waits for the others' files of one phase
STACKS_WAIT = 3.0          # how long a hung collective gets to write its stacks


# -- small helpers ----------------------------------------------------------------------------
def _write(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def _wait_all(d: Path, phase: str, nodes: Sequence[str], bound: float) -> Dict[str, Any]:
    """Every node's file of a phase, polled until all are there or ``bound`` passed."""
    end = time.monotonic() + bound
    got: Dict[str, Any] = {}
    while True:
        for n in nodes:
            if n not in got:
                p = d / f"{phase}-{n}.json"
                if p.exists():
                    try:
                        got[n] = json.loads(p.read_text())
                    except (OSError, ValueError):
                        pass
        if len(got) == len(nodes) or time.monotonic() > end:
            return got
        time.sleep(0.05)


def expand_nodelist(nodelist: str) -> List[str]:
    """``node[0-2,5],gpu7`` -> names (scontrol show hostnames where there, else parsed)."""
    try:
        p = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                           text=True, timeout=10, check=False)
        if p.returncode == 0 and p.stdout.split():
            return p.stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        pass
    out: List[str] = []
    depth, cur, parts = 0, "", []
    for ch in nodelist:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for part in filter(None, parts):
        if "[" not in part:
            out.append(part)
            continue
        head, rest = part.split("[", 1)
        body, tail = rest.split("]", 1)
        for r in body.split(","):
            lo, _, hi = r.partition("-")
            if hi:
                out += [f"{head}{i:0{len(lo)}d}{tail}" for i in range(int(lo), int(hi) + 1)]
            else:
                out.append(f"{head}{lo}{tail}")
    return out


def resolve(name: str) -> Tuple[List[str], Optional[str]]:
    """IPv4/IPv6 addresses of a name on this node, or the resolver's error."""
    try:
        infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
    except OSError as e:
        return [], str(e)
    addrs: List[str] = []
    for info in infos:
        a = str(info[4][0])
        if a not in addrs:
            addrs.append(a)
    return addrs, None


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%")[0]).is_loopback
    except ValueError:
        return False


def interfaces() -> Dict[str, List[str]]:
    """Interface -> its addresses as ``addr/prefix`` (IPv4 and IPv6)."""
    import psutil

    out: Dict[str, List[str]] = {}
    for name, addrs in psutil.net_if_addrs().items():
        for a in addrs:
            if a.family in (socket.AF_INET, socket.AF_INET6):
                addr = a.address.split("%")[0]
                try:
                    net = ipaddress.ip_interface(f"{addr}/{a.netmask}") if a.netmask else \
                        ipaddress.ip_interface(addr)
                except ValueError:
                    net = ipaddress.ip_interface(addr)
                out.setdefault(name, []).append(f"{addr}/{net.network.prefixlen}")
    return out


def _holder(addr: str, ifs: Dict[str, List[str]]) -> Optional[str]:
    """The interface whose address is ``addr``, else whose network holds it (lo's 127/8)."""
    ip = ipaddress.ip_address(addr.split("%")[0])
    for exact in (True, False):
        for name, addrs in ifs.items():
            for a in addrs:
                i = ipaddress.ip_interface(a)
                if (i.ip == ip) if exact else (ip in i.network and i.network.prefixlen < 32
                                               and i.version == ip.version):
                    return name
    return None


def gloo_interface(hostname: str, own: List[str], ifs: Dict[str, List[str]]
                   ) -> Dict[str, Any]:
    """The interface and address gloo would use (pure, given the facts)."""
    want = os.environ.get("GLOO_SOCKET_IFNAME", "")
    if want:
        name = want.split(",")[0]
        addrs = [a.split("/")[0] for a in ifs.get(name, [])]
        addrs = [a for a in addrs if ":" not in a] or addrs
        if not addrs:
            return {"source": "GLOO_SOCKET_IFNAME", "ifname": name, "addr": None,
                    "problem": f"GLOO_SOCKET_IFNAME={want} but this node has no interface "
                               f"{name!r} with an address (it has {', '.join(sorted(ifs))})"}
        return {"source": "GLOO_SOCKET_IFNAME", "ifname": name, "addr": addrs[0],
                "problem": None}
    for addr in own:
        holder = _holder(addr, ifs)
        if holder is not None:
            problem = None
            if _loopback(addr):
                problem = (f"GLOO_SOCKET_IFNAME unset and {hostname} resolves to {addr} "
                           f"({holder}): gloo would advertise loopback to its peers")
            return {"source": f"host name {hostname}", "ifname": holder, "addr": addr,
                    "problem": problem}
    first = own[0] if own else None
    return {"source": f"host name {hostname}", "ifname": None, "addr": first,
            "problem": f"{hostname} resolves to {', '.join(own) or 'nothing'}, an address on "
                       "none of this node's interfaces: gloo cannot bind to it"}


def nccl_interface(ifs: Dict[str, List[str]], value: Optional[str] = None) -> Dict[str, Any]:
    """The interface NCCL's socket transport (its bootstrap, and its data without InfiniBand)
    would use (pure, given the facts), by NCCL's rules: ``NCCL_SOCKET_IFNAME`` is a list of
    name prefixes, ``^`` in front excludes them, ``=`` in front makes them exact names; unset,
    ``ib*`` first, then any interface but ``lo`` and ``docker*``, ``lo`` last."""
    value = os.environ.get("NCCL_SOCKET_IFNAME", "") if value is None else value
    have = [n for n in sorted(ifs) if ifs[n]]

    def pick(names: List[str], source: str, problem: Optional[str] = None) -> Dict[str, Any]:
        name = names[0]
        addrs = [a.split("/")[0] for a in ifs[name]]
        addr = ([a for a in addrs if ":" not in a] or addrs)[0]
        return {"source": source, "ifname": name, "addr": addr, "problem": problem}

    if value:
        rule = value
        exclude = rule.startswith("^")
        rule = rule[1:] if exclude else rule
        exact = rule.startswith("=")
        rule = rule[1:] if exact else rule
        pats = [x for x in rule.split(",") if x]

        def hit(n: str) -> bool:
            return any(n == x if exact else n.startswith(x) for x in pats)

        got = [n for n in have if hit(n) != exclude]
        if not got:
            return {"source": "NCCL_SOCKET_IFNAME", "ifname": None, "addr": None,
                    "problem": f"NCCL_SOCKET_IFNAME={value} matches none of this node's "
                               f"interfaces (it has {', '.join(have) or 'none'})"}
        return pick(got, "NCCL_SOCKET_IFNAME")
    for group in ([n for n in have if n.startswith("ib")],
                  [n for n in have if n != "lo" and not n.startswith("docker")]):
        if group:
            return pick(group, "NCCL's default (ib*, then any but lo and docker*)")
    if "lo" in have:
        return pick(["lo"], "NCCL's default", "NCCL_SOCKET_IFNAME unset and only loopback: "
                    "NCCL would bind lo, its peers cannot dial it")
    return {"source": "NCCL's default", "ifname": None, "addr": None,
            "problem": "no interface with an address"}


def nccl_skip(facts: Dict[str, Any]) -> Optional[str]:
    """Why the NCCL collective cannot run on this set of nodes (None: it can), from every
    node's facts (pure: every node reads the same files, so every node decides alike)."""
    for n, f in sorted(facts.items()):
        g = f.get("gpu") or {}
        if not g.get("torch_nccl", False):
            return f"torch built without NCCL (on {n})" if g.get("cuda_devices") else \
                f"no CUDA device (on {n})"
        if not g.get("cuda_devices"):
            return f"no CUDA device (on {n})"
    return None if facts else "no node answered"


def gpu() -> Dict[str, Any]:
    """CUDA devices torch sees and whether torch has NCCL."""
    try:
        import torch
        import torch.distributed as dist

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return {"cuda_devices": n, "torch_nccl": bool(dist.is_nccl_available())}
    except Exception as e:  # noqa: BLE001 - a finding, not a crash
        return {"cuda_devices": 0, "torch_nccl": False, "error": f"{type(e).__name__}: {e}"}


def versions() -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = {"python": platform.python_version(),
                                     "executable": sys.executable,
                                     "torch": None, "cuda": None, "nccl": None}
    try:
        import torch

        out["torch"] = str(torch.__version__)
        out["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            v = torch.cuda.nccl.version()
            out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as e:  # noqa: BLE001 - an import failure is a finding, not a crash
        out["torch"] = f"import failed: {type(e).__name__}: {e}"
    return out


def _dial(addr: str, port: int, bound: float, expect: str) -> Dict[str, Any]:
    """Connect, then read the listener's node name: reaching *a* listener is not enough (a
    loopback address reaches the dialler itself)."""
    t0 = time.monotonic()
    try:
        with socket.create_connection((addr, port), timeout=bound) as s:
            s.settimeout(max(0.1, bound - (time.monotonic() - t0)))
            who = s.recv(256).decode(errors="replace").strip()
            if who != expect:
                return {"ok": False, "s": round(time.monotonic() - t0, 3),
                        "error": f"{addr}:{port} answered as {who or 'nothing'!r}, not {expect}"
                                 + (" (a loopback address reaches the dialler itself)"
                                    if _loopback(addr) else "")}
            return {"ok": True, "s": round(time.monotonic() - t0, 3)}
    except OSError as e:
        return {"ok": False, "s": round(time.monotonic() - t0, 3),
                "error": (type(e).__name__ + (f": {e}" if str(e) else ""))}


def _answer(s: socket.socket, node: str) -> None:
    """A listener's loop: each connection is told this node's name (until the socket closes)."""
    while True:
        try:
            c, _ = s.accept()
        except OSError:
            return
        try:
            c.sendall(f"{node}\n".encode())
            c.settimeout(2.0)
            c.recv(1)              # the dialler closes first: TIME_WAIT stays on its side
        except OSError:
            pass
        finally:
            c.close()


def proc_state(pid: int) -> Optional[str]:
    """The kernel's one-letter state of a process (``T``: stopped), None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


# -- the collective, in a child ----------------------------------------------------------------
# argv: stacks file, timeout, backend, result file. The result is a JSON file the child writes
# (what it raised: class, MRO, message; or ok), so that nothing is read from its output, which
# is torch's log and a traceback for people
COLLECTIVE = r"""
import faulthandler, json, os, signal, sys, time
faulthandler.register(signal.SIGUSR1, file=open(sys.argv[1], "w"), all_threads=True)
def say(**result):
    with open(sys.argv[4] + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(sys.argv[4] + ".tmp", sys.argv[4])
t0 = time.monotonic()
nccl = sys.argv[3] == "nccl"
try:
    from datetime import timedelta
    import torch, torch.distributed as dist
    t0 = time.monotonic()
    if nccl:
        torch.cuda.set_device(0)
    dist.init_process_group("cpu:gloo,cuda:nccl" if nccl else "gloo",
                            timeout=timedelta(seconds=float(sys.argv[2])))
    t = torch.ones(1)
    dist.all_reduce(t)
    assert int(t.item()) == dist.get_world_size(), f"all_reduce gave {t.item()}"
    if nccl:
        t = torch.ones(1, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        assert int(t.item()) == dist.get_world_size(), f"NCCL all_reduce gave {t.item()}"
    dist.destroy_process_group()
except BaseException as e:
    say(ok=False, exception=type(e).__name__, message=str(e),
        mro=[f"{c.__module__}.{c.__qualname__}" for c in type(e).__mro__], nccl=None)
    raise
say(ok=True, s=round(time.monotonic() - t0, 3), nccl="ok" if nccl else None)
"""


def classify_collective(rc: Optional[int], result: Optional[Dict[str, Any]],
                        timed_out: bool) -> Tuple[str, str]:
    """(verdict, reason) in the harness's words (pure), from the child's exit status and the
    result it wrote: what it raised is a timeout or an error by the harness's own table
    (``harness.judge.classify.is_timeout``), as a rank's would be."""
    from ..judge.classify import is_timeout

    if timed_out:
        return "hang", "the init or all_reduce outlived its timeout (stacks taken)"
    if rc == 0 and result and result.get("ok"):
        return "ok", "init_process_group + all_reduce"
    if result and result.get("exception"):
        line = f"{result['exception']}: {result.get('message', '')}".strip()[:300]
        timeout = is_timeout(list(result.get("mro") or []), str(result.get("message", "")))
        return ("timeout" if timeout else "error"), line
    if rc is not None and rc < 0:
        return "crash", f"killed by signal {-rc}"
    return "error", f"exit status {rc} without a result (its output is kept)"


def collective(d: Path, node: str, rank: int, world: int, master: str, port: int,
               timeout: float, grace: float, nccl_skipped: Optional[str] = "not asked"
               ) -> Dict[str, Any]:
    stacks = d / f"stacks-{node}.txt"
    said = d / f"collective-{node}.json"
    said.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env.update(RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR=master, MASTER_PORT=str(port),
               LOCAL_RANK="0")
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-c", COLLECTIVE, str(stacks), str(timeout),
                          "gloo" if nccl_skipped else "nccl", str(said)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timed_out = False
    state = None
    try:
        out, _ = p.communicate(timeout=timeout + grace)
    except subprocess.TimeoutExpired:
        timed_out = True
        state = proc_state(p.pid)
        p.send_signal(signal.SIGUSR1)       # a stopped child gets it when continued:
        p.send_signal(signal.SIGCONT)       # faulthandler dumps from the signal handler
        end = time.monotonic() + STACKS_WAIT
        while time.monotonic() < end and not (stacks.exists() and stacks.stat().st_size):
            time.sleep(0.05)                # bounded poll for the dump, then it goes
        p.kill()
        out, _ = p.communicate()
    try:
        result: Optional[Dict[str, Any]] = json.loads(said.read_text())
    except (OSError, ValueError):
        result = None
    said.unlink(missing_ok=True)
    verdict, reason = classify_collective(p.returncode, result, timed_out)
    if state == "T":
        reason += " (the process was stopped, state T: SIGSTOP or a debugger)"
    res = {"verdict": verdict, "reason": reason, "s": round(time.monotonic() - t0, 3),
           "returncode": p.returncode, "output": out[-2000:], "master": f"{master}:{port}",
           "stopped": state == "T",
           "nccl": f"skipped: {nccl_skipped}" if nccl_skipped else
           ("ok" if result and result.get("nccl") == "ok" else f"not ok: {verdict}")}
    if timed_out and stacks.exists():
        res["stacks"] = stacks.read_text()[-6000:]
    elif stacks.exists() and not stacks.stat().st_size:
        stacks.unlink()                    # no hang, no stacks: no empty file left behind
    return res


# -- one task ------------------------------------------------------------------------------------
def task(args: argparse.Namespace) -> int:
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    nodes = expand_nodelist(os.environ.get("SLURM_JOB_NODELIST")
                            or os.environ.get("SLURM_NODELIST", ""))
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    world = int(os.environ.get("SLURM_NTASKS", str(len(nodes) or 1)))
    if not nodes:
        nodes = [node]
    if world != len(nodes):
        print(f"harness preflight: {world} tasks on {len(nodes)} nodes: run exactly one task "
              "per node (srun --ntasks-per-node=1)", file=sys.stderr)
        return 2
    port = args.port or int(os.environ.get("MASTER_PORT") or DEFAULT_PORT)
    master = os.environ.get("MASTER_ADDR") or nodes[0]
    t_start = time.monotonic()

    # 1. local facts
    listeners = _local_facts(d, node, rank, nodes, port)

    # 2. the reachability matrix: every peer's gloo address on both its ports, in parallel
    peers = _wait_all(d, "facts", nodes, args.wait)
    present = _reach_matrix(args, d, node, nodes, peers)
    for s in listeners:
        s.shutdown(socket.SHUT_RDWR)   # wakes the accept of _answer (close alone does not,
        s.close()                      # and the port would stay bound: EADDRINUSE for the store)

    # 3. the real thing
    coll = collective(d, node, rank, world, master, port, args.timeout, args.grace,
                      nccl_skip(peers) if len(peers) == len(nodes) else "a node never answered")
    ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    cpu = sum(r.ru_utime + r.ru_stime for r in ru)
    _write(d / f"result-{node}.json", {"node": node, "collective": coll, "cpu_s": round(cpu, 3),
                                       "s": round(time.monotonic() - t_start, 3)})
    if rank != 0:
        final = _wait_all(d, "report", ["all"], args.wait + args.timeout + args.grace)
        return 0 if final.get("all", {}).get("ok") else 1
    results = _wait_all(d, "result", present, args.wait + args.timeout + args.grace)
    facts_all = _wait_all(d, "facts", nodes, 0)
    reach_all = _wait_all(d, "reach", nodes, 0)
    report = judge(nodes, facts_all, reach_all, results)
    report["wall_s"] = round(time.monotonic() - t_start, 3)
    _write(d / "report.json", report)
    _write(d / "report-all.json", {"ok": report["ok"]})
    print(table(report), flush=True)
    write_html(args, report)
    return 0 if report["ok"] else 1


def _local_facts(d: Path, node: str, rank: int, nodes: List[str], port: int
                 ) -> List[socket.socket]:
    """This node's facts written for the others (names, interfaces, GPU, versions), with two
    listeners (the master port and an ephemeral one) answering with the node's name; returns
    the listeners, open until the matrix is done."""
    hostname = socket.gethostname()
    own, own_err = resolve(hostname)
    with cf.ThreadPoolExecutor(max_workers=min(32, len(nodes))) as ex:   # a slow resolver
        names = {n: dict(zip(("addrs", "error"), r))                    # costs one lookup,
                 for n, r in zip(nodes, ex.map(resolve, nodes))}        # not N
    ifs = interfaces()
    gloo = gloo_interface(hostname, own, ifs)
    nccl = nccl_interface(ifs)
    listeners = []
    ports: Dict[str, Any] = {}
    for name, p in (("master", port), ("ephemeral", 0)):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", p))
            s.listen(256)
            ports[name] = s.getsockname()[1]
            listeners.append(s)
            threading.Thread(target=_answer, args=(s, node), daemon=True).start()
        except OSError as e:
            ports[name] = None
            ports[f"{name}_error"] = f"cannot listen on {p}: {e}"
            s.close()
    facts = {"node": node, "rank": rank, "hostname": hostname, "own": own, "own_error": own_err,
             "names": names, "interfaces": ifs, "gloo": gloo, "nccl": nccl, "gpu": gpu(),
             "ports": ports, "versions": versions()}
    _write(d / f"facts-{node}.json", facts)
    return listeners


def _reach_matrix(args: argparse.Namespace, d: Path, node: str, nodes: List[str],
                  peers: Dict[str, Any]) -> List[str]:
    """Every peer's gloo address dialled on both its ports, in parallel, written for the
    others; returns the nodes present, once every present node's dials are done."""
    t_matrix = time.monotonic()
    jobs = {}
    with cf.ThreadPoolExecutor(max_workers=min(64, 2 * len(peers) + 1)) as ex:
        for n, f in peers.items():
            if n == node:
                continue
            addr = f["gloo"].get("addr")
            for kind in ("master", "ephemeral"):
                pp = f["ports"].get(kind)
                if addr and pp:
                    jobs[(n, kind)] = ex.submit(_dial, addr, pp, args.connect_timeout, n)
        reach = {f"{n} {k}": fut.result() for (n, k), fut in jobs.items()}
    _write(d / f"reach-{node}.json", {"node": node, "reach": reach,
                                      "s": round(time.monotonic() - t_matrix, 3)})
    present = [n for n in nodes if n in peers]    # a node silent so far is not waited for again
    _wait_all(d, "reach", present, args.wait)     # every dial done before the ports close
    return present


def write_html(args: argparse.Namespace, report: Dict[str, Any]) -> None:
    if getattr(args, "html", None):
        from ..reports.html import write_preflight_html

        print(f"preflight: HTML {write_preflight_html(report, args.html)}", flush=True)


# -- judging (pure) ---------------------------------------------------------------------------
def _majority(values: Dict[str, Any], first: str) -> Any:
    c = Counter(json.dumps(v, sort_keys=True) for v in values.values())
    top = c.most_common()
    best = [k for k, n in top if n == top[0][1]]
    key = json.dumps(values[first], sort_keys=True) if first in values and \
        json.dumps(values[first], sort_keys=True) in best else best[0]
    return json.loads(key)


def judge(nodes: Sequence[str], facts: Dict[str, Any], reach: Dict[str, Any],
          results: Dict[str, Any]) -> Dict[str, Any]:
    """Per node: verdict pass/fail and the reasons (pure: the files' contents in)."""
    reasons: Dict[str, List[str]] = {n: [] for n in nodes}
    for n in nodes:
        if n not in facts:
            reasons[n].append("no answer (its task never wrote its facts)")
    _judge_names(facts, reasons)
    _judge_reach(facts, reach, reasons)
    _judge_versions(nodes, facts, reasons)
    notes, coll = _judge_collective(nodes, facts, results, reasons)
    rows = []
    for n in nodes:
        f = facts.get(n, {})
        c = results.get(n, {}).get("collective", {})
        rows.append({"node": n, "ok": not reasons[n], "reasons": reasons[n], "notes": notes[n],
                     "resolves_to": f.get("own"),
                     "gloo": f"{(f.get('gloo') or {}).get('ifname')} "
                             f"{(f.get('gloo') or {}).get('addr')}" if f else None,
                     "nccl": (f"{(f.get('nccl') or {}).get('ifname')} "
                              f"{(f.get('nccl') or {}).get('addr')}; collective "
                              f"{c.get('nccl') or '-'}") if f else None,
                     "versions": f.get("versions"), "collective": c.get("verdict"),
                     "collective_s": c.get("s"), "stacks": c.get("stacks"),
                     "task_s": results.get(n, {}).get("s"),
                     "cpu_s": results.get(n, {}).get("cpu_s"),
                     "matrix_s": reach.get(n, {}).get("s")})
    said = sorted({str(c.get("nccl")) for c in coll.values() if c and c.get("nccl")})
    return {"ok": all(r["ok"] for r in rows), "nodes": rows, "facts": facts, "reach": reach,
            "results": results, "nccl": "; ".join(said) or None}


def _judge_names(facts: Dict[str, Any], reasons: Dict[str, List[str]]) -> None:
    """Names: on every node, every node's name; gloo's interface, and NCCL's where a GPU is."""
    for obs, f in facts.items():
        if f.get("own_error"):
            reasons[obs].append(f"its own name {f['hostname']} does not resolve: "
                                f"{f['own_error']}")
        for name, r in f.get("names", {}).items():
            if r.get("error"):
                reasons[obs].append(f"{name} does not resolve here: {r['error']}")
            elif r.get("addrs") and all(_loopback(a) for a in r["addrs"]):
                reasons[obs].append(f"{name} resolves to {', '.join(r['addrs'])} here "
                                    "(loopback)")
        if f.get("gloo", {}).get("problem"):
            reasons[obs].append(f["gloo"]["problem"])
        if (f.get("gpu") or {}).get("cuda_devices") and (f.get("nccl") or {}).get("problem"):
            reasons[obs].append(f["nccl"]["problem"])     # NCCL matters where there is a GPU


def _judge_reach(facts: Dict[str, Any], reach: Dict[str, Any],
                 reasons: Dict[str, List[str]]) -> None:
    """Reachability: a target nobody reaches is flagged; a source that reaches nothing that
    others reach is flagged; a port a node could not listen on is its own."""
    reached_by: Dict[str, List[str]] = {}
    for src, r in reach.items():
        for key, res in r.get("reach", {}).items():
            dst, kind = key.split(" ")
            if res["ok"]:
                reached_by.setdefault(f"{dst} {kind}", []).append(src)
    for src, r in reach.items():
        for key, res in r.get("reach", {}).items():
            if res["ok"]:
                continue
            dst, kind = key.split(" ")
            port = facts.get(dst, {}).get("ports", {}).get(kind)
            others = [s for s in reached_by.get(key, []) if s != src]
            if others:
                reasons[src].append(f"cannot reach {dst}:{port} ({kind}) that "
                                    f"{', '.join(others)} reach: {res.get('error')}")
            else:
                reasons[dst].append(f"{kind} port {port} not reachable from {src}: "
                                    f"{res.get('error')}")
    for n, f in facts.items():
        for kind in ("master", "ephemeral"):
            if f.get("ports", {}).get(f"{kind}_error"):
                reasons[n].append(f["ports"][f"{kind}_error"])


def _judge_versions(nodes: Sequence[str], facts: Dict[str, Any],
                    reasons: Dict[str, List[str]]) -> None:
    """Versions: the majority (ties: rank 0's node); a node that differs is flagged."""
    vers = {n: {k: v for k, v in f["versions"].items() if k != "executable"}
            for n, f in facts.items()}
    if vers:
        usual = _majority(vers, nodes[0])
        for n, v in vers.items():
            diff = [f"{k} {v[k]} (others {usual[k]})" for k in v if v[k] != usual.get(k)]
            if diff:
                reasons[n].append("differs from the other nodes: " + ", ".join(diff))


def _judge_collective(nodes: Sequence[str], facts: Dict[str, Any], results: Dict[str, Any],
                      reasons: Dict[str, List[str]]
                      ) -> Tuple[Dict[str, List[str]], Dict[str, Any]]:
    """(notes per node, each node's collective). A node that hung, crashed or never answered
    is the cause; the others' timeouts while they waited for it are its consequence (a note,
    not a failure of theirs)."""
    notes: Dict[str, List[str]] = {n: [] for n in nodes}
    coll = {n: results.get(n, {}).get("collective") for n in nodes}
    # a collective the kernel showed stopped (state T) is the cause of the others' hangs too:
    # a peer of a frozen process waits in gloo's mesh connect past any timeout (watched: 1 of 2)
    # failing that, one that hung, crashed or never answered; failing that, a node the checks
    # above already flagged (its dropped ports are what the others' collective waited for)
    culprits = [n for n in nodes if (coll[n] or {}).get("stopped")] or \
        [n for n in nodes if coll[n] is None or coll[n]["verdict"] in ("hang", "crash")] or \
        [n for n in nodes if reasons[n] and len([m for m in nodes if reasons[m]]) < len(nodes)]
    for n in nodes:
        c = coll[n]
        if c is None:
            if n in facts:
                reasons[n].append("no collective result within the bound")
            continue
        if c["verdict"] == "ok":
            continue
        line = f"init_process_group + all_reduce: {c['verdict']}: {c['reason']}"
        if c["verdict"] in ("timeout", "hang") and culprits and n not in culprits:
            notes[n].append(f"{line} (waiting for {', '.join(culprits)}, flagged)")
        else:
            reasons[n].append(line)
    return notes, coll


def table(report: Dict[str, Any]) -> str:
    lines = [f"{'node':<16} {'verdict':<7} {'name ->':<18} {'gloo iface/addr':<22} "
             f"{'torch':<12} {'all_reduce':<10} reason"]
    for r in report["nodes"]:
        v = r.get("versions") or {}
        lines.append(f"{r['node']:<16} {'PASS' if r['ok'] else 'FAIL':<7} "
                     f"{','.join(r.get('resolves_to') or ['-']):<18} {r.get('gloo') or '-':<22} "
                     f"{v.get('torch') or '-':<12} {r.get('collective') or '-':<10} "
                     f"{'; '.join(r['reasons']) or 'all checks passed'}"
                     + "".join(f"; note: {x}" for x in r.get("notes") or []))
    bad = [r["node"] for r in report["nodes"] if not r["ok"]]
    lines.append(f"preflight: {len(report['nodes']) - len(bad)}/{len(report['nodes'])} nodes "
                 "pass" + (f"; flagged: {', '.join(bad)}" if bad else "")
                 + (f"; NCCL collective: {report['nccl']}" if report.get("nccl") else ""))
    return "\n".join(lines)


# -- outside srun: start the tasks -------------------------------------------------------------
def outer(args: argparse.Namespace) -> int:
    from ..core.errors import UsageError

    if not os.environ.get("SLURM_JOB_ID"):
        raise UsageError("not inside a Slurm allocation (SLURM_JOB_ID unset): run it under "
                         "salloc (salloc -N4 harness preflight) or in an sbatch script")
    d = Path(args.dir or f"preflight-{os.environ['SLURM_JOB_ID']}-{int(time.time())}")
    d = d.resolve()
    d.mkdir(parents=True, exist_ok=True)
    n = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or "1"
    argv = ["srun", f"-N{n}", "--ntasks-per-node=1", *args.srun_arg, sys.executable, "-m",
            "harness", "preflight", "--task", "--dir", str(d),
            "--timeout", str(args.timeout), "--grace", str(args.grace),
            "--connect-timeout", str(args.connect_timeout), "--wait", str(args.wait)]
    if args.port:
        argv += ["--port", str(args.port)]
    rc = subprocess.run(argv, check=False).returncode
    if not (d / "report.json").exists():
        print(f"preflight: no report in {d} (srun exited {rc})", file=sys.stderr)
        return rc or 1
    print(f"preflight: report {d / 'report.json'}")
    try:
        write_html(args, json.loads((d / "report.json").read_text()))
    except (OSError, ValueError) as e:
        print(f"preflight: no HTML: {d / 'report.json'} unreadable ({e})", file=sys.stderr)
    return rc


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", action="store_true", help="be one node's task (under srun)")
    p.add_argument("--dir", help="a directory every node sees (default: ./preflight-<job>-<t>)")
    p.add_argument("--port", type=int, default=0,
                   help=f"master port (default: MASTER_PORT or {DEFAULT_PORT})")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="init_process_group's timeout in seconds (default 10)")
    p.add_argument("--grace", type=float, default=30.0,
                   help="beyond the timeout before the collective is a hang (default 30: gloo's "
                        "mesh connect can take ~25 s whatever the timeout)")
    p.add_argument("--connect-timeout", type=float, default=2.0,
                   help="bound of each connect of the matrix (default 2 s)")
    p.add_argument("--wait", type=float, default=PHASE_WAIT,
                   help=f"bound of each wait for the other nodes (default {PHASE_WAIT:g} s)")
    p.add_argument("--show", metavar="DIR", help="print the table of DIR/report.json (a "
                   "finished preflight) and exit with its status")
    p.add_argument("--html", metavar="PATH", help="also write the report as HTML: per-node "
                   "table, reachability matrix, versions, the collective's verdicts and stacks")
    p.add_argument("--srun-arg", action="append", default=[], metavar="ARG",
                   help="an extra srun option (repeatable)")


def run(args: argparse.Namespace) -> int:
    if args.show:
        from ..core.errors import UsageError

        path = Path(args.show) / "report.json"
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise UsageError(f"{path}: not a preflight report ({e})") from None
        print(table(report))
        write_html(args, report)
        return 0 if report.get("ok") else 1
    if args.task:
        if not args.dir:
            from ..core.errors import UsageError

            raise UsageError("--task needs --dir, a directory every node sees")
        return task(args)
    return outer(args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="harness preflight")
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    faulthandler.enable()
    sys.exit(main())
