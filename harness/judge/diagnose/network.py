"""Rules of the network the scenario's faults shaped: SYNs dropped or refused by an nft
rule, gloo's mesh blocked, no route, partitions, rules added after init, the fault proxy, a
shaped link, a listen queue that overflowed. Most sit late in the table: they speak only
where nothing more specific did."""

from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from ...net.safety import as_meant
from ._core import Cause, RankContext, _exc_line, rule
from ._shared import CONNECT_TIMEOUT, COUNTER, _dead_address, _dropping_rule, _host_addrs, _proxied


@rule(order=510, evidence=("exception", "sockets", "nft", "counters", "plan"))
def syn_unanswered(c: RankContext) -> Optional[Cause]:
    """A SYN sent and never answered: dropped (the nft rule that drops it, when one does)."""
    syn = [s for s in c.sockets if s.state == "SYN_SENT"]
    target: Optional[Tuple[str, int]] = None
    ev: List[str] = []
    if syn:
        s = syn[0]
        target = (s.remote.rsplit(":", 1)[0], s.remote_port)
        ev.append(f"socket: {s.line()}")
    else:
        m = CONNECT_TIMEOUT.search(c.verdict.message or "")
        if m is None:
            return None
        target = (m.group(1).strip(), int(m.group(2)))
    rule = _dropping_rule(c.run.rules, target[1])
    if rule is not None and re.search(r"\breject\b", rule[1]):
        return Cause(f"its connects to {target[0]}:{target[1]} were refused by the nft rule on "
                     f"host {rule[0]} and retried until the client's timeout: {rule[1]}",
                     [_exc_line(c.verdict), f"nft on {rule[0]}: {rule[1]}"])
    # the counters as harness.net.hostspec.COUNTERS names them ("TcpExt.TCPSynRetrans")
    retrans = {h: n.get("TcpExt.TCPSynRetrans", 0) for h, n in c.run.counters.items()
               if n.get("TcpExt.TCPSynRetrans", 0)}
    if not syn and rule is None:
        return None
    text = f"its SYN to {target[0]}:{target[1]} was never answered"
    ip = as_meant(target[0])
    if rule is not None:
        text += f": dropped by the nft rule on host {rule[0]}: {rule[1]}"
        ev.append(f"nft on {rule[0]}: {rule[1]}")
    elif _dead_address(c, ip):
        # the connect waits for ARP, which nobody answers; it ends in No route to host
        text += (f": {ip} is an address where no host of the run answers (nobody on the link "
                 "has it)")
    if retrans:
        ev.append("TCPSynRetrans: " + ", ".join(f"{h} {n}" for h, n in retrans.items()))
    if c.verdict.exception:
        ev.insert(0, _exc_line(c.verdict))
    return Cause(text, ev)


def _blanket_rule(rules: Dict[str, str]) -> Optional[Tuple[str, str]]:
    """(host, rule line) of an nft rule that drops or rejects new connections to every port
    but a few (``dport != P``) or to any port."""
    for host, text in rules.items():
        for ln in text.splitlines():
            ln = COUNTER.sub("", ln.strip())
            if re.search(r"\b(?:drop|reject)\b", ln) and "policy" not in ln and (
                    re.search(r"dport\s*!=", ln) or "dport" not in ln):
                return host, ln
    return None


@rule(order=470, evidence=("exception", "nft"))
def gloo_mesh_blocked(c: RankContext) -> Optional[Cause]:
    """gloo's full mesh could not connect (rank to rank, on ports other than the store's)
    because an nft rule drops or rejects new connections to every port but the store's."""
    msg = c.verdict.message or ""
    if "connectFullMesh" not in msg or not re.search(r"timeout|timed out|refused", msg, re.I):
        return None
    rule = _blanket_rule(c.run.rules)
    if rule is None:
        return None
    host, ln = rule
    how = "refused" if re.search(r"\breject\b", ln) else "dropped"
    verb = "rejects" if how == "refused" else "drops"
    keep = re.search(r"dport\s*!=\s*(\S+)", ln)
    but = f" but {keep.group(1)}" + (" (the store's)" if keep.group(1) == str(c.master_port)
                                     else "") if keep else ""
    own = c.obs is not None and c.obs.host == host
    remote = re.search(r"remote=\[([^\]]+)\]:(\d+)", msg)
    where = "its own host" if own else "host"
    text = f"gloo's full mesh could not connect: the nft rule on {where} " \
        f"{host} {verb} new connections to every port{but}, so the ranks' pair connections " \
        f"to {host} were {how}"
    ev = [_exc_line(c.verdict), f"nft on {host}: {ln}"]
    if remote:
        ev.append(f"its connect to {remote.group(1)}:{remote.group(2)} was {how}")
    return Cause(text, ev)


NO_ROUTE = re.compile(r"connect to (\S+?):(\d+) \(errno: 113 - No route to host\)")
NET_UNREACHABLE = re.compile(r"Network is unreachable", re.I)
DOWN_STEP = re.compile(r"add (\S+) \(down\) on (\S+)")


@rule(order=660, evidence=("exception", "plan", "steps"))
def no_route(c: RankContext) -> Optional[Cause]:
    """A connect the kernel failed at once: nobody on the link answers for the address (113,
    No route to host), or no route at all (Network is unreachable)."""
    v = c.verdict
    msg = v.message or ""
    m = NO_ROUTE.search(msg)
    addrs = _host_addrs(c)
    if m is not None:
        ip, port = m.group(1).strip("[]"), m.group(2)
        if ip in addrs.values():
            return None
        hosts = ", ".join(f"{h} {a}" for h, a in addrs.items())
        return Cause(f"no host answers for {ip} (No route to host): it dialled {ip}:{port}, "
                     f"an address in no host of the run{f' ({hosts})' if hosts else ''}",
                     [_exc_line(v)])
    if not NET_UNREACHABLE.search(msg):
        return None
    names = c.env(v.label).get("GLOO_SOCKET_IFNAME", "")
    host = c.obs.host if c.obs is not None else ""
    down = [m for m in (DOWN_STEP.search(st.what or "") for st in c.run.step_log)
            if m is not None and (not host or m.group(2) == host)]
    listed = [d for d in down if d.group(1) in names.split(",")]
    if listed:
        d = listed[0]
        return Cause(f"GLOO_SOCKET_IFNAME={names} lists {d.group(1)}, which is down on host "
                     f"{d.group(2)}: a gloo pair's connect over it found no route (Network is "
                     "unreachable)", [_exc_line(v), f"step: {d.group(0)}"])
    return Cause("a connect found no route to its address (Network is unreachable)",
                 [_exc_line(v)])


@rule(order=710, evidence=("steps", "plan"))
def through_the_fault_proxy(c: RankContext) -> Optional[Cause]:
    """The scenario's proxy fault (black hole, delay...) sat on the ranks' traffic."""
    v = c.verdict
    if v.outcome not in ("hang", "timeout", "error"):
        return None
    got = _proxied(c)
    if got is None:
        return None
    fault, ports, what, t = got
    return Cause(f"the traffic of {ports} went through the harness's fault proxy: {what} (the "
                 f"scenario's {fault} fault, from {t:g} s)",
                 [_exc_line(v) if v.exception else v.reason])


SADDR_DROP = re.compile(r"ip6? saddr (\S+) (drop|reject)")


@rule(order=700, evidence=("nft", "plan"))
def partitioned(c: RankContext) -> Optional[Cause]:
    """nft rules that drop everything from another host of the run: a partition."""
    v = c.verdict
    if v.outcome not in ("hang", "timeout", "error"):
        return None
    names = {a: h for h, a in _host_addrs(c).items()}
    cuts = []
    for host, text in c.run.rules.items():
        for ln in text.splitlines():
            ln = COUNTER.sub("", ln)
            m = SADDR_DROP.search(ln)
            if m is not None and m.group(1) in names:
                cuts.append((host, names[m.group(1)], ln.strip()))
    if not cuts:
        return None
    said = "; ".join(f"{h} drops every packet from {o}" for h, o, _ in cuts)
    return Cause(f"the hosts were partitioned by nft rules ({said}): the ranks on either side "
                 "could not reach each other", [_exc_line(v) if v.exception else v.reason]
                 + [f"nft on {h}: {ln}" for h, _, ln in cuts])


@rule(order=690, evidence=("nft", "steps"))
def cut_after_init(c: RankContext) -> Optional[Cause]:
    """A rule added by the scenario's firewall after init cut the ranks' established pairs."""
    v = c.verdict
    if v.outcome not in ("hang", "timeout", "error") or not (v.phase or "").startswith(
            ("workload step", "train step", "ddp")):
        return None
    rule = _blanket_rule(c.run.rules)
    added = next((s for s in c.run.step_log if s.fault == "firewall" and s.action == "do"
                  and float(s.t or 0) > 0), None)
    if rule is None or added is None:
        return None
    host, ln = rule
    how = "rejects (a reset)" if re.search(r"\breject\b", ln) else "drops"
    return Cause(f"an nft rule added at {float(added.t):g} s on host {host} {how} all of its "
                 f"TCP traffic: gloo's pairs, made in init, were cut in {v.phase}",
                 [_exc_line(v) if v.exception else v.reason, f"nft on {host}: {ln}"])


LINK_FAULTS = ("packet_loss", "bandwidth", "latency")


@rule(order=720, evidence=("steps",))
def a_link_fault_in_force(c: RankContext) -> Optional[Cause]:
    """A timeout or hang while the scenario's fault shaped a host's link (packet loss, a
    bandwidth limit, a delay): said with what the fault did."""
    v = c.verdict
    if v.outcome not in ("hang", "timeout"):
        return None
    shaped = [st for st in c.run.step_log if st.fault in LINK_FAULTS and st.action == "do"
              and not (st.what or "").startswith(("start the fault proxy", "proxy: "))]
    if not shaped:
        return None
    said = "; ".join(f"{st.target}: {st.what} (from {float(st.t or 0):g} s)" for st in shaped[:3])
    return Cause(f"the scenario's {shaped[0].fault} fault shaped the link ({said})",
                 [_exc_line(v) if v.exception else v.reason])


LISTEN_SYSCTLS = ("net.core.somaxconn", "net.ipv4.tcp_max_syn_backlog",
                  "net.ipv4.tcp_abort_on_overflow")
NET_FAILURE = re.compile(r"reset by peer|closed by peer|Connect timeout|timed out connecting|"
                         r"Timed out waiting \d+ms for (?:recv|send)|Failed to recv|"
                         r"clients joined", re.I)


@rule(order=670, evidence=("exception", "plan", "counters"))
def listen_queue_overflowed(c: RankContext) -> Optional[Cause]:
    """A network failure in a run where a host the scenario gave a small listen backlog
    (``sysctl: net.core.somaxconn``, ``tcp_abort_on_overflow``) counted listen overflows: the
    kernel dropped or reset connections to its listeners (the store's and rank 0's gloo
    listener share that backlog)."""
    v = c.verdict
    if v.outcome not in ("error", "timeout") or not NET_FAILURE.search(v.message or ""):
        return None
    for h in c.run.plan.get("hosts", []):
        sysctl = (h.get("machine") or {}).get("sysctl") or {}
        set_ = {k: sysctl[k] for k in LISTEN_SYSCTLS if k in sysctl}
        counts = (c.run.counters or {}).get(h.get("name"), {})
        over = counts.get("TcpExt.ListenOverflows", 0)
        if not set_ or not over:
            continue
        said = ", ".join(f"{k}={val}" for k, val in set_.items())
        return Cause(f"{h.get('name')}'s listen queue overflowed (TcpExt.ListenOverflows "
                     f"{over}, ListenDrops {counts.get('TcpExt.ListenDrops', 0)}; the "
                     f"scenario's sysctl {said}): the kernel dropped or reset connections to "
                     "its listeners (the store and rank 0's gloo listener), and gloo's mesh "
                     f"broke: this rank {'timed out' if v.outcome == 'timeout' else 'failed'} "
                     f"in {v.phase}", [_exc_line(v), f"{h.get('name')} counters: "
                                       + ", ".join(f"{k} {n}" for k, n in counts.items())])
    return None
