"""Rules of names: a name that did not resolve (the resolver's words, the run's name server
faults, a host with IPv6 off), a reverse lookup the silenced name server held."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Dict, List, Optional

from ._core import Cause, RankContext, _exc_line, rule

GAI = re.compile(r".*(?:gai error|getaddrinfo|Name or service not known|"
                 r"Temporary failure in name resolution|No address associated).*", re.I)


@rule(order=420, evidence=("stderr", "plan", "steps"))
def name_unresolved(c: RankContext) -> Optional[Cause]:
    """A name the rank had to resolve did not resolve (the resolver's words in its stderr)."""
    if c.obs is None:
        return None
    m = GAI.search(c.stderr())
    if m is None:
        return None
    addr = c.env(c.verdict.label).get("MASTER_ADDR", "")
    line = m.group(0).strip()[:300]
    ev = [f"stderr: {line}"] + ([_exc_line(c.verdict)] if c.verdict.exception else [])
    try:
        literal = ipaddress.ip_address(addr.strip("[]")) if addr else None
    except ValueError:
        literal = None
    if literal is not None:
        hosts = [h for h in c.run.plan.get("hosts") or [] if h.get("name") == c.verdict.host]
        host: Dict[str, Any] = hosts[0] if hosts else {}
        off = {k: v for k, v in ((host.get("machine") or {}).get("sysctl") or {}).items()
               if "disable_ipv6" in k and str(v) == "1"}
        if off and literal.version == 6:
            said = ", ".join(f"{k}={v}" for k, v in off.items())
            return Cause(f"MASTER_ADDR={addr} is an IPv6 address, and its lookup failed on "
                         f"this host: host {c.verdict.host} has IPv6 off ({said}): the resolver "
                         "gives no address of a family the host lacks", ev)
    end = c.verdict.duration if c.verdict.duration is not None else float("inf")
    server: List[str] = []
    for st in c.run.step_log:   # what the scenario's name-server faults did by this rank's end
        if st.action != "do" or not st.fault.startswith("dns") or st.t > end:
            continue
        healed = next((u.t for u in c.run.step_log if u.step == st.step and u.action == "undo"),
                      None)
        if healed is not None and healed <= end:
            continue
        server.append(f"{st.what.removeprefix('dns: ')} (the scenario's {st.fault} fault, from "
                    f"{st.t:g} s)")
    return Cause(f"a name did not resolve{f' (MASTER_ADDR={addr})' if addr else ''}"
                 + (": the run's name server: " + "; ".join(server) if server else ""), ev)


NO_PEER_NAME = re.compile(r"The hostname of the client socket cannot be retrieved\. err=-?\d+")
RESOLVER_FAULTS = ("dns_server",)


@rule(order=430, evidence=("stderr", "steps"))
def reverse_lookup_stalled(c: RankContext) -> Optional[Cause]:
    """A store connect that timed out while the name server the scenario's fault silenced held
    c10d's reverse lookup of the peer (its "hostname of the client socket cannot be retrieved"
    comes only after the resolver's own timeouts, past torch's)."""
    v = c.verdict
    if v.outcome not in ("timeout", "hang") or c.obs is None:
        return None
    m = NO_PEER_NAME.search(c.stderr())
    dns = [st for st in c.run.step_log if st.fault in RESOLVER_FAULTS and st.action == "do"]
    if m is None or not dns:
        return None
    return Cause(f"c10d's reverse lookup of its store peer hung on the name server that the "
                 f"scenario's dns_server fault silenced ({dns[0].what}, from "
                 f"{float(dns[0].t or 0):g} s): the connection was up, but the lookup outlasted "
                 "the timeout, though MASTER_ADDR needs no name",
                 [f"stderr: {m.group(0)}"] + ([_exc_line(v)] if v.exception else []))
