"""A job step's task 0 runs `harness preflight` as a user would in an allocation (it starts its
own srun step, --overlap because this step holds the nodes); the other tasks wait for the
report. Used by tests/test_preflight.py on the test cluster."""

import os
import subprocess
import sys
import time
from pathlib import Path

d = Path(sys.argv[1])
if os.environ.get("SLURM_PROCID") == "0":
    sys.exit(subprocess.run([sys.executable, "-m", "harness", "preflight", "--dir", str(d),
                             "--timeout", "5", "--grace", "20", "--wait", "40",
                             "--port", sys.argv[2], "--srun-arg=--overlap"]).returncode)
end = time.monotonic() + 120
while time.monotonic() < end and not (d / "report.json").exists():
    time.sleep(0.2)
