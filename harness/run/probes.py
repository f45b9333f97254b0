"""Evidence the supervisor takes of a live run, for the observation and the diagnosis: the
rows' TCP sockets (:mod:`harness.net.sockets`), what the job's store and the workers' own
stores hold (:mod:`harness.net.storeprobe`), who holds the master port before the start line,
the harness's own memory, the hosts' nft rules and TCP counters. Evidence only: whatever goes
wrong here leaves the observation without that piece, and never fails the run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..launchers import RankProcess, process_env
from ..machine import interrupts
from ..machine.procs import ManagedProcess
from ..net.sockets import port_owners
from .runtime import StepRuntime, _remote


class Probes(StepRuntime):
    """The supervisor's part that takes a live run's evidence (sockets, stores, port owners,
    memory, rules, counters)."""

    def _take_sockets(self, rows: Sequence[RankProcess]) -> None:
        """The TCP sockets of ``rows``, read from /proc (harness.net.sockets: no process is
        entered, nothing waits), each remote end named when a process of the run holds it.
        Evidence only: whatever goes wrong leaves the rows without sockets."""
        from ..net.sockets import children, snapshot

        names: Dict[int, str] = {}
        rows = [r for r in rows if not _remote(r)]   # a node's /proc is not this machine's
        try:
            for r in self.ranks:
                if _remote(r):
                    continue
                if r.proc.pid is not None and r.proc.poll() is None:
                    names[r.proc.pid] = r.label if r.label.startswith(f"{r.role}:") \
                        or f":{r.role}:" in r.label else f"{r.role} {r.label}"
                    if r.role == "rank":
                        names[r.proc.pid] = f"rank {r.label}"
            for pid in list(names):
                for c in children(pid):
                    names.setdefault(c, f"a child of {names[pid]} (pid {c})")
            for svc in self.services:
                try:
                    names.setdefault(svc.pid, f"{svc.name} (pid {svc.pid}, the harness's)")
                except Exception:  # noqa: BLE001 - not started
                    continue
            table = snapshot(names, t=round(self.now(), 3))
        except Exception:  # noqa: BLE001 - evidence only: never fail the run for it
            return
        for r in rows:
            self._sockets_taken.add(r.label)
            if r.proc.pid in table:
                r.obs.sockets = table[r.proc.pid]

    def _store_addr(self) -> Optional[Tuple[str, str]]:
        """(host, "ip:port") where the job's store listens (harness.core.jobstore: the port the
        launch gives it, not necessarily the lease), on the loopback of its host (TCPStore
        listens on every address of its host; asking by loopback needs no name and no route);
        where rank 0 was told another MASTER_PORT (a fault), that one. A port chosen at run
        time (torchrun's standalone or single-node launch) is the one its rank-0 worker was
        handed, as observed. None: no store port is known (init: file, or none observed)."""
        store = self.plan.store()
        first = self.plan.ranks[0]
        port = str(store.port) if store.port is not None else ""
        if not port and store.kind == "tcp":
            for r in self.ranks:
                info = r.obs.info or {}
                if r.obs.role == "worker" and info.get("rank") == 0 and \
                        str(info.get("use_agent_store")) != "False" and \
                        str(info.get("master_port") or "").isdigit():
                    return r.obs.host, f"127.0.0.1:{info['master_port']}"
        if first.rank == 0 and first.role == "rank" and store.kind == "tcp" and \
                not first.init.url:
            told = str((first.env or {}).get("MASTER_PORT") or "")
            port = told if told.isdigit() else port
        if not port:
            return None
        host = store.host or first.host
        six = ":" in str(self.plan.master_addr) and not str(self.plan.master_addr).startswith("[")
        return host, (f"[::1]:{port}" if six else f"127.0.0.1:{port}")

    def _take_store(self, again: bool = False) -> None:
        """Ask the run's store what it holds (harness.net.storeprobe), once, in a thread: at the
        deadline before the kill, or when a rank first raises. Evidence only. The nft rules
        in force are read at the deadline too (a rule a trigger lifts later is still shown)."""
        if (self._store is not None and not again) or not self.plan.ranks:
            return
        if self.plan.allocation is not None:   # the store is on a node, not on this machine
            return
        from ..net.storeprobe import StoreSnapshot, connect_and_ask

        where = self._store_addr()
        host, addr = where if where is not None else ("", "")
        t = round(self.now(), 3)

        def asking() -> Optional[StoreSnapshot]:
            if where is None:   # no store port known: nothing to ask
                return None
            fam = socket.AF_INET6 if addr.startswith("[") else socket.AF_INET
            try:
                sock = self.topo.socket(host, fam, socket.SOCK_STREAM) \
                    if self.topo is not None else socket.socket(fam, socket.SOCK_STREAM)
            except Exception as e:  # noqa: BLE001 - evidence only
                return StoreSnapshot(addr=addr, host=host, t=t, error=str(e))
            snap = connect_and_ask(sock, addr)
            snap.host, snap.t = host, t
            return snap

        # submitted and shut down as one: a Ctrl-C between (one landing in the worker thread's
        # start is enough) left the worker waiting for work that never came, its executor held
        # by the traceback, and the interpreter's exit joined it for good (pytest hung after
        # two quick Ctrl-Cs: 2 of 6 tries)
        with interrupts.shield():
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")
            try:
                self._store = pool.submit(asking)
                for whost, waddr in self._worker_stores():
                    if waddr != addr:
                        self._stores[waddr] = pool.submit(self._asker(whost, waddr, t))
            finally:
                pool.shutdown(wait=False)
        if self.topo is not None and self.now() >= self.plan.deadline:
            self._rules_at_deadline = {h.name: self._rules(h.name) for h in self.plan.hosts}

    def _asker(self, host: str, addr: str, t: float) -> Any:
        from ..net.storeprobe import StoreSnapshot, connect_and_ask

        def asking() -> StoreSnapshot:
            try:
                sock = self.topo.socket(host, socket.AF_INET, socket.SOCK_STREAM) \
                    if self.topo is not None else socket.socket(socket.AF_INET,
                                                                socket.SOCK_STREAM)
            except Exception as e:  # noqa: BLE001 - evidence only
                return StoreSnapshot(addr=addr, host=host, t=t, error=str(e))
            snap = connect_and_ask(sock, addr)
            snap.host, snap.t = host, t
            return snap
        return asking

    def _worker_stores(self) -> List[Tuple[str, str]]:
        """(host, "127.0.0.1:port") of each store torchrun's workers host themselves
        (TORCHELASTIC_USE_AGENT_STORE False: their rank 0 starts a TCPStore on MASTER_PORT),
        asked on the host of the worker that hosts it."""
        out: Dict[str, str] = {}
        for r in self.ranks:
            info = r.obs.info or {}
            if r.obs.role != "worker" or str(info.get("use_agent_store")) != "False" or \
                    not str(info.get("master_port") or "").isdigit():
                continue
            addr = f"127.0.0.1:{info['master_port']}"
            if info.get("rank") == 0 or addr not in out:
                out[addr] = r.obs.host
        return [(h, a) for a, h in out.items()]

    def settle_store(self) -> None:
        """Wait (bounded) for the store questions in flight: at the deadline, before the kill,
        which would end the store mid-answer and leave "no answer" as the evidence."""
        from concurrent.futures import wait

        from ..net.storeprobe import TIMEOUT

        futs = [f for f in [self._store, *self._stores.values()] if f is not None]
        if futs:
            wait(futs, timeout=2 * TIMEOUT + 1.0)   # connect and the conversation

    def _stores_snapshots(self) -> List[Dict[str, Any]]:
        out = []
        for fut in self._stores.values():
            try:
                out.append(dict(fut.result(timeout=5.0).to_dict()))
            except Exception:  # noqa: BLE001 - evidence only
                pass
        return out

    def _store_snapshot(self) -> Dict[str, Any]:
        if self._store is None:
            return {}
        try:
            snap = self._store.result(timeout=5.0)
            return dict(snap.to_dict()) if snap is not None else {}
        except Exception:  # noqa: BLE001 - evidence only
            return {}

    def _own_memory(self) -> Dict[str, Any]:
        """The harness's own resident memory when every rank is ready: this supervisor and what
        its launcher keeps for the run (fork servers; a forked rank's pages shared with its
        server are counted once, in the server), in MiB, and per rank of the run."""
        import psutil

        def rss(pid: int) -> float:
            try:
                return float(psutil.Process(pid).memory_info().rss) / (1 << 20)
            except psutil.Error:
                return 0.0

        sup = rss(os.getpid())
        servers = sum(rss(int(o.pid)) for o in self.owned if getattr(o, "pid", None))
        n = max(1, len(self.ranks))
        return {"supervisor_mb": round(sup, 1), "servers_mb": round(servers, 1),
                "ranks": len(self.ranks), "per_rank_mb": round((sup + servers) / n, 2)}

    def _port_owners_start(self) -> Any:
        """Who holds MASTER_PORT, seen from the master host (inside its namespace if any:
        psutil only sees the network namespace it runs in): asked now, in a child that the
        ranks' start does not wait for (:meth:`_port_owners_end` reads it before the start
        line; no rank binds a port before it)."""
        if self.plan.allocation is not None:   # the master port is a node's, not ours
            return []
        port = self.plan.store().port   # the job's store port (harness.core.jobstore)
        if port is None:
            return []
        if self.topo is None:
            return port_owners(port)
        # harness.net.sockets imports nothing of the harness: the child costs ~40 ms of CPU
        # where one importing harness.run.supervisor cost ~0.3 s, once per run with namespaces
        code = ("import json,sys; from harness.net.sockets import port_owners; "
                f"print(json.dumps(port_owners({port})))")
        try:
            with interrupts.shield():
                return ManagedProcess(self.prefix(self.plan.store().host or
                                                  self._master_host()) +
                                      [sys.executable, "-c", code], name="port owners",
                                      record=self.rundir.pids, env=process_env(),
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError:
            return []

    def _port_owners_end(self, looking: Any) -> List[Dict[str, Any]]:
        if not isinstance(looking, ManagedProcess):
            return list(looking)
        try:
            out, _ = looking.popen.communicate(timeout=60)
            return list(json.loads(out.decode().strip().splitlines()[-1]))
        except (subprocess.TimeoutExpired, ValueError, IndexError, OSError):
            return []
        finally:
            looking.kill()

    def _counters(self, host: str) -> Dict[str, int]:
        try:
            return dict(self.topo.counters(host))
        except Exception:  # noqa: BLE001 - evidence only: never fail the run for it
            return {}

    def _rules(self, host: str) -> str:
        try:
            return str(self.topo.rules(host))
        except Exception as e:  # evidence only: never fail the run for it
            return f"(could not list: {e})"
