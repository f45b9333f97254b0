"""A topology's traffic control: rate limits (``tbf``) and delays (``netem``) on the hosts'
links, made over netlink (pyroute2, from a thread inside the namespace) and read back with the
kernel's statistics; and tc's unit words, read as tc reads them.

A rate limit shapes what a host sends (its ``eth0``) or receives (the bridge-side end of its
veth, in the switch namespace); latency is added only with the ``netem`` qdisc
(:meth:`Qdiscs.add_delay`; :func:`harness.net.topology.qdisc_missing` says whether the kernel
has one; tbf's own queue-bound argument adds no delay).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Dict, List, Mapping, Optional, Tuple

from pyroute2.netlink.rtnl import TC_H_ROOT

from .addresses import LINK_IFNAME, TopologyBase
from .firewall import LossDirection
from .netns import _in_netns, _index

_TC_VALUE_RE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)$")

# tc's units (tc(8), "UNITS"), read as tc reads them (case-insensitive): the harness gives the
# kernel numbers, so the words of a scenario must mean what they meant to tc
_RATE_BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12, "bps": 8,
              "kbps": 8e3, "mbps": 8e6, "gbps": 8e9, "tbps": 8e12}
_SIZE_BYTES = {"b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3,
               "gb": 1024**3, "kbit": 1024 / 8, "mbit": 1024**2 / 8, "gbit": 1024**3 / 8}
_TIME_US = {"s": 1e6, "sec": 1e6, "secs": 1e6, "ms": 1e3, "msec": 1e3, "msecs": 1e3,
            "us": 1, "usec": 1, "usecs": 1}


def _tc_value(what: str, value: str, units: Mapping[str, float], default: str) -> float:
    m = _TC_VALUE_RE.match(value) if isinstance(value, str) else None
    unit = (m.group(2) or default).lower() if m else ""
    if not m or unit not in units:
        raise ValueError(f"{what} must be a number and one of tc's units "
                         f"({', '.join(units)}), got {value!r}")
    return float(m.group(1)) * units[unit]


def tc_rate(rate: str) -> int:
    """tc's rate words (``1mbit``, ``100kbps``; a bare number is bits) in bytes per second."""
    return max(1, int(_tc_value("rate", rate, _RATE_BITS, "bit") / 8))


def tc_size(size: str) -> int:
    """tc's size words (``16kb``: 16384 bytes; a bare number is bytes) in bytes."""
    return int(_tc_value("size", size, _SIZE_BYTES, "b"))


def tc_time(time_: str) -> int:
    """tc's time words (``400ms``; a bare number is microseconds) in microseconds."""
    return int(_tc_value("time", time_, _TIME_US, "us"))


def _root_qdisc(ipr: Any, index: int) -> Optional[Any]:
    """The qdisc the harness set at the root of a link, if any (a default one the kernel
    attached by itself has handle 0 and is nothing to remove)."""
    for msg in ipr.get_qdiscs(index=index):
        if msg["index"] == index and msg["parent"] == TC_H_ROOT and msg["handle"]:
            return msg
    return None


def _clear_root_qdisc(netns: str, dev: str) -> None:
    """Remove the root qdisc of a link (none there, or the link or namespace gone: no error)."""
    def clear(ipr: Any) -> None:
        index = _index(ipr, dev)
        q = _root_qdisc(ipr, index)
        if q is not None:   # no kind given: pyroute2 would encode that kind's options
            ipr.tc("del", index=index, handle=q["handle"], parent=TC_H_ROOT)

    _in_netns(netns, f"removing the qdisc of {dev}", clear, ok_if_gone=True)



class Qdiscs(TopologyBase):
    """The qdisc part of a Topology: rate limits and delays on the hosts' links."""

    def _shaped_links(self, host: str, direction: LossDirection) -> List[Tuple[str, str]]:
        """(namespace, device) pairs whose egress carries the host's traffic that way."""
        net = self.host(host)
        if direction not in ("in", "out", "both"):
            raise ValueError(f"direction must be 'in', 'out' or 'both', got {direction!r}")
        if not self.link:
            return [(net.netns, "lo")]
        links = []
        if direction in ("out", "both"):
            links.append((net.netns, LINK_IFNAME))
        if direction in ("in", "both") and self.switch_netns:
            links.append((self.switch_netns, self._ports[host]))
        return links

    def rate_limit(
        self,
        host: str,
        rate: str,
        burst: Optional[str] = None,
        queue_bound: str = "400ms",
        direction: LossDirection = "out",
    ) -> None:
        """Limit the host's link with a ``tbf`` qdisc (replacing the root qdisc, over netlink).

        ``out`` shapes what the host sends (its ``eth0``), ``in`` what it receives (the
        bridge-side end of its veth, in the switch namespace). ``queue_bound`` (tbf's own
        keyword for it is "latency") bounds queueing; it adds no delay. ``burst`` defaults to
        16kb, or 80kb on loopback, whose 64 KiB packets tbf would otherwise drop. Values are
        written in tc's units (:func:`tc_rate`, :func:`tc_size`, :func:`tc_time`); the kernel
        gets the numbers ``tc qdisc replace ... tbf rate R burst B latency L`` would give it.
        """
        self._require_up()
        if burst is None:
            burst = "16kb" if self.link else "80kb"
        params = {"rate": tc_rate(rate), "burst": tc_size(burst),
                  "latency": tc_time(queue_bound)}
        def tbf(ipr: Any, dev: str) -> None:
            ipr.tc("replace", "tbf", _index(ipr, dev), **params)

        for netns, dev in self._shaped_links(host, direction):
            _in_netns(netns, f"limiting {dev} to {rate}", functools.partial(tbf, dev=dev))

    def rate_limit_stats(self, host: str,
                         direction: LossDirection = "out") -> List[Dict[str, Any]]:
        """The statistics of the root qdisc of each link :meth:`rate_limit` shapes that way, as
        the kernel keeps them (``tc -s qdisc``): ``{"link": "eth0", "way": "out", "kind": "tbf",
        "packets",
        "bytes", "drops", "overlimits", "requeues", "backlog", "qlen"}``; a link without a qdisc
        of the harness's has ``"kind": None`` and no numbers."""
        self._require_up()

        def read(ipr: Any, dev: str) -> Dict[str, Any]:
            q = _root_qdisc(ipr, _index(ipr, dev))
            if q is None:
                return {"link": dev, "kind": None}
            basic = dict(q.get_nested("TCA_STATS2", "TCA_STATS_BASIC") or {})
            queue = dict(q.get_nested("TCA_STATS2", "TCA_STATS_QUEUE") or {})
            old = dict(q.get_attr("TCA_STATS") or {})
            def num(d: Dict[str, Any], key: str, old_key: str) -> int:
                v = d.get(key)
                return int(v if v is not None else old.get(old_key) or 0)

            return {"link": dev, "kind": q.get_attr("TCA_KIND"),
                    "packets": num(basic, "packets", "packets"),
                    "bytes": num(basic, "bytes", "bytes"),
                    "drops": num(queue, "drops", "drop"),
                    "overlimits": num(queue, "overlimits", "overlimits"),
                    "requeues": num(queue, "requeues", "requeues"),
                    "backlog": num(queue, "backlog", "backlog"),
                    "qlen": num(queue, "qlen", "qlen")}

        return [{**(_in_netns(netns, f"reading the qdisc of {dev}",
                              functools.partial(read, dev=dev)) or {}),
                 "way": "in" if netns == self.switch_netns else "out" if self.link else "both"}
                for netns, dev in self._shaped_links(host, direction)]

    def clear_rate_limit(self, host: str, direction: LossDirection = "both") -> None:
        """Remove a limit set by :meth:`rate_limit` (no error if there is none)."""
        self._require_up()
        for netns, dev in self._shaped_links(host, direction):
            _clear_root_qdisc(netns, dev)

    def add_delay(self, host: str, delay_ms: float, jitter_ms: float = 0.0) -> None:
        """Delay what the host sends on its link with a ``netem`` qdisc (where the kernel has
        one: :func:`qdisc_missing`)."""
        self._require_up()
        net = self.host(host)
        params = {"delay": round(delay_ms * 1000), "jitter": round(jitter_ms * 1000)}  # µs
        _in_netns(net.netns, f"delaying {net.ifname} by {delay_ms:g} ms",
                  lambda ipr: ipr.tc("replace", "netem", _index(ipr, net.ifname), **params))

    def clear_delay(self, host: str) -> None:
        """Remove a delay set by :meth:`add_delay` (no error if there is none)."""
        self._require_up()
        net = self.host(host)
        _clear_root_qdisc(net.netns, net.ifname)
