"""Rules of the interfaces gloo and NCCL pick: GLOO_SOCKET_IFNAME naming a card the host
lacks, a second card on a network no other host is on, a link-local only card, a pair that
dialled an address no host has; NCCL finding no interface, two ranks on one GPU."""

from __future__ import annotations

import re
from typing import Callable, Dict, List, Optional, Tuple

from ._core import Cause, RankContext, _exc_line, rule
from ._shared import _host_addrs, _is_loopback

REMOTE = re.compile(r"remote=\[([^\]]+)\]:(\d+)")


def _ifname(c: RankContext, label: str) -> str:
    """The rank's GLOO_SOCKET_IFNAME in words: as planned, else as the process said at its
    start (a task srun started, a worker of an agent)."""
    env = c.env(label)
    name = env.get("GLOO_SOCKET_IFNAME")
    if name is None and not env:
        o = c.obs_of(label)
        if o is None or "gloo_socket_ifname" not in (o.info or {}):
            return "GLOO_SOCKET_IFNAME as its launcher set it"
        name = o.info.get("gloo_socket_ifname")
    return "GLOO_SOCKET_IFNAME unset" if name is None else f"GLOO_SOCKET_IFNAME={name}"


SPARE_STEP = re.compile(r"^add (\S+) \((up|down)(, link-local only)?\) on (\S+)$")


def _spare_cards(c: RankContext) -> List[Tuple[str, str, str, bool]]:
    """(address, host, interface, link-local only) of every second card a fault gave a host
    (second_nic, wrong_interface list_down): the step's own record of the address it got."""
    out = []
    for st in c.run.step_log:
        m = SPARE_STEP.match(st.what or "")
        addr = (st.info or {}).get("addr") if st.action == "do" else None
        if m is not None and addr:
            out.append((str(addr), m.group(4), m.group(1), m.group(3) is not None))
    return out


def _second_cards(c: RankContext) -> Dict[str, Tuple[str, str]]:
    """Address -> (host, interface) of every second card with an address of its own subnet."""
    return {a: (h, i) for a, h, i, link_local in _spare_cards(c) if not link_local}


def _peer_dialled_mine(c: RankContext, where: Callable[[str], Optional[Tuple[str, str]]]
                      ) -> Optional[Cause]:
    """Another row's gloo pair dialled an address this rank advertised and gave up, while this
    rank waited for the pair: the first such row whose address ``where`` speaks of (``where``:
    what the address is, after "the address this rank advertised", and the evidence line; None
    for an address the rule is not about)."""
    v = c.verdict
    for o in c.verdicts:
        om = REMOTE.search(o.message or "") if o.label != v.label else None
        said = where(om.group(1)) if om is not None else None
        if om is not None and said is not None:
            return Cause(f"gloo's full mesh never connected: rank {o.label} dialled "
                         f"{om.group(1)}:{om.group(2)}, the address this rank advertised "
                         f"{said[0]}, and gave up at {o.duration:g} s; this rank waited for "
                         "the pair until gloo's connect timeout",
                         [_exc_line(v), _exc_line(o), said[1]])
    return None


@rule(order=490, evidence=("exception", "plan", "steps", "verdicts"))
def gloo_pair_to_a_second_card(c: RankContext) -> Optional[Cause]:
    """A gloo pair dialled the address of a host's second card, on a network no other host is
    on (GLOO_SOCKET_IFNAME named it: each rank advertised its own there): no route; the rank
    on that card's host waits for the pair until gloo's connect timeout."""
    v = c.verdict
    if "connectFullMesh" not in (v.message or ""):
        return None
    cards = _second_cards(c)
    if not cards:
        return None
    m = REMOTE.search(v.message or "")
    if m is not None and m.group(1) in cards:
        host, ifname = cards[m.group(1)]
        who = [o.label for o in c.verdicts if o.host == host and o.label != v.label
               and o.role == v.role]
        said = re.search(r"SO_ERROR: ([^,]+)", v.message or "")
        return Cause(f"its gloo pair dialled {m.group(1)}:{m.group(2)}, the address of host "
                     f"{host}'s second card {ifname}, on a network no other host is on"
                     + (f" ({said.group(1)})" if said else "") + ": "
                     + (f"rank {who[0]} advertised it ({_ifname(c, who[0])})" if who
                        else "its rank advertised it"),
                     [_exc_line(v), f"{host} {ifname}: {m.group(1)}"])
    mine = {a: hi for a, hi in cards.items() if hi[0] == v.host}

    def on_my_card(addr: str) -> Optional[Tuple[str, str]]:
        if addr not in mine:
            return None
        host, ifname = mine[addr]
        return (f"on {host}'s second card {ifname} ({_ifname(c, v.label)}), on a network no "
                "other host is on", f"{host} {ifname}: {addr}")

    return _peer_dialled_mine(c, on_my_card)


@rule(order=480, evidence=("exception", "plan", "steps"))
def gloo_on_a_link_local_card(c: RankContext) -> Optional[Cause]:
    """GLOO_SOCKET_IFNAME names a card whose only address is IPv6 link-local (second_nic
    address: link_local): gloo advertises that address, a peer's pair dials it out of its own
    card of that name, on a network where no other host is (a link-local address is good only
    on its own link), and gloo's connect times out."""
    v = c.verdict
    if "connectFullMesh" not in (v.message or ""):
        return None
    names = [n.strip() for n in c.env(v.label).get("GLOO_SOCKET_IFNAME", "").split(",")]
    for addr, host, ifname, link_local in _spare_cards(c):
        if not link_local or host != v.host or ifname not in names:
            continue
        return Cause(f"GLOO_SOCKET_IFNAME={','.join(n for n in names if n)} names "
                     f"{ifname}, whose only address on host {v.host} is the IPv6 "
                     f"link-local {addr}: gloo advertised it, but a link-local address is "
                     "good only on its own link, and each host's "
                     f"{ifname} is on a network no other host is on: no pair connected "
                     "until gloo's connect timeout",
                     [_exc_line(v), f"{v.host} {ifname}: {addr} (link-local only)"])
    return None


@rule(order=500, evidence=("exception", "plan", "verdicts"))
def gloo_pair_to_no_host(c: RankContext) -> Optional[Cause]:
    """A gloo pair dialled an address no host of the run has (a peer advertised 127.0.0.1: on
    namespace hosts that is the dialler's own namespace): the dialler is refused, the peer
    waits for the pair until gloo's connect timeout."""
    v = c.verdict
    if "connectFullMesh" not in (v.message or ""):
        return None
    addrs = _host_addrs(c)
    if len(addrs) < 2:
        return None   # one machine: 127.0.0.1 is everybody's
    hosts = ", ".join(f"{h} {a}" for h, a in addrs.items())
    m = REMOTE.search(v.message or "")
    if m is not None and m.group(1) not in addrs.values() and _is_loopback(m.group(1)):
        peers = [o.label for o in c.verdicts if o.label != v.label and o.role == v.role]
        return Cause(f"its gloo pair dialled {m.group(1)}:{m.group(2)}, an address no host of "
                     f"the run has ({hosts}): the peer{'s' * (len(peers) > 1)} advertised it "
                     f"({_ifname(c, peers[0]) if peers else ''}), so it dialled its own "
                     "namespace, where nothing listened, and was refused",
                     [_exc_line(v), f"hosts: {hosts}"])

    def on_no_host(addr: str) -> Optional[Tuple[str, str]]:
        if addr in addrs.values() or not _is_loopback(addr):
            return None
        return (f"({_ifname(c, v.label)}), which no host of the run has ({hosts})",
                f"hosts: {hosts}")

    return _peer_dialled_mine(c, on_no_host)


@rule(order=440, evidence=("exception", "plan", "info"))
def gloo_interface_missing(c: RankContext) -> Optional[Cause]:
    """GLOO_SOCKET_IFNAME names an interface the rank's host does not have."""
    m = re.search(r"Unable to find address for: (\S+)", c.verdict.message or "")
    if m is None:
        return None
    host = c.obs.host if c.obs is not None else "its host"
    return Cause(f"{_ifname(c, c.verdict.label)} names interface {m.group(1)}, which host "
                 f"{host} does not have", [_exc_line(c.verdict)])


NCCL_NO_IFACE = re.compile(r"Bootstrap : no socket interface found")
NCCL_DUP_GPU = re.compile(r"Duplicate GPU detected : rank (\d+) and rank (\d+) both on CUDA "
                          r"device (\w+)")


@rule(order=450, evidence=("exception", "plan"))
def nccl_interface_missing(c: RankContext) -> Optional[Cause]:
    """NCCL's bootstrap found no interface NCCL_SOCKET_IFNAME allows (watched on an H200,
    torch 2.11.0+cu130, NCCL 2.28.9: DistBackendError ncclInvalidUsage at the first
    collective: NCCL makes its communicator there, not in init_process_group)."""
    m = NCCL_NO_IFACE.search(c.verdict.message or "")
    if m is None:
        return None
    name = c.env(c.verdict.label).get("NCCL_SOCKET_IFNAME")
    host = c.obs.host if c.obs is not None else ""
    where = "this machine's" if host in ("", "local") else f"host {host}'s"
    said = f"NCCL_SOCKET_IFNAME={name} matches" if name is not None else \
        "NCCL_SOCKET_IFNAME unset: NCCL's default choice matched"
    return Cause(f"NCCL found no network interface to bootstrap on in {c.verdict.phase}: {said} "
                 f"none of {where} interfaces",
                 [_exc_line(c.verdict), f"NCCL's last error: {m.group(0)}"])


@rule(order=460, evidence=("exception", "plan"))
def nccl_ranks_share_a_gpu(c: RankContext) -> Optional[Cause]:
    """Two ranks of one communicator on one CUDA device: NCCL refuses it (ncclInvalidUsage,
    "Duplicate GPU detected"), where a program does not give each rank its own device, or
    omits the backend (torch then takes cpu:gloo,cuda:nccl and runs barrier on the current
    CUDA device: watched on an H200 with 2 ranks and no set_device)."""
    m = NCCL_DUP_GPU.search(c.verdict.message or "")
    if m is None:
        return None
    a, b, dev = m.groups()
    a, b = sorted((a, b), key=int)
    locals_ = {c.env(r).get("LOCAL_RANK") for r in (a, b)}
    how = f" (both were given LOCAL_RANK={locals_.pop()})" if len(locals_) == 1 and \
        None not in locals_ else ""
    return Cause(f"ranks {a} and {b} are both on CUDA device {dev}{how}: NCCL needs one GPU per "
                 "rank: each rank sets its own (torch.cuda.set_device(LOCAL_RANK), or "
                 "init_process_group(device_id=...)) before its first collective",
                 [_exc_line(c.verdict), f"NCCL's last error: {m.group(0)}"])
