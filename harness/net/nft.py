"""nftables through its JSON interface (``nft -j``): the rule expressions the harness adds, and
the rules in force rendered back to the text ``nft -a list table`` prints.

Pure (no process is run here): :mod:`harness.net.topology` sends what :func:`add_rule` and
:func:`add_chain` make to ``nft -j --echo --handle -f -`` and reads tables with
``nft -j list table``; nothing reads nft's human-readable output. :func:`render_table` writes a
table's JSON back in nft's own text form (tabs, ``# handle N``, a one-element set written as
its value, ``reject`` for inet's default ICMPx port-unreachable, named chain priorities), so
that reports and the diagnosis quote a rule exactly as ``nft -a list table`` would show it.
Only the expressions the harness makes are rendered in nft's words; anything else is written
as its JSON (never dropped).
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = [
    "Expr",
    "add_chain",
    "add_rule",
    "add_table",
    "ct_state",
    "delete_rule",
    "delete_table",
    "match",
    "meta",
    "payload",
    "render_rule",
    "render_table",
    "rules_of",
    "script",
]

Expr = Dict[str, Any]
Value = Union[int, str, Expr, List[Any]]

# nft's named base-chain priorities (families ip, ip6, inet), with the hooks each name is used
# for when nft prints a chain (dstnat only in prerouting, srcnat only in postrouting)
_PRIORITIES = (
    ("raw", -300, None),
    ("mangle", -150, None),
    ("dstnat", -100, ("prerouting",)),
    ("filter", 0, None),
    ("security", 50, None),
    ("srcnat", 100, ("postrouting",)),
)
# meta keys nft prints without the word "meta"
_UNQUALIFIED_META = ("iif", "oif", "iifname", "oifname", "iifgroup", "oifgroup")


# ---- building ------------------------------------------------------------------------------

def payload(protocol: str, field: str) -> Expr:
    """A header field: ``payload("tcp", "dport")``, ``payload("ip6", "saddr")``."""
    return {"payload": {"protocol": protocol, "field": field}}


def meta(key: str) -> Expr:
    """A meta key: ``meta("l4proto")``, ``meta("iifname")``, ``meta("mark")``."""
    return {"meta": {"key": key}}


def match(left: Expr, right: Value, op: str = "==") -> Expr:
    """``left op right``; a list as ``right`` is a set (``{"set": [...]}``), a 2-tuple a range
    is given as ``{"range": [low, high]}`` by the caller."""
    if isinstance(right, list):
        right = {"set": list(right)}
    return {"match": {"op": op, "left": left, "right": right}}


def ct_state(*states: str) -> Expr:
    """``ct state new`` (a bitmask match: op ``in``)."""
    return match({"ct": {"key": "state"}}, states[0] if len(states) == 1 else list(states),
                  "in")


def add_table(family: str, table: str) -> Expr:
    return {"add": {"table": {"family": family, "name": table}}}


def add_chain(family: str, table: str, chain: str, *, type: str, hook: str, prio: int,
              policy: str = "accept") -> Expr:
    """A base chain (``type filter hook input priority 0; policy accept;``)."""
    return {"add": {"chain": {"family": family, "table": table, "name": chain, "type": type,
                              "hook": hook, "prio": prio, "policy": policy}}}


def add_rule(family: str, table: str, chain: str, expr: Sequence[Expr],
             comment: Optional[str] = None) -> Expr:
    rule: Dict[str, Any] = {"family": family, "table": table, "chain": chain,
                            "expr": list(expr)}
    if comment is not None:
        rule["comment"] = comment
    return {"add": {"rule": rule}}


def delete_rule(family: str, table: str, chain: str, handle: int) -> Expr:
    return {"delete": {"rule": {"family": family, "table": table, "chain": chain,
                                "handle": handle}}}


def delete_table(family: str, table: str) -> Expr:
    return {"delete": {"table": {"family": family, "name": table}}}


def script(commands: Sequence[Expr]) -> str:
    """The JSON text ``nft -j -f -`` reads: one batch, applied all or nothing."""
    return json.dumps({"nftables": list(commands)})


def rules_of(echoed: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The rules (with their handles) of what ``nft -j --echo --handle`` printed for a batch,
    or of a ``nft -j list`` answer."""
    out = []
    for item in echoed.get("nftables", []):
        rule = (item.get("add") or item).get("rule") if isinstance(item, dict) else None
        if isinstance(rule, dict):
            out.append(rule)
    return out


def counters_of(listing: Mapping[str, Any], rules: Any) -> Dict[str, int]:
    """Packets and bytes counted by the rules of ``listing`` (``nft -j list table``) whose
    (chain, handle) is in ``rules``, summed; ``rules`` found counts how many of them had a
    counter."""
    out = {"packets": 0, "bytes": 0, "rules": 0}
    for r in rules_of(listing):
        if (str(r.get("chain")), r.get("handle")) not in rules:
            continue
        for e in r.get("expr") or []:
            if isinstance(e, dict) and "counter" in e:
                c = e["counter"] or {}
                out["packets"] += int(c.get("packets", 0))
                out["bytes"] += int(c.get("bytes", 0))
                out["rules"] += 1
    return out


def tables_of(listing: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """(family, name) of every table in a ``nft -j list tables`` answer."""
    out = []
    for item in listing.get("nftables", []):
        table = item.get("table") if isinstance(item, dict) else None
        if isinstance(table, dict):
            out.append((str(table.get("family")), str(table.get("name"))))
    return out


# ---- rendering (nft's own text) ------------------------------------------------------------

def _prio(prio: Any, hook: str) -> str:
    for name, level, hooks in _PRIORITIES:
        if prio == level and (hooks is None or hook in hooks):
            return name
    return str(prio)


def _expr(e: Any, left: Optional[Expr] = None) -> str:
    """An expression (the left or right side of a match)."""
    if isinstance(e, bool):
        return json.dumps(e)
    if isinstance(e, int):
        if left is not None and left.get("meta", {}).get("key") == "mark":
            return f"0x{e:08x}"
        return str(e)
    if isinstance(e, str):
        if left is not None and "meta" in left and left["meta"].get("key") in (
                "iifname", "oifname"):
            return json.dumps(e)
        return e
    if isinstance(e, list):   # ct state new,established
        return ",".join(_expr(x, left) for x in e)
    if isinstance(e, dict):
        if "payload" in e:
            p = e["payload"]
            return f"{p.get('protocol')} {p.get('field')}"
        if "meta" in e:
            key = e["meta"].get("key")
            return str(key) if key in _UNQUALIFIED_META else f"meta {key}"
        if "ct" in e:
            return f"ct {e['ct'].get('key')}"
        if "numgen" in e:
            n = e["numgen"]
            off = n.get("offset", 0)
            return f"numgen {n.get('mode')} mod {n.get('mod')}" + (
                f" offset {off}" if off else "")
        if "set" in e:
            return "{ " + ", ".join(_expr(x, left) for x in e["set"]) + " }"
        if "range" in e:
            low, high = e["range"]
            return f"{_expr(low, left)}-{_expr(high, left)}"
    return json.dumps(e)


def _statement(s: Mapping[str, Any]) -> str:
    if "match" in s:
        m = s["match"]
        op = m.get("op", "==")
        left = m.get("left")
        text = [_expr(left)]
        if op not in ("==", "in"):
            text.append(op)
        text.append(_expr(m.get("right"), left if isinstance(left, dict) else None))
        return " ".join(text)
    if "drop" in s:
        return "drop"
    if "accept" in s:
        return "accept"
    if "reject" in s:
        r = s["reject"] or {}
        kind, what = r.get("type"), r.get("expr")
        if kind is None or (kind == "icmpx" and what in (None, "port-unreachable")):
            return "reject"     # inet's default reject, as nft prints it
        return f"reject with {kind}" + (f" {what}" if what else "")
    if "redirect" in s:
        r = s["redirect"] or {}
        return f"redirect to :{r['port']}" if "port" in r else "redirect"
    if "counter" in s:
        c = s["counter"] or {}
        return f"counter packets {c.get('packets', 0)} bytes {c.get('bytes', 0)}"
    return json.dumps(s)


def render_rule(rule: Mapping[str, Any], handle: bool = True) -> str:
    """One rule as ``nft -a list`` prints it: ``tcp dport 1234 drop comment "fw1" # handle 5``."""
    text = " ".join(_statement(s) for s in rule.get("expr", []))
    if rule.get("comment") is not None:
        text += f" comment {json.dumps(rule['comment'])}"
    if handle and rule.get("handle") is not None:
        text += f" # handle {rule['handle']}"
    return text


def render_table(listing: Mapping[str, Any]) -> str:
    """A ``nft -j list table`` answer as ``nft -a list table`` prints it."""
    items = [i for i in listing.get("nftables", []) if isinstance(i, dict)]
    table = next((i["table"] for i in items if "table" in i), None)
    if table is None:
        return ""
    chains = [i["chain"] for i in items if "chain" in i]
    rules = [i["rule"] for i in items if "rule" in i]
    lines = [f"table {table['family']} {table['name']} {{ # handle {table.get('handle')}"]
    for n, chain in enumerate(chains):
        if n:
            lines.append("")
        lines.append(f"\tchain {chain['name']} {{ # handle {chain.get('handle')}")
        if "hook" in chain:
            lines.append(f"\t\ttype {chain.get('type')} hook {chain['hook']} priority "
                         f"{_prio(chain.get('prio'), chain['hook'])}; "
                         f"policy {chain.get('policy', 'accept')};")
        for rule in rules:
            if rule.get("chain") == chain["name"]:
                lines.append("\t\t" + render_rule(rule))
        lines.append("\t}")
    lines.append("}")
    return "\n".join(lines) + "\n"
