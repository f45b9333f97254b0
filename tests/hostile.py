"""The hostile-input corpus: hand-written files in tests/data/hostile/ plus generated ones.

Each file starts with a header saying what it is and what must happen::

    # hostile: <what it is>
    # expect: error            (or: runs)
    # line: N                  (error: the line of the first problem; - for none)
    # field: F                 (error: its field path, may be empty)
    # message: REGEX           (error: searched in its message)

Files too big to keep in git (40,000 keys, 10,000 cases, a 300 KB env value...) are written by
``write_generated`` with the same header; ``write_special`` makes what git cannot hold (a FIFO,
a symlink to /dev/zero, a directory and a broken symlink, each named ``*.yaml``). Used by
tests/test_hostile.py and benchmarks/hostile_corpus.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

HOSTILE = Path(__file__).parent / "data" / "hostile"
HEADER = re.compile(r"^# (hostile|expect|line|field|message): ?(.*?)\r?$", re.M)

GOOD = """\
name: good
about: the one good file beside the hostile ones; one rank, init only
world_size: 1
timeout: 10
deadline: 60
workload: init
expect: {job: ok}
"""

BASE = "name: big\nabout: hostile input\nworld_size: 1\ntimeout: 10\ndeadline: 60\nworkload: init\n"


def header(path: Path) -> Dict[str, str]:
    raw = path.read_bytes()
    text = raw.decode("utf-16") if raw.startswith(b"\xff\xfe") else \
        raw.decode("utf-8", errors="replace").lstrip("\ufeff")
    return {k: v for k, v in HEADER.findall(text[:2000])}


def corpus() -> List[Path]:
    return sorted(HOSTILE.glob("*.yaml"))


def _write(dst: Path, name: str, what: str, line: Optional[int], field: str, message: str,
           body: str) -> Path:
    shown = "-" if line is None else line + 5
    head = (f"# hostile: {what}\n# expect: error\n# line: {shown}\n# field: {field}\n"
            f"# message: {message}\n")
    p = dst / name
    p.write_text(head + body, encoding="utf-8")
    return p


def write_generated(dst: Path) -> List[Path]:
    """The big hostile files, each with its header (lines counted after the 5 header lines)."""
    dst.mkdir(parents=True, exist_ok=True)
    out = [
        _write(dst, "keys_40000.yaml", "40,000 unknown top-level keys (48 s, quadratic, before)",
               7, "k00000", "unknown field",
               BASE + "".join(f"k{i:05d}: 1\n" for i in range(40000))),
        _write(dst, "env_value_300k.yaml", "an env value of 300 KB (failed at spawn before)",
               8, "env.BIG", "at most 32768", BASE + "env:\n  BIG: " + "x" * 300_000 + "\n"),
        _write(dst, "env_total.yaml", "eight env values of 20 KB each: 160 KB in all",
               7, "env", "at most 131072",
               BASE + "env:\n" + "".join(f"  V{i}: {'y' * 20_000}\n" for i in range(8))),
        _write(dst, "cases_10000.yaml", "10,000 cases in one file", 7, "cases", "at most 256",
               BASE + "cases:\n" + "".join(f"  c{i}: {{}}\n" for i in range(10000))),
        _write(dst, "faults_10000.yaml", "10,000 faults in one case", 7, "faults", "at most 64",
               BASE.replace("world_size: 1", "world_size: 2") + "faults:\n" +
               "".join("  - {kind: delayed_rank, delay: 1}\n" for _ in range(10000))),
        _write(dst, "steps_100000.yaml", "a workload of 100,000 steps in a flow list", 6,
               "workload", "at most 256",
               BASE.replace("workload: init", "workload: [" + "barrier," * 60_000 + "barrier]")),
        _write(dst, "about_900k.yaml", "an about of 900 KB", 2, "about", "at most 65536",
               BASE.replace("about: hostile input", "about: " + "z" * 900_000)),
        _write(dst, "file_2mib.yaml", "a file of 2 MiB (one comment)", None, "",
               "larger than 1048576 bytes", BASE + "#" + "c" * (2 << 20) + "\n"),
        _write(dst, "expect_ranks_5000.yaml", "expect for 5,000 ranks in a world of 1", 8,
               "expect.ranks", "at most 129",
               BASE + "expect:\n  ranks:\n" + "".join(f"    {i}: ok\n" for i in range(5000))),
    ]
    return out


SPECIAL = ("fifo.yaml", "dev_zero.yaml", "directory.yaml", "broken_link.yaml")


def write_special(dst: Path) -> List[Tuple[Path, str]]:
    """Entries named *.yaml that are not regular files: (path, what it is)."""
    dst.mkdir(parents=True, exist_ok=True)
    fifo, zero, d, broken = (dst / n for n in SPECIAL)
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    d.mkdir()
    broken.symlink_to(dst / "no-such-target.yaml")
    return [(fifo, "a FIFO"), (zero, "a symlink to /dev/zero"), (d, "a directory"),
            (broken, "a broken symlink")]
