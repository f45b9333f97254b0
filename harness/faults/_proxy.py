"""Shared parts of the proxy faults: the harness's fault proxy (harness.services.proxy) stands in
front of chosen TCP traffic of one host, and each fault is one "toxic" switched on and off in it
by the usual triggers (``at`` | ``phase``, ``heal_after``).

Where the proxy stands (``placement``):

* ``transparent`` (default): inside the host's network namespace, behind nftables ``redirect``
  rules (harness.net.topology.Topology.redirect) for the chosen ``traffic``: connections arriving at
  the host and connections it opens. Needs the run's namespaces (root).
* ``front``: in front of the store port alone, without any rule and without root: it listens on
  a port of its own on the master host, and every rank but rank 0 (whose process serves the
  store) is told that port as MASTER_PORT.

The proxy is started once per host by a set-up step (before any rank), shared by every proxy
fault on that host; it is a service of the run (recorded, stopped with it, swept after a killed
run). Its log (every connection and toxic change, one JSON line each) is the run directory's
``service-proxy_<host>.err``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, List, Literal, Optional, Sequence, Union

from pydantic import Field

from ..core.limits import MAX_NAME, Port
from ..core.triggers import When
from ..machine.requirement import NAMESPACES, Requirement, Tool
from ..services.proxy.toxics import toxic_class
from . import Fault
from ._probe import json_lines
from .steps import Effect, Step

MARK = 0x7468               # the firewall mark of the proxy's own connections ("th")
NFT = Tool("nft", package="nftables", why="the proxy's redirect rules")
TRAFFIC_HELP = ("store (connections to the job's store port: MASTER_PORT, init_url's, the "
                "launcher's rdzv_endpoint or master_port), data (every other TCP connection: "
                "gloo's mesh), all, or a list of ports (a connection's destination port)")


def connections_met(log: Any, toxic: str, start_line: float, limit: int = 50
                    ) -> List[Dict[str, Any]]:
    """The proxy's log lines (``service-proxy_<host>.err``) for the connections ``toxic`` met:
    when (seconds after the start line, ``start_line`` on the monotonic clock), the
    connection's number, where it went, and how it closed."""
    t0: Optional[float] = None
    conns: Dict[int, Dict[str, Any]] = {}
    out: List[Dict[str, Any]] = []
    for rec in json_lines(log):
        ev = rec.get("ev")
        if ev == "ready" and rec.get("t0") is not None:
            t0 = float(rec["t0"])
        elif ev == "open":
            conns[int(rec.get("conn", -1))] = rec
        elif ev == "toxic_applies" and rec.get("toxic") == toxic and len(out) < limit:
            c = conns.get(int(rec.get("conn", -1)), {})
            t = float(rec.get("t") or 0.0)
            dst = c.get("dst") or ["?", "?"]
            out.append({"t": round(t0 + t - start_line, 3) if t0 is not None else None,
                        "conn": rec.get("conn"), "dst": f"{dst[0]}:{dst[1]}",
                        "what": f"connection {rec.get('conn')} ({c.get('kind', '?')}bound to "
                                f"{dst[0]}:{dst[1]}) met the toxic"})
    return out


def proxy_name(host: str) -> str:
    return f"proxy@{host}"


def rate_bytes(rate: str) -> float:
    """tc's rate words (``1mbit``, ``100kbps``) in bytes per second."""
    import re

    m = re.fullmatch(r"([0-9.]+)(bit|kbit|mbit|gbit|bps|kbps|mbps)", rate)
    if not m:
        raise ValueError(f"not a rate: {rate!r}")
    scale = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "bps": 1.0,
             "kbps": 1e3, "mbps": 1e6}[m.group(2)]
    return max(1.0, float(m.group(1)) * scale)


@dataclass
class ProxyUp(Step):
    """Start the fault proxy on a host (a service of the run) and, when transparent, redirect
    the chosen traffic through it. Set-up only; nothing to undo (the proxy is stopped with the
    run, the rules go with the namespaces)."""

    UNDO_AT_TEARDOWN: ClassVar[bool] = False
    host: str = ""
    placement: str = "transparent"
    captures: List[Any] = field(default_factory=list)   # Ports, as Topology.redirect takes them
    in_port: int = 0            # transparent: connections to the host
    out_port: int = 0           # transparent: connections the host opens
    listen: str = ""            # front: address and port it listens on, and where it dials
    listen_port: int = 0
    upstream: str = ""
    upstream_port: int = 0

    def do(self, rt: Any) -> Dict[str, Any]:
        from ..services import Answers, ServiceSpec

        name = f"proxy-{self.host}.sock"     # bound by name: the service's cwd is the run dir
        control = str(rt.run_dir / name)
        argv = rt.python("harness.services.proxy", "--control", name, "--mark", str(MARK))
        if self.placement == "transparent":
            argv += ["--transparent", str(self.in_port), str(self.out_port)]
        else:
            argv += ["--front", self.listen, str(self.listen_port), self.upstream,
                     str(self.upstream_port)]
        svc = rt.start_service(ServiceSpec(proxy_name(self.host), argv, self.host,
                                           ready=Answers(), control=control))
        rules = []
        if self.placement == "transparent":
            for ports in self.captures:
                rules.append(rt.net.redirect(self.host, ports=ports, in_port=self.in_port,
                                             out_port=self.out_port, mark=MARK))
        return {"pid": svc.pid, "ready_after": svc.ready_after, "rules": rules}

    def describe(self) -> str:
        if self.placement == "transparent":
            return (f"start the fault proxy; redirect {', '.join(map(str, self.captures))} "
                    f"through it (in :{self.in_port}, out :{self.out_port})")
        return (f"start the fault proxy at {self.listen}:{self.listen_port} in front of "
                f"{self.upstream}:{self.upstream_port}")


@dataclass
class ToxicStep(Step):
    """One toxic in a host's proxy: switched on by ``do``, off by ``undo`` (a heal)."""

    UNDO_AT_TEARDOWN: ClassVar[bool] = False   # goes with the proxy
    host: str = ""
    type: str = ""
    direction: str = "both"
    probability: float = 1.0
    ports: Optional[Dict[str, List[int]]] = None
    params: Dict[str, Any] = field(default_factory=dict)
    shown: str = ""

    def request(self) -> Dict[str, Any]:
        return {"op": "add", "id": self.id, "type": self.type, "direction": self.direction,
                "probability": self.probability, "ports": self.ports, "params": self.params}

    def do(self, rt: Any) -> Dict[str, Any]:
        answer = rt.service(proxy_name(self.host)).request(self.request())
        return {"open_connections": answer.get("open")}

    def undo(self, rt: Any) -> None:
        rt.service(proxy_name(self.host)).request({"op": "remove", "id": self.id})

    def effect(self, rt: Any) -> Effect:
        """The connections the toxic met: the proxy's own count, and its per-connection log
        (each connection's destination and when the toxic first applied to it)."""
        svc = rt.service(proxy_name(self.host))
        stats = svc.request({"op": "stats"})
        n = int((stats.get("applied") or {}).get(self.id, 0))
        events = connections_met(svc.stderr_path, self.id, time.monotonic() - rt.now())
        opened = int(stats.get("opened") or 0)
        return Effect(acted=n > 0,
                      summary=f"{n} connection{'s' * (n != 1)} met the toxic (of {opened} the "
                              f"proxy carried)",
                      numbers={"connections": n, "proxied": opened}, events=events)

    def describe(self) -> str:
        p = "" if self.probability >= 1 else f", {self.probability:g} of connections"
        return f"proxy: {self.shown} ({self.direction}{p})"


class ProxyFault(Fault, When):
    """A fault made by the fault proxy on one host's TCP traffic."""

    TOXIC: ClassVar[str] = ""              # the proxy's toxic type
    REQUIRES: ClassVar[Sequence[Requirement]] = (NAMESPACES, NFT)
    ON_ALLOCATION = (
        "the fault proxy is a service of the harness beside the ranks (in front of their ports,"
        " redirected by nftables in a namespace of the harness's): not built for an "
        "allocation's nodes")
    host: Optional[str] = Field(None, max_length=MAX_NAME,
                                description="the host whose traffic (default: the master host)")
    traffic: Union[Literal["store", "data", "all"], List[Port]] = Field(
        "all", description=TRAFFIC_HELP)
    placement: Literal["transparent", "front"] = Field(
        "transparent", description="transparent (nftables redirect in the host's namespace) "
        "or front (a port of its own in front of the store; no root needed)")
    direction: Literal["in", "out", "both"] = Field(
        "both", description="bytes the host receives (in), sends (out), or both; for a "
        "connection the host accepted (its store, its gloo listener) out are its replies, for "
        "one it opened its requests")
    probability: float = Field(1.0, gt=0, le=1, description="share of connections it meets, "
                               "drawn once per connection and fault")

    @property
    def needs_netns(self) -> bool:  # type: ignore[override]
        return self.placement == "transparent"

    def is_random(self) -> bool:
        return self.probability < 1

    def requirements(self, scn: Any) -> Sequence[Requirement]:
        return (NAMESPACES, NFT) if self.placement == "transparent" else ()

    def check(self, scn: Any) -> List[Any]:
        problems = super().check(scn)
        if self.host and self.host not in scn.host_names():
            problems.append((("host",), f"no host {self.host!r} (hosts: "
                                        f"{', '.join(scn.host_names())})"))
        if self.placement == "front":
            if self.traffic != "store":
                problems.append((("traffic",), "placement front stands in front of the store "
                                 "port only: give traffic: store (or placement: transparent)"))
            if scn.init == "file":
                problems.append((("placement",), "placement front needs a store port "
                                 "(init: env or tcp), and init is file"))
            if self.host and self.host != (scn.master_host or scn.host_names()[0]):
                problems.append((("host",), "placement front stands on the master host"))
        return problems

    # -- planning -----------------------------------------------------------------------------
    def target_host(self, plan: Any, scn: Any) -> str:
        return self.host or scn.master_host or plan.hosts[0].name

    def store_port(self, plan: Any) -> int:
        """The job's store port (harness.core.jobstore), wherever the launch puts it."""
        from ..core.jobstore import known_port

        return known_port(plan, f"traffic: {self.traffic}")

    def toxic_ports(self, plan: Any) -> Optional[Dict[str, List[int]]]:
        if self.traffic == "store":
            return {"only": [self.store_port(plan)]}
        if self.traffic == "data":
            return {"except": [self.store_port(plan)]}
        if self.traffic == "all":
            return None
        return {"only": list(self.traffic)}

    def capture(self, plan: Any) -> Any:
        if self.traffic == "store":
            return [self.store_port(plan)]
        if self.traffic == "data":
            return {"except": [self.store_port(plan)]}
        if self.traffic == "all":
            return "all"
        return list(self.traffic)

    def traffic_words(self) -> str:
        return {"store": "the store connections", "data": "the data connections",
                "all": "every TCP connection"}.get(str(self.traffic), f"ports {self.traffic}") \
            if isinstance(self.traffic, str) else f"ports {self.traffic}"

    def ensure_proxy(self, plan: Any, scn: Any, host: str) -> ProxyUp:
        """The host's proxy set-up step (made once per host, shared), with this fault's traffic
        among what it redirects; in front placement, the ranks are pointed at it."""
        for step in plan.steps:
            if isinstance(step, ProxyUp) and step.host == host:
                if step.placement != self.placement:
                    raise ValueError(f"host {host}: one proxy per host, and the faults ask for "
                                     f"both {step.placement} and {self.placement} placement")
                if self.placement == "transparent" and self.capture(plan) not in step.captures:
                    step.captures.append(self.capture(plan))
                return step
        if self.placement == "transparent":
            step = ProxyUp(host=host, placement="transparent", captures=[self.capture(plan)],
                           in_port=plan.new_port(), out_port=plan.new_port(),
                           target=f"host {host}")
        else:
            addr = plan.host(host).addr
            step = ProxyUp(host=host, placement="front", listen=addr, listen_port=plan.new_port(),
                           upstream=addr, upstream_port=self.store_port(plan),
                           target=f"host {host}")
            self.point_ranks_at(plan, step.listen_port)
        plan.add_step(self, step)
        return step

    @staticmethod
    def point_ranks_at(plan: Any, port: int) -> None:
        """Every rank but rank 0 (it serves the store) dials the proxy's port for the store."""
        for r in plan.ranks:
            if r.rank == 0 or r.rank is None:
                continue
            r.env["MASTER_PORT"] = str(port)
            if r.init.url and r.init.url.startswith("tcp://"):
                r.init = r.init.with_url(r.init.url.rsplit(":", 1)[0] + f":{port}")

    def params(self) -> Dict[str, Any]:
        """The toxic's own parameters, as the proxy takes them: the fault's fields of the names
        its toxic declares (``REQUIRED`` and ``OPTIONAL`` in
        ``harness/services/proxy/toxics/TOXIC.py``), those that are not None. A fault whose
        fields say them otherwise (bandwidth's ``rate``) overrides this."""
        toxic = toxic_class(self.TOXIC)
        if toxic is None:
            raise TypeError(f"{type(self).__name__}.TOXIC is {self.TOXIC!r}: no such toxic "
                            f"(add harness/services/proxy/toxics/{self.TOXIC}.py)")
        out: Dict[str, Any] = {}
        for name in toxic.parameters():
            if name not in type(self).model_fields:
                if name in toxic.REQUIRED:
                    raise TypeError(f"the toxic {self.TOXIC} needs {name}: give "
                                    f"{type(self).__name__} a field of that name, or override "
                                    "params()")
                continue
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def proxied(self) -> bool:
        """Whether this fault, as written, runs through the fault proxy on every machine (a
        kind with another engine says when it does not)."""
        return True

    def shown(self) -> str:
        return self.TOXIC

    def apply(self, plan: Any, scn: Any) -> None:
        self.apply_toxic(plan, scn)

    def apply_toxic(self, plan: Any, scn: Any) -> ToxicStep:
        host = self.target_host(plan, scn)
        self.ensure_proxy(plan, scn, host)
        step = ToxicStep(host=host, type=self.TOXIC, direction=self.direction,
                         probability=self.probability, ports=self.toxic_ports(plan),
                         params=self.params(), shown=self.shown(), trigger=self.trigger(),
                         target=f"host {host}")
        plan.add_step(self, step)
        step.undo_trigger = self.heal(step.id)
        plan.notes.append(f"{self.kind}: {self.shown()} on {self.traffic_words()} of host "
                          f"{host} ({self.direction}, fault proxy {self.placement}), "
                          f"{self.when()}")
        return step
