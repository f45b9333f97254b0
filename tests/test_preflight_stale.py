"""harness preflight's stale-image check, for real: one node of the run's own Slurm cluster runs
its preflight task with another interpreter (the host's ``python:``), a venv made from another
Python build on this machine that imports the same torch. That node reports another Python
version, as a node booted from an older image does, and must be the only one flagged, for its
versions, while the collective still passes on every node. Skipped, with the reason, where no
second Python build exists or the cluster cannot start."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Optional, Tuple

import pytest

from harness.net import topology
from harness.services import slurm as svc
from harness.tools import preflight as pf

MISSING = svc.missing() + topology.missing()

CANDIDATES = ["/usr/bin/python3", "/usr/bin/python3.11", "/usr/local/bin/python3"]


def other_python() -> Tuple[Optional[str], str]:
    """A Python build other than the running one whose ABI can import our torch (same
    major.minor), and its version; (None, why) where there is none."""
    want = f"{sys.version_info.major}.{sys.version_info.minor}"
    ours = ".".join(map(str, sys.version_info[:3]))
    for c in CANDIDATES:
        if not Path(c).exists():
            continue
        r = subprocess.run([c, "-c", "import platform; print(platform.python_version())"],
                           capture_output=True, text=True, timeout=30)
        v = r.stdout.strip()
        if r.returncode == 0 and v.startswith(want + ".") and v != ours:
            return c, v
    return None, (f"no second Python {want} build other than {ours} among "
                  f"{', '.join(CANDIDATES)}")


def stale_venv(where: Path, base: str) -> str:
    """A venv of ``base`` that sees this venv's packages (torch, the harness) through a .pth."""
    subprocess.run([base, "-m", "venv", "--without-pip", str(where)], check=True, timeout=120)
    site = next(where.glob("lib/python*/site-packages"))
    (site / "harness-under-test.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return str(where / "bin" / "python")


OTHER, OTHER_VERSION = other_python()


@pytest.mark.skipif(bool(MISSING), reason="the Slurm test cluster needs: " + "; ".join(MISSING))
@pytest.mark.skipif(OTHER is None, reason=OTHER_VERSION)
def test_a_node_running_another_python_build_is_flagged_alone(tmp_path):
    from harness.run.supervisor import run_scenario
    from harness.scenario.loader import load_text

    assert OTHER is not None
    py = stale_venv(tmp_path / "stale-venv", OTHER)
    out = tmp_path / "pf"
    text = textwrap.dedent(f"""\
        name: preflight_stale
        about: harness preflight where node1 runs another Python build
        hostnames: own
        deadline: 150
        launcher: slurm
        program: {{module: harness.tools.preflight, args: ["--task", "--dir", "{out}", "--timeout",
                  "5", "--grace", "20", "--wait", "40"]}}
        hosts:
          - {{name: node0, ranks: 1}}
          - {{name: node1, ranks: 1, python: {py}}}
          - {{name: node2, ranks: 1}}
    """)
    (scn,) = load_text(text, "preflight_stale.yaml")
    try:
        run_scenario(scn)
        rep = json.loads((out / "report.json").read_text())
    finally:
        shutil.rmtree(tmp_path / "stale-venv", ignore_errors=True)
    assert [r["node"] for r in rep["nodes"] if not r["ok"]] == ["node1"], pf.table(rep)
    node1 = rep["nodes"][1]
    assert node1["versions"]["python"] == OTHER_VERSION
    why = " ".join(node1["reasons"])
    ours = ".".join(map(str, sys.version_info[:3]))
    assert f"differs from the other nodes: python {OTHER_VERSION} (others {ours})" in why, why
    assert [r["collective"] for r in rep["nodes"]] == ["ok", "ok", "ok"], pf.table(rep)
