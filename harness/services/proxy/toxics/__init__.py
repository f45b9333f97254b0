"""The fault proxy's toxics: one module each, registered by discovery (no hand-kept list).

A toxic (Toxiproxy's model) is a small named thing with a direction, a probability and a few
parameters. Its module defines one :class:`Toxic` subclass with a ``NAME`` and owns everything
the proxy does for it:

* ``REQUIRED`` / ``OPTIONAL``: its parameters (numbers, checked by :meth:`Toxic.parse`;
  ``MINIMUM`` where one's lower bound is above 0), and :meth:`Toxic.validate` for the rest;
* what it does to a connection, through the hooks a :class:`~..conn.Conn` calls; the base
  class's hooks do nothing, and a connection asks only the toxics whose class overrides a
  hook (a toxic counts as having met a connection the first time one of its hooks is asked):

  - ``HOLDS``: nothing is read in its direction while it is on, and a connection whose
    client-to-server stream it holds is never dialed on (``blackhole``);
  - :meth:`Toxic.read_delay`: seconds added to each chunk read (``latency``);
  - :meth:`Toxic.shape`: what is sent of a chunk and the pause after it, or the connection's
    end (``slicer``, ``limit_data``, ``reset_peer``, ``bandwidth``), in ``STAGE`` order;
  - :meth:`Toxic.close_delay`: seconds before a stream's end of file is passed on
    (``slow_close``);
  - :meth:`Toxic.reset_at`: when (monotonic) the connection is reset, whatever flows
    (``reset_peer`` by time).

Adding a toxic touches its module here, the fault that switches it on (a
``harness.faults._proxy.ProxyFault`` subclass with ``TOXIC = NAME``, in ``harness/faults/``),
a catalog scenario and tests (``tests/test_registries.py`` names what is missing).

Only the standard library (and :mod:`harness.core.registry`): the proxy imports this in its own
process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Dict, List, Optional, Tuple, Type

from ....core.registry import discover

if TYPE_CHECKING:   # a connection calls the hooks; this package never imports it
    from ..conn import Conn

DIRECTIONS = ("in", "out", "both")
HOOKS = ("read_delay", "shape", "close_delay", "reset_at")


class ToxicError(ValueError):
    """A request names an unknown toxic, direction or parameter."""


def number(params: Dict[str, Any], name: str, default: Optional[float] = None, *,
           low: float = 0.0, high: float = 1e12) -> float:
    """A parameter that must be a number within ``low..high``."""
    v = params.get(name, default)
    if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ToxicError(f"{name} must be a number, got {v!r}")
    if not low <= v <= high:
        raise ToxicError(f"{name} must be within {low:g}..{high:g}, got {v!r}")
    return float(v)


def _ports(ports: Any) -> Optional[Dict[str, List[int]]]:
    if ports is None:
        return None
    if not isinstance(ports, dict) or len(ports) != 1 or \
            next(iter(ports)) not in ("only", "except") or \
            not all(isinstance(p, int) and 0 < p < 65536 for p in next(iter(ports.values()))):
        raise ToxicError(f"ports must be {{'only': [...]}} or {{'except': [...]}}, got {ports!r}")
    return ports


@dataclass
class Toxic:
    """One toxic switched on in the proxy (its class: the kind; see the package doc)."""

    NAME: ClassVar[str] = ""
    SUMMARY: ClassVar[str] = ""       # what it does to a connection (the reference page)
    REQUIRED: ClassVar[Tuple[str, ...]] = ()
    OPTIONAL: ClassVar[Tuple[str, ...]] = ()
    MINIMUM: ClassVar[Dict[str, float]] = {}
    HOLDS: ClassVar[bool] = False
    STAGE: ClassVar[int] = 50         # shape's order among the toxics of one chunk

    id: str
    direction: str = "both"
    probability: float = 1.0
    ports: Optional[Dict[str, List[int]]] = None
    params: Dict[str, Any] = field(default_factory=dict)
    since: float = 0.0                # monotonic time it was switched on

    @property
    def type(self) -> str:
        return self.NAME

    @classmethod
    def parameters(cls) -> Tuple[str, ...]:
        return cls.REQUIRED + cls.OPTIONAL

    @classmethod
    def overrides(cls, hook: str) -> bool:
        """Whether this kind does something at ``hook`` (a name in HOOKS, or ``holds``)."""
        if hook == "holds":
            return cls.HOLDS
        return getattr(cls, hook) is not getattr(Toxic, hook)

    @staticmethod
    def parse(req: Dict[str, Any]) -> Toxic:
        """The toxic an ``add`` request asks for, of its registered kind."""
        tid, typ = req.get("id"), req.get("type")
        if not isinstance(tid, str) or not tid:
            raise ToxicError("a toxic needs an id (a non-empty string)")
        cls = TOXICS.get(typ) if isinstance(typ, str) else None
        if cls is None:
            raise ToxicError(f"unknown toxic type {typ!r} (known: {', '.join(TOXICS)})")
        direction = req.get("direction", "both")
        if direction not in DIRECTIONS:
            raise ToxicError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        prob = number(req, "probability", 1.0, low=0.0, high=1.0)
        ports = _ports(req.get("ports"))
        params = req.get("params") or {}
        if not isinstance(params, dict):
            raise ToxicError("params must be an object")
        unknown = set(params) - set(cls.parameters())
        if unknown:
            raise ToxicError(f"{typ} takes no {', '.join(sorted(unknown))}")
        for name in cls.REQUIRED:
            number(params, name, low=cls.MINIMUM.get(name, 0.0))
        for name in cls.OPTIONAL:
            if params.get(name) is not None:
                number(params, name, low=cls.MINIMUM.get(name, 0.0))
        toxic = cls(tid, direction, prob, ports, dict(params), time.monotonic())
        toxic.validate()
        return toxic

    def validate(self) -> None:
        """What the numbers' bounds cannot say (raise ToxicError)."""

    def port_matches(self, port: int) -> bool:
        if self.ports is None:
            return True
        if "only" in self.ports:
            return port in self.ports["only"]
        return port not in self.ports["except"]

    def p(self, name: str, default: float = 0.0) -> float:
        v = self.params.get(name)
        return default if v is None else float(v)

    # -- hooks (see the package doc); the base class's do nothing and are never asked ---------
    def read_delay(self, conn: Conn) -> float:
        """Seconds added to a chunk read from the stream (its order is kept)."""
        return 0.0

    def shape(self, conn: Conn, stream: str, piece: bytes, pause: float
              ) -> Tuple[bytes, float]:
        """What is sent of ``piece`` and the pause after it; a toxic that ends the connection
        calls ``conn.finish`` (nothing more is sent)."""
        return piece, pause

    def close_delay(self, conn: Conn) -> float:
        """Seconds before the stream's end of file reaches the other side."""
        return 0.0

    def reset_at(self, conn: Conn) -> Optional[float]:
        """When (``time.monotonic()``) the connection is reset; None: never by time."""
        return None


def _discover() -> Dict[str, Type[Toxic]]:
    """Every Toxic subclass with a NAME in this package's modules, in name order."""
    return discover(__name__, __path__, Toxic, "toxic")


TOXICS: Dict[str, Type[Toxic]] = _discover()


def toxic_class(name: str) -> Optional[Type[Toxic]]:
    return TOXICS.get(name)
