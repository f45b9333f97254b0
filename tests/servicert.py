"""The little of the supervisor's Runtime that the service steps (the run's etcd) use, with no
namespaces: tests that start a real service on the machine's loopback and fire steps at it."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, List

from harness.machine.procs import ManagedProcess
from harness.services import Services


class ServiceRuntime:
    def __init__(self, run_dir: Path, plan: Any):
        self.run_dir, self.plan, self.services = run_dir, plan, Services(run_dir)
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def python(self, module: str, *args: str) -> List[str]:
        return [sys.executable, "-m", module, *args]

    def start_service(self, spec: Any) -> Any:
        def spawn(argv: Any, out: Any, err: Any) -> ManagedProcess:
            return ManagedProcess(argv, name=spec.name, cwd=str(self.run_dir), stdout=out,
                                  stderr=err)
        return self.services.start(spec, spawn).wait_ready()

    def service(self, name: str) -> Any:
        return self.services.get(name)
