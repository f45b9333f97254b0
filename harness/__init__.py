"""torchdist-harness: fault-injection test harness for PyTorch distributed start-up.

A scenario (YAML) flows one way through a few parts (subpackages, docs/architecture.md):
load (``harness.scenario.loader``) -> plan (``harness.run.plan``) -> launch + supervise
(``harness.run.supervisor``, ranks run ``harness.ranks.worker``) -> classify
(``harness.judge.classify``) -> expect (``harness.scenario.expect``).
Front doors: the pytest plugin (``harness.pytest_plugin``) and the CLI (``harness.cli``).
"""

__version__ = "0.1.0"
