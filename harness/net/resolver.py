"""The resolver view: what every process the harness starts for torch reads to resolve names.

This module owns the three files a process's name lookups depend on and how a process comes to
see them, so that no DNS query ever leaves the machine (torch looks names up on its own: c10d
reverse-resolves every peer address, gloo resolves the machine's host name):

* ``hosts``: loopback names only (:func:`hosts_text`; :func:`loopback_names` is what the safety
  rule accepts), with ``::ffff:127.0.0.1`` mapped too (c10d's reverse lookup of a peer arrives
  as that IPv4-mapped IPv6 address, which a plain ``127.0.0.1`` line does not match), and the
  machine's host name on ``127.0.0.1`` (gloo picks its address by that name).
* ``nsswitch.conf``: the machine's own, with ``hosts: files`` (no ``dns``, ``resolve``, ``mdns``):
  glibc then never asks a name server; a name outside the hosts file fails at once, locally.
* ``resolv.conf``: ``nameserver 127.0.0.1``, for programs that read it without glibc's NSS; a
  query of theirs stays on loopback.

How a process sees them (nothing of the machine's own files changes):

* In the harness's network namespaces the topology writes them to ``/etc/netns/<ns>/``;
  ``ip netns exec`` bind-mounts every file there over ``/etc`` in a private mount namespace.
* Anywhere, :func:`enter` gives the calling process a private mount namespace with the files
  bind-mounted over ``/etc/hosts``, ``/etc/nsswitch.conf`` and ``/etc/resolv.conf`` (and
  ``/dev/null`` over nscd's socket, if any: that daemon resolves with the machine's files).
  As root ``unshare(CLONE_NEWNS)``; otherwise ``unshare(CLONE_NEWUSER | CLONE_NEWNS)`` with the
  user's own uid/gid mapped to themselves (unprivileged user namespaces). It must run while the
  process is single-threaded: before ``import torch``. The worker calls :func:`enter_from_env`
  first thing; ``python -m harness.net.resolver --view DIR -- ARGV...`` enters the view and execs
  any other program in it; ``--write DIR`` makes a view folder; ``--check`` tries it here.

Where neither root nor unprivileged user namespaces are available, :func:`missing` says so and
scenarios that would run in the machine's own network namespace are skipped with that reason.
"""

from __future__ import annotations

import ctypes
import functools
import ipaddress
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = [
    "ENV_USERNS",
    "ENV_VIEW",
    "FILES",
    "ViewError",
    "enter",
    "enter_from_env",
    "exec_prefix",
    "hosts_text",
    "loopback_names",
    "missing",
    "nsswitch_text",
    "parse_hosts",
    "resolv_conf_text",
    "dns_resolv_conf_lines",
    "write_view",
]

FILES = ("hosts", "nsswitch.conf", "resolv.conf")
ENV_VIEW = "HARNESS_RESOLVER_VIEW"      # the view folder a rank enters (set by the supervisor)
ENV_USERNS = "HARNESS_RESOLVER_USERNS"  # "1": use a user namespace even as root (tests)
NSCD_SOCKETS = ("/run/nscd/socket", "/var/run/nscd/socket")
HEADER = "# torchdist-harness resolver view: loopback names only; nsswitch says hosts: files\n"
LOOPBACK_LINES: Tuple[Tuple[str, str], ...] = (
    ("127.0.0.1", "localhost"),
    ("127.0.0.1", "localhost.localdomain"),
    ("::1", "localhost"),
    ("::1", "ip6-localhost"),
    ("::1", "ip6-loopback"),
    # c10d reverse-resolves peers as ::ffff:127.0.0.1; glibc's files backend matches that only
    # by an IPv6 line (its dns backend would unmap it and ask for 1.0.0.127.in-addr.arpa)
    ("::ffff:127.0.0.1", "localhost"),
)
RESOLV_CONF = ("nameserver 127.0.0.1", "options timeout:1 attempts:1")
_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_-]{1,63})*$")

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_RDONLY = 0x1
MS_REMOUNT = 0x20
ENV_READ_ONLY = "HARNESS_READ_ONLY"     # folders a rank sees read-only (os.pathsep-separated)


class ViewError(RuntimeError):
    """The resolver view could not be made or entered; the message says what is missing."""


# --------------------------------------------------------------------------------------------
# the files


def machine_hostname() -> Optional[str]:
    """This machine's host name when it can go in a hosts file, else None."""
    name = socket.gethostname()
    return name if len(name) <= 253 and _NAME_RE.match(name) else None


def hosts_text(entries: Mapping[str, Union[str, Sequence[str]]] = {},  # noqa: B006 - read only
               hostname: Optional[str] = None) -> str:
    """The view's hosts file: the loopback lines, ``hostname`` on 127.0.0.1, then ``entries``
    (name -> IP address, or a list of them, one line each in that order; an entry replaces
    every line of a name the view already maps).

    One name a line: glibc's reverse lookup returns the first line's name and no aliases, so
    ``127.0.0.1`` reads back as ``localhost``, as on a stock machine."""
    pairs: List[Tuple[str, str]] = list(LOOPBACK_LINES)
    if hostname and hostname.lower() not in {n.lower() for _, n in pairs}:
        pairs.append(("127.0.0.1", hostname))
    for name, addr in entries.items():
        if not isinstance(name, str) or len(name) > 253 or not _NAME_RE.match(name):
            raise ValueError(f"not a host name for /etc/hosts: {name!r}")
        ips = []
        for one in ([addr] if isinstance(addr, str) else list(addr)):
            try:
                ips.append(str(ipaddress.ip_address(one)))
            except ValueError:
                raise ValueError(f"{name!r} must map to an IP address, got {one!r}") from None
        pairs = [(a, n) for a, n in pairs if n.lower() != name.lower()] + \
            [(ip, name) for ip in ips]
    return HEADER + "".join(f"{a}\t{n}\n" for a, n in pairs)


def parse_hosts(text: str) -> Dict[str, List[str]]:
    """name (lower case) -> its addresses, in file order, as glibc's files backend reads them."""
    out: Dict[str, List[str]] = {}
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2:
            continue
        for name in fields[1:]:
            out.setdefault(name.lower(), []).append(fields[0])
    return out


def loopback_names(text: Optional[str] = None) -> Dict[str, List[str]]:
    """Names the view maps to loopback addresses only (name -> addresses). Without ``text``:
    the view's own loopback lines, the part that is the same on every machine."""
    names = parse_hosts(text if text is not None else hosts_text())
    out = {}
    for name, addrs in names.items():
        try:
            if all(ipaddress.ip_address(a).is_loopback
                   or ipaddress.ip_address(a) == ipaddress.ip_address("::ffff:127.0.0.1")
                   for a in addrs):
                out[name] = addrs
        except ValueError:
            continue
    return out


def nsswitch_text(machine: Optional[str] = None, dns: bool = False) -> str:
    """The machine's nsswitch.conf (``machine``: its text; default: read it) with the ``hosts``
    line replaced by ``hosts: files`` (``dns``: ``hosts: files dns``, for a run with its own
    name server, whose resolv.conf names only that server); every other database is left as
    the machine has it."""
    if machine is None:
        try:
            machine = Path("/etc/nsswitch.conf").read_text()
        except OSError:
            machine = ""
    # glibc reads a '#' after a service as more of the line (an AF_UNSPEC lookup of an unknown
    # name then failed with EBUSY): the note goes on a line of its own
    hosts = ["# torchdist-harness: host names come from the hosts file only, never from DNS",
             "hosts:          files"]
    if dns:
        hosts = ["# torchdist-harness: host names from the hosts file, then the run's own name "
                 "server", "hosts:          files dns"]
    lines: List[str] = []
    seen = False
    for line in machine.splitlines():
        if re.match(r"^\s*hosts\s*:", line):
            if not seen:
                lines += hosts
            seen = True
            continue
        lines.append(line)
    if not seen:
        lines += hosts
    return "".join(f"{line}\n" for line in lines)


def resolv_conf_text(lines: Sequence[str] = RESOLV_CONF) -> str:
    if isinstance(lines, str):
        raise ValueError("lines must be a list of lines, not a string")
    for line in lines:
        if "\n" in line:
            raise ValueError(f"a resolv.conf line must not contain a newline: {line!r}")
    return "".join(f"{line}\n" for line in lines)


def dns_resolv_conf_lines(server: str, domain: Optional[str] = None, timeout: int = 5,
                          attempts: int = 2) -> List[str]:
    """resolv.conf of a host that resolves through the run's own name server (one address of
    the run, never the machine's): glibc's timeout and attempts unless told otherwise."""
    ipaddress.ip_address(server)
    lines = [f"nameserver {server}"]
    if domain:
        lines.append(f"search {domain}")
    return lines + [f"options timeout:{int(timeout)} attempts:{int(attempts)}"]


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_view(directory: Path, entries: Mapping[str, str] = {},  # noqa: B006 - read only
               hostname: Optional[str] = "") -> Path:
    """Write the view's files into ``directory`` (made if missing); return it. ``hostname``:
    "" (default) this machine's, None none."""
    directory = Path(directory)
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    name = machine_hostname() if hostname == "" else hostname
    _write(directory / "hosts", hosts_text(entries, name))
    _write(directory / "nsswitch.conf", nsswitch_text())
    _write(directory / "resolv.conf", resolv_conf_text())
    return directory


# --------------------------------------------------------------------------------------------
# entering it


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_void_p]
    libc.unshare.argtypes = [ctypes.c_int]
    return libc


def _err(what: str) -> str:
    e = ctypes.get_errno()
    return f"{what}: {os.strerror(e)} (errno {e})"


def _mount(libc: ctypes.CDLL, src: Optional[str], dst: str, flags: int) -> None:
    if libc.mount(src.encode() if src else None, dst.encode(), None, flags, None) != 0:
        raise ViewError(_err(f"mount {src or ''} on {dst} (flags {flags:#x})"))


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _want_userns() -> bool:
    return os.geteuid() != 0 or os.environ.get(ENV_USERNS, "") == "1"


def _private_mounts(userns: bool) -> ctypes.CDLL:
    """A private mount namespace for this process (in a user namespace of its own when
    ``userns``, its uid and gid mapped to themselves); nothing mounted in it propagates to
    the machine. Returns libc for the mounts to come."""
    libc = _libc()
    uid, gid = os.geteuid(), os.getegid()
    flags = CLONE_NEWNS | (CLONE_NEWUSER if userns else 0)
    if libc.unshare(flags) != 0:
        raise ViewError(_err("unshare(" + ("CLONE_NEWUSER|" if userns else "") + "CLONE_NEWNS)")
                        + "; " + (userns_hint() if userns else "a mount namespace needs "
                                  "CAP_SYS_ADMIN"))
    if userns:
        try:
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1\n")
            Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1\n")
        except OSError as e:
            raise ViewError(f"could not map uid {uid}/gid {gid} in the user namespace: {e}") \
                from None
    _mount(libc, None, "/", MS_REC | MS_PRIVATE)   # nothing below propagates to the machine
    return libc


def enter(view: os.PathLike, userns: Optional[bool] = None) -> None:
    """Make this process (and what it starts later) see the view's files; see the module doc.

    ``userns``: use a user namespace (default: when not root, or ``HARNESS_RESOLVER_USERNS=1``).
    Raises ViewError, saying what failed; the process is then unchanged or must not go on."""
    view = Path(view)
    for name in FILES:
        try:
            (view / name).read_bytes()
        except FileNotFoundError:
            raise ViewError(f"the resolver view {view} has no {name}") from None
        except OSError as e:
            raise ViewError(f"cannot read the resolver view's {name}: {e}") from None
    if userns is None:
        userns = _want_userns()
    if _threads() > 1:
        raise ViewError(f"the resolver view must be entered while single-threaded (before "
                        f"import torch); this process has {_threads()} threads")
    libc = _private_mounts(userns)
    for name in FILES:
        target = f"/etc/{name}"
        if name == "resolv.conf" and not os.path.exists(target):
            continue   # glibc then asks 127.0.0.1, and with hosts: files it asks nobody
        _mount(libc, str(view / name), target, MS_BIND)
    for sock in NSCD_SOCKETS:   # connect() to /dev/null is refused: glibc then uses NSS
        if os.path.exists(sock) and not os.path.islink(sock):
            _mount(libc, "/dev/null", sock, MS_BIND)
    _verify(view)


def _verify(view: Path) -> None:
    for name in ("hosts", "nsswitch.conf"):
        if Path(f"/etc/{name}").read_bytes() != (view / name).read_bytes():
            raise ViewError(f"/etc/{name} does not show the view's {view / name} after the "
                            "bind mount")


def enter_read_only(paths: Sequence[str]) -> None:
    """Make ``paths`` (existing folders) read-only mounts for this process and what it starts,
    in a private mount namespace of its own, as a read-only NFS export or a ``ro`` volume is:
    writes fail with EROFS. Nothing of the machine's mounts changes; the namespace ends with
    the process. Single-threaded callers only (the worker, before torch)."""
    libc = _private_mounts(os.geteuid() != 0)
    for path in paths:
        _mount(libc, path, path, MS_BIND)
        _mount(libc, None, path, MS_BIND | MS_REMOUNT | MS_RDONLY)


def enter_from_env() -> Optional[str]:
    """For the worker, first thing: enter the view named by ``HARNESS_RESOLVER_VIEW`` (popped,
    so that programs the rank starts do not enter it again); returns the folder, or None."""
    view = os.environ.pop(ENV_VIEW, "")
    read_only = [p for p in os.environ.pop(ENV_READ_ONLY, "").split(os.pathsep) if p]
    if view:
        enter(Path(view))
    if read_only:
        enter_read_only(read_only)
    return view or None


def exec_prefix(view: os.PathLike, python: str = sys.executable) -> List[str]:
    """Argv prefix that runs any program inside the view."""
    return [python, "-m", "harness.net.resolver", "--view", str(view), "--"]


def userns_hint() -> str:
    """Why unprivileged user namespaces may be off here, and the knobs that turn them on."""
    knobs = []
    for path, want in (("/proc/sys/user/max_user_namespaces", "> 0"),
                       ("/proc/sys/kernel/unprivileged_userns_clone", "= 1"),
                       ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "= 0")):
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        name = path[len("/proc/sys/"):].replace("/", ".")
        knobs.append(f"{name} is {value} (needs {want})")
    return "unprivileged user namespaces are not allowed here" + (
        f": {', '.join(knobs)}" if knobs else "")


@functools.cache
def missing() -> Optional[str]:
    """None if a process of this user can enter the view here; else one sentence saying what is
    missing. Tried for real, once per process, in a child."""
    with tempfile.TemporaryDirectory(prefix="harness-view-") as tmp:
        view = write_view(Path(tmp))
        code = ("import sys; from harness.net.resolver import enter; enter(sys.argv[1]); "
                "import socket; socket.getaddrinfo('localhost.localdomain', None); print('ok')")
        env = dict(os.environ)
        from ..machine.rundir import package_path  # the package alone: never a site-packages

        env["PYTHONPATH"] = package_path() + (
            os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        try:
            p = subprocess.run([sys.executable, "-c", code, str(view)], capture_output=True,
                               text=True, timeout=60, env=env, cwd="/")
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"could not try the resolver view: {e}"
    if p.returncode == 0 and p.stdout.strip() == "ok":
        return None
    last = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    last = last.split("ViewError: ", 1)[-1]
    how = "root or unprivileged user namespaces" if _want_userns() else "CAP_SYS_ADMIN"
    return (f"cannot keep torch's DNS lookups on this machine: the ranks' private resolver "
            f"view needs {how} ({last})")


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m harness.net.resolver",
        description="Run a program inside the harness's resolver view (no DNS leaves the "
                    "machine), write a view folder, or check that views work here.")
    ap.add_argument("--view", metavar="DIR", help="enter the view in DIR, then exec ARGV")
    ap.add_argument("--write", metavar="DIR", help="write a view folder and exit")
    ap.add_argument("--check", action="store_true", help="say whether views work here")
    ap.add_argument("--userns", action="store_true", help="use a user namespace even as root")
    ap.add_argument("argv", nargs=argparse.REMAINDER, help="-- PROGRAM ARGS...")
    args = ap.parse_args(argv)
    rest = list(args.argv)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if args.write:
        write_view(Path(args.write))
        return 0
    if args.check:
        why = missing()
        print(why or "ok: processes of this user can enter the resolver view")
        return 1 if why else 0
    if not args.view or not rest:
        ap.error("give --view DIR -- PROGRAM [ARGS...] (or --write DIR, or --check)")
    try:
        enter(Path(args.view), userns=True if args.userns else None)
    except ViewError as e:
        print(f"harness.net.resolver: {e}", file=sys.stderr)
        return 125
    try:
        os.execvp(rest[0], rest)
    except OSError as e:
        print(f"harness.net.resolver: cannot run {rest[0]}: {e}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
